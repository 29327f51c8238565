import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation

/// The part of mock-apns every loop shares: configuration, checks, faults, counters.
final class MockShared: Sendable {
    let options: MockOptions
    let validator = APNsRequestValidator()
    let broadcastValidator = BroadcastRequestValidator()
    let channelValidator = ChannelRequestValidator()
    let verifier: ProviderTokenVerifier?
    let unregistered: [String: UnregisteredDate]
    let stats: MockStats
    let record: MockRecord?
    let faults: FaultPlan
    let channels: MockChannels

    init(
        options: MockOptions, verifier: ProviderTokenVerifier?, unregistered: [String: UnregisteredDate],
        stats: MockStats,
        record: MockRecord?, channels: MockChannels
    ) {
        self.options = options
        self.channels = channels
        self.verifier = verifier
        self.unregistered = unregistered
        self.stats = stats
        self.record = record
        faults = FaultPlan(options: options)
    }
}

/// Per-connection state, kept in the connection's `userInfo`.
final class MockConnectionState {
    /// A valid provider token was seen: the stream limit was raised from 1.
    var authenticated = false
    /// `--throttle-after-reject` dropped the limit to 1 after a rejection.
    var throttled = false
    /// The last valid provider token on this connection, so the stats count each distinct one once per change.
    var lastProviderToken: String?
    /// That token's `authorization` value as sent and its `iat`: a client sends the same value on every request
    /// until it refreshes its token, and a request whose value has these bytes needs only its age checked.
    var lastAuthorization: [UInt8] = []
    var lastIssuedAt: Int64?
    /// The client certificate the connection's TLS handshake verified (`--client-ca`); nil: none.
    var clientCertificate: CertificateDetails?
}

extension MockShared {
    /// The provider-token check of both listeners: nil when the token verifies (or checks are off), else the 403
    /// with APNs's reason. The first good token on a connection raises its stream limit from 1 to `--max-streams`.
    func authenticate(
        _ request: HTTP2ServerRequest, connection: HTTP2ServerConnection, state: MockConnectionState
    ) -> MockAnswer? {
        // A connection whose client certificate verified against `--client-ca` is authenticated by it, as APNs's
        // certificate-based connections are: no provider token is needed (one sent anyway is ignored).
        if let certificate = state.clientCertificate {
            if certificate.development || certificate.production,
                !(options.environment == .development ? certificate.development : certificate.production)
            {
                return MockAnswer(status: 403, reason: "BadCertificateEnvironment")
            }
            return nil
        }
        // `verifier?.maxAge`, not `guard let verifier`: binding the verifier would copy it (three references) per
        // request.
        guard let maxAge = verifier?.maxAge else {
            // `--client-ca` with `--no-auth`: a client certificate is the only way in.
            return options.clientCAPath == nil ? nil : MockAnswer(status: 403, reason: "MissingProviderToken")
        }
        // The connection's last valid token again: compare its bytes and check its age, without making a String of
        // it or hashing it into the shared cache (which would be a quarter of the mock's CPU per request).
        if let issuedAt = state.lastIssuedAt,
            APNsRequestValidator.authorization(in: request.head, equals: state.lastAuthorization)
        {
            return ProviderTokenVerifier.ageRejection(issuedAt: issuedAt, now: Int64(time(nil)), maxAge: maxAge).map {
                MockAnswer(status: 403, reason: $0)
            }
        }
        guard let verifier else { return nil }
        guard let token = APNsRequestValidator.bearerToken(in: request.head) else {
            return MockAnswer(status: 403, reason: "MissingProviderToken")
        }
        let result = verifier.verify(token, now: Int64(time(nil)))
        if let reason = result.apnsReason { return MockAnswer(status: 403, reason: reason) }
        if case .valid(let claims) = result {
            state.lastIssuedAt = claims.issuedAt
            state.lastAuthorization = APNsRequestValidator.authorizationBytes(in: request.head) ?? []
        }
        if token != state.lastProviderToken {
            state.lastProviderToken = token
            stats.recordProviderToken(token)
        }
        if !state.authenticated {
            state.authenticated = true
            if !state.throttled { connection.setMaxConcurrentStreams(options.maxStreams) }
        }
        return nil
    }
}

