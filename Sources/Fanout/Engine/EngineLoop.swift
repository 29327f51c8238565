import FanoutCore
import FanoutPolicy
import FanoutTransport
import Foundation
import Synchronization

/// One notification on its way: which job, which token, its fixed `apns-id` (kept across retries),
/// and how many attempts may have reached APNs.
///
/// Records are reused: once a notification has its result, its loop keeps the record (`EngineLoop.recycle`)
/// and the feeding task fills it again for a later notification (`EngineLoop.takeSpares`), so in steady state
/// a notification makes no record.
///
/// `@unchecked Sendable`: touched by one thread at a time. The feeding task fills it, then hands it to its loop
/// with `execute` (a lock); from then on only the loop touches it, until `recycle` hands it back to the
/// feeding side through the loop's spares mutex.
final class PendingNotification: @unchecked Sendable {
    /// Nil only while the record is spare.
    @exclusivity(unchecked) private var preparedJob: PreparedJob?
    var job: PreparedJob { preparedJob! }
    @exclusivity(unchecked) private(set) var token: String
    @exclusivity(unchecked) private(set) var apnsID: String
    /// Position of the recipient in its job.
    @exclusivity(unchecked) private(set) var position: Int
    @exclusivity(unchecked) var attempts = 0
    /// Loop clock (ms) of the first send, for latency.
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

    init(job: PreparedJob, token: String, apnsID: String, position: Int) {
        preparedJob = job
        self.token = token
        self.position = position
        self.apnsID = apnsID
    }

    /// Fills a spare record for another notification, as `init` would.
    func reuse(job: PreparedJob, token: String, apnsID: String, position: Int) {
        precondition(preparedJob == nil, "a record is reused only once it is spare")
        preparedJob = job
        self.token = token
        self.apnsID = apnsID
        self.position = position
    }

    /// Makes the record spare: it lets go of its job (and so of the job's run and result handler) and strings.
    fileprivate func clear() {
        preparedJob = nil
        token = ""
        apnsID = ""
        position = 0
        attempts = 0
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
    let limiter: InFlightLimiter
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
        pruner = configuration.registry.map { RegistryPruner(store: $0) }
        limiter = InFlightLimiter(capacity: configuration.effectiveMaxInFlight)
    }
}

/// The part of the engine on one loop thread: its connections, the notifications waiting for a
/// stream, and the retries waiting for their backoff. Confined to `loop` (asserted).
///
/// Streams are kept busy as h2load does: whenever a connection can open a stream (ready, a stream
/// closed, the server raised its limit) it takes waiting notifications up to its limit.
final class EngineLoop: HTTP2ResponseHandler, @unchecked Sendable {
    // @unchecked Sendable: referenced from other threads only to `loop.execute` onto it.

    let loop: LoopThread
    private let shared: EngineShared
    private var configuration: FanoutEngineConfiguration { shared.configuration }
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
    /// Connections that became ready and have not closed (for the open-connections gauge).
    @exclusivity(unchecked) private var readyConnections = Set<ObjectIdentifier>()
    @exclusivity(unchecked) private var lastConnectError: TransportError?
    @exclusivity(unchecked) private(set) var isStopping = false
    /// Notifications on the wire, each at its `wireSlot`; freed slots are reused, so once warm this
    /// allocates nothing per notification. Only a cancelled job walks it.
    @exclusivity(unchecked) private var onWire: [PendingNotification?] = []
    @exclusivity(unchecked) private var freeWireSlots: [Int] = []
    /// Records of finished notifications, kept by the loop until there are enough to hand over at once.
    @exclusivity(unchecked) private var finishedRecords: [PendingNotification] = []
    /// Records the feeding tasks take (`takeSpares`) before they make new ones; at most `maxSpares`.
    private let spares = Mutex<[PendingNotification]>([])
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
        slots = (0..<shared.configuration.connectionsPerLoop).map { _ in ConnectionSlot() }
        retryBudget = RetryBudget(ratio: shared.configuration.retryBudgetRatio)
        // No more than can be in flight at once: past that, the feeding side could not use them.
        maxSpares = shared.limiter.capacity
        // Weak: the action lives in self, and the loop's list of the turn's flushes may hold it after an engine
        // is dropped. Read once per turn, so the weak reference's cost does not matter.
        pumpAtTurnEnd = LoopTurnAction(loop: loop) { [weak self] in self?.pump() }
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

    /// Keeps the record of a notification that has its result. Loop thread; hands records to the feeding side
    /// in groups of `batch`, so the lock is taken once per group, not per notification.
    private func recycle(_ pending: PendingNotification) {
        pending.clear()
        finishedRecords.append(pending)
        if finishedRecords.count >= Self.recycleBatch { handOverFinishedRecords() }
    }

    private func handOverFinishedRecords() {
        spares.withLock { spares in
            let room = max(0, maxSpares - spares.count)
            spares.append(contentsOf: finishedRecords.prefix(room))
        }
        finishedRecords.removeAll(keepingCapacity: true)
    }

