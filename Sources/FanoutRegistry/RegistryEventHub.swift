import FanoutCore

/// The in-process change feed: any number of `AsyncStream` subscribers, each given every published event in order.
package final class RegistryEventHub: Sendable {
    private struct State {
        var nextID = 0
        var subscribers: [Int: AsyncStream<RegistryEvent>.Continuation] = [:]
        var finished = false
    }

    private let state = FanoutMutex(State())
    private let bufferLimit: Int

    package init(bufferLimit: Int) {
        self.bufferLimit = bufferLimit
    }

    /// A new stream of every event published from now on. It buffers up to `bufferLimit` events for a slow reader,
    /// then drops the oldest; it ends when the hub finishes or the reader stops iterating.
    package func subscribe() -> AsyncStream<RegistryEvent> {
        let (stream, continuation) = AsyncStream<RegistryEvent>.makeStream(
            bufferingPolicy: .bufferingNewest(bufferLimit))
        let id: Int? = state.withLock { state in
            guard !state.finished else { return nil }
            let id = state.nextID
            state.nextID += 1
            state.subscribers[id] = continuation
            return id
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        // Called on the reader's cancellation or after finish(); never while `state` is locked by this hub.
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.subscribers.removeValue(forKey: id) }
        }
        return stream
    }

    /// Whether anyone is listening (so writers can skip building nothing for nobody).
    package var hasSubscribers: Bool { state.withLock { !$0.subscribers.isEmpty } }

    /// Gives `events` to every subscriber. Callers publish under their write lock, so every subscriber sees the
    /// events of successive transactions in commit order.
    package func publish(_ events: [RegistryEvent]) {
        guard !events.isEmpty else { return }
        // Yield outside the lock: a yield can run a termination handler, which takes the lock.
        let subscribers = state.withLock { Array($0.subscribers.values) }
        for subscriber in subscribers {
            for event in events { subscriber.yield(event) }
        }
    }

    /// Ends every stream; later subscribers get a stream that is already finished.
    package func finish() {
        let subscribers = state.withLock { state in
            state.finished = true
            defer { state.subscribers.removeAll() }
            return Array(state.subscribers.values)
        }
        for subscriber in subscribers { subscriber.finish() }
    }
}
