import CLibUV

/// Calls an action on every turn of a loop, just before the loop blocks for I/O (a `uv_prepare_t`, as the loop's
/// own write flush is): whatever the turn's callbacks collected is handed on once per turn, and never waits for the
/// next event. It does not hold the loop open. Confined to its loop; `close()` is idempotent and the action is
/// never called after it.
package final class LoopTurnEnd {
    /// Owned: the handle holds a +1 on self (`handle.data`), released in the close callback, where the handle
    /// memory is freed too.
    private let handle: UnsafeMutablePointer<uv_prepare_t>
    private let loop: LoopThread
    private var action: (() -> Void)?
    private var closed = false

    /// Starts calling `action` once per turn. The owner closes it, from a stop action of its own if it must run
    /// something first (this registers none, so that the owner decides what happens when the loop stops).
    package init(loop: LoopThread, _ action: @escaping () -> Void) {
        loop.assertInLoop()
        self.loop = loop
        self.action = action
        handle = .allocate(capacity: 1)
        uv_prepare_init(loop.loop, handle)
        handle.pointee.data = Unmanaged.passRetained(self).toOpaque()
        uv_prepare_start(handle, loopTurnEndCallback)
        uv_unref(UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_handle_t.self))
    }

    package func close() {
        loop.assertInLoop()
        guard !closed else { return }
        closed = true
        action = nil
        uv_close(UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_handle_t.self)) { raw in
            guard let raw, let data = raw.pointee.data else { return }
            Unmanaged<LoopTurnEnd>.fromOpaque(data).release()
            raw.deallocate()
        }
    }

    fileprivate func fire() {
        if let action { action() }
    }
}

private func loopTurnEndCallback(_ handle: UnsafeMutablePointer<uv_prepare_t>?) {
    guard let handle, let data = handle.pointee.data else { preconditionFailure("prepare handle without owner") }
    Unmanaged<LoopTurnEnd>.fromOpaque(data).takeUnretainedValue().fire()
}