    private static let recycleBatch = 256

    // MARK: Work in

    /// Queues notifications (made by the feeding task, off this thread) and sends them. Loop thread.
    func enqueue(_ batch: [PendingNotification]) {
        loop.assertInLoop()
        if let down = endpointDown, !slots.contains(where: { $0.connection?.isReady == true }) {
            for pending in batch { finish(pending, outcome: .failed, reason: "ConnectionFailed: \(down.message)") }
            probeEndpoint()
            return
        }
        for pending in batch {
            if isStopping {
                finish(pending, outcome: .failed, reason: "NotSent")
            } else if pending.job.run.isCancelled {
                finish(pending, outcome: .cancelled, reason: "Cancelled")
            } else {
                waiting.append(pending)
            }
        }
        pump()
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
        var nowSeconds: Int64 = 0  // read only if a job has an expiration
        // By index, here and in ensureConnections: pump runs once per response, and a debug build's array
        // iterator allocates on every step (two allocations per notification, in the allocation test's figure).
        for index in slots.indices {
            guard let connection = slots[index].connection, connection.isReady, connection.isAcceptingRequests else {
                continue
            }
            while connection.outstanding < connection.streamLimit, let pending = waiting.popFirst() {
                if pending.job.run.isSuperseded {
                    // A newer update for the activity came before this one left: it is never sent.
                    finish(pending, outcome: .superseded, reason: "Superseded")
                } else if hasExpired(pending, nowSeconds: &nowSeconds) {
                    finish(pending, outcome: .expired, reason: "Expired")
                } else {
                    send(pending, on: connection, bearer: bearer, now: now)
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
        _ pending: PendingNotification, on connection: HTTP2ClientConnection, bearer: String?, now: UInt64
    ) {
        if pending.firstSentAt == 0 {
            pending.firstSentAt = now
            retryBudget.recordFirstAttempt(now: now * 1_000_000)
        }
        pending.attempts += 1
        // `:path` is "/3/device/" and the token, joined by the session in a buffer it reuses (no String per
        // notification). A broadcast's one recipient is its channel, which travels in a header, not the path.
        let broadcastPath = pending.job.broadcastPath
        let request = HTTP2Request(
            // A broadcast carries no apns-id (Apple lists only apns-request-id for it).
            head: pending.job.headerBlock(bearer: bearer), path: broadcastPath ?? "/3/device/",
            pathSuffix: broadcastPath == nil ? pending.token : "",
            apnsID: pending.job.isBroadcast ? nil : pending.apnsID, body: pending.job.body)
        if let slot = freeWireSlots.popLast() {
            pending.wireSlot = slot
            onWire[slot] = pending
        } else {
            pending.wireSlot = onWire.count
            onWire.append(pending)
        }
        pending.connection = connection
        // No closure per notification: the connection hands `pending` back to `request(_:didComplete:on:)`.
        pending.requestID = connection.submit(request, context: pending, handler: self)
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
            finish(pending, outcome: .delivered, status: 200, apnsUniqueID: http.apnsUniqueID)
        case .success(let http):
            let response = APNsResponse.parse(
                status: http.status, apnsID: http.apnsID, apnsUniqueID: http.apnsUniqueID, body: http.body)
            handle(pending, response: response, connection: connection)
        case .failure(.cancelled):
            // Only a cancelled job cancels its streams.
            finish(pending, outcome: .cancelled, reason: "Cancelled")
        case .failure(let failure):
            if failure.isSafeToRetry {
                // The server did not act on it: send again at once, without counting an attempt.
                pending.attempts -= 1
                if isStopping {
                    finish(pending, outcome: .failed, reason: "NotSent")
                } else if pending.job.run.isCancelled {
                    finish(pending, outcome: .cancelled, reason: "Cancelled")
                } else {
                    waiting.prepend(pending)
                }
            } else {
                pending.lastReason = Self.describe(failure)
                retryOrFail(pending)
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
            connection.close()
            retryOrFail(pending, immediately: true)
        } else if reasonClass.isRetryable {
            retryOrFail(pending)
        } else {
            finish(pending, outcome: .rejected, response: response)
        }
    }

    /// Sends again after a jittered backoff, or ends as `failed` when the attempts are used up.
    private func retryOrFail(_ pending: PendingNotification, immediately: Bool = false) {
        if pending.job.run.isCancelled {
            finish(pending, outcome: .cancelled, reason: "Cancelled")
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
        configuration.metrics?.retries.increment()
        if immediately {
            waiting.prepend(pending)
            return
        }
        guard retryBudget.tryRetry(now: loop.nowMilliseconds * 1_000_000) else {
            finish(
                pending, outcome: .failed, reason: "RetryBudgetExhausted: " + (pending.lastReason ?? "transient error"))
            return
        }
        let ceiling = min(
            configuration.retryCap.wholeMilliseconds,
            configuration.retryBase.wholeMilliseconds << UInt64(min(pending.attempts, 20)))
        let delay = ceiling == 0 ? 0 : UInt64.random(in: 0...ceiling, using: &random)
        pending.notBefore = loop.nowMilliseconds + delay
        delayed.append(pending)
        armDelayTimer(due: pending.notBefore)
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

    private func finish(
        _ pending: PendingNotification, outcome: NotificationOutcome, response: APNsResponse? = nil,
        reason: String? = nil,
        status: Int? = nil, apnsUniqueID: String? = nil
    ) {
        let latency = pending.firstSentAt == 0 ? 0 : Double(loop.nowMilliseconds - pending.firstSentAt)
        let isBroadcast = pending.job.isBroadcast
        var result = NotificationResult(
            jobID: pending.job.id, token: isBroadcast ? nil : pending.token, outcome: outcome,
            status: status ?? response?.status ?? pending.lastStatus,
            reason: response?.reason?.rawValue ?? reason ?? (outcome == .delivered ? nil : pending.lastReason),
            apnsID: response?.apnsID ?? (isBroadcast ? nil : pending.apnsID),
            apnsUniqueID: apnsUniqueID ?? response?.apnsUniqueID,
            attempts: pending.attempts,
            latencyMilliseconds: latency, timestamp: response?.timestamp)
        result.position = pending.position
        if isBroadcast { result.channel = pending.token }
        if let metrics = configuration.metrics {
            metrics.record(outcome, reason: result.reason)
            if result.status != nil { metrics.apnsRoundTrip.observe(latency / 1000) }
        }
        if outcome == .unregistered && !isBroadcast {
            let invalidated = InvalidatedToken(
                token: pending.token, reason: result.reason ?? "Unregistered", timestamp: result.timestamp,
                jobID: pending.job.id)
            shared.invalidTokens.yield(invalidated)
            shared.pruner?.add(invalidated)
        }
        // The permit comes back before the result is recorded: whoever the result wakes (the job's
        // summary, a caller reading `inFlight`) then sees nothing of it in flight.
        shared.limiter.release(1)
        configuration.metrics?.inFlight.set(shared.limiter.inFlight)
        pending.job.run.record(result)
        // Nothing refers to the record now: it left the waiting queue, the delayed list and the on-the-wire
        // table before it was finished, and its stream's completion has run.
        recycle(pending)
    }

    private func failAllWaiting(reason: String) {
        while let pending = waiting.popFirst() {
            finish(pending, outcome: .failed, reason: reason)
        }
    }

    private static func describe(_ failure: HTTP2StreamFailure) -> String {
        switch failure {
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
        let connection = HTTP2ClientConnection(
            loop: loop,
            configuration: HTTP2ClientConfiguration(
                host: configuration.endpoint.host, port: configuration.endpoint.port, tls: shared.tls.configuration,
                connectTimeoutMilliseconds: configuration.connectTimeout.wholeMilliseconds,
                maxConcurrentStreams: configuration.maxConcurrentStreams,
                pingIntervalMilliseconds: configuration.pingInterval.wholeMilliseconds,
                requestTimeout: configuration.requestTimeout),
            tlsContext: shared.tls)
        slot.connection = connection
        connection.onEvent = { [self, unowned slot, unowned connection] event in
            connectionEvent(event, slot: slot, connection: connection)
        }
    }

    private func connectionEvent(_ event: HTTP2ConnectionEvent, slot: ConnectionSlot, connection: HTTP2ClientConnection)
    {
        switch event {
        case .ready:
            endpointDown = nil
            if readyConnections.insert(ObjectIdentifier(connection)).inserted {
                configuration.metrics?.openConnections.increment()
            }
            slot.failures = 0
            consecutiveConnectFailures = 0
            pump()
        case .capacityAvailable:
            break  // the stream completion already pumped
        case .goaway:
            // Finish its streams there; new work goes to a fresh connection in the same slot.
            if slot.connection === connection {
                draining[ObjectIdentifier(connection)] = connection
                slot.connection = nil
                if !waiting.isEmpty { connect(slot) }
            }
        case .closed(let error):
            draining[ObjectIdentifier(connection)] = nil
            if readyConnections.remove(ObjectIdentifier(connection)) != nil {
                configuration.metrics?.openConnections.decrement()
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
        consecutiveConnectFailures += 1
        lastConnectError = error
        let permanent = [.tlsUnknownCA, .tlsHostnameMismatch, .tlsCertificateInvalid, .tlsNoH2, .tlsConfiguration]
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
            finish(pending, outcome: .cancelled, reason: "Cancelled")
        }
        var kept: [PendingNotification] = []
        for pending in delayed {
            if pending.job.run === run {
                finish(pending, outcome: .cancelled, reason: "Cancelled")
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
}
