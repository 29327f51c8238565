import FanoutCore
import FanoutPolicy
import FanoutTransport
import Foundation

/// One notification on its way: which job, which token, its fixed `apns-id` (kept across retries),
/// and how many attempts may have reached APNs.
///
/// Records are reused: once a notification's result is built, its loop's results thread returns the record to the
/// loop's spares (`deliverFinished`) and the feeding task fills it again for a later notification
/// (`EngineLoop.takeSpares`), so in steady state a notification makes no record.
///
/// `@unchecked Sendable`: touched by one thread at a time, each handing it to the next under a lock. The feeding
/// task fills it and hands it to its loop with `execute`; the loop sends it and, with its outcome, hands it to the
/// results thread once per turn; that thread clears it and puts it back in the spares mutex.
final class PendingNotification: @unchecked Sendable {
    /// Nil only while the record is spare.
    @exclusivity(unchecked) private var preparedJob: PreparedJob?
    var job: PreparedJob { preparedJob! }
    @exclusivity(unchecked) private(set) var token: RecipientToken
    @exclusivity(unchecked) private(set) var apnsID: APNsIdentifier
    /// Position of the recipient in its job.
    @exclusivity(unchecked) private(set) var position: Int
    @exclusivity(unchecked) var attempts = 0
    /// Sends the server never acted on (refused, above a GOAWAY's last stream, failed before leaving), resent at
    /// once without counting an attempt: up to `EngineLoop.maxFreeResends`, then each counts.
    @exclusivity(unchecked) var freeResends = 0
    /// The loop's high-resolution clock (ns, `LoopThread.readClock()`) at the first send, for latency.
    @exclusivity(unchecked) var firstSentAt: UInt64 = 0
    @exclusivity(unchecked) var lastStatus: Int?
    @exclusivity(unchecked) var lastReason: String?
    /// Loop clock (ms) before which a retry must not be sent.
    @exclusivity(unchecked) var notBefore: UInt64 = 0
    /// While on the wire: the connection carrying it, its request there, and its slot in the loop's
    /// on-the-wire table (-1 otherwise), so that a cancelled job can reset its open streams.
    @exclusivity(unchecked) var connection: HTTP2ClientConnection?
    @exclusivity(unchecked) var requestID = HTTP2RequestID(rawValue: 0)
    @exclusivity(unchecked) var wireSlot = -1

    init(job: PreparedJob, token: RecipientToken, apnsID: APNsIdentifier, position: Int) {
        preparedJob = job
        self.token = token
        self.position = position
        self.apnsID = apnsID
    }

    /// Fills a spare record for another notification, as `init` would.
    func reuse(job: PreparedJob, token: RecipientToken, apnsID: APNsIdentifier, position: Int) {
        precondition(preparedJob == nil, "a record is reused only once it is spare")
        preparedJob = job
        self.token = token
        self.apnsID = apnsID
        self.position = position
    }

    /// What a spare record holds as its token and id.
    private static let noToken = RecipientToken.text("")
    private static let noID = APNsIdentifier.uuid(high: 0, low: 0)
    /// The id of a notification APNs gives its id to (`APNsIDAssignment.apns`): none is sent, and its result carries
    /// the one APNs answers with.
    static let assignedByAPNs = noID

    /// Whether the request carries an `apns-id` of Fanout's (or the caller's).
    var sendsAPNsID: Bool { apnsID != PendingNotification.noID }

    /// Makes the record spare: it lets go of its job (and so of the job's run and result handler) and strings.
    fileprivate func clear() {
        preparedJob = nil
        token = PendingNotification.noToken
        apnsID = PendingNotification.noID
        position = 0
        attempts = 0
        freeResends = 0
        firstSentAt = 0
        lastStatus = nil
        lastReason = nil
        notBefore = 0
        connection = nil
        requestID = HTTP2RequestID(rawValue: 0)
        wireSlot = -1
    }
}

/// What the loops of one engine share.
final class EngineShared: Sendable {
    let configuration: FanoutEngineConfiguration
    let tls: TLSClientContext
    let tokens: (any ProviderTokenSource)?
    /// Jobs' notifications in flight (`run`, `submit`).
    let limiter: InFlightLimiter
    /// `send`s' notifications in flight, apart from the jobs': a job's permits come back only as its results are
    /// delivered, so behind a job whose `onResult` is slow, a `send` waiting in the same queue would wait seconds.
    let sendLimiter: InFlightLimiter
    /// Where tokens APNs invalidated are reported (`FanoutEngine.invalidTokens`).
    let invalidTokens: AsyncStream<InvalidatedToken>.Continuation
    /// Removes invalidated tokens from the registry, when the engine has one.
    let pruner: RegistryPruner?

    init(
        configuration: FanoutEngineConfiguration, tls: TLSClientContext, tokens: (any ProviderTokenSource)?,
        invalidTokens: AsyncStream<InvalidatedToken>.Continuation
    ) {
        self.configuration = configuration
        self.tls = tls
        self.tokens = tokens
        self.invalidTokens = invalidTokens
        pruner = configuration.registry.map { RegistryPruner(store: $0, warn: configuration.warningHandler) }
        limiter = InFlightLimiter(capacity: configuration.effectiveMaxInFlight)
        sendLimiter = InFlightLimiter(capacity: configuration.effectiveMaxInFlight)
    }

