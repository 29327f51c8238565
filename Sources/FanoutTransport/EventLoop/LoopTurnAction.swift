/// Work that runs at most once per loop turn, however often it is asked for: `schedule()` from the loop thread
/// queues `action` with the turn's flushes, before the loop blocks (or sooner, when a full read flushes early; see
/// `LoopThread.flushScheduledNow`). The engine uses it to open streams once per batch of answers read, not once per
/// answer, and to hand a turn's results to its results thread at once. It runs only in turns that asked for it, and
/// with the turn's flushes, so an early flush runs it too.
package final class LoopTurnAction: LoopFlushable {
    private let loop: LoopThread
    private let action: () -> Void

    /// `action` is held strongly: capture its owner `weak` to avoid a cycle.
    package init(loop: LoopThread, action: @escaping () -> Void) {
        self.loop = loop
        self.action = action
    }

    /// Queues `action` for the end of this turn, once. Loop thread.
    package func schedule() {
        loop.scheduleFlush(self)
    }

    override func flushNow() {
        action()
    }
}
