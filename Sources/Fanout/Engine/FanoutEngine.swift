import FanoutCore
import FanoutPolicy
package import FanoutTransport
import Foundation
import Synchronization

/// The fan-out engine: one update in, many device tokens out.
///
/// It runs `loops` event-loop threads, each with `connectionsPerLoop` HTTP/2 connections to the
/// endpoint, and keeps every connection's stream window full. A job's payload and constant headers
/// are encoded once and shared by all its streams. Tokens are streamed to the loops in batches, and
/// submission waits while `maxInFlight` notifications are in flight, so memory stays flat however
/// large the job. Every notification ends in exactly one `NotificationResult`.
///
/// ```swift
/// let engine = try FanoutEngine(configuration: .init(endpoint: .sandbox, credentials: credentials))
/// let summary = try await engine.run(job) { result in print(result.token ?? "", result.outcome) }
/// await engine.shutdown()
/// ```
public final class FanoutEngine: Sendable {
    public let configuration: FanoutEngineConfiguration
    private let shared: EngineShared
    private let loops: [EngineLoop]
    private let nextLoop = Atomic<Int>(0)
    /// One per loop, for `sendExecutor()`.
    private let executors: [LoopTaskExecutor]
    private let nextExecutor = Atomic<Int>(0)
    /// The endpoint's `:authority`, worked out once rather than per job (it searches and formats strings).
    private let authority: String
    private let state = FanoutMutex(EngineState())
    /// Constant headers of recent jobs, checked and encoded once per distinct header set.
    private let headerCache = HeaderCache()
    /// Seeds each job's `apns-id` generator: a job's seed is this plus a count, expanded by SplitMix64,
    /// instead of a `getrandom` system call per job (1 of the 2 system calls a one-token job made
    /// before it reached its loop).
    private let idSeedBase: UInt64 = {
        var system = SystemRandomNumberGenerator()
        return system.next()
    }()
    private let idSeedCount = Atomic<UInt64>(0)
    /// `send` calls under way, held to `configuration.maxPendingSends`.
    private let pendingSends = Atomic<Int>(0)
    /// The deadlines of calls given a timeout.
    private let deadlines = CallDeadlines()
    /// Latest-wins and the priority-10 guard, per activity.
    let activities = ActivityLedger()
    /// Tokens APNs invalidated (410, BadDeviceToken, DeviceTokenNotForTopic), from every job, for the
    /// caller to drop from its token store. Holds the newest 100,000 when nobody reads it.
    public let invalidTokens: AsyncStream<InvalidatedToken>

    private struct EngineState {
        var shuttingDown = false
        /// Set when the first `shutdown()` has done its work: the loops have exited and the pruner is closed.
        var stopped = false
        /// Later `shutdown()` calls, waiting for the first to finish.
        var stopWaiters: [CheckedContinuation<Void, Never>] = []
        var payloadEncodings = 0
    }

    /// The provider certificate the engine's connections authenticate with (its topics are checked per job); nil
    /// with a signing key.
    private let certificate: CertificateDetails?

    /// Tokens handed to a loop per wake-up.
    static let batchSize = 256

    /// Checks the configuration, loads the trust store and the signing key and starts the loop threads. Connections
    /// open on first use.
    /// - Throws: `.configuration` for a setting out of its range (the error names the field and the range: a count
    ///   below 1, a time that is not positive or is longer than a day, a negative or NaN `retryBudgetRatio`), before
    ///   anything is started; `.connection` for a bad CA file; `.credentials` for a bad key or token schedule, or a
    ///   certificate that cannot be read (the message names the file and the cause). With a certificate, a job whose
    ///   topic it does not cover is refused (`.invalidNotification`, naming the topic and those it covers).
    public init(configuration: FanoutEngineConfiguration) throws(FanoutError) {
        try configuration.validate()
        self.configuration = configuration
        authority = configuration.endpoint.authority
        // A certificate authenticates every connection in its TLS handshake, and its requests carry no token.
        let identity = try configuration.credentials?.makeClientIdentity()
        certificate = identity?.details
        let tls: TLSClientContext
        do {
            tls = try TLSClientContext(TLSClientConfiguration(caFile: configuration.caFile, identity: identity))
        } catch {
            throw FanoutError(.connection, error.message)
        }
        let tokens: (any ProviderTokenSource)?
        if identity != nil {
            tokens = nil
        } else if let source = configuration.tokenSource {
            tokens = source
        } else {
            tokens = try configuration.credentials?.makeTokenCache(
                refreshAfter: configuration.tokenRefresh, minimumInterval: configuration.tokenMinimumInterval)
        }
        let (invalidTokens, invalidTokensContinuation) = AsyncStream<InvalidatedToken>.makeStream(
            bufferingPolicy: .bufferingNewest(100_000))
        self.invalidTokens = invalidTokens
        let shared = EngineShared(
            configuration: configuration, tls: tls, tokens: tokens, invalidTokens: invalidTokensContinuation)
        self.shared = shared
        loops = (0..<configuration.loops).map { index in
            EngineLoop(loop: LoopThread(name: "fanout-loop-\(index)"), shared: shared)
        }
        executors = loops.map { LoopTaskExecutor(loop: $0.loop) }
    }

    /// An engine dropped without `shutdown()` stops its loop threads: what was still in flight ends
    /// `failed` (NotSent) and the threads exit on their own (this does not wait for them).
    deinit {
        guard !state.withLock({ $0.shuttingDown }) else { return }
        for engineLoop in loops {
            try? engineLoop.loop.execute { engineLoop.stop() }
            engineLoop.loop.requestStop()
        }
        shared.invalidTokens.finish()
    }