    /// The limiter `run`'s notifications take their permits from: `send`s' (`deliversOnLoop`) or jobs'.
    func limiter(for run: FanoutRun) -> InFlightLimiter { run.deliversOnLoop ? sendLimiter : limiter }

    /// Notifications in flight, jobs' and sends'.
    var inFlight: Int { limiter.inFlight + sendLimiter.inFlight }
    /// Feeds parked for room in flight, jobs' and sends'.
    var waitingForRoom: Int { limiter.waiting + sendLimiter.waiting }
}

/// The part of the engine on one loop thread: its connections, the notifications waiting for a
/// stream, and the retries waiting for their backoff. Confined to `loop` (asserted).
///
/// Streams are kept busy as h2load does: whenever a connection can open a stream (ready, a stream
/// closed, the server raised its limit) it takes waiting notifications up to its limit.
final class EngineLoop: HTTP2ResponseHandler, @unchecked Sendable {
    // @unchecked Sendable: referenced from other threads only to `loop.execute` onto it.

    /// How many times one notification is resent at once, uncounted, when the server did not act on it. A few
    /// GOAWAYs or refusals in a row are bad luck; past that a server that refuses every stream would have it sent
    /// for ever (a hot loop, the job never ending), so later ones count as attempts, with backoff, and end `failed`.
    static let maxFreeResends = 8

    let loop: LoopThread
    private let shared: EngineShared
    private var configuration: FanoutEngineConfiguration { shared.configuration }
    /// The configuration's listener, read from here rather than through the configuration (a struct of some forty
    /// fields behind `shared`) at each event.
    private let metricsListener: (any FanoutMetricsListener)?
    @exclusivity(unchecked) private var slots: [ConnectionSlot]
    /// Connections that got GOAWAY and are finishing their streams.
    @exclusivity(unchecked) private var draining: [ObjectIdentifier: HTTP2ClientConnection] = [:]
    @exclusivity(unchecked) private var waiting = FIFOQueue<PendingNotification>()
    @exclusivity(unchecked) private var delayed: [PendingNotification] = []
    @exclusivity(unchecked) private var delayTimer: LoopTimer?
    @exclusivity(unchecked) private var delayTimerDue: UInt64 = .max
    @exclusivity(unchecked) private var random = FastRandomGenerator()
    @exclusivity(unchecked) private var consecutiveConnectFailures = 0
    /// Set when connecting keeps failing (or TLS verification fails): new work fails fast while a
    /// reconnect probes the endpoint in the background; cleared when a connection is ready.
    @exclusivity(unchecked) private var endpointDown: TransportError?
    @exclusivity(unchecked) private var retryBudget: RetryBudget
    /// The retry budget's answer for each connection lost this loop turn, asked once for all the streams it took
    /// down (`admitRetry`); emptied at the turn's end, when every stream of those connections has completed.
    @exclusivity(unchecked) private var lostConnectionRetries: [ObjectIdentifier: Bool] = [:]
    /// Empties `lostConnectionRetries` at the end of the turn that filled it. Created in `init`.
    private var forgetLostConnectionsAtTurnEnd: LoopTurnAction!
    /// Connections that became ready and have not closed (for the open-connections gauge).
    @exclusivity(unchecked) private var readyConnections = Set<ObjectIdentifier>()
    @exclusivity(unchecked) private var lastConnectError: TransportError?
    @exclusivity(unchecked) private(set) var isStopping = false
    /// Notifications on the wire, each at its `wireSlot`; freed slots are reused, so once warm this
    /// allocates nothing per notification. Only a cancelled job walks it.
    @exclusivity(unchecked) private var onWire: [PendingNotification?] = []
    @exclusivity(unchecked) private var freeWireSlots: [Int] = []
    /// Records the feeding tasks take (`takeSpares`) before they make new ones; at most `maxSpares`.
    private let spares = FanoutMutex<[PendingNotification]>([])
    private let maxSpares: Int
    /// Runs `pump` once at the end of the loop turn in which answers freed streams. Created in `init`.
    private var pumpAtTurnEnd: LoopTurnAction!

    /// One connection position in the pool: the live connection, or when to make the next one.
    private final class ConnectionSlot {
        @exclusivity(unchecked) var connection: HTTP2ClientConnection?
        @exclusivity(unchecked) var reconnectTimer: LoopTimer?
        @exclusivity(unchecked) var failures = 0
    }

    init(loop: LoopThread, shared: EngineShared) {
        self.loop = loop
        self.shared = shared
        metricsListener = shared.configuration.metricsListener
        slots = (0..<shared.configuration.connectionsPerLoop).map { _ in ConnectionSlot() }
        retryBudget = RetryBudget(ratio: shared.configuration.retryBudgetRatio)
        // No more than can be in flight at once: past that, the feeding side could not use them.
        maxSpares = shared.limiter.capacity
        // Weak: the action lives in self, and the loop's list of the turn's flushes may hold it after an engine
        // is dropped. Read once per turn, so the weak reference's cost does not matter.
        pumpAtTurnEnd = LoopTurnAction(loop: loop) { [weak self] in self?.pump() }
        handOverAtTurnEnd = LoopTurnAction(loop: loop) { [weak self] in self?.handOverFinished() }
        forgetLostConnectionsAtTurnEnd = LoopTurnAction(loop: loop) { [weak self] in
            self?.lostConnectionRetries.removeAll(keepingCapacity: true)
        }
    }

