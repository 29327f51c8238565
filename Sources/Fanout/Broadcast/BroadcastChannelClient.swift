import FanoutCore
package import FanoutTransport
import Foundation

/// The APNs channel management API of iOS 18 broadcast push: create, read, delete and list an app's broadcast
/// channels (docs/reference/broadcast-channels.md, "Channel management API"), over HTTP/2 to the management host with
/// the same provider token as pushes: the
/// process's one token for the key, which every `FanoutEngine` of the process signing with that key also sends
/// (`ProviderTokenCache.shared`), so creating a channel never mints a second token for the team.
///
/// One connection on its own loop thread, opened at the first call and again after it closes. Every call has a
/// deadline (`requestTimeout`). Apple's refusals come back as `BroadcastChannelError` with the reason.
public final class BroadcastChannelClient: Sendable {
    /// `api-manage-broadcast.push.apple.com:2196`.
    public static let production = APNsEndpoint(host: "api-manage-broadcast.push.apple.com", port: 2196)
    /// `api-manage-broadcast.sandbox.push.apple.com:2195`.
    public static let sandbox = APNsEndpoint(host: "api-manage-broadcast.sandbox.push.apple.com", port: 2195)

    /// The APNs environment this client manages channels in: `production`, `development` (Apple's sandbox host), or
    /// the management host's `HOST:PORT` for any other (a mock). A channel exists in one environment only, so the
    /// registry records this with each channel bound through the client, and a prune leaves alone the channels
    /// created elsewhere instead of taking APNs's `ChannelNotRegistered` here for their being gone.
    public let environment: String
    private let endpoint: APNsEndpoint
    private let loop: LoopThread
    private let tls: TLSClientContext
    /// Nil with a certificate: its requests carry no provider token.
    private let tokens: (any ProviderTokenSource)?
    private let requestTimeout: Duration
    private let proxy: APNsProxy?
    private let connection = ConnectionSlot()

    /// - Parameters:
    ///   - endpoint: the management host (`production`, `sandbox`, or a mock's `HOST:PORT`).
    ///   - credentials: the team's signing key, or the app's certificate, as the engine's (`ProviderCredentials`).
    ///   - caFile: a CA to trust instead of the system's (a mock's test CA).
    ///   - requestTimeout: each call's deadline, 1 ms to 1 day (else `FanoutError(.configuration)`).
    ///   - proxy: the HTTP proxy to reach the host through, as the engine's (`FanoutEngineConfiguration.proxy`).
    public convenience init(
        endpoint: APNsEndpoint, credentials: ProviderCredentials, caFile: String? = nil,
        requestTimeout: Duration = .seconds(30), proxy: APNsProxy? = nil
    ) throws(FanoutError) {
        let identity = try credentials.makeClientIdentity()
        try self.init(
            endpoint: endpoint,
            tokenSource: credentials.makeTokenCache(refreshAfter: .seconds(3000), minimumInterval: .seconds(1200)),
            identity: identity, caFile: caFile, requestTimeout: requestTimeout, proxy: proxy)
    }

    /// A client that takes its provider token from `tokenSource`: the one the team's engines send (`fanout serve
    /// --redis` gives both its team's `FleetProviderToken`, one token for every process on that Redis).
    /// `identity`: the certificate to authenticate with instead (then `tokenSource` is nil).
    package init(
        endpoint: APNsEndpoint, tokenSource: (any ProviderTokenSource)?, identity: TLSClientIdentity? = nil,
        caFile: String? = nil, requestTimeout: Duration = .seconds(30), proxy: APNsProxy? = nil
    ) throws(FanoutError) {
        try FanoutEngineConfiguration.checkTime("requestTimeout", requestTimeout)
        self.endpoint = endpoint
        self.proxy = proxy
        environment = endpoint.apnsEnvironment ?? endpoint.authority
        self.requestTimeout = requestTimeout
        tokens = tokenSource
        do {
            tls = try TLSClientContext(TLSClientConfiguration(caFile: caFile, identity: identity))
        } catch {
            throw FanoutError(.connection, "TLS: \(error)")
        }
        loop = LoopThread(name: "fanout-channels")
    }

    deinit {
        shutdown()
    }

    /// Closes the connection and stops the loop thread. Idempotent.
    public func shutdown() {
        guard !loop.hasExited else { return }
        let connection = self.connection
        try? loop.execute { connection.current?.close(immediately: true) }
        loop.shutdown()
    }