    /// An executor on one of the engine's loop threads (each call the next loop, in turn), for the tasks of a gateway
    /// that calls `send` per request. A task started with it as its preference runs on that loop:
    ///
    /// ```swift
    /// Task(executorPreference: engine.sendExecutor()) {
    ///     let result = try await engine.send(notification)
    ///     respond(result)  // short, and never blocking: it runs on the loop
    /// }
    /// ```
    ///
    /// so each `send` it makes skips both hand-offs between threads (to the loop, and back with the result), which
    /// cost more CPU than the rest of a lone send. The task's code must not block (it holds up the loop's
    /// connections while it runs) and must not wait for the engine synchronously; awaiting anything is fine. After
    /// `shutdown()` the task goes on on Swift's cooperative pool.
    public func sendExecutor() -> any TaskExecutor {
        executors[nextExecutor.add(1, ordering: .relaxed).oldValue % executors.count]
    }

    /// The loop threads, for tests that check they stop.
    package var loopThreads: [LoopThread] { loops.map(\.loop) }

    /// Payloads encoded by this engine so far: one per job with batch encoding.
    public var payloadEncodings: Int { state.withLock { $0.payloadEncodings } }

    /// Notifications accepted and not yet finished.
    public var inFlight: Int { shared.inFlight }

    /// Jobs and sends parked until room in flight frees up (for tests that need one parked).
    package var waitingForRoom: Int { shared.waitingForRoom }

    /// Whether `shutdown()` has begun (for tests of a second call).
    package var isShuttingDown: Bool { state.withLock { $0.shuttingDown } }

    /// `send` calls under way (for tests of `maxPendingSends`).
    package var pendingSendCount: Int { pendingSends.load(ordering: .relaxed) }

    /// Sends `job` to all its recipients and returns when every notification has its outcome.
    /// `onResult` is called once per notification, on an engine thread; keep it short.
    ///
    /// Cancelling the calling task cancels the job (see `FanoutRun.cancel()`): it returns soon after,
    /// with the notifications that were not answered counted as `cancelled`.
    /// - Parameters:
    ///   - job: what to send, and to whom.
    ///   - timeout: how long the whole job may take: waiting for budget and for room in flight, every
    ///     attempt and backoff. When it passes, every notification not answered yet ends `failed` with reason
    ///     `DeadlineExceeded` (open streams are reset), and the call returns. Nil: no deadline.
    ///   - onResult: called with each notification's result.
    /// - Throws: `.shutdown` once `shutdown()` has begun; `.invalidNotification` for a job that fails
    ///   validation (which also gets one `invalid` result).
    public func run(
        _ job: FanoutJob, timeout: Duration? = nil, onResult: @escaping @Sendable (NotificationResult) -> Void
    ) async throws(FanoutError) -> JobSummary {
        try await run(job, timeout: timeout, onResult: onResult, deliversOnLoop: false)
    }

    /// `run(_:timeout:onResult:)`; `deliversOnLoop` is `send`'s (see `FanoutRun.deliversOnLoop`).
    private func run(
        _ job: FanoutJob, timeout: Duration?, onResult: @escaping @Sendable (NotificationResult) -> Void,
        deliversOnLoop: Bool
    ) async throws(FanoutError) -> JobSummary {
        try checkNotShutDown()
        let run = makeRun(jobID: job.id, onResult: onResult, deliversOnLoop: deliversOnLoop)
        if let timeout { try FanoutEngineConfiguration.checkTime("timeout", timeout) }
        let deadline = timeout.map { deadlines.add(run, deadline: .now + $0) }
        defer { if let deadline { deadlines.remove(deadline) } }
        let outcome = await withTaskCancellationHandler { () async -> Result<JobSummary, FanoutError> in
            do throws(FanoutError) {
                try await feed(job, into: run)
            } catch {
                return .failure(error)
            }
            return .success(await run.summary())
        } onCancel: {
            run.cancel()
        }
        return try outcome.get()
    }

    /// Starts `job` and returns at once; iterate `results` (or await `summary()`) on the returned run.
    /// Cancel it with `FanoutRun.cancel()`, or by cancelling the task that iterates `results`.
    /// - Throws: `.shutdown` once `shutdown()` has begun. A job that fails validation ends with one
    ///   `invalid` result.
    public func submit(_ job: FanoutJob) throws(FanoutError) -> FanoutRun {
        try checkNotShutDown()
        let run = makeRun(jobID: job.id, onResult: nil)
        // The feeding task's error is the job's one `invalid` result, already recorded.
        run.setFeeder(Task { try? await feed(job, into: run) })
        return run
    }