    // MARK: Records

    /// Moves up to `count` spare records into `records` (the feeding task then fills them with `reuse`). Any
    /// thread.
    func takeSpares(upTo count: Int, into records: inout [PendingNotification]) {
        spares.withLock { spares in
            let taken = min(count, spares.count)
            records.append(contentsOf: spares[(spares.count - taken)...])
            spares.removeLast(taken)
        }
    }

    /// One spare record, if there is one (a `send` fills it with `reuse`). Any thread.
    func takeSpare() -> PendingNotification? {
        spares.withLock { $0.popLast() }
    }

    // MARK: Work in

    /// Queues notifications (made by the feeding task, off this thread) and sends them. Loop thread.
    func enqueue(_ batch: [PendingNotification]) {
        loop.assertInLoop()
        if let down = endpointDown, !slots.contains(where: { $0.connection?.isReady == true }) {
            for pending in batch { finish(pending, outcome: .failed, reason: "ConnectionFailed: \(down.message)") }
            probeEndpoint()
            return
        }
        for pending in batch { accept(pending) }
        pump()
    }

    /// Queues one `send`'s notification and sends it: `enqueue` without a batch array. Loop thread.
    func enqueue(_ pending: PendingNotification) {
        loop.assertInLoop()
        if let down = endpointDown, !slots.contains(where: { $0.connection?.isReady == true }) {
            finish(pending, outcome: .failed, reason: "ConnectionFailed: \(down.message)")
            probeEndpoint()
            return
        }
        accept(pending)
        pump()
    }

    /// Queues a notification handed in, or ends it when the loop is stopping or its run was stopped already.
    private func accept(_ pending: PendingNotification) {
        if isStopping {
            finish(pending, outcome: .failed, reason: "NotSent")
        } else if pending.job.run.isCancelled {
            finish(pending, outcome: pending.job.run.stopOutcome, reason: pending.job.run.stopReason)
        } else {
            waiting.append(pending)
        }
    }

    // MARK: Streams

    /// Gives every connection that can open streams as many waiting notifications as it can take.
    private func pump() {
        guard !waiting.isEmpty, !isStopping else { return }
        ensureConnections()
        var bearer: String?
        if let tokens = shared.tokens {
            do {
                bearer = try tokens.currentToken()
            } catch {
                failAllWaiting(reason: "ProviderTokenUnavailable")
                return
            }
        }
        let now = loop.nowMilliseconds
        let clock = loop.readClock()
        var nowSeconds: Int64 = 0  // read only if a job has an expiration
        var lastJob: PreparedJob?
        var head: HeaderBlock?
        // By index, here and in ensureConnections: pump runs once per response, and a debug build's array
        // iterator allocates on every step (two allocations per notification, in the allocation test's figure).
        for index in slots.indices {
            guard let connection = slots[index].connection, connection.isReady, connection.isAcceptingRequests else {
                continue
            }
            // `isAcceptingRequests` again for each: a connection can stop taking requests within this loop (it
            // drains when its stream ids run out), and one that fails them as not sent would get them back for ever.
            while connection.isAcceptingRequests, connection.outstanding < connection.streamLimit,
                let pending = waiting.popFirst()
            {
                if pending.job.run.isSuperseded {
                    // A newer update for the activity came before this one left: it is never sent.
                    finish(pending, outcome: .superseded, reason: "Superseded")
                } else if hasExpired(pending, nowSeconds: &nowSeconds) {
                    finish(pending, outcome: .expired, reason: "Expired")
                } else {
                    let job = pending.job
                    if lastJob !== job {
                        // Once per run of notifications of one job, not per notification (headerBlock takes a lock).
                        lastJob = job
                        head = job.headerBlock(bearer: bearer)
                    }
                    send(pending, job: job, head: head!, on: connection, now: now, clock: clock)
                }
            }
            if waiting.isEmpty { break }
        }
    }

    /// Whether the notification's `apns-expiration` has passed; reads the wall clock at most once
    /// per pump, and only for jobs that have an expiration.
    private func hasExpired(_ pending: PendingNotification, nowSeconds: inout Int64) -> Bool {
        guard let expiresAt = pending.job.expiresAt else { return false }
        if nowSeconds == 0 { nowSeconds = Int64(Date().timeIntervalSince1970) }
        return nowSeconds > expiresAt
    }