/// An answer to one request.
struct MockAnswer {
    var status: Int
    var reason: String?
    /// The request that passed the checks (its token is where `checked.token` says in the request's head).
    var checked: CheckedDeviceRequest?
    var timestamp: Int64?
}

/// Answers requests as APNs does, on one loop: provider-token check, request validation, then the
/// faults the options ask for.
final class MockRequestHandler: HTTP2ServerHandler {
    private let shared: MockShared
    private let loop: LoopThread
    private let delayed: DelayedResponses?
    /// This loop's counts, which no other loop writes.
    private let stats: MockStats.LoopStats
    /// Ids for answers; per loop, so no locking and no system call per request.
    @exclusivity(unchecked) private var random = FastRandomGenerator()
    /// This loop's cache of the last body's JSON shape.
    private let shapes = PayloadShapeCache()
    /// The headers of an accepted answer, as bytes, refilled per request (no string is made for them).
    private let acceptedFields = HTTP2ResponseFields()

    init(shared: MockShared, loop: LoopThread) {
        self.shared = shared
        self.loop = loop
        stats = shared.stats.makeLoopStats()
        delayed =
            shared.options.latencyMilliseconds > 0
            ? DelayedResponses(loop: loop, delayMilliseconds: shared.options.latencyMilliseconds) : nil
    }

    func serverConnection(_ connection: HTTP2ServerConnection, didReceive request: HTTP2ServerRequest) {
        let state = connectionState(connection)
        let decision = shared.faults.next()
        if decision.refuse {
            shared.stats.recordRefused()
            connection.refuse(streamID: request.streamID)
            return
        }
        if decision.blackhole {
            // Left open: the client's deadline resets it (or the connection's end closes it).
            shared.stats.recordBlackholed()
            return
        }
        if decision.drop {
            shared.stats.recordDrop()
            connection.drop()
            return
        }
        if isBroadcastPath(request.head) {
            respondToBroadcast(request, connection: connection, state: state, decision: decision)
            return
        }
        let answer = self.answer(request, connection: connection, state: state, injected: decision.failure)
        if answer.status == 200, let checked = answer.checked, delayed == nil, shared.record == nil,
            !shared.options.capturePayloads
        {
            respondAccepted(request, checked, reason: answer.reason, connection: connection, state: state)
            finish(connection, decision: decision)
            return
        }
        // The request's own apns-id (valid when it passed the checks; echoed as sent otherwise), or a new one.
        let requestID =
            if let checked = answer.checked { checked.apnsID.map(request.head.string) } else {
                request.head.value(of: APNsHeaderName.apnsID)
            }
        let id = requestID ?? AnswerID.generate(using: &random)
        var headers: [(name: String, value: String)]
        var body: [UInt8] = []
        var token: UInt64?
        if answer.status == 200 {
            headers = [("apns-id", id), ("apns-unique-id", AnswerID.generate(using: &random))]
            if let checked = answer.checked {
                token = request.head.bytes.withUnsafeBufferPointer {
                    MockStats.digest(hex: UnsafeBufferPointer(rebasing: $0[checked.token]))
                }
                if shared.record != nil || shared.options.capturePayloads {
                    let hex = tokenHex(request.head, checked)
                    shared.record?.append(token: hex, apnsID: id)
                    if shared.options.capturePayloads { shared.stats.recordPayload(request.body, token: hex) }
                }
            }
        } else {
            body = APNsResponse.errorBody(
                reason: APNsReason(answer.reason ?? "InternalServerError"), timestamp: answer.timestamp)
            headers = [("apns-id", id), ("content-type", "application/json")]
        }
        stats.recordAnswer(
            // Only a client's apns-id can be sent twice: one this mock generated (122 random bits) is not counted.
            status: answer.status, reason: answer.reason, token: token, apnsID: requestID.map(Self.digest),
            priority: answer.checked?.priority)
        adjustThrottle(connection, state: state, accepted: answer.status == 200)
        finish(request, connection: connection, status: answer.status, headers: headers, body: body, decision: decision)
    }

