package import Fanout
import FanoutCore
import FanoutJobFormat
import FanoutJobLines
package import FanoutRegistry
import Foundation
import Synchronization

/// Runs accepted dispatches through the engines, oldest first, at most `maxRunning` at once, and the dispatches of
/// one activity one after another in the order they were accepted. (Run side by side, the engine's latest-wins rule
/// would drop the older one as superseded, even when the newer one reaches other tokens, such as after a stop.)
///
/// Every dispatch is already in the store when it gets here. Its results go to the store in batches
/// (`DispatchResultBuffer`), each keyed by the recipient's position, and it is marked done only after the last
/// batch is committed. So when the process dies, a restart (`resumeUnfinished`) finds each dispatch queued or
/// running, skips the positions already recorded and sends the rest: only what was in flight at the death is sent
/// twice, and no recipient gets a second result. A notification the engine reports `cancelled` (the process was
/// stopping) is not recorded, so it is sent on the next start.
package final class Dispatcher: Sendable {
    private struct State {
        var waiting: [(record: DispatchRecord, activity: String?)] = []
        var running: [String: Task<Void, Never>] = [:]
        /// Activities with a dispatch sending: the next one of the same activity waits for it.
        var busyActivities: Set<String> = []
        var stopping = false
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let store: DispatchStore
    private let engines: TeamEngines
    /// For the size of an activity's audience (the status page's progress).
    private let registry: (any RegistryStore)?
    /// How many results each running dispatch will have, when known at its start.
    private let expected = FanoutMutex<[String: Int]>([:])
    private let maxRunning: Int
    private let state = FanoutMutex(State())
    private let log: @Sendable (String) -> Void
    /// Told the id of each dispatch queued, started or finished (for `SharedDispatches`).
    private let changed: @Sendable (String) -> Void
    /// Run on a dispatch's results writer after each commit (`DispatchResultBuffer`'s `afterCommit`).
    private let afterCommit: (@Sendable (String, [NotificationResult]) -> Void)?

    package init(
        store: DispatchStore, engines: TeamEngines, registry: (any RegistryStore)? = nil, maxRunning: Int,
        log: @escaping @Sendable (String) -> Void = { _ in }, changed: @escaping @Sendable (String) -> Void = { _ in },
        afterCommit: (@Sendable (String, [NotificationResult]) -> Void)? = nil
    ) {
        self.afterCommit = afterCommit
        precondition(maxRunning > 0)
        self.store = store
        self.engines = engines
        self.registry = registry
        self.maxRunning = maxRunning
        self.log = log
        self.changed = changed
    }

    /// Queues every dispatch a previous process left queued or running (oldest first).
    package func resumeUnfinished() throws(DispatchStoreError) -> Int {
        let unfinished = try store.unfinished()
        for record in unfinished { submit(record, activityID: Self.activityID(of: record)) }
        return unfinished.count
    }

    /// Queues an accepted dispatch; it starts when a slot is free.
    /// - Parameter activityID: the activity it updates, ends or starts, if any (its dispatches run in order).
    package func submit(_ record: DispatchRecord, activityID: String?) {
        let activity = activityID.map { record.app + "\u{0}" + $0 }
        state.withLock { state in
            guard !state.stopping else { return }
            state.waiting.append((record, activity))
        }
        changed(record.id)
        launchWhatFits()
    }

    /// Stops one dispatch here (another process took it over): dropped if waiting, cancelled if running; what it
    /// recorded stays.
    package func cancel(_ id: String) {
        let task = state.withLock { state in
            state.waiting.removeAll { $0.record.id == id }
            return state.running[id]
        }
        task?.cancel()
    }

    /// Dispatches sending now.
    package var runningCount: Int { state.withLock { $0.running.count } }

    /// The ids of the dispatches sending now.
    var runningIDs: [String] { state.withLock { Array($0.running.keys) } }

    /// Stops starting dispatches, lets the running ones go on for `gracePeriod`, then cancels what is left (it
    /// stays in the store, queued or running, for the next start). Returns when every dispatch task has ended.
    package func stop(gracePeriod: Duration) async {
        let tasks = state.withLock { state in
            state.stopping = true
            state.waiting.removeAll()
            return Array(state.running.values)
        }
        guard !tasks.isEmpty else { return }
        // Cancelled from a separate task: awaiting `task.value` does not end when the awaiting task is cancelled.
        let canceller = Task {
            try? await Task.sleep(for: gracePeriod)
            guard !Task.isCancelled else { return }
            for task in tasks { task.cancel() }
        }
        for task in tasks { await task.value }
        canceller.cancel()
    }

    private func launchWhatFits() {
        state.withLock { state in
            var index = 0
            while !state.stopping, state.running.count < maxRunning, index < state.waiting.count {
                let (record, activity) = state.waiting[index]
                if let activity, state.busyActivities.contains(activity) {
                    index += 1  // behind an earlier dispatch of its activity
                    continue
                }
                state.waiting.remove(at: index)
                guard state.running[record.id] == nil else { continue }
                if let activity { state.busyActivities.insert(activity) }
                // Below the API requests' priority: a large send must not delay the next request's answer.
                state.running[record.id] = Task(executorPreference: BlockingExecutor.dispatches, priority: .utility) {
                    [self] in
                    await run(record)
                    finished(record.id, activity: activity)
                }
            }
        }
    }

    private func finished(_ id: String, activity: String?) {
        state.withLock { state in
            _ = state.running.removeValue(forKey: id)
            if let activity { state.busyActivities.remove(activity) }
        }
        changed(id)
        launchWhatFits()
    }

    /// The `activity_id` of a job line that names an activity (update, end, or a start into it). Parses the line:
    /// only for dispatches found at start, since the API passes what it already knows.
    static func activityID(of record: DispatchRecord) -> String? {
        (try? JSONValue.parse(record.jobLine))?["activity_id"]?.stringValue
    }

    private static func nowMilliseconds() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    /// Runs of a dispatch that may end in a job-level failure (the registry unreadable mid-send, the engine
    /// refusing the job) before that failure is recorded as its result and the dispatch is done. With the backoff
    /// between runs (`retryLater`: 1, 2, 4 ... 32 s) the last run starts about a minute after the first failure,
    /// so a registry that restarts (Redis reloading its AOF) is ridden out.
    static let attemptsBeforeGivingUp = 7

    /// Sends one dispatch to the end, or until its task is cancelled. A job-level failure (its recipients could not
    /// all be read, say while the registry was busy) or a store error leaves the dispatch unfinished and runs it
    /// again after a backoff, resuming after what is recorded; the failure becomes its result only on the last
    /// attempt.
    private func run(_ record: DispatchRecord) async {
        var run = 0
        do {
            run = try store.markRunning(id: record.id, now: Self.nowMilliseconds())
            let offset = DispatchStore.positionOffset(run: run)
            let lastAttempt = run >= Self.attemptsBeforeGivingUp
            let buffer = DispatchResultBuffer(store: store, dispatchID: record.id, afterCommit: afterCommit)
            guard let job = try job(for: record, run: run, buffer: buffer),
                let engine = engines.engine(forApp: record.app)
            else {
                try await buffer.flush()
                try store.markDone(id: record.id, now: Self.nowMilliseconds(), payloadEncodings: 0, demoted: 0)
                return
            }
            let total = await audienceSize(of: job)
            expected.withLock { $0[record.id] = total }
            defer { expected.withLock { _ = $0.removeValue(forKey: record.id) } }
            let jobFailed = Atomic<Bool>(false)
            let summary: JobSummary
            do {
                summary = try await engine.run(job) { result in
                    // Not sent for sure: left for the next start, which resends it.
                    guard result.outcome != .cancelled else { return }
                    guard result.position >= 0 else {
                        // A job-level failure: recorded only when no attempt is left.
                        if result.outcome == .invalid { jobFailed.store(true, ordering: .relaxed) }
                        if lastAttempt || result.outcome != .invalid { buffer.add(result) }
                        return
                    }
                    guard offset > 0 else { return buffer.add(result) }
                    var placed = result
                    placed.position += offset
                    buffer.add(placed)
                }
            } catch {
                try await buffer.flush()
                if Task.isCancelled || error.kind == .shutdown { return }
                guard lastAttempt else { return retryLater(record, after: run) }
                try store.markDone(id: record.id, now: Self.nowMilliseconds(), payloadEncodings: 0, demoted: 0)
                return
            }
            try await buffer.flush()
            // Cancelled while sending: what is recorded stays; the rest runs on the next start.
            guard !Task.isCancelled, summary.counts.cancelled == 0 else { return }
            if jobFailed.load(ordering: .relaxed) && !lastAttempt { return retryLater(record, after: run) }
            try store.markDone(
                id: record.id, now: Self.nowMilliseconds(), payloadEncodings: summary.payloadEncodings,
                demoted: summary.demoted)
        } catch {
            log("dispatch \(record.id): \(error); it runs again later")
            if !Task.isCancelled { retryLater(record, after: max(run, 1)) }
        }
    }

    /// How many results a running dispatch will have in all, when it was known at its start (inline tokens, a
    /// channel, an activity's live tokens plus its broadcast); nil otherwise.
    package func expectedResults(of id: String) -> Int? {
        expected.withLock { $0[id] }
    }

    private func audienceSize(of job: FanoutJob) async -> Int? {
        switch job.recipients {
        case .tokens(let tokens): return tokens.count
        case .channel: return 1
        case .activity(let app, let id):
            guard let registry else { return nil }
            let now = registry.clock.now()
            guard let live = try? await registry.liveUpdateTokenCount(app: app, activityID: id, now: now) else {
                return nil
            }
            let channel = try? await registry.activity(app: app, activityID: id)?.channelID
            return live + (channel == nil ? 0 : 1)
        case .file, .sequence, .pushToStart, .devices: return nil
        }
    }

    /// Queues the dispatch again after a backoff that grows with its runs (1 s, 2 s, 4 s, ... up to a minute).
    private func retryLater(_ record: DispatchRecord, after run: Int) {
        let delay = Duration.seconds(min(60, 1 << min(run - 1, 6)))
        let activityID = Self.activityID(of: record)
        Task(executorPreference: BlockingExecutor.dispatches, priority: .utility) { [self] in
            try? await Task.sleep(for: delay)
            submit(record, activityID: activityID)
        }
    }

    /// The engine job of a dispatch (resuming after what is recorded), or nil when the line no longer parses
    /// (recorded as its one `invalid` result).
    private func job(for record: DispatchRecord, run: Int, buffer: DispatchResultBuffer) throws(DispatchStoreError)
        -> FanoutJob?
    {
        let now = Int64(Date().timeIntervalSince1970)
        switch JobLineParser().parse(line: record.jobLine, lineNumber: 1, jobFileDirectory: "", now: now) {
        case .failure(let error):
            buffer.add(NotificationResult(jobID: record.id, token: nil, outcome: .invalid, reason: error.message))
            return nil
        case .success(var parsed):
            parsed.job.id = record.id
            var job = FanoutJob(parsed.job)
            if run > 1 {
                // Resumed: skip every recipient that has a result, matched by token (see `recordedRecipients`).
                let recorded = try store.recordedRecipients(id: record.id)
                job.alreadyDone = ResumePoint(
                    beyondPrefix: recorded.broadcast ? [FanoutEngine.activityBroadcastPosition] : [],
                    tokensDone: recorded.tokens)
            }
            return job
        }
    }
}