    private func send(
        _ pending: PendingNotification, job: PreparedJob, head: HeaderBlock, on connection: HTTP2ClientConnection,
        now: UInt64, clock: UInt64
    ) {
        if pending.firstSentAt == 0 {
            pending.firstSentAt = clock
            retryBudget.recordFirstAttempt(now: now * 1_000_000)
        }
        pending.attempts += 1
        // `:path` is "/3/device/" and the token, joined by the session in a buffer it reuses (no String per
        // notification). A broadcast's one recipient is its channel, which travels in a header, not the path.
        let broadcastPath = job.broadcastPath
        let request = HTTP2Request(
            // A broadcast carries no apns-id (Apple lists only apns-request-id for it).
            head: head, path: broadcastPath ?? "/3/device/",
            pathSuffix: broadcastPath == nil ? pending.token : nil,
            apnsID: broadcastPath != nil || !pending.sendsAPNsID ? nil : pending.apnsID, body: job.body)
        if let slot = freeWireSlots.popLast() {
            pending.wireSlot = slot
            onWire[slot] = pending
        } else {
            pending.wireSlot = onWire.count
            onWire.append(pending)
        }
        pending.connection = connection
        // The id first: `submit` can complete the request before it returns (one the connection fails at once), and
        // the completion can finish the record and hand it on (to the results thread, or when the loop is stopping
        // to the spares, from which a feeding task refills it on another thread). So nothing touches `pending`
        // once `submit` has it.
        pending.requestID = connection.nextRequestID
        metricsListener?.notificationSent(attempt: pending.attempts)
        // No closure per notification: the connection hands `pending` back to `request(_:didComplete:on:)`.
        connection.submit(request, context: pending, handler: self)
    }

    /// HTTP2ResponseHandler: a notification's stream ended; `context` is its PendingNotification.
    func request(
        _ context: AnyObject, didComplete result: Result<HTTP2Response, HTTP2StreamFailure>,
        on connection: HTTP2ClientConnection
    ) {
        complete(unsafeDowncast(context, to: PendingNotification.self), result: result, connection: connection)
    }

    private func complete(
        _ pending: PendingNotification, result: Result<HTTP2Response, HTTP2StreamFailure>,
        connection: HTTP2ClientConnection
    ) {
        if pending.wireSlot >= 0 {
            onWire[pending.wireSlot] = nil
            freeWireSlots.append(pending.wireSlot)
            pending.wireSlot = -1
        }
        pending.connection = nil
        switch result {
        case .success(let http) where http.status == 200:
            pending.lastStatus = 200
            finish(
                pending, outcome: .delivered, status: 200, apnsID: pending.sendsAPNsID ? nil : http.apnsIDValue,
                apnsUniqueID: http.apnsUniqueIDValue)
        case .success(let http):
            let response = APNsResponse.parse(
                status: http.status, apnsID: http.apnsID, apnsUniqueID: http.apnsUniqueID, body: http.body)
            handle(pending, response: response, connection: connection)
        case .failure(.cancelled):
            // Only a cancelled job cancels its streams.
            finish(pending, outcome: pending.job.run.stopOutcome, reason: pending.job.run.stopReason)
        case .failure(let failure):
            if failure.isSafeToRetry && pending.freeResends < Self.maxFreeResends {
                // The server did not act on it: send again at once, without counting an attempt.
                pending.freeResends += 1
                pending.attempts -= 1
                if isStopping {
                    finish(pending, outcome: .failed, reason: "NotSent")
                } else if pending.job.run.isCancelled {
                    finish(pending, outcome: pending.job.run.stopOutcome, reason: pending.job.run.stopReason)
                } else {
                    waiting.prepend(pending)
                }
            } else {
                pending.lastReason = Self.describe(failure)
                if case .connectionLost = failure {
                    retryOrFail(pending, lostWith: connection)
                } else {
                    retryOrFail(pending)
                }
            }
        }
        // Once per batch of answers (a read buffer holds hundreds), not once per answer: the provider token,
        // the clock and the connection scan are then read once for all the streams the batch freed.
        pumpAtTurnEnd.schedule()
    }

    private func handle(_ pending: PendingNotification, response: APNsResponse, connection: HTTP2ClientConnection) {
        pending.lastStatus = response.status
        pending.lastReason = response.reason?.rawValue
        if response.status == 200 {
            finish(pending, outcome: .delivered, response: response)
            return
        }
        let reasonClass = response.reasonClass ?? ReasonClass(status: response.status, reason: response.reason)
        if response.invalidatesToken {
            finish(pending, outcome: .unregistered, response: response)
        } else if reasonClass == .providerTokenRefresh {
            // A new token, and a new connection (APNs wedges the old one); then send again.
            shared.tokens?.refreshAfterRejection()
            retire(connection)
            retryOrFail(pending, immediately: true)
        } else if reasonClass.isRetryable {
            // `Shutdown`, `ServiceUnavailable` and `IdleTimeout` say this server is going or the connection is stale:
            // the retry goes to a new connection, then backs off (docs/reference/apns.md, "Status codes and reasons").
            if response.reason?.requiresNewConnection == true && warrantsReconnecting(response, on: connection) {
                retire(connection)
            }
            retryOrFail(pending)
        } else {
            finish(pending, outcome: .rejected, response: response)
        }
    }