    /// Answers an accepted request when nothing needs its ids as strings (no `--record`, `--capture-payloads` or
    /// `--latency-ms`): as the general path does, with the ids written straight into the answer's header bytes.
    private func respondAccepted(
        _ request: HTTP2ServerRequest, _ checked: CheckedDeviceRequest, reason: String?,
        connection: HTTP2ServerConnection, state: MockConnectionState
    ) {
        acceptedFields.reset(status: 200)
        var token: UInt64 = 0
        var apnsID: UInt64?
        request.head.bytes.withUnsafeBufferPointer { bytes in
            // The request's own apns-id (it passed the checks), or a new one.
            if let range = checked.apnsID {
                let id = UnsafeBufferPointer(rebasing: bytes[range])
                acceptedFields.append(name: "apns-id", value: UnsafeRawBufferPointer(id), indexed: false)
                // Only a client's apns-id can be sent twice: one this mock generated is not counted.
                apnsID = MockStats.digest(hex: id)
            } else {
                AnswerID.write(
                    using: &random,
                    into: acceptedFields.appendValue(name: "apns-id", count: APNsID.length, indexed: false))
            }
            token = MockStats.digest(hex: UnsafeBufferPointer(rebasing: bytes[checked.token]))
        }
        AnswerID.write(
            using: &random,
            into: acceptedFields.appendValue(name: "apns-unique-id", count: APNsID.length, indexed: false))
        stats.recordAnswer(status: 200, reason: reason, token: token, apnsID: apnsID, priority: checked.priority)
        adjustThrottle(connection, state: state, accepted: true)
        connection.respond(streamID: request.streamID, fields: acceptedFields)
    }

    /// The digest of an apns-id for the duplicate count (one that passed the checks: a UUID).
    private static func digest(_ apnsID: String) -> UInt64 {
        var apnsID = apnsID
        return apnsID.withUTF8 { MockStats.digest(hex: $0) }
    }

    /// Whether the request's path is a broadcast one (`/4/...`), read from its bytes.
    private func isBroadcastPath(_ head: HeaderView) -> Bool {
        head.bytes.withUnsafeBufferPointer { bytes in
            let path = UnsafeBufferPointer(rebasing: bytes[head.path])
            return path.count >= 3 && path[0] == UInt8(ascii: "/") && path[1] == UInt8(ascii: "4")
                && path[2] == UInt8(ascii: "/")
        }
    }

    /// The checked request's device token, lowercased.
    private func tokenHex(_ head: HeaderView, _ checked: CheckedDeviceRequest) -> String {
        head.bytes.withUnsafeBufferPointer { DeviceToken(utf8: UnsafeBufferPointer(rebasing: $0[checked.token]))!.hex }
    }

    /// Sends the answer (now, or after `--latency-ms`), then GOAWAY when the fault plan says so.
    private func finish(
        _ request: HTTP2ServerRequest, connection: HTTP2ServerConnection, status: Int,
        headers: [(name: String, value: String)], body: [UInt8], decision: FaultPlan.Decision
    ) {
        if let delayed {
            delayed.add(
                connection: connection, streamID: request.streamID, status: status, headers: headers, body: body)
        } else {
            connection.respond(streamID: request.streamID, status: status, headers: headers, body: body)
        }
        finish(connection, decision: decision)
    }

    /// GOAWAY after an answer, when the fault plan says so.
    private func finish(_ connection: HTTP2ServerConnection, decision: FaultPlan.Decision) {
        if decision.goaway {
            shared.stats.recordGoaway()
            connection.sendGoaway(reason: "Shutdown")
        }
    }

