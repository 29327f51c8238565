import CLibUV

/// A one-shot or repeating timer on a loop, calling a closure on the loop thread.
/// Confined to its loop. `close()` is idempotent; the closure is never called after it.
package final class LoopTimer {
    /// Owned: the handle holds a +1 on self (`handle.data`), released in the close callback,
    /// where the handle memory is freed too.
    private let handle: UnsafeMutablePointer<uv_timer_t>
    private let loop: LoopThread
    private var action: (() -> Void)?
    private var closed = false
    private var stopActionID = 0

    package init(loop: LoopThread) {
        loop.assertInLoop()
        self.loop = loop
        handle = .allocate(capacity: 1)
        uv_timer_init(loop.loop, handle)
        handle.pointee.data = Unmanaged.passRetained(self).toOpaque()
        stopActionID = loop.addStopAction { [self] in close() }
    }

    /// Calls `action` after `milliseconds`, then every `repeatMilliseconds` if nonzero. Replaces a
    /// pending schedule.
    package func schedule(milliseconds: UInt64, repeatMilliseconds: UInt64 = 0, _ action: @escaping () -> Void) {
        loop.assertInLoop()
        precondition(!closed, "schedule on a closed timer")
        self.action = action
        uv_timer_start(handle, loopTimerCallback, milliseconds, repeatMilliseconds)
    }

    /// Starts the timer again, after `milliseconds`, with the action of the last `schedule`: re-arming
    /// a timer that always does the same thing allocates no new closure.
    package func restart(milliseconds: UInt64) {
        loop.assertInLoop()
        precondition(!closed && action != nil, "restart needs a scheduled action")
        uv_timer_start(handle, loopTimerCallback, milliseconds, 0)
    }

    /// Stops the timer but keeps its action, for a later `restart`.
    package func stop() {
        guard !closed else { return }
        uv_timer_stop(handle)
    }

    package func cancel() {
        guard !closed else { return }
        action = nil
        uv_timer_stop(handle)
    }

    /// Keeps the timer from holding its loop open.
    package func unref() {
        uv_unref(UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_handle_t.self))
    }

    package func close() {
        guard !closed else { return }
        closed = true
        action = nil
        loop.removeStopAction(stopActionID)
        uv_close(UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_handle_t.self)) { raw in
            guard let raw, let data = raw.pointee.data else { return }
            Unmanaged<LoopTimer>.fromOpaque(data).release()
            raw.deallocate()
        }
    }

    fileprivate func fire() {
        if let action { action() }
    }
}

private func loopTimerCallback(_ handle: UnsafeMutablePointer<uv_timer_t>?) {
    guard let handle, let data = handle.pointee.data else { preconditionFailure("timer without owner") }
    Unmanaged<LoopTimer>.fromOpaque(data).takeUnretainedValue().fire()
}

extension LoopThread {
    /// The loop's cached clock in milliseconds (libuv's `uv_now`, updated once per turn). Loop thread only.
    package var nowMilliseconds: UInt64 {
        assertInLoop()
        return uv_now(loop)
    }

    /// The high-resolution clock (`uv_hrtime`, ns) as `readClock()` last read it. Loop thread only.
    package var clockNanoseconds: UInt64 {
        assertInLoop()
        return lastClockNanoseconds
    }

    /// Reads the high-resolution clock (`uv_hrtime`, ns), for `clockNanoseconds`. Called once per batch of events
    /// (a read, a pump of sends), not per notification: a clock read per request would cost about 1% of a
    /// notification's CPU. Loop thread only.
    @discardableResult package func readClock() -> UInt64 {
        assertInLoop()
        lastClockNanoseconds = uv_hrtime()
        return lastClockNanoseconds
    }
}