    /// Sends again after a jittered backoff, or ends as `failed` when the attempts are used up or the retry budget
    /// refuses. `lostWith`: the connection whose loss ended the stream (see `admitRetry`).
    private func retryOrFail(
        _ pending: PendingNotification, immediately: Bool = false, lostWith connection: HTTP2ClientConnection? = nil
    ) {
        if pending.job.run.isCancelled {
            finish(pending, outcome: pending.job.run.stopOutcome, reason: pending.job.run.stopReason)
            return
        }
        if pending.job.run.isSuperseded {
            finish(pending, outcome: .superseded, reason: "Superseded")
            return
        }
        guard !isStopping, pending.attempts < configuration.maxAttempts else {
            finish(pending, outcome: .failed, reason: pending.lastReason)
            return
        }
        if immediately {
            metricsListener?.notificationRetried(reason: pending.lastReason)
            waiting.prepend(pending)
            return
        }
        guard admitRetry(lostWith: connection) else {
            finish(
                pending, outcome: .failed, reason: "RetryBudgetExhausted: " + (pending.lastReason ?? "transient error"))
            return
        }
        metricsListener?.notificationRetried(reason: pending.lastReason)
        let ceiling = min(
            configuration.retryCap.wholeMilliseconds,
            configuration.retryBase.wholeMilliseconds << UInt64(min(pending.attempts, 20)))
        let delay = ceiling == 0 ? 0 : UInt64.random(in: 0...ceiling, using: &random)
        pending.notBefore = loop.nowMilliseconds + delay
        delayed.append(pending)
        armDelayTimer(due: pending.notBefore)
    }

    /// Whether the retry budget takes one more retry. A lost connection is one failure of the endpoint however many
    /// streams it carried: the budget is asked once for all of them (and they all follow its answer), where asking
    /// per stream let one dropped connection with a thousand streams open spend the whole budget (20% of the first
    /// attempts of the last 10 s, plus 10), and a gateway's sends then failed for good after a single reset. Each
    /// notification's own attempts are still counted (`maxAttempts`).
    private func admitRetry(lostWith connection: HTTP2ClientConnection?) -> Bool {
        let now = loop.nowMilliseconds * 1_000_000
        guard let connection else { return retryBudget.tryRetry(now: now) }
        let id = ObjectIdentifier(connection)
        if let admitted = lostConnectionRetries[id] { return admitted }
        let admitted = retryBudget.tryRetry(now: now)
        if lostConnectionRetries.isEmpty { forgetLostConnectionsAtTurnEnd.schedule() }
        lostConnectionRetries[id] = admitted
        return admitted
    }

    private func armDelayTimer(due: UInt64) {
        guard due < delayTimerDue else { return }
        let timer = delayTimer ?? LoopTimer(loop: loop)
        delayTimer = timer
        delayTimerDue = due
        let now = loop.nowMilliseconds
        timer.schedule(milliseconds: due > now ? due - now : 0) { [self] in releaseDelayed() }
    }

    private func releaseDelayed() {
        delayTimerDue = .max
        let now = loop.nowMilliseconds
        var next: UInt64 = .max
        var keep: [PendingNotification] = []
        for pending in delayed {
            if pending.notBefore <= now {
                waiting.append(pending)
            } else {
                keep.append(pending)
                next = min(next, pending.notBefore)
            }
        }
        delayed = keep
        if next != .max { armDelayTimer(due: next) }
        pump()
    }

    /// From the first send to now: an answer's time is the clock the read that brought it took; a notification
    /// ended by the loop itself (a timeout, a failure) reads the clock.
    private func latency(of pending: PendingNotification, answered: Bool) -> Int64 {
        guard pending.firstSentAt != 0 else { return 0 }
        let now = answered ? loop.clockNanoseconds : loop.readClock()
        return Int64(bitPattern: now &- pending.firstSentAt)
    }

    private func finish(
        _ pending: PendingNotification, outcome: NotificationOutcome, response: APNsResponse? = nil,
        reason: String? = nil,
        status: Int? = nil, apnsID: APNsIdentifier? = nil, apnsUniqueID: APNsIdentifier? = nil
    ) {
        let finished = FinishedNotification(
            pending: pending, outcome: outcome, status: status ?? response?.status ?? pending.lastStatus,
            reason: response?.reason?.rawValue ?? reason ?? (outcome == .delivered ? nil : pending.lastReason),
            apnsID: apnsID ?? response?.apnsID.map(APNsIdentifier.init),
            apnsUniqueID: apnsUniqueID ?? response?.apnsUniqueID.map(APNsIdentifier.init),
            timestamp: response?.timestamp,
            latencyNanoseconds: latency(of: pending, answered: response != nil))
        if finishedThisTurn.isEmpty && finishedOnLoopThisTurn.isEmpty { handOverAtTurnEnd.schedule() }
        if pending.job.run.deliversOnLoop {
            // `send`'s result goes to its waiting caller, not to a handler: the loop delivers it at the end of the
            // turn itself, which spares a lone send the results thread's wake-up (see `FanoutRun.deliversOnLoop`).
            if isStopping || loop.isStopping || resultsClosed {
                // A turn-end action registered now might never run.
                var batch = [finished]
                deliverFinished(&batch, scratch: deliveredOnLoop)
                return
            }
            finishedOnLoopThisTurn.append(consume finished)
            return
        }
        // The loop only decides: the result is made, reported, counted and delivered, and the permit and the record
        // come back, on this loop's results thread (`deliverFinished`), which takes the turn's results at once.
        // Moved, not copied: a copy retained the record and the reason, and the local's end released them.
        finishedThisTurn.append(consume finished)
        if results == nil { startResults() }
    }

    private func failAllWaiting(reason: String) {
        while let pending = waiting.popFirst() {
            finish(pending, outcome: .failed, reason: reason)
        }
    }

