package import Fanout
package import Foundation

/// Batches one dispatch's results from the engine's threads into `DispatchStore.appendResults` transactions, off
/// those threads.
///
/// - `add` is callable from any thread but a loop thread (the engine hands results over on its results threads, and
///   on the task feeding the job) and does no I/O: it appends under a lock and wakes the writer only when the batch
///   starts or fills. It waits while `maxUncommitted` results are not committed yet (below).
/// - One writer thread per buffer (SQLite blocks, so not a task on the cooperative pool) commits a batch once it has
///   `batchSize` (512) results or `interval` (50 ms) after its first result, whichever comes first, and at once
///   when `flush()` waits. The thread ends after the buffer is released, once what was added is written.
/// - `flush()` returns once everything added before it is committed; it throws the first commit that failed (that
///   batch is lost: its recipients have no result, so the dispatch must not be marked done, and a restart sends them
///   again).
///
/// What a crash can send twice: every notification whose result is not committed. `add` waits while
/// `maxUncommitted` (1,024: the batch being committed and the next one filling) are added and not committed. The
/// engine's in-flight permits come back only when a results thread takes a loop's answers over, and that thread is
/// the one `add` holds, so a writer that falls behind holds the sending back instead of letting the backlog grow. A
/// dispatch's notifications sent and not recorded are thus at most the engine's in-flight limit (on the wire, or
/// answered and not taken over yet), plus the answers a results thread has taken over and not handed to `add` yet
/// (no more than that limit either), plus 1,024: docs/SERVE.md states it as the bound of a `kill -9`. The writer
/// commits about 200,000 results/s (1,000,000 in 4.9 s, debug build, measured when the buffer was written), several
/// times what a dispatch sends at, so in a real send the backlog stays at about one batch and `add` does not wait
/// (`fanout-bench --scenario serve` runs a 1,000,000-token dispatch through it). `waiting` and `maxWaiting` expose
/// it for the status page and metrics.
package final class DispatchResultBuffer: Sendable {
    /// Small enough that an API request's `accept`, which needs the same write lock, never waits long behind a
    /// results transaction: the 202's p99 while a 1,000,000-token dispatch sends was 13.6 ms with 2,048 and 8.9 ms
    /// with 512 (`fanout-bench --scenario serve`, 2 cores), at the same send rate.
    package static let batchSize = 512
    package static let interval: TimeInterval = 0.05
    /// The most results one transaction takes when the writer is behind.
    package static let maxTransaction = 1_024
    /// The most results added and not committed: `add` waits past it. Two batches, so that one fills while the
    /// other is committed.
    package static let maxUncommitted = 2 * batchSize

    private let core: Core

    /// - Parameter afterCommit: called on the writer thread after each commit, with the dispatch and the batch
    ///   committed, before the `add`s it held back go on (with the queue on Redis: the batch's publication started
    ///   and the previous one's awaited, so that what another instance would send again after this one died stays
    ///   bounded). It may block.
    package init(
        store: DispatchStore, dispatchID: String, afterCommit: (@Sendable (String, [NotificationResult]) -> Void)? = nil
    ) {
        core = Core(store: store, dispatchID: dispatchID, afterCommit: afterCommit)
        let core = self.core
        let thread = Thread { core.run() }
        thread.name = "fanout-dispatch-writer"
        thread.start()
    }

    deinit {
        core.close()
    }

    /// Queues one result. Any thread but a loop thread; no I/O. Waits while `maxUncommitted` results are not
    /// committed.
    package func add(_ result: NotificationResult) {
        core.add(result)
    }

    /// Returns once every result added so far is committed; throws the first failed commit.
    package func flush() async throws(DispatchStoreError) {
        let result = await withCheckedContinuation { continuation in core.flush(continuation) }
        try result.get()
    }

    /// Results added and not yet committed.
    package var waiting: Int { core.waiting }
    /// The largest `waiting` seen.
    package var maxWaiting: Int { core.maxWaiting }
}