    /// Sends one notification and returns its result (APNs's answer, or why there was none: a
    /// connection failure, `Timeout` after the last attempt, `DeadlineExceeded` when `timeout` passed, `cancelled`
    /// when the calling task was cancelled). An `apnsID` in the headers is used as the request's `apns-id`.
    /// - Parameters:
    ///   - notification: one device's notification (`PushNotification.alert(_:to:app:priority:expiration:collapseID:)`
    ///     and the other typed constructors make one).
    ///   - timeout: how long the call may take in all (waiting for budget and room in flight, every attempt and
    ///     backoff); past it the notification ends `failed`, reason `DeadlineExceeded`, and nothing of it is left
    ///     running. Default: `configuration.sendTimeout` (30 s).
    ///   - overBudget: with workspace budgets, whether to wait for the budget (within `timeout`) or end
    ///     `rate_limited` at once; nil: the budget's own policy.
    /// - Throws: `.shutdown` once `shutdown()` has begun; `.invalidNotification` for a bad token,
    ///   header or payload (nothing is sent); `.overloaded` when `maxPendingSends` calls are already under way
    ///   (nothing is sent).
    public func send(_ notification: PushNotification, timeout: Duration? = nil, overBudget: OverBudget? = nil)
        async throws(FanoutError) -> NotificationResult
    {
        guard let token = DeviceToken(notification.deviceToken) else {
            throw FanoutError(.invalidNotification, "device token is not 64 to 200 hex digits")
        }
        // The job's checks leave `apns-id` out (a job's ids are the engine's own): the caller's is checked here, or a
        // malformed one would go out and come back BadMessageId.
        if let apnsID = notification.headers.apnsID, !APNsID.isValid(apnsID) {
            throw FanoutError(.invalidNotification, "apns-id is not a canonical UUID (8-4-4-4-12 hex digits)")
        }
        let limit = configuration.effectiveMaxPendingSends
        guard pendingSends.add(1, ordering: .relaxed).newValue <= limit else {
            pendingSends.subtract(1, ordering: .relaxed)
            throw FanoutError(.overloaded, "\(limit) sends are already under way (maxPendingSends); nothing was sent")
        }
        defer { pendingSends.subtract(1, ordering: .relaxed) }
        // With room in flight now, and the budget's room when there is one in process (the usual case), the
        // notification goes straight to a loop. A budget shared through Redis decides asynchronously: general path.
        if configuration.rateLimits == nil || configuration.sharedRateLimits == nil,
            let result = try await sendDirectly(
                notification, token: token, timeout: timeout ?? configuration.sendTimeout)
        {
            return result
        }
        var job = FanoutJob(
            id: notification.headers.apnsID ?? "single", workspace: notification.workspace,
            headers: notification.headers,
            payload: .raw(notification.payload),
            recipients: .tokens([notification.deviceToken]))
        job.singleNotificationID = notification.headers.apnsID.map(APNsIdentifier.init)
        job.overBudget = overBudget
        let collected = FanoutMutex<NotificationResult?>(nil)
        // Storing the result costs next to nothing, so the loop delivers it (no results-thread hop).
        _ = try await run(
            job, timeout: timeout ?? configuration.sendTimeout,
            onResult: { result in collected.withLock { $0 = result } },
            deliversOnLoop: true)
        guard let result = collected.withLock({ $0 }) else {
            preconditionFailure("a finished job of one token has one result")
        }
        return result
    }