    private static func describe(_ failure: HTTP2StreamFailure) -> String {
        switch failure {
        // A TLS alert names its cause (a server refusing the client certificate sends one after a TLS 1.3
        // handshake); any other loss is just that.
        case .connectionLost(let cause) where cause.kind == .tlsAlert: return "ConnectionLost: \(cause.message)"
        case .connectionLost: return "ConnectionLost"
        case .reset(let code): return "StreamReset(\(code))"
        case .notSent: return "NotSent"
        case .refused: return "RefusedStream"
        case .notProcessed: return "GoAway"
        case .timedOut: return "Timeout"
        case .cancelled: return "Cancelled"
        }
    }

    // MARK: Connections

    private func ensureConnections() {
        for index in slots.indices where slots[index].connection == nil && slots[index].reconnectTimer == nil {
            connect(slots[index])
        }
    }

    private func connect(_ slot: ConnectionSlot) {
        var connectionConfiguration = HTTP2ClientConfiguration(
            host: configuration.endpoint.host, port: configuration.endpoint.port, tls: shared.tls.configuration,
            connectTimeoutMilliseconds: configuration.connectTimeout.wholeMilliseconds,
            maxConcurrentStreams: configuration.maxConcurrentStreams,
            pingIntervalMilliseconds: configuration.pingInterval.wholeMilliseconds,
            requestTimeout: configuration.requestTimeout)
        connectionConfiguration.firstStreamID = configuration.firstStreamID
        connectionConfiguration.proxy = configuration.proxy?.proxy
        let connection = HTTP2ClientConnection(
            loop: loop, configuration: connectionConfiguration, tlsContext: shared.tls)
        slot.connection = connection
        connection.onEvent = { [self, unowned slot, unowned connection] event in
            connectionEvent(event, slot: slot, connection: connection)
        }
    }

    /// Whether an answer asking for a new connection gets one. `Shutdown` and `IdleTimeout` always do. An overloaded
    /// service (`ServiceUnavailable`) does once the connection has been up `overloadReconnectInterval`: at most one
    /// new connection per slot that often while 503s go on. Retiring at every 503 would be a reconnect storm while
    /// APNs is overloaded (a new connection carries one stream until its first answer, so a TLS handshake per request;
    /// Apple treats rapid reconnects as an attack), and the notification's own retry backs off anyway.
    private func warrantsReconnecting(_ response: APNsResponse, on connection: HTTP2ClientConnection) -> Bool {
        guard response.reason == .serviceUnavailable else { return true }
        let age = loop.nowMilliseconds &- connection.readyAtMilliseconds
        return connection.readyAtMilliseconds > 0 && age >= configuration.overloadReconnectInterval.wholeMilliseconds
    }

    /// Takes no more work to `connection`: its open streams finish there (it closes after them), and a new connection
    /// takes its slot at once, as after a GOAWAY. Once per connection: later answers on it find it retired already.
    private func retire(_ connection: HTTP2ClientConnection) {
        guard let slot = slots.first(where: { $0.connection === connection }) else { return }
        connection.close()
        replace(connection, in: slot)
    }

    /// Moves `connection`, which takes no new work, out of `slot` to finish its streams among `draining`; new work
    /// goes to a fresh connection in the slot.
    private func replace(_ connection: HTTP2ClientConnection, in slot: ConnectionSlot) {
        draining[ObjectIdentifier(connection)] = connection
        slot.connection = nil
        if !waiting.isEmpty && !isStopping { connect(slot) }
    }

    private func connectionEvent(_ event: HTTP2ConnectionEvent, slot: ConnectionSlot, connection: HTTP2ClientConnection)
    {
        switch event {
        case .ready:
            endpointDown = nil
            if readyConnections.insert(ObjectIdentifier(connection)).inserted {
                metricsListener?.connectionAdded()
            }
            slot.failures = 0
            consecutiveConnectFailures = 0
            pump()
        case .capacityAvailable:
            pump()  // the server raised its stream limit (a stream's completion pumps by itself)
        case .goaway, .draining:
            if slot.connection === connection { replace(connection, in: slot) }
        case .closed(let error):
            draining[ObjectIdentifier(connection)] = nil
            if readyConnections.remove(ObjectIdentifier(connection)) != nil {
                metricsListener?.connectionRemoved()
            }
            guard slot.connection === connection else { return }
            slot.connection = nil
            let neverReady = connection.responsesReceived == 0 && error != nil
            if let error, neverReady {
                connectionFailed(slot, error: error)
            } else if !waiting.isEmpty && !isStopping {
                connect(slot)
            }
        }
    }

    /// A connection ended before it carried anything: back off, and after too many failures in a
    /// row fail what waits (a wrong CA or an unreachable endpoint must not hang a job).
    private func connectionFailed(_ slot: ConnectionSlot, error: TransportError) {
        metricsListener?.connectionFailed(reason: error.message)
        consecutiveConnectFailures += 1
        lastConnectError = error
        let permanent = [
            .tlsUnknownCA, .tlsHostnameMismatch, .tlsCertificateInvalid, .tlsNoH2, .tlsConfiguration,
            .proxyAuthentication,
        ]
        .contains(error.kind)
        if permanent || consecutiveConnectFailures >= configuration.maxConnectAttempts * slots.count {
            // Circuit open: fail what waits and, until a connection succeeds again, fail new work at
            // once instead of letting each batch wait out its own round of connect attempts.
            endpointDown = error
            failAllWaiting(reason: "ConnectionFailed: \(error.message)")
            consecutiveConnectFailures = 0
        }
        guard !isStopping else { return }
        slot.failures += 1
        let ceiling = min(
            configuration.retryCap.wholeMilliseconds,
            configuration.retryBase.wholeMilliseconds << UInt64(min(slot.failures, 20)))
        let delay = UInt64.random(in: ceiling / 2...max(ceiling / 2, ceiling), using: &random)
        let timer = LoopTimer(loop: loop)
        slot.reconnectTimer = timer
        timer.schedule(milliseconds: delay) { [self, unowned slot] in
            slot.reconnectTimer?.close()
            slot.reconnectTimer = nil
            if (!waiting.isEmpty || endpointDown != nil) && !isStopping && slot.connection == nil { connect(slot) }
        }
    }

