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
    let unregistered: Set<String>
    let stats: MockStats
    let record: MockRecord?
    let faults: FaultPlan
    let channels: MockChannels

    init(
        options: MockOptions, verifier: ProviderTokenVerifier?, unregistered: Set<String>, stats: MockStats,
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
}

extension MockShared {
    /// The provider-token check of both listeners: nil when the token verifies (or checks are off), else the 403
    /// with APNs's reason. The first good token on a connection raises its stream limit from 1 to `--max-streams`.
    func authenticate(
        _ request: HTTP2ServerRequest, connection: HTTP2ServerConnection, state: MockConnectionState
    ) -> MockAnswer? {
        guard let verifier else { return nil }
        guard let token = APNsRequestValidator.bearerToken(in: request.headers) else {
            return MockAnswer(status: 403, reason: "MissingProviderToken")
        }
        let result = verifier.verify(token, now: Int64(time(nil)))
        if let reason = result.apnsReason { return MockAnswer(status: 403, reason: reason) }
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
    var token: String?
    var timestamp: Int64?
    /// `apns-priority` of an accepted request.
    var priority: Int?
}

/// Answers requests as APNs does, on one loop: provider-token check, request validation, then the
/// faults the options ask for.
final class MockRequestHandler: HTTP2ServerHandler {
    private let shared: MockShared
    private let loop: LoopThread
    private let delayed: DelayedResponses?
    /// Ids for answers; per loop, so no locking and no system call per request.
    private var random = FastRandomGenerator()

    init(shared: MockShared, loop: LoopThread) {
        self.shared = shared
        self.loop = loop
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
        if BroadcastRequestValidator.isBroadcastPath(request.path) {
            respondToBroadcast(request, connection: connection, state: state, decision: decision)
            return
        }
        let answer = self.answer(request, connection: connection, state: state, injected: decision.failure)
        let apnsID = request.headers.first { $0.name == "apns-id" }?.value ?? APNsID.generate(using: &random)
        var headers: [(name: String, value: String)] = [("apns-id", apnsID)]
        var body: [UInt8] = []
        if answer.status == 200 {
            headers.append(("apns-unique-id", APNsID.generate(using: &random)))
            if let token = answer.token {
                shared.record?.append(token: token, apnsID: apnsID)
                if shared.options.capturePayloads { shared.stats.recordPayload(request.body, token: token) }
            }
        } else {
            body = APNsResponse.errorBody(
                reason: APNsReason(answer.reason ?? "InternalServerError"), timestamp: answer.timestamp)
            headers.append(("content-type", "application/json"))
        }
        shared.stats.recordAnswer(
            status: answer.status, reason: answer.reason, token: answer.token, apnsID: apnsID, priority: answer.priority
        )
        adjustThrottle(connection, state: state, accepted: answer.status == 200)
        finish(request, connection: connection, status: answer.status, headers: headers, body: body, decision: decision)
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
        shared.stats.recordBroadcast(status: status, reason: reason, channel: channel)
        adjustThrottle(connection, state: state, accepted: status == 200)
        finish(request, connection: connection, status: status, headers: headers, body: body, decision: decision)
    }

    private func answer(
        _ request: HTTP2ServerRequest, connection: HTTP2ServerConnection, state: MockConnectionState,
        injected: InjectedFailure?
    ) -> MockAnswer {
        if let refusal = shared.authenticate(request, connection: connection, state: state) { return refusal }
        if request.bodyTruncated { return MockAnswer(status: 413, reason: "PayloadTooLarge") }
        let validated: ValidatedDeviceRequest
        switch shared.validator.check(
            method: request.method, path: request.path, headers: request.headers, body: request.body)
        {
        case .failure(let rejection):
            return MockAnswer(status: rejection.status, reason: rejection.reason.rawValue)
        case .success(let request):
            validated = request
        }
        let token = validated.deviceToken.hex
        if let injected {
            return MockAnswer(status: injected.status, reason: injected.reason, token: token)
        }
        if !shared.unregistered.isEmpty && shared.unregistered.contains(token) {
            let milliseconds = Int64(Date().timeIntervalSince1970 * 1000)
            return MockAnswer(status: 410, reason: "Unregistered", token: token, timestamp: milliseconds)
        }
        return MockAnswer(status: 200, token: token, priority: validated.priority)
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