    /// `send` without the job machinery (no `FanoutJob`, feeding task, batch, summary or handler): the calling task
    /// checks and prepares the notification, takes its in-flight permit, hands the record to a loop with one
    /// `execute` (a lock and, when the loop sleeps, one wake-up) and suspends; the loop sends it, retries it as any
    /// notification, and at the end of the turn that finishes it resumes the task with its result
    /// (`FanoutRun.waitForResult`). The deadline, cancellation and shutdown stop it through its run, as they stop a
    /// job's notifications. Nil, with nothing sent or taken: no room in flight now, or the in-process budget does not
    /// admit it now, so the caller takes the general path (it waits, or ends `rate_limited`, as a job does).
    private func sendDirectly(_ notification: PushNotification, token: DeviceToken, timeout: Duration?)
        async throws(FanoutError) -> NotificationResult?
    {
        try checkNotShutDown()
        if let timeout { try FanoutEngineConfiguration.checkTime("timeout", timeout) }
        let limiter = shared.sendLimiter
        guard limiter.tryAcquire(1) else { return nil }
        // A task running on one of the loops (`sendExecutor`) hands its notification to that loop, with no wake-up.
        let engineLoop = loopOfThisThread() ?? loops[nextLoop.add(1, ordering: .relaxed).oldValue % loops.count]
        let jobID = notification.headers.apnsID ?? "single"
        let metricsListener = configuration.metricsListener
        let run = FanoutRun(sendOf: jobID, metricsListener: metricsListener) { run in
            // A stopped loop has already ended what it held.
            try? engineLoop.loop.execute { engineLoop.cancel(run) }
        }
        var prepared: PreparedJob
        do {
            prepared = try prepareSend(notification, jobID: jobID, run: run)
        } catch {
            limiter.release(1)
            metricsListener?.notificationFinished(outcome: .invalid, reason: error.message, latency: nil)
            throw error
        }
        if let limits = configuration.rateLimits {
            // The budget's decision, as `admit` makes it; one that does not admit at once (wait, or reject) consumed
            // nothing, and the general path decides again and waits or answers `rate_limited` as the call asks.
            let priority = notification.headers.effectivePriority
            let decision = limits.decide(
                workspace: notification.workspace, priority: priority, now: MonotonicRateClock().nanoseconds())
            guard case .admit(let admitted) = decision else {
                limiter.release(1)
                return nil
            }
            if admitted != priority { prepared = PreparedJob(demoting: prepared, to: admitted) }
        }
        state.withLock { $0.payloadEncodings += 1 }
        let apnsID: APNsIdentifier
        if let given = notification.headers.apnsID {
            apnsID = APNsIdentifier(given)
        } else if configuration.apnsIDs == .fanout {
            var random = FastRandomGenerator(
                seed: idSeedBase &+ idSeedCount.add(1, ordering: .relaxed).newValue &* 0xD1B5_4A32_D192_ED03)
            apnsID = .random(using: &random)
        } else {
            apnsID = PendingNotification.assignedByAPNs
        }
        let recipient = RecipientToken(token.hex)
        let pending: PendingNotification
        if let spare = engineLoop.takeSpare() {
            spare.reuse(job: prepared, token: recipient, apnsID: apnsID, position: 0)
            pending = spare
        } else {
            pending = PendingNotification(job: prepared, token: recipient, apnsID: apnsID, position: 0)
        }
        let deadline = timeout.map { deadlines.add(run, deadline: .now + $0) }
        defer { if let deadline { deadlines.remove(deadline) } }
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<NotificationResult, Never>) in
                run.waitForResult(continuation)
                do throws(TransportError) {
                    try engineLoop.loop.execute { engineLoop.enqueue(pending) }
                } catch {
                    // The loop has stopped (shutdown): nothing was sent, as for a job's notifications then.
                    limiter.release(1)
                    var result = NotificationResult(jobID: jobID, token: nil, outcome: .failed, reason: "NotSent")
                    result.tokenValue = recipient
                    result.position = 0
                    metricsListener?.notificationFinished(outcome: .failed, reason: "NotSent", latency: nil)
                    run.deliver(result)
                }
            }
        } onCancel: {
            run.cancel()
        }
    }

    /// `encode` for a `send`: the payload's limits and shape, the certificate's topics, and the constant headers.
    private func prepareSend(_ notification: PushNotification, jobID: String, run: FanoutRun)
        throws(FanoutError) -> PreparedJob
    {
        let headers = notification.headers
        if let certificate, !certificate.covers(topic: headers.topic) {
            throw FanoutError(
                .invalidNotification, ProviderCertificate.refusal(topic: headers.topic, topics: certificate.topics))
        }
        do {
            try PayloadLimits.check(notification.payload, pushType: headers.pushType)
            try RawPayload.checkObject(notification.payload)
            return try PreparedJob(
                id: jobID, headers: headers, payload: notification.payload, run: run, authority: authority,
                headerCache: headerCache)
        } catch {
            let reason = (error as? NotificationHeaderError)?.description ?? "\(error)"
            throw FanoutError(.invalidNotification, reason)
        }
    }

    private func checkNotShutDown() throws(FanoutError) {
        guard !state.withLock({ $0.shuttingDown }) else { throw FanoutError(.shutdown, "engine is shut down") }
    }

    private func makeRun(
        jobID: String, onResult: (@Sendable (NotificationResult) -> Void)?, deliversOnLoop: Bool = false
    ) -> FanoutRun {
        let loops = self.loops
        return FanoutRun(
            jobID: jobID, onResult: onResult, deliversOnLoop: deliversOnLoop,
            metricsListener: configuration.metricsListener
        ) { run in
            for engineLoop in loops {
                // A stopped loop has already ended everything it held.
                try? engineLoop.loop.execute { engineLoop.cancel(run) }
            }
        }
    }

    /// Why a job stopped feeding before its last recipient: the rest is reported, not sent.
    private enum FeedStop {
        case shutdown
        case cancelled
        /// The call's deadline passed (`FanoutRun.expire()`).
        case deadline
        case superseded

        /// A cancel of `run`: by its caller, or by its deadline.
        static func cancel(of run: FanoutRun) -> FeedStop { run.deadlinePassed ? .deadline : .cancelled }

        var outcome: NotificationOutcome {
            switch self {
            case .shutdown, .deadline: return .failed
            case .cancelled: return .cancelled
            case .superseded: return .superseded
            }
        }
        var reason: String {
            switch self {
            case .shutdown: return "NotSent"
            case .cancelled: return "Cancelled"
            case .deadline: return "DeadlineExceeded"
            case .superseded: return "Superseded"
            }
        }
    }

    /// Streams the job's tokens to the loops in batches, waiting for room in flight. A job that fails
    /// validation ends with one `invalid` result (and the error is thrown). Once the engine shuts down
    /// or the job is cancelled, the recipients not yet handed to a loop end `failed` (NotSent) or
    /// `cancelled` without being sent, so every recipient still gets exactly one result.
    private func feed(_ job: FanoutJob, into run: FanoutRun) async throws(FanoutError) {
        let checked: PreparedJob
        var reader: RecipientReader
        do {
            checked = try await prepare(job, run: run)
            // One moment for the whole job, on the registry's clock, so every page agrees on what has expired.
            let now = configuration.registry?.clock.now() ?? Int64(Date().timeIntervalSince1970 * 1000)
            reader = try RecipientReader(job.recipients, registry: configuration.registry, now: now)
        } catch {
            Self.recordInvalid(run, jobID: job.id, reason: error.message)
            run.didFinishSubmitting()
            throw error
        }

        state.withLock { $0.payloadEncodings += 1 }
        // The activity rules, the activity's channel broadcast and its end apply to a job by activity id only; any
        // other job skips the calls, and so the frames a task allocates for them (3.5 KB for the broadcast).
        let byActivity = if case .activity = job.recipients { true } else { false }
        let rules =
            byActivity
            ? await applyActivityRules(job, prepared: checked, run: run)
            : (stale: false, send: checked, demotedByGuard: false)
        let prepared = rules.send
        var demoted: PreparedJob?
        let isShuttingDown = { self.state.withLock { $0.shuttingDown } }
        var stop: FeedStop? = rules.stale ? .superseded : nil
        // Whether any notification went to a loop: an activity job that sent none gives its claim back at the end.
        var handedAny = false
        func checkStop() {
            guard stop == nil else { return }
            if run.isSuperseded {
                stop = .superseded
            } else if run.isCancelled || Task.isCancelled {
                stop = .cancel(of: run)
            } else if isShuttingDown() {
                stop = .shutdown
            }
        }
        func stopped(by admission: Admission) -> FeedStop? {
            switch admission {
            case .notSent: return .shutdown
            case .cancelled: return .cancel(of: run)
            default: return nil
            }
        }
        let countsNotifications = configuration.rateLimits?.budget(for: job.workspace).countingUnit == .notification
        // Counting per job: one decision for the whole job, before anything is sent.
        var jobAdmission: Admission = .send(prepared)
        if !countsNotifications && stop == nil {
            jobAdmission = await admit(
                job, prepared: prepared, demoted: &demoted, cost: 1, run: run, isShuttingDown: isShuttingDown)
            stop = stopped(by: jobAdmission)
        }
        // A batch takes one in-flight permit per notification, so it can never be larger than the limit.
        let limiter = shared.limiter(for: run)
        var batchSize = min(Self.batchSize, limiter.capacity)
        if countsNotifications { batchSize = min(batchSize, maximumRateCost(for: job) ?? batchSize) }
        var batch: [(token: RecipientToken, position: Int)] = []
        batch.reserveCapacity(min(batchSize, reader.knownCount ?? batchSize))
        var random = FastRandomGenerator(
            seed: idSeedBase &+ idSeedCount.add(1, ordering: .relaxed).newValue &* 0xD1B5_4A32_D192_ED03)
        var position = -1
        var resume = job.alreadyDone
        // Called only from the out-of-line helpers below, so it is inlined into them, not into `feed`'s frame.
        func result(_ token: RecipientToken, _ position: Int, _ outcome: NotificationOutcome, _ reason: String)
            -> NotificationResult
        {
            var result = NotificationResult(jobID: job.id, token: nil, outcome: outcome, reason: reason)
            result.tokenValue = token
            result.position = position
            return result
        }
        @inline(never) func recordStopped(_ stop: FeedStop) {
            for (token, position) in batch { run.record(result(token, position, stop.outcome, stop.reason)) }
        }
        @inline(never) func recordRejected(_ token: RecipientToken, _ position: Int) {
            run.didSubmit(1)
            // A malformed token ends as APNs's BadDeviceToken does: one outcome for a dead token wherever it is found.
            run.record(result(token, position, .unregistered, "BadDeviceToken"))
        }
        @inline(never) func recordRateLimited(retryAfter: Double) {
            configuration.metricsListener?.notificationsRateLimited(
                workspace: job.workspace, priority: job.headers.effectivePriority, count: batch.count)
            for (token, position) in batch {
                var limited = result(token, position, .rateLimited, "RateLimited")
                limited.retryAfterSeconds = retryAfter
                run.record(limited)
            }
        }
        /// Makes the batch's records and hands them to the next loop; false when that loop has stopped. The
        /// per-notification objects (path, apns-id) are made here, on the feeding task's thread, so the loop thread
        /// only sends; records of finished notifications are filled again, new ones are made only past those.
        let assignsIDs = configuration.apnsIDs == .fanout
        @inline(never) func handOver(sending target: PreparedJob) -> Bool {
            // A task running on one of the loops (`sendExecutor`) hands its notifications to that loop.
            let engineLoop = loopOfThisThread() ?? loops[nextLoop.add(1, ordering: .relaxed).oldValue % loops.count]
            var notifications: [PendingNotification] = []
            notifications.reserveCapacity(batch.count)
            engineLoop.takeSpares(upTo: batch.count, into: &notifications)
            for (index, entry) in batch.enumerated() {
                let apnsID =
                    job.singleNotificationID
                    ?? (assignsIDs ? .random(using: &random) : PendingNotification.assignedByAPNs)
                if index < notifications.count {
                    notifications[index].reuse(
                        job: target, token: entry.token, apnsID: apnsID, position: entry.position)
                } else {
                    notifications.append(
                        PendingNotification(job: target, token: entry.token, apnsID: apnsID, position: entry.position))
                }
            }
            if rules.demotedByGuard { run.countDemoted(notifications.count) }
            do {
                try engineLoop.loop.execute { [notifications] in engineLoop.enqueue(notifications) }
                return true
            } catch {
                return false
            }
        }
        if stop == nil, byActivity, case .send(let target) = jobAdmission {
            stop = await sendChannelBroadcast(of: job, tokenJob: target, run: run, random: &random)
        }
        while true {
            if let stop {
                // Stopped: the rest is reported, not sent, so it needs no validation or permits.
                var exhausted = false
                while !exhausted {
                    batch.removeAll(keepingCapacity: true)
                    while batch.count < batchSize {
                        guard let token = await reader.next() else {
                            exhausted = true
                            break
                        }
                        position += 1
                        if resume != nil && Self.isDone(token: token, position: position, in: &resume!) { continue }
                        batch.append((token, position))
                    }
                    run.didSubmit(batch.count)
                    recordStopped(stop)
                }
                break
            }
            batch.removeAll(keepingCapacity: true)
            while batch.count < batchSize, let token = await reader.next() {
                position += 1
                if resume != nil && Self.isDone(token: token, position: position, in: &resume!) { continue }
                if prepared.isBroadcast {
                    batch.append((token, position))  // the channel id, checked when the job was prepared
                } else if case .hex64 = token {
                    batch.append((token, position))  // 64 lowercase hex digits: a valid token as it is
                } else if case .text(let text) = token, let valid = DeviceToken(text) {
                    batch.append((RecipientToken(valid.hex), position))
                } else {
                    recordRejected(token, position)
                }
            }
            if batch.isEmpty { break }
            run.didSubmit(batch.count)
            checkStop()
            var admission = jobAdmission
            if countsNotifications && stop == nil {
                admission = await admit(
                    job, prepared: prepared, demoted: &demoted, cost: batch.count, run: run,
                    isShuttingDown: isShuttingDown)
                stop = stop ?? stopped(by: admission)
            }
            if let stop {
                recordStopped(stop)
                continue
            }
            if case .rateLimited(let retryAfter) = admission {
                recordRateLimited(retryAfter: retryAfter)
                continue
            }
            guard case .send(let target) = admission else { continue }
            guard await limiter.acquire(batch.count, for: run) else {
                let cancel = FeedStop.cancel(of: run)
                stop = cancel
                recordStopped(cancel)
                continue
            }
            checkStop()
            if let stop {
                limiter.release(batch.count)
                recordStopped(stop)
                continue
            }
            if handOver(sending: target) {
                handedAny = true
            } else {
                // The loop stopped under us (shutdown, or the engine was dropped).
                limiter.release(batch.count)
                stop = .shutdown
                recordStopped(.shutdown)
            }
        }
        if let failure = reader.failure {
            // The file or the registry broke mid-read: what was read is sent, and the rest is one
            // `invalid` result, since its tokens are unknown.
            Self.recordInvalid(
                run, jobID: job.id, reason: "\(failure.message)\(reader.position); the rest was not sent")
        }
        if stop == nil && byActivity { await recordActivityEnded(job) }
        if byActivity && !rules.stale && !handedAny { releaseActivityClaim(job, run: run) }
        run.didFinishSubmitting()
    }

    /// The engine loop whose thread this is, if any (a task on `sendExecutor()`). An index loop: `first(where:)` and
    /// `for … in` each allocate once per call in a debug build (unspecialized), which the allocation test counts.
    private func loopOfThisThread() -> EngineLoop? {
        var index = 0
        while index < loops.count {
            if loops[index].loop.inLoop { return loops[index] }
            index += 1
        }
        return nil
    }

    /// One `invalid` result without a token: a job that failed validation, or the unread rest of a job whose
    /// recipients broke mid-read.
    ///
    /// `feed`'s helpers that make results are out of line (`@inline(never)`): inlined, each result's temporaries would
    /// become part of `feed`'s async frame, which a task allocates whole when `feed` is called and holds while it waits
    /// for room in flight (about 9.4 KB of it, for a `send` as for a million-token job).
    @inline(never) private static func recordInvalid(_ run: FanoutRun, jobID: String, reason: String) {
        run.didSubmit(1)
        run.record(NotificationResult(jobID: jobID, token: nil, outcome: .invalid, reason: reason))
    }

    /// Whether an earlier run already finished this recipient (and forgets a matched tail token).
    private static func isDone(token: RecipientToken, position: Int, in resume: inout ResumePoint) -> Bool {
        if position < resume.prefix || resume.beyondPrefix.contains(position) { return true }
        guard !resume.tokensDone.isEmpty else { return false }
        let token = token.string
        let key = resume.tokensDone[token] != nil ? token : token.lowercased()
        if let count = resume.tokensDone[key], count > 0 {
            resume.tokensDone[key] = count - 1
            resume.skippedByToken?(position)
            return true
        }
        return false
    }

    /// Checks the job and encodes its payload (the one encoding every stream of the job shares), and
    /// builds its constant headers.
    ///
    /// Only a job addressed through the registry awaits anything here, and the encoding is a synchronous function of
    /// its own: a task allocates an async function's whole frame (every local it holds across an await) when it is
    /// called, and as async frames these steps would be most of the 26 KB that each `send` waiting for room in flight
    /// would hold.
    private func prepare(_ job: FanoutJob, run: FanoutRun) async throws(FanoutError) -> PreparedJob {
        try checkNotShutDown()
        switch job.recipients {
        case .tokens, .file, .sequence, .channel:
            return try encode(job, run: run)
        case .activity(let app, _), .pushToStart(let app, _, _, _), .devices(let app, _):
            try await checkRegistry(knows: app, jobID: job.id)
            return try encode(try await withChannelBinding(job), run: run)
        }
    }

    /// `prepare`'s encoding: the payload once, its limits, and the job's constant headers.
    private func encode(_ job: FanoutJob, run: FanoutRun) throws(FanoutError) -> PreparedJob {
        do {
            let payload = try payloadWithActivityID(job).encode()
            if case .channel(let app, let channel, let policy) = job.recipients {
                try Self.checkBroadcast(job, payload: payload, storagePolicy: policy)
                let prepared = try PreparedJob(
                    broadcastOf: job, payload: SharedBody(payload), bundleID: app, channelID: channel,
                    storagePolicy: policy, run: run, authority: authority)
                run.countEncoding()
                return prepared
            }
            if let certificate, !certificate.covers(topic: job.headers.topic) {
                throw FanoutError(
                    .invalidNotification,
                    (run.deliversOnLoop ? "" : "job \(job.id): ")
                        + ProviderCertificate.refusal(topic: job.headers.topic, topics: certificate.topics))
            }
            try PayloadLimits.check(payload, pushType: job.headers.pushType)
            // Only bytes given as they are can be something else than one JSON object; built payloads are one.
            if case .raw = job.payload { try RawPayload.checkObject(payload) }
            let prepared = try PreparedJob(
                job: job, payload: payload, run: run, authority: authority, headerCache: headerCache)
            run.countEncoding()
            return prepared
        } catch let error as FanoutError {
            throw error  // checkBroadcast's, which names the job already
        } catch {
            // A `send`'s job is its own (`deliversOnLoop`): the caller made no job, so its errors name none.
            let prefix = run.deliversOnLoop ? "" : "job \(job.id): "
            let reason = (error as? NotificationHeaderError)?.description ?? "\(error)"
            throw FanoutError(.invalidNotification, prefix + reason)
        }
    }

    /// The position of an activity's broadcast among the job's results: past every token, so resuming skips it
    /// once it has a result, like any recipient.
    package static let activityBroadcastPosition = Int(Int32.max)

    /// A job by activity id whose activity is bound to a broadcast channel sends one broadcast to the channel
    /// besides its token pushes (tokens registered without a channel). Returns why feeding must stop, if it must.
    private func sendChannelBroadcast(
        of job: FanoutJob, tokenJob: PreparedJob, run: FanoutRun, random: inout FastRandomGenerator
    ) async -> FeedStop? {
        guard case .activity(let app, let id) = job.recipients, let registry = configuration.registry,
            let record = try? await registry.activity(app: app, activityID: id), let channel = record.channelID
        else { return nil }
        if let done = job.alreadyDone, done.beyondPrefix.contains(Self.activityBroadcastPosition) { return nil }
        run.didSubmit(1)
        var result = NotificationResult(jobID: job.id, token: nil, outcome: .rejected)
        result.position = Self.activityBroadcastPosition
        result.channel = channel
        var broadcast: PreparedJob
        do {
            let policy = record.channelStoragePolicy.flatMap(ChannelStoragePolicy.init(rawValue:))
            try Self.checkBroadcast(
                job, payload: Array(tokenJob.body.bytes), storagePolicy: policy, checksJSON: false)
            broadcast = try PreparedJob(
                broadcastOf: job, payload: tokenJob.body, bundleID: app, channelID: channel, storagePolicy: policy,
                run: run, authority: authority)
            // At the priority the token pushes go at: the priority-10 guard or the rate budget may have demoted them,
            // and a broadcast at 10 would reach every subscribed device past the guard.
            let priority = tokenJob.headers.effectivePriority
            if broadcast.headers.effectivePriority != priority {
                broadcast = PreparedJob(demoting: broadcast, to: priority)
            }
        } catch {
            result.outcome = .invalid
            result.reason = "\(error)"
            run.record(result)
            return nil
        }
        guard await shared.limiter.acquire(1, for: run) else {
            let cancel = FeedStop.cancel(of: run)
            result.outcome = cancel.outcome
            result.reason = cancel.reason
            run.record(result)
            return cancel
        }
        let pending = PendingNotification(
            job: broadcast, token: RecipientToken(channel), apnsID: .random(using: &random),
            position: Self.activityBroadcastPosition)
        let engineLoop = loops[nextLoop.add(1, ordering: .relaxed).oldValue % loops.count]
        do {
            try engineLoop.loop.execute { engineLoop.enqueue([pending]) }
        } catch {
            shared.limiter.release(1)
            result.outcome = .failed
            result.reason = "NotSent"
            run.record(result)
            return .shutdown
        }
        return nil
    }

    /// What APNs would refuse of a broadcast, refused before sending with the field named: another push type, a
    /// `start` (a broadcast cannot start an activity), a payload over 5,120 bytes or (given raw) not one JSON object,
    /// and a non-zero expiration on a channel that stores nothing. `checksJSON` is false for the payload of a job's
    /// token pushes, checked when that job was prepared.
    static func checkBroadcast(
        _ job: FanoutJob, payload: [UInt8], storagePolicy: ChannelStoragePolicy?, checksJSON: Bool = true
    ) throws(FanoutError) {
        func refuse(_ field: String, _ message: String) -> FanoutError {
            FanoutError(.invalidNotification, "job \(job.id): \(field): \(message)")
        }
        guard job.headers.pushType == .liveactivity else {
            throw refuse("push_type", "a broadcast is a Live Activity push (liveactivity), not \(job.headers.pushType)")
        }
        guard payload.count <= BroadcastRequest.maximumPayloadBytes else {
            throw refuse(
                "payload", "\(payload.count) bytes, over the broadcast limit of \(BroadcastRequest.maximumPayloadBytes)"
            )
        }
        if checksJSON, case .raw = job.payload {
            do {
                try RawPayload.checkObject(payload)
            } catch {
                throw refuse(error.field, error.message)
            }
        }
        let event: String?
        switch job.payload {
        case .liveActivity(let content): event = content.event.rawValue
        default: event = (try? JSONValue.parse(payload))?["aps"]?["event"]?.stringValue
        }
        guard event == "update" || event == "end" else {
            throw refuse(
                "live_activity.event",
                "a broadcast can only update or end an activity, not \(event.map { "\"\($0)\"" } ?? "no event")")
        }
        if storagePolicy == .noMessageStored, let expiration = job.headers.expiration, expiration != 0 {
            throw refuse(
                "expiration", "must be 0 for a channel that stores no message (storage policy 0), not \(expiration)")
        }
    }

    /// A job addressed through the registry (by activity, push-to-start or device) must name an app the registry
    /// knows.
    private func checkRegistry(knows app: String, jobID: String) async throws(FanoutError) {
        guard let registry = configuration.registry else {
            throw FanoutError(
                .invalidNotification,
                "job \(jobID): recipients: addressing by activity, push-to-start or device needs a registry")
        }
        let known: [RegistryApp]
        do {
            known = try await registry.apps()
        } catch {
            throw FanoutError(.connection, "job \(jobID): registry: \(error.description)")
        }
        guard known.contains(where: { $0.bundleID == app }) else {
            throw FanoutError(.invalidNotification, "job \(jobID): app: \"\(app)\" is not in the registry")
        }
    }

    /// A push-to-start job that names its activity id carries it in `attributes`, under the job's
    /// `activityIDAttribute` (or else `configuration.activityIDAttribute`), so that the app registers the new
    /// activity's token under it.
    /// A push-to-start job that names its activity and a channel (`input_push_channel`) binds the channel to the
    /// activity in the registry, so later jobs by that activity id broadcast to it; one that names its activity but
    /// no channel (and no `input_push_token`) subscribes the new activity to the channel already bound, if any.
    ///
    /// An activity keeps its channel, as `BroadcastChannelClient.createChannel(forActivity:)` has it: a start naming
    /// another channel than the one bound is refused before anything is sent or changed, naming both. Rebinding would
    /// lose the bound channel's id while it still counted against the app's 10,000 (nothing would delete it), and cut
    /// the activity's updates off from the devices subscribed to it.
    ///
    /// A start by the id of an activity that has ended begins a new session under that id: the activity is live
    /// again (as a token registered after the end makes it), so its channel is not deleted at the old dismissal
    /// date while the new session is subscribed to it.
    private func withChannelBinding(_ job: FanoutJob) async throws(FanoutError) -> FanoutJob {
        guard case .pushToStart(let app, _, _, let activityID?) = job.recipients, let registry = configuration.registry,
            case .liveActivity(var content) = job.payload, content.event == .start
        else { return job }
        let record = try? await registry.activity(app: app, activityID: activityID)
        func refuse(bound: String, named: String) -> FanoutError {
            FanoutError(
                .invalidNotification,
                "job \(job.id): live_activity.input_push_channel: activity \"\(activityID)\" is bound to channel "
                    + "\(bound), not \(named); nothing was sent (an activity keeps its channel: delete \(bound) "
                    + "first, or leave input_push_channel out to subscribe to it)")
        }
        if let channel = content.inputPushChannel, let bound = record?.channelID, bound != channel {
            throw refuse(bound: bound, named: channel)
        }
        if record?.state == .ended {
            _ = try? await registry.apply([
                .startActivity(app: app, activityID: activityID, attributesType: content.attributesType)
            ])
        }
        if let channel = content.inputPushChannel {
            // The channel already bound is left as it is (its storage policy with it). An unbound activity gets
            // this one, its policy unknown, in the environment of Apple's host this engine sends to (unknown for
            // another host), unless another binding came first: that one stays and this start is refused like any
            // other naming a channel not bound.
            if record?.channelID == nil {
                _ = try? await registry.apply([
                    .channel(
                        app: app, activityID: activityID, channelID: channel, onlyIfUnbound: true,
                        environment: configuration.endpoint.apnsEnvironment)
                ])
                if let bound = try? await registry.activity(app: app, activityID: activityID)?.channelID,
                    bound != channel
                {
                    throw refuse(bound: bound, named: channel)
                }
            }
            return job
        }
        guard !content.inputPushToken, let bound = record?.channelID else { return job }
        content.inputPushChannel = bound
        var subscribed = job
        subscribed.payload = .liveActivity(content)
        return subscribed
    }

    private func payloadWithActivityID(_ job: FanoutJob) throws(PayloadError) -> JobPayload {
        guard case .pushToStart(_, _, _, let activityID?) = job.recipients else { return job.payload }
        guard case .liveActivity(var content) = job.payload, content.event == .start else {
            throw PayloadError(field: "live_activity.event", message: "a push-to-start job must be a start event")
        }
        var attributes = content.attributes?.value.objectValue ?? JSONObject()
        let attribute = job.activityIDAttribute ?? configuration.activityIDAttribute
        attributes.set(.string(activityID), at: attribute.path[...])
        content.attributes = RawJSON(.object(attributes))
        return .liveActivity(content)
    }

    /// Stops taking jobs (`run`, `submit` and `send` throw `.shutdown` from now on), lets in-flight
    /// notifications finish for up to `gracePeriod`, then ends the rest as `failed` (NotSent) and stops
    /// the loop threads.
    ///
    /// Every call returns only once the engine has stopped: a call made while another is still draining waits for
    /// that one to finish (its grace period applies, not this call's), so a signal handler that calls `shutdown()`
    /// and then exits never cuts in-flight work short. Calls after the engine stopped return at once.
    public func shutdown(gracePeriod: Duration = .seconds(30)) async {
        let already = state.withLock { state -> Bool in
            defer { state.shuttingDown = true }
            return state.shuttingDown
        }
        guard !already else {
            await waitUntilStopped()
            return
        }
        deadlines.close()
        let (limiter, sendLimiter) = (shared.limiter, shared.sendLimiter)
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await limiter.waitUntilEmpty()
                await sendLimiter.waitUntilEmpty()
            }
            group.addTask { try? await Task.sleep(for: gracePeriod) }
            await group.next()
            group.cancelAll()
        }
        let loops = self.loops
        let shared = self.shared
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            // LoopThread.shutdown blocks until the thread exits: keep it off the cooperative pool.
            Thread.detachNewThread {
                for engineLoop in loops {
                    // Each loop ends what it holds, then closes its connections and exits.
                    try? engineLoop.loop.execute { engineLoop.stop() }
                }
                for engineLoop in loops { engineLoop.loop.shutdown() }
                shared.invalidTokens.finish()
                continuation.resume()
            }
        }
        // Every result is in: the registry has seen every token they invalidated once this returns.
        await shared.pruner?.close()
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.stopped = true
            defer { state.stopWaiters.removeAll() }
            return state.stopWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// A later `shutdown()`'s wait for the first to finish. Not cut short by cancellation: `shutdown()` promises a
    /// stopped engine when it returns.
    private func waitUntilStopped() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let stopped = state.withLock { state -> Bool in
                if state.stopped { return true }
                state.stopWaiters.append(continuation)
                return false
            }
            if stopped { continuation.resume() }
        }
    }
}