    /// While the endpoint is down, keeps one connection attempt going (none when one is already
    /// in progress or waiting out its backoff), so that the circuit closes once it is back.
    private func probeEndpoint() {
        guard !isStopping, let slot = slots.first, slot.connection == nil, slot.reconnectTimer == nil else { return }
        connect(slot)
    }

    // MARK: Cancel

    /// Ends what this loop holds of a cancelled run: its waiting and delayed notifications end
    /// `cancelled` now, and its open streams are reset (CANCEL) and end `cancelled`; an answer already
    /// read keeps its outcome. Loop thread.
    func cancel(_ run: FanoutRun) {
        loop.assertInLoop()
        // Each cancel completes its notification at once, which frees its slot: collect first.
        let open = onWire.compactMap { pending in pending?.job.run === run ? pending : nil }
        for pending in open {
            pending.connection?.cancel(pending.requestID)
        }
        for pending in waiting.removeAll(where: { $0.job.run === run }) {
            finish(pending, outcome: pending.job.run.stopOutcome, reason: pending.job.run.stopReason)
        }
        var kept: [PendingNotification] = []
        for pending in delayed {
            if pending.job.run === run {
                finish(pending, outcome: pending.job.run.stopOutcome, reason: pending.job.run.stopReason)
            } else {
                kept.append(pending)
            }
        }
        delayed = kept
    }

    // MARK: Stop

    /// Ends everything now: waiting and delayed notifications end as `failed` (NotSent), open
    /// streams end when their connections close. Loop thread.
    func stop() {
        isStopping = true
        failAllWaiting(reason: "NotSent")
        for pending in delayed { finish(pending, outcome: .failed, reason: pending.lastReason ?? "NotSent") }
        delayed = []
        delayTimer?.close()
        delayTimer = nil
        for slot in slots {
            slot.reconnectTimer?.close()
            slot.reconnectTimer = nil
            slot.connection?.close(immediately: true)
            slot.connection = nil
        }
        for connection in Array(draining.values) { connection.close(immediately: true) }
        draining = [:]
    }

    /// Notifications this loop holds (waiting or delayed); the rest of in-flight is on the wire.
    var heldCount: Int { waiting.count + delayed.count }

    // MARK: Results

    /// Notifications finished this loop turn (the record and the outcome), handed to `results` at the end of the turn.
    private var finishedThisTurn: [FinishedNotification] = []
    /// This loop's results thread, started with the first result and ended when the loop stops.
    private var results: ResultsThread?
    /// Hands `finishedThisTurn` to `results` at the end of a turn that finished something. Created in `init`.
    private var handOverAtTurnEnd: LoopTurnAction!
    /// Set once the results thread has ended (or the loop was stopping before there was one): from then on `finish`
    /// delivers on the loop thread, since nobody else will.
    private var resultsClosed = false
    /// `deliverFinished`'s scratch, kept for its capacity. Touched only by whoever delivers: the results thread, or
    /// the loop thread once that thread has ended.
    private let delivered = DeliveryScratch()
    /// Notifications of `deliversOnLoop` runs finished this turn, delivered on the loop at the end of the turn.
    private var finishedOnLoopThisTurn: [FinishedNotification] = []
    /// `deliverFinished`'s scratch when the loop delivers `deliversOnLoop` runs' results (the results thread may be
    /// delivering other runs' with `delivered` at the same time). Loop thread only.
    private let deliveredOnLoop = DeliveryScratch()

    /// Starts the results thread, on the first result; once the loop is stopping, delivers the turn's results here.
    private func startResults() {
        if resultsClosed || isStopping || loop.isStopping {
            // The loop is stopping: a stop action registered now might never run, so deliver here.
            resultsClosed = true
            deliverFinished(&finishedThisTurn, scratch: delivered)
            return
        }
        results = ResultsThread(name: loop.name.replacingOccurrences(of: "-loop", with: "-writer")) {
            [self] batch in deliverFinished(&batch, scratch: delivered)
        }
        // When the loop stops (shutdown, or the engine dropped), every result is delivered before its thread ends:
        // `shutdown()` returns only then, and finishes `invalidTokens` after what the results reported.
        _ = loop.addStopAction { [self] in closeResults() }
    }

    /// End of a turn that finished notifications: the results thread takes them all at once (after `closeResults`,
    /// `finish` delivers them itself and there is nothing left here), and those of `deliversOnLoop` runs are
    /// delivered here.
    private func handOverFinished() {
        if !finishedThisTurn.isEmpty { results?.handOver(&finishedThisTurn) }
        deliverFinished(&finishedOnLoopThisTurn, scratch: deliveredOnLoop)
    }