    /// Creates a channel and returns its id (base64, chosen by APNs).
    public func create(app: String, storagePolicy: ChannelStoragePolicy) async throws(BroadcastChannelError) -> String {
        let body = Array(#"{"message-storage-policy": \#(storagePolicy.rawValue), "push-type": "LiveActivity"}"#.utf8)
        let response = try await send("POST", path: "/1/apps/\(app)/channels", channelID: nil, body: body)
        guard response.status == 201, let channel = response.channelID, BroadcastRequest.isValidChannelID(channel)
        else {
            throw BroadcastChannelError(
                status: response.status, reason: nil, message: "create: no channel id in the answer")
        }
        return channel
    }

    /// A channel's storage policy.
    public func read(app: String, channelID: String) async throws(BroadcastChannelError) -> ChannelStoragePolicy {
        let response = try await send("GET", path: "/1/apps/\(app)/channels", channelID: channelID, body: [])
        guard let value = (try? JSONValue.parse(response.body))?["message-storage-policy"]?.int64Value,
            let policy = ChannelStoragePolicy(rawValue: Int(value))
        else {
            throw BroadcastChannelError(
                status: response.status, reason: nil, message: "read: no message-storage-policy in the answer")
        }
        return policy
    }

    /// Deletes a channel for good (APNs never reissues its id).
    public func delete(app: String, channelID: String) async throws(BroadcastChannelError) {
        _ = try await send("DELETE", path: "/1/apps/\(app)/channels", channelID: channelID, body: [])
    }

    /// Every channel id of the app (in this environment).
    public func list(app: String) async throws(BroadcastChannelError) -> [String] {
        let response = try await send("GET", path: "/1/apps/\(app)/all-channels", channelID: nil, body: [])
        guard let channels = (try? JSONValue.parse(response.body))?["channels"]?.arrayValue else {
            throw BroadcastChannelError(
                status: response.status, reason: nil, message: "list: no channels in the answer")
        }
        return channels.compactMap(\.stringValue)
    }

    // MARK: Requests

    private func send(_ method: String, path: String, channelID: String?, body: [UInt8])
        async throws(BroadcastChannelError) -> HTTP2Response
    {
        guard !path.contains(" "), !path.utf8.contains(where: ASCIIBytes.isForbiddenInHeaderValue) else {
            throw BroadcastChannelError(status: nil, reason: nil, message: "the app id is not a bundle id")
        }
        if let channelID, !BroadcastRequest.isValidChannelID(channelID) {
            throw BroadcastChannelError(status: nil, reason: "BadChannelId", message: "not a base64 channel id")
        }
        // A token APNs calls expired or invalid is refreshed (as the source allows: one per 20 minutes) and the
        // request sent once more on a new connection, as the engine does; a second refusal is the caller's.
        for attempt in 1...2 {
            var fields: [(name: String, value: String, neverIndex: Bool)] = [
                (":method", method, false), (":scheme", "https", false), (":authority", endpoint.authority, false),
            ]
            if let tokens {
                do {
                    fields.append(("authorization", "bearer " + (try tokens.currentToken()), true))
                } catch {
                    throw BroadcastChannelError(status: nil, reason: nil, message: "provider token: \(error)")
                }
            }
            fields.append(("apns-request-id", UUID().uuidString.lowercased(), false))
            if let channelID { fields.append(("apns-channel-id", channelID, false)) }
            if !body.isEmpty { fields.append(("content-type", "application/json", false)) }
            let request = HTTP2Request(head: HeaderBlock(fields), path: path, body: SharedBody(body))
            switch await submit(request, newConnection: attempt > 1) {
            case .failure(let failure):
                throw BroadcastChannelError(status: nil, reason: nil, message: "\(method) \(path): \(failure)")
            case .success(let response) where (200..<300).contains(response.status):
                return response
            case .success(let response):
                let reason = (try? JSONValue.parse(response.body))?["reason"]?.stringValue
                if attempt == 1, let tokens, reason == "ExpiredProviderToken" || reason == "InvalidProviderToken" {
                    tokens.refreshAfterRejection()
                    continue
                }
                throw BroadcastChannelError(
                    status: response.status, reason: reason,
                    message: "\(method) \(path): \(response.status) \(reason ?? "")")
            }
        }
        preconditionFailure("the second attempt returns or throws")
    }

    /// - Parameter newConnection: close the current connection (gracefully) and open another for this request.
    private func submit(_ request: HTTP2Request, newConnection: Bool = false) async
        -> Result<HTTP2Response, HTTP2StreamFailure>
    {
        let loop = self.loop
        let connection = self.connection
        var connectionConfiguration = HTTP2ClientConfiguration(
            host: endpoint.host, port: endpoint.port, tls: tls.configuration, maxConcurrentStreams: 100,
            requestTimeout: requestTimeout)
        connectionConfiguration.proxy = proxy?.proxy
        let configuration = connectionConfiguration
        let tls = self.tls
        // The response is made on the loop thread and read here after the await (HandOffFence says why the fence).
        let fence = HandOffFence()
        defer { fence.acquire() }
        return await withCheckedContinuation { continuation in
            do {
                try loop.execute {
                    let open: HTTP2ClientConnection
                    if newConnection, let current = connection.current {
                        current.close()
                        connection.current = nil
                    }
                    if let current = connection.current, current.isAcceptingRequests {
                        open = current
                    } else {
                        open = HTTP2ClientConnection(loop: loop, configuration: configuration, tlsContext: tls)
                        connection.current = open
                    }
                    _ = open.submit(request) { response in
                        fence.release()
                        continuation.resume(returning: response)
                    }
                }
            } catch {
                continuation.resume(
                    returning: .failure(.notSent(TransportError(.cancelled, "the channel client is shut down"))))
            }
        }
    }
}

/// The client's one connection. `@unchecked Sendable`: read and written only on the client's loop thread.
private final class ConnectionSlot: @unchecked Sendable {
    var current: HTTP2ClientConnection?
}

/// A channel management call APNs refused (or that never got an answer), with Apple's reason when there was one:
/// `ChannelNotRegistered`, `BadChannelId`, `CannotCreateChannelConfig`, `MissingChannelId`, `InvalidPushType`,
/// `FeatureNotEnabled`, `TopicDisallowed`, the provider-token reasons, ...
public struct BroadcastChannelError: Error, Sendable, CustomStringConvertible, Equatable {
    /// The HTTP status, nil when no answer came.
    public var status: Int?
    /// Apple's `reason`, e.g. `ChannelNotRegistered`.
    public var reason: String?
    public var message: String

    public init(status: Int?, reason: String?, message: String) {
        self.status = status
        self.reason = reason
        self.message = message
    }

    public var description: String { message }
}
