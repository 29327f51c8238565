import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation

/// Answers the channel-management API on the management listener (`--manage-listen`), as APNs's
/// `api-manage-broadcast` hosts do: provider token (the push listener's check and 403 reasons), then
/// `ChannelRequestValidator`, then the operation on `MockChannels`. Faults and latency options apply to the push
/// listener only. Every answer carries `apns-request-id`: the request's, or a new one.
final class MockManageHandler: HTTP2ServerHandler {
    private let shared: MockShared
    /// Request ids; per loop, so no locking.
    private var random = FastRandomGenerator()

    init(shared: MockShared) {
        self.shared = shared
    }

    func serverConnection(_ connection: HTTP2ServerConnection, didReceive request: HTTP2ServerRequest) {
        let state = connectionState(connection)
        var status: Int
        var reason: String?
        var headers: [(name: String, value: String)] = []
        var body: [UInt8] = []
        if let refusal = shared.authenticate(request, connection: connection, state: state) {
            (status, reason) = (refusal.status, refusal.reason)
        } else {
            switch shared.channelValidator.check(
                method: request.method, path: request.path, headers: request.headers, body: request.body)
            {
            case .failure(let rejection):
                (status, reason) = (rejection.status, rejection.reason.rawValue)
            case .success(let channelRequest):
                (status, reason, headers, body) = perform(channelRequest)
            }
        }
        let requestID = BroadcastRules.echoedRequestID(in: request.headers) ?? APNsID.generate(using: &random)
        headers.insert(("apns-request-id", requestID), at: 0)
        if let reason {
            body = APNsResponse.errorBody(reason: APNsReason(reason))
            headers.append(("content-type", "application/json"))
        }
        connection.respond(streamID: request.streamID, status: status, headers: headers, body: body)
    }

    /// Applies a valid request to the channels: status, error reason, extra headers, body.
    private func perform(
        _ request: ChannelRequest
    ) -> (status: Int, reason: String?, headers: [(name: String, value: String)], body: [UInt8]) {
        let channels = shared.channels
        let json = [(name: "content-type", value: "application/json")]
        switch request.operation {
        case .create(let policy):
            guard let id = channels.create(app: request.bundleID, policy: policy) else {
                return (400, APNsReason.cannotCreateChannelConfig.rawValue, [], [])
            }
            return (201, nil, [("apns-channel-id", id)], [])
        case .read(let channelID):
            guard let policy = channels.policy(app: request.bundleID, channel: channelID) else {
                return (400, APNsReason.channelNotRegistered.rawValue, [], [])
            }
            let text = #"{"message-storage-policy":\#(policy.rawValue),"push-type":"LiveActivity"}"#
            return (200, nil, json, Array(text.utf8))
        case .delete(let channelID):
            guard channels.delete(app: request.bundleID, channel: channelID) else {
                return (400, APNsReason.channelNotRegistered.rawValue, [], [])
            }
            return (204, nil, [], [])
        case .list:
            // Base64 ids need no JSON escaping.
            let ids = channels.list(app: request.bundleID).map { "\"\($0)\"" }.joined(separator: ",")
            return (200, nil, json, Array(#"{"channels":[\#(ids)]}"#.utf8))
        }
    }

    private func connectionState(_ connection: HTTP2ServerConnection) -> MockConnectionState {
        if let state = connection.userInfo { return unsafeDowncast(state, to: MockConnectionState.self) }
        let state = MockConnectionState()
        connection.userInfo = state
        state.authenticated = shared.verifier == nil
        return state
    }

    func serverConnectionStreamLimitViolated(_ connection: HTTP2ServerConnection) {
        shared.stats.recordViolation()
    }

    func serverConnectionDidClose(_ connection: HTTP2ServerConnection, error: TransportError?) {}
}