    /// Loop thread, when the loop stops: hands over the last results, waits for the results thread to deliver
    /// everything and end, then delivers whatever still finishes (streams of connections closed after this) itself.
    private func closeResults() {
        results?.handOver(&finishedThisTurn)
        results?.close()
        results = nil
        resultsClosed = true
        deliverFinished(&finishedThisTurn, scratch: delivered)
        deliverFinished(&finishedOnLoopThisTurn, scratch: deliveredOnLoop)
    }

    /// The results thread's work for one batch (and the loop's, for `deliversOnLoop` runs): makes each
    /// notification's result, reports it (metrics, invalidated tokens), gives the records back to the feeding side,
    /// returns the permits, then delivers and counts the results run by run (one lock per run and batch). `scratch`
    /// is the caller's own, kept for its capacity.
    private func deliverFinished(_ batch: inout [FinishedNotification], scratch: DeliveryScratch) {
        guard !batch.isEmpty else { return }
        // A delivery that starts another on this thread (a result's handler finishing a notification while the loop
        // stops) takes a scratch of its own.
        let made = scratch.inUse ? DeliveryScratch() : scratch
        made.inUse = true
        defer { made.inUse = false }
        let metricsListener = self.metricsListener
        // Through buffer pointers, and with the runs apart from the results: an element read through an array's
        // subscript, or a field of a (run, result) tuple's, is copied whole (each String and enum of a result, a
        // reference-counting call each: about twenty per notification, counted with scripts/count-arc.sh), and a
        // buffer pointer's subscript lends it in place.
        var sends = 0
        batch.withUnsafeBufferPointer { batch in
            for index in batch.indices {
                // By pointer: an element lent to a method (even `borrowing`) is copied whole first.
                let finished = batch.baseAddress! + index
                let pending = finished.pointee.pending
                if pending.job.run.deliversOnLoop { sends += 1 }
                made.append(
                    makeResult(finished, pending: pending, metricsListener: metricsListener), of: pending.job.run)
                // Nothing else refers to the record: it left the waiting queue, the delayed list and the on-the-wire
                // table before it was finished, and its stream's completion has run.
                pending.clear()
            }
            // The records go back before the permits, so that the feeding task the permits wake finds them spare.
            spares.withLock { spares in
                for index in 0..<min(batch.count, max(0, maxSpares - spares.count)) {
                    spares.append(batch[index].pending)
                }
            }
        }
        batch.removeAll(keepingCapacity: true)
        // The permits come back before the results are delivered, so whoever a result wakes (the job's summary, a
        // caller reading `inFlight`) sees nothing of it in flight; and no sooner, so while this thread is behind the
        // feeding side waits, and no more than the in-flight limit is ever queued here.
        if made.count > sends { shared.limiter.release(made.count - sends) }
        if sends > 0 { shared.sendLimiter.release(sends) }
        metricsListener?.notificationsInFlight(shared.inFlight)
        var counts = OutcomeCounts()
        var broadcasts = 0
        made.drain { run, result in
            run.deliver(result)
            counts.add(result.outcome, retries: max(0, result.attempts - 1))
            if result.channel != nil { broadcasts += 1 }
        } endOfRun: { run, results in
            run.countDelivered(counts, results: results, broadcasts: broadcasts)
            counts = OutcomeCounts()
            broadcasts = 0
        }
    }

    /// One finished notification's result, made in one expression (a result made and then filled in would be
    /// copied out), and what it reports (the metrics listener, an invalidated token) on the way.
    private func makeResult(
        _ finished: UnsafePointer<FinishedNotification>, pending: PendingNotification,
        metricsListener: (any FanoutMetricsListener)?
    ) -> NotificationResult {
        let job = pending.job
        let isBroadcast = job.isBroadcast
        if let metricsListener {
            // The latency of an answer; a notification that got none (never sent, its connection lost) has none.
            let latency =
                finished.pointee.status == nil
                ? nil : Duration.nanoseconds(finished.pointee.latencyNanoseconds)
            metricsListener.notificationFinished(
                outcome: finished.pointee.outcome, reason: finished.pointee.reason, latency: latency)
        }
        if finished.pointee.outcome == .unregistered && !isBroadcast {
            let invalidated = InvalidatedToken(
                token: pending.token.string, reason: finished.pointee.reason ?? "Unregistered",
                timestamp: finished.pointee.timestamp,
                jobID: job.id, topic: job.headers.topic)
            shared.invalidTokens.yield(invalidated)
            shared.pruner?.add(invalidated)
        }
        return NotificationResult(
            jobID: job.id, tokenValue: isBroadcast ? nil : pending.token, outcome: finished.pointee.outcome,
            status: finished.pointee.status, reason: finished.pointee.reason,
            apnsIDValue: finished.pointee.apnsID ?? (isBroadcast || !pending.sendsAPNsID ? nil : pending.apnsID),
            apnsUniqueIDValue: finished.pointee.apnsUniqueID, attempts: pending.attempts,
            latencyNanoseconds: finished.pointee.latencyNanoseconds, timestamp: finished.pointee.timestamp,
            position: pending.position, channel: isBroadcast ? pending.token.string : nil)
    }
}