extension DispatchResultBuffer {
    /// The state the writer thread shares with the buffer (the thread holds this, not the buffer, so releasing the
    /// buffer ends it). Every mutable field is guarded by `condition`'s lock, hence `@unchecked Sendable`.
    private final class Core: @unchecked Sendable {
        typealias Waiter = CheckedContinuation<Result<Void, DispatchStoreError>, Never>

        let store: DispatchStore
        let dispatchID: String
        let afterCommit: (@Sendable (String, [NotificationResult]) -> Void)?
        private let condition = NSCondition()
        private var pending: [NotificationResult] = []
        /// Results added, and results the writer has finished with (committed or lost to a failed commit).
        private var added = 0
        private var written = 0
        private var highWater = 0
        /// `flush()` callers, each waiting for `written` to reach its target.
        private var waiters: [(target: Int, continuation: Waiter)] = []
        private var failure: DispatchStoreError?
        private var closed = false

        init(
            store: DispatchStore, dispatchID: String, afterCommit: (@Sendable (String, [NotificationResult]) -> Void)?
        ) {
            self.store = store
            self.dispatchID = dispatchID
            self.afterCommit = afterCommit
        }

        func add(_ result: NotificationResult) {
            condition.lock()
            // Held back until the writer catches up (see the type's comment): what a crash can send twice stays
            // bounded. The writer wakes everyone after each commit. After `close` nothing is committed any more.
            while added - written >= DispatchResultBuffer.maxUncommitted && !closed { condition.wait() }
            pending.append(result)
            added += 1
            let count = pending.count
            if added - written > highWater { highWater = added - written }
            // The writer waits for a batch's first result, then for it to fill (or for the interval). Broadcast: a
            // held-back `add` waits on the same condition, and must not take the writer's wake-up.
            if count == 1 || count == DispatchResultBuffer.batchSize { condition.broadcast() }
            condition.unlock()
        }

        func flush(_ continuation: Waiter) {
            condition.lock()
            guard written < added else {
                let failure = self.failure
                condition.unlock()
                continuation.resume(returning: failure.map { .failure($0) } ?? .success(()))
                return
            }
            waiters.append((added, continuation))
            condition.broadcast()
            condition.unlock()
        }

        var waiting: Int {
            condition.lock()
            defer { condition.unlock() }
            return added - written
        }

        var maxWaiting: Int {
            condition.lock()
            defer { condition.unlock() }
            return highWater
        }

        func close() {
            condition.lock()
            closed = true
            condition.broadcast()
            condition.unlock()
        }

        /// The writer thread: waits for a batch, commits it, resumes the flushes it satisfied; ends once closed and
        /// drained.
        func run() {
            condition.lock()
            while true {
                while pending.isEmpty && !closed { condition.wait() }
                if pending.isEmpty { break }
                let deadline = Date(timeIntervalSinceNow: DispatchResultBuffer.interval)
                while pending.count < DispatchResultBuffer.batchSize && waiters.isEmpty && !closed {
                    if !condition.wait(until: deadline) { break }
                }
                var batch: [NotificationResult] = []
                if pending.count <= DispatchResultBuffer.maxTransaction {
                    swap(&batch, &pending)
                } else {
                    batch = Array(pending[..<DispatchResultBuffer.maxTransaction])
                    pending.removeFirst(DispatchResultBuffer.maxTransaction)
                }
                condition.unlock()

                var error: DispatchStoreError?
                do {
                    try store.appendResults(batch, dispatch: dispatchID)
                } catch let failed {
                    error = failed
                }
                store.checkpointIfDue()
                if error == nil { afterCommit?(dispatchID, batch) }

                condition.lock()
                written += batch.count
                // Wakes the `add`s held back by `maxUncommitted`.
                condition.broadcast()
                if failure == nil { failure = error }
                var ready: [Waiter] = []
                waiters.removeAll { waiter in
                    guard waiter.target <= written else { return false }
                    ready.append(waiter.continuation)
                    return true
                }
                let outcome: Result<Void, DispatchStoreError> = failure.map { .failure($0) } ?? .success(())
                condition.unlock()
                for continuation in ready { continuation.resume(returning: outcome) }
                condition.lock()
            }
            condition.unlock()
        }
    }
}
