import FanoutCore
import FanoutRegistry

/// Removes the tokens APNs invalidated from the registry as their results arrive, in batches, off the
/// loop threads: a 410 (`Unregistered`) only if the token was registered before its timestamp,
/// `BadDeviceToken` and `DeviceTokenNotForTopic` at once (the registry applies the rules), and each only from the
/// registrations its topic reaches (`InvalidatedToken.topic`): never another app's or workspace's, and never the
/// app's own tokens of another kind.
final class RegistryPruner: Sendable {
    private struct State {
        var pending: [RegistryChange] = []
        var closed = false
    }
    /// Shared with the pruning task (which must not hold the pruner: dropping it ends the task).
    private final class SharedState: Sendable {
        let mutex = FanoutMutex(State())
    }
    private let shared = SharedState()
    /// Wakes the pruning task when the first change of a batch arrives (or when closing).
    private let wake: AsyncStream<Void>.Continuation
    private let task: Task<Void, Never>

    /// - Parameter warn: where a refused batch is reported (`FanoutEngineConfiguration.warningHandler`).
    init(store: any RegistryStore, warn: FanoutEngineConfiguration.WarningHandler?) {
        let (signals, wake) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        self.wake = wake
        let shared = self.shared
        task = Task { await Self.drain(signals, state: shared, into: store, warn: warn) }
    }

    /// Applies each batch as it is signalled, until closed.
    private static func drain(
        _ signals: AsyncStream<Void>, state shared: SharedState, into store: any RegistryStore,
        warn: FanoutEngineConfiguration.WarningHandler?
    ) async {
        for await _ in signals {
            let (batch, closed) = shared.mutex.withLock { state in
                defer { state.pending.removeAll(keepingCapacity: true) }
                return (state.pending, state.closed)
            }
            if !batch.isEmpty {
                do throws(RegistryError) {
                    _ = try await store.apply(batch)
                } catch {
                    // A batch the registry refuses (busy past its timeout, a database error) is dropped: its tokens
                    // are invalidated again by the next send that reaches them, and update tokens expire on their
                    // own. Said once per batch, with why (the error names no token: a refused batch is a storage
                    // failure, and its changes passed the engine's own token checks).
                    // (A field named like `tokens` would be redacted by the logger: `not_removed`.)
                    warn?(
                        "registry prune failed: \(batch.count) invalidated tokens not removed",
                        ["not_removed": String(batch.count), "kind": error.kind.description, "error": error.message])
                }
            }
            if closed { break }
        }
    }

    /// Queues one invalidated token. Any thread.
    func add(_ token: InvalidatedToken) {
        let change: RegistryChange =
            token.reason == "Unregistered"
            ? .unregistered(token: token.token, timestamp: token.timestamp, topic: token.topic)
            : .invalidToken(token: token.token, topic: token.topic)
        let first = shared.mutex.withLock { state -> Bool in
            guard !state.closed else { return false }
            state.pending.append(change)
            return state.pending.count == 1
        }
        if first { wake.yield() }
    }

    /// Applies what is queued, then stops. Idempotent.
    func close() async {
        shared.mutex.withLock { $0.closed = true }
        wake.yield()
        await task.value
    }
}
