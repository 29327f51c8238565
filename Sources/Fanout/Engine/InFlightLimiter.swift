import FanoutCore
import FanoutTransport

/// Bounds the notifications in flight in an engine: submission suspends while the engine is full,
/// so a large job applies back-pressure instead of queueing without limit. Permits are released
/// by the loops' results threads, a batch at a time, once the notifications' results are built.
///
/// Both waits (`acquire` and `waitUntilEmpty`) end when the waiting task is cancelled.
final class InFlightLimiter: Sendable {
    private struct Waiter {
        let id: UInt64
        let count: Int
        let continuation: CheckedContinuation<Bool, Never>
    }
    private struct State {
        var available: Int
        var waiters = FIFOQueue<Waiter>()
        /// Waiters removed by cancellation while still queued: skipped when they reach the head.
        var cancelledWaiters = Set<UInt64>()
        /// Waiters given an id on the slow path and not answered yet (queued, or about to be).
        var unanswered = Set<UInt64>()
        var nextWaiterID: UInt64 = 0
        var emptyWaiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
    }
    private let state: FanoutMutex<State>
    let capacity: Int

    init(capacity: Int) {
        precondition(capacity > 0)
        self.capacity = capacity
        state = FanoutMutex(State(available: capacity))
    }

    /// Waits until `count` permits (at most `capacity`) are free, then takes them. FIFO. A wait for `run` ends too
    /// when the run is stopped (cancelled, or its deadline passed).
    /// - Returns: false, with no permit taken, when the waiting task was cancelled or the run stopped.
    func acquire(_ count: Int, for run: FanoutRun? = nil) async -> Bool {
        let count = min(count, capacity)
        if Task.isCancelled { return false }
        // Room now and nobody queued ahead (the usual case, and always so for a gateway's one-token jobs): one lock,
        // no continuation and no cancellation handler.
        let id = state.withLock { state -> UInt64? in
            if state.waiters.isEmpty && state.available >= count {
                state.available -= count
                return nil
            }
            state.nextWaiterID += 1
            state.unanswered.insert(state.nextWaiterID)
            return state.nextWaiterID
        }
        guard let id else { return true }
        if let run {
            return await run.stoppable({ await wait(id: id, count: count) }, cancel: { self.cancelWaiter(id) })
        }
        return await wait(id: id, count: count)
    }

    /// Takes `count` permits if they are free now and nobody waits ahead (FIFO is kept); false, taking none, otherwise.
    func tryAcquire(_ count: Int) -> Bool {
        state.withLock { state -> Bool in
            guard state.waiters.isEmpty && state.available >= count else { return false }
            state.available -= count
            return true
        }
    }

    /// The queued part of `acquire`: waits as waiter `id` for `count` permits.
    private func wait(id: UInt64, count: Int) async -> Bool {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let ready = state.withLock { state -> Bool? in
                    if Task.isCancelled || state.cancelledWaiters.remove(id) != nil {
                        state.unanswered.remove(id)
                        return false
                    }
                    if state.waiters.isEmpty && state.available >= count {
                        state.available -= count
                        state.unanswered.remove(id)
                        return true
                    }
                    state.waiters.append(Waiter(id: id, count: count, continuation: continuation))
                    return nil
                }
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            cancelWaiter(id)
        }
    }

    /// Returns permits and wakes the waiters they satisfy, in order. With nobody waiting it is one lock around an
    /// addition (no arrays, no generic metadata).
    func release(_ count: Int) {
        let someoneWaits = state.withLock { state -> Bool in
            state.available += count
            return !state.waiters.isEmpty || !state.emptyWaiters.isEmpty
        }
        if someoneWaits { wakeWaiters() }
    }

    /// Wakes the waiters the free permits now satisfy (a waiter may have come or gone since `release`'s lock:
    /// this looks again).
    private func wakeWaiters() {
        let (woken, empty) = state.withLock { state -> ([Waiter], [CheckedContinuation<Void, Never>]) in
            let woken = Self.takeSatisfiedWaiters(&state)
            var empty: [CheckedContinuation<Void, Never>] = []
            if state.available == capacity && !state.emptyWaiters.isEmpty {
                empty = Array(state.emptyWaiters.values)
                state.emptyWaiters.removeAll()
            }
            return (woken, empty)
        }
        for waiter in woken { waiter.continuation.resume(returning: true) }
        for waiter in empty { waiter.resume() }
    }

    /// Returns when nothing is in flight, or when the waiting task is cancelled.
    func waitUntilEmpty() async {
        let id = state.withLock { state -> UInt64 in
            state.nextWaiterID += 1
            return state.nextWaiterID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let done = state.withLock { state -> Bool in
                    if state.available == capacity || Task.isCancelled { return true }
                    state.emptyWaiters[id] = continuation
                    return false
                }
                if done { continuation.resume() }
            }
        } onCancel: {
            let continuation = state.withLock { $0.emptyWaiters.removeValue(forKey: id) }
            continuation?.resume()
        }
    }

    var inFlight: Int { state.withLock { capacity - $0.available } }

    /// Waiters queued for permits (not counting those cancelled and not yet skipped): for tests that need a job parked.
    var waiting: Int { state.withLock { $0.waiters.count - $0.cancelledWaiters.count } }

    /// A waiter whose task was cancelled: resumed with false now; its place in the queue is skipped.
    private func cancelWaiter(_ id: UInt64) {
        let (cancelled, woken) = state.withLock { state -> (Waiter?, [Waiter]) in
            // Answered already: nothing to cancel. Not queued yet: refused when it comes (`wait` finds its id).
            guard state.unanswered.remove(id) != nil else { return (nil, []) }
            state.cancelledWaiters.insert(id)
            guard let waiter = state.waiters.first(where: { $0.id == id }) else { return (nil, []) }
            // The head may have been the one blocking the others.
            return (waiter, Self.takeSatisfiedWaiters(&state))
        }
        cancelled?.continuation.resume(returning: false)
        for waiter in woken { waiter.continuation.resume(returning: true) }
    }

    private static func takeSatisfiedWaiters(_ state: inout State) -> [Waiter] {
        var woken: [Waiter] = []
        while let head = state.waiters.first {
            if state.cancelledWaiters.remove(head.id) != nil {
                _ = state.waiters.popFirst()
                continue
            }
            guard head.count <= state.available else { break }
            state.available -= head.count
            state.unanswered.remove(head.id)
            woken.append(state.waiters.popFirst()!)
        }
        return woken
    }
}