    /// A broadcast send (`POST /4/broadcasts/apps/{bundleId}`): provider token, then `BroadcastRequestValidator`
    /// against this environment's channels, then an injected failure. Answers carry `apns-request-id` (the
    /// request's, or a new one), and `apns-unique-id` on success; counted per channel in the stats.
    private func respondToBroadcast(
        _ request: HTTP2ServerRequest, connection: HTTP2ServerConnection, state: MockConnectionState,
        decision: FaultPlan.Decision
    ) {
        var status = 200
        var reason: String?
        var channel: String?
        var stored = false
        var priority: Int?
        if let refusal = shared.authenticate(request, connection: connection, state: state) {
            (status, reason) = (refusal.status, refusal.reason)
        } else if request.bodyTruncated {
            (status, reason) = (413, APNsReason.payloadTooLarge.rawValue)
        } else {
            let channels = shared.channels
            switch shared.broadcastValidator.check(
                method: request.method, path: request.path, headers: request.headers, body: request.body,
                channelPolicy: { channels.policy(app: $0, channel: $1) })
            {
            case .failure(let rejection):
                (status, reason) = (rejection.status, rejection.reason.rawValue)
            case .success(let broadcast):
                if let injected = decision.failure {
                    (status, reason) = (injected.status, injected.reason)
                } else {
                    channel = broadcast.channelID
                    priority = broadcast.priority
                    // What APNs keeps for devices that are offline: the latest message of a policy-1 channel, sent
                    // with an expiration still ahead (0 is a single attempt).
                    stored =
                        broadcast.policy == .mostRecentMessageStored
                        && broadcast.expiration > Int64(Date().timeIntervalSince1970)
                }
            }
        }
        let requestID =
            BroadcastRules.echoedRequestID(in: request.headers) ?? APNsID.generate(using: &random)
        var headers: [(name: String, value: String)] = [("apns-request-id", requestID)]
        var body: [UInt8] = []
        if status == 200 {
            headers.append(("apns-unique-id", APNsID.generate(using: &random)))
        } else {
            body = APNsResponse.errorBody(reason: APNsReason(reason ?? "InternalServerError"))
            headers.append(("content-type", "application/json"))
        }
        shared.stats.recordBroadcast(
            status: status, reason: reason, channel: channel, stored: stored, priority: priority)
        adjustThrottle(connection, state: state, accepted: status == 200)
        finish(request, connection: connection, status: status, headers: headers, body: body, decision: decision)
    }

    private func answer(
        _ request: HTTP2ServerRequest, connection: HTTP2ServerConnection, state: MockConnectionState,
        injected: InjectedFailure?
    ) -> MockAnswer {
        if let refusal = shared.authenticate(request, connection: connection, state: state) { return refusal }
        if request.bodyTruncated { return MockAnswer(status: 413, reason: "PayloadTooLarge") }
        let checked: CheckedDeviceRequest
        switch request.body.withUnsafeBufferPointer({ shared.validator.check(request.head, body: $0, shapes: shapes) })
        {
        case .failure(let rejection):
            return MockAnswer(status: rejection.status, reason: rejection.reason.rawValue)
        case .success(let request):
            checked = request
        }
        if let certificate = state.clientCertificate, !certificate.topics.isEmpty {
            // A certificate sends for the topics it names only.
            let topic = request.head.bytes.withUnsafeBufferPointer {
                String(decoding: $0[checked.topic], as: UTF8.self)
            }
            if !certificate.covers(topic: topic) { return MockAnswer(status: 400, reason: "TopicDisallowed") }
        }
        if let injected {
            return MockAnswer(status: injected.status, reason: injected.reason, checked: checked)
        }
        if !shared.unregistered.isEmpty, let date = shared.unregistered[tokenHex(request.head, checked)] {
            let milliseconds: Int64
            switch date {
            case .answered: milliseconds = Int64(Date().timeIntervalSince1970 * 1000)
            case .fixed(let fixed): milliseconds = fixed
            }
            return MockAnswer(status: 410, reason: "Unregistered", checked: checked, timestamp: milliseconds)
        }
        return MockAnswer(status: 200, checked: checked)
    }

