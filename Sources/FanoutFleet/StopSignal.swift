import FanoutCore
import FanoutRedis

/// A one-shot signal that ends the waits raced against it at once: the worker's stop, and the end of its shards'
/// last chance to write.
///
/// A Redis call cannot be interrupted: `RedisClient` does not stop a command when its task is cancelled, and only
/// its deadline (10 s; 11 s for the blocked read) ends it, so with Redis hung a stop that waits for the call in
/// progress waits that long. `race` does not wait: once the signal fires, its caller goes on with nil while the
/// operation runs on unobserved until it ends by itself (its result is dropped). That is safe for the fleet's Redis
/// calls, because a worker may die at any point of any of them: a shard read or claimed but never seen stays pending
/// under the worker's name until another claims it, and every write is a script whose effect is once per position.
final class StopSignal: Sendable {
    private struct State {
        var fired = false
        var nextWaiter = 0
        var waiters: [Int: @Sendable () -> Void] = [:]
    }

    private let state = FanoutMutex(State())

    init() {}

    var hasFired: Bool { state.withLock { $0.fired } }

    /// Ends every wait raced against the signal, now and later. Idempotent.
    func fire() {
        let waiters = state.withLock { state -> [@Sendable () -> Void] in
            guard !state.fired else { return [] }
            state.fired = true
            defer { state.waiters.removeAll() }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter() }
    }

    /// What `operation` returns, or nil as soon as the signal fires (at once, without starting it, when it already
    /// has). `operation` runs in a task of its own, so it goes on after a nil; its result is then dropped.
    func race<T: Sendable>(_ operation: @escaping @Sendable () async -> T) async -> T? {
        let answer = Once<T?>()
        return await withCheckedContinuation { continuation in
            answer.set(continuation)
            let id = state.withLock { state -> Int? in
                guard !state.fired else { return nil }
                state.nextWaiter += 1
                state.waiters[state.nextWaiter] = { answer.resume(nil) }
                return state.nextWaiter
            }
            guard let id else { return answer.resume(nil) }
            Task {
                let value = await operation()
                _ = self.state.withLock { $0.waiters.removeValue(forKey: id) }
                answer.resume(value)
            }
        }
    }

    /// `operation`'s answer, or `RedisError(.shutdown)` once the signal fires first (the call may still run).
    func call<T: Sendable>(
        _ operation: @escaping @Sendable () async throws(RedisError) -> T
    ) async throws(RedisError) -> T {
        let outcome = await race { () async -> Result<T, RedisError> in
            do throws(RedisError) {
                return .success(try await operation())
            } catch {
                return .failure(error)
            }
        }
        guard let outcome else {
            throw RedisError(.shutdown, "not waited for: the worker is stopping (the command may still run)")
        }
        return try outcome.get()
    }

    /// What `operation` returns, or nil once `limit` has passed (the operation runs on, unobserved).
    static func race<T: Sendable>(within limit: Duration, _ operation: @escaping @Sendable () async -> T) async -> T? {
        let signal = StopSignal()
        let timer = Task {
            try? await Task.sleep(for: limit)
            signal.fire()
        }
        defer { timer.cancel() }
        return await signal.race(operation)
    }

    /// Sleeps for `duration`, or until the signal fires.
    func sleep(for duration: Duration) async {
        _ = await race { try? await Task.sleep(for: duration) }
    }
}

/// A continuation resumed by whichever of two parties comes first; the second's value is dropped.
private final class Once<T: Sendable>: Sendable {
    private let continuation = FanoutMutex<CheckedContinuation<T, Never>?>(nil)

    func set(_ continuation: CheckedContinuation<T, Never>) {
        self.continuation.withLock { $0 = continuation }
    }

    func resume(_ value: T) {
        continuation.withLock { $0.take() }?.resume(returning: value)
    }
}
