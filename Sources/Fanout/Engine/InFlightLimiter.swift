import Synchronization

/// Bounds the notifications in flight in an engine: submission suspends while the engine is full,
/// so a large job applies back-pressure instead of queueing without limit. Permits are released
/// from loop threads as notifications finish.
final class InFlightLimiter: Sendable {
    private struct State {
        var available: Int
        var waiters: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []
        var waiterHead = 0
    }
    private let state: Mutex<State>
    let capacity: Int

    init(capacity: Int) {
        precondition(capacity > 0)
        self.capacity = capacity
        state = Mutex(State(available: capacity))
    }

    /// Waits until `count` permits (at most `capacity`) are free, then takes them. FIFO.
    func acquire(_ count: Int) async {
        let count = min(count, capacity)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                if state.waiterHead == state.waiters.count && state.available >= count {
                    state.available -= count
                    return true
                }
                state.waiters.append((count, continuation))
                return false
            }
            if ready { continuation.resume() }
        }
    }

    /// Returns permits and wakes the waiters they satisfy, in order.
    func release(_ count: Int) {
        let woken = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.available += count
            var woken: [CheckedContinuation<Void, Never>] = []
            while state.waiterHead < state.waiters.count, state.waiters[state.waiterHead].count <= state.available {
                state.available -= state.waiters[state.waiterHead].count
                woken.append(state.waiters[state.waiterHead].continuation)
                state.waiterHead += 1
            }
            if state.waiterHead == state.waiters.count {
                state.waiters.removeAll(keepingCapacity: true)
                state.waiterHead = 0
            }
            return woken
        }
        for continuation in woken { continuation.resume() }
    }

    var inFlight: Int { state.withLock { capacity - $0.available } }
}