    /// APNs drops a connection's stream limit to 1 after a rejection and restores it after the
    /// next accepted push (radar 27870881, Pushy #732).
    private func adjustThrottle(_ connection: HTTP2ServerConnection, state: MockConnectionState, accepted: Bool) {
        guard shared.options.throttleAfterReject else { return }
        if !accepted && !state.throttled {
            state.throttled = true
            connection.setMaxConcurrentStreams(1)
        } else if accepted && state.throttled {
            state.throttled = false
            connection.setMaxConcurrentStreams(
                state.authenticated || shared.verifier == nil ? shared.options.maxStreams : 1)
        }
    }

    private func connectionState(_ connection: HTTP2ServerConnection) -> MockConnectionState {
        // Only this handler sets userInfo, always to a MockConnectionState: skip the dynamic cast.
        if let state = connection.userInfo { return unsafeDowncast(state, to: MockConnectionState.self) }
        let state = MockConnectionState()
        connection.userInfo = state
        shared.stats.recordConnection()
        // Without token checks the window was opened in the first SETTINGS already.
        state.authenticated = shared.verifier == nil
        state.clientCertificate = connection.peerCertificate
        if state.clientCertificate != nil, !state.authenticated {
            // The certificate authenticated the connection in its handshake: no token to wait for.
            state.authenticated = true
            connection.setMaxConcurrentStreams(shared.options.maxStreams)
        }
        return state
    }

    func serverConnectionStreamLimitViolated(_ connection: HTTP2ServerConnection) {
        shared.stats.recordViolation()
    }

    func serverConnectionDidClose(_ connection: HTTP2ServerConnection, error: TransportError?) {}
}

/// `--latency-ms`: answers leave a fixed delay after their request, in arrival order, driven by
/// one timer per loop rather than one per request.
private final class DelayedResponses {
    private struct Pending {
        let due: UInt64
        let connection: HTTP2ServerConnection
        let streamID: Int32
        let status: Int
        let headers: [(name: String, value: String)]
        let body: [UInt8]
    }

    private let loop: LoopThread
    private let delay: UInt64
    private let timer: LoopTimer
    private var queue: [Pending] = []
    private var head = 0
    private var armed = false

    init(loop: LoopThread, delayMilliseconds: UInt64) {
        self.loop = loop
        delay = delayMilliseconds
        timer = LoopTimer(loop: loop)
    }

    func add(
        connection: HTTP2ServerConnection, streamID: Int32, status: Int, headers: [(name: String, value: String)],
        body: [UInt8]
    ) {
        queue.append(
            Pending(
                due: loop.nowMilliseconds + delay, connection: connection, streamID: streamID, status: status,
                headers: headers, body: body))
        arm()
    }

    private func arm() {
        guard !armed, head < queue.count else { return }
        armed = true
        let now = loop.nowMilliseconds
        let due = queue[head].due
        timer.schedule(milliseconds: due > now ? due - now : 0) { [self] in
            armed = false
            let now = loop.nowMilliseconds
            while head < queue.count, queue[head].due <= now {
                let item = queue[head]
                head += 1
                item.connection.respond(
                    streamID: item.streamID, status: item.status, headers: item.headers, body: item.body)
            }
            if head == queue.count {
                queue.removeAll(keepingCapacity: true)
                head = 0
            }
            arm()
        }
    }
}

/// The timestamp mock-apns puts in a 410 Unregistered body for a token of its `--unregistered` file: the time it
/// answers, or the Unix milliseconds the file's line gives (APNs dates a 410 with the time it learned the token was
/// no longer valid, which later sends do not move).
enum UnregisteredDate: Sendable, Equatable {
    case answered
    case fixed(Int64)
}
