public import FanoutCore
import FanoutTransport
import Foundation
import Synchronization

/// How an `APNsClient` connects.
public struct APNsClientConfiguration: Sendable {
    public var endpoint: APNsEndpoint
    /// Provider-token credentials; nil sends no `authorization` header.
    public var credentials: ProviderCredentials?
    /// PEM CA file to trust instead of the system store (mock-apns's `ca.pem`). Verification stays on.
    public var caFile: String?
    public var connectTimeoutMilliseconds: UInt64 = 10_000
    public var handshakeTimeoutMilliseconds: UInt64 = 10_000
    /// Upper bound on concurrent streams per connection.
    public var maxConcurrentStreams = 1000

    public init(endpoint: APNsEndpoint, credentials: ProviderCredentials? = nil, caFile: String? = nil) {
        self.endpoint = endpoint
        self.credentials = credentials
        self.caFile = caFile
    }
}

/// Sends single notifications over one HTTP/2 connection on its own loop thread: what `fanout push`
/// and simple gateway calls use. The fan-out engine builds on the same transport with pools.
public final class APNsClient: Sendable {
    public let configuration: APNsClientConfiguration
    private let loop: LoopThread
    private let tls: TLSClientContext
    private let tokens: ProviderTokenCache?
    private let state: LoopBound
    private let shutdownStarted = Atomic<Bool>(false)

    /// Loop-confined state, touched only on `loop`.
    private final class LoopBound: @unchecked Sendable {
        var connection: HTTP2ClientConnection?
        var isShutDown = false
    }

    /// Loads the trust store and the signing key. Throws on a bad CA file or key: nothing is sent.
    public init(configuration: APNsClientConfiguration) throws(FanoutError) {
        self.configuration = configuration
        do {
            tls = try TLSClientContext(
                TLSClientConfiguration(
                    caFile: configuration.caFile,
                    handshakeTimeoutMilliseconds: configuration.handshakeTimeoutMilliseconds))
        } catch {
            throw FanoutError(.connection, error.message)
        }
        tokens = try configuration.credentials?.makeTokenCache()
        loop = LoopThread(name: "apns-client")
        state = LoopBound()
    }

    /// Sends one notification and returns APNs's answer (any status). Throws for a notification that
    /// is invalid before sending, and for connection failures. A stream the server refused or did
    /// not process (GOAWAY) is sent once more on a new connection.
    public func send(_ notification: PushNotification) async throws(FanoutError) -> APNsResponse {
        guard let token = DeviceToken(notification.deviceToken) else {
            throw FanoutError(.invalidNotification, "device token is not 64 to 200 hex digits")
        }
        var headers = notification.headers
        if let tokens {
            do {
                headers.bearerToken = try tokens.currentToken()
            } catch {
                throw FanoutError(.credentials, "cannot make a provider token: \(error)")
            }
        }
        if headers.apnsID == nil { headers.apnsID = APNsID.generate() }
        let fields: [HeaderField]
        do {
            fields = try headers.headerFields(deviceToken: token, authority: configuration.endpoint.authority)
        } catch {
            throw FanoutError(.invalidNotification, error.description)
        }
        let limit = headers.pushType.payloadSizeLimit
        guard notification.payload.count <= limit else {
            throw FanoutError(
                .invalidNotification, "payload is \(notification.payload.count) bytes, over the \(limit)-byte limit")
        }
        let request = HTTP2Request(
            head: HeaderBlock(
                fields.filter { $0.name != ":path" && $0.name != "apns-id" }.map { ($0.name, $0.value, $0.neverIndex) }),
            path: NotificationHeaders.path(for: token), apnsID: headers.apnsID, body: SharedBody(notification.payload))

        var attempt = 0
        while true {
            attempt += 1
            let result = await submit(request)
            switch result {
            case .success(let response):
                return APNsResponse.parse(
                    status: response.status, apnsID: response.apnsID, apnsUniqueID: response.apnsUniqueID,
                    body: response.body)
            case .failure(let failure):
                if failure.isSafeToRetry && attempt < 3 { continue }
                throw Self.error(for: failure, endpoint: configuration.endpoint)
            }
        }
    }

    private static func error(for failure: HTTP2StreamFailure, endpoint: APNsEndpoint) -> FanoutError {
        switch failure {
        case .notSent(let error), .connectionLost(let error):
            if error.kind == .cancelled { return FanoutError(.shutdown, "client is shut down") }
            return FanoutError(.connection, "\(endpoint): \(error.message)")
        case .refused:
            return FanoutError(.connection, "\(endpoint): stream refused (REFUSED_STREAM)")
        case .notProcessed:
            return FanoutError(.connection, "\(endpoint): server closed the connection (GOAWAY) before processing")
        case .reset(let code):
            return FanoutError(.connection, "\(endpoint): stream reset by server (HTTP/2 error \(code))")
        case .timedOut:
            return FanoutError(.connection, "\(endpoint): no answer within the request timeout")
        case .cancelled:
            return FanoutError(.shutdown, "request cancelled")
        }
    }

    private func submit(_ request: HTTP2Request) async -> Result<HTTP2Response, HTTP2StreamFailure> {
        await withCheckedContinuation { continuation in
            loop.execute { [self] in
                guard !state.isShutDown else {
                    continuation.resume(
                        returning: .failure(.notSent(TransportError(.cancelled, "client is shut down"))))
                    return
                }
                connection().submit(request) { result in continuation.resume(returning: result) }
            }
        }
    }

    /// The live connection, or a new one when there is none or it can take no more requests.
    private func connection() -> HTTP2ClientConnection {
        if let connection = state.connection, connection.isAcceptingRequests { return connection }
        state.connection?.close()
        let connection = HTTP2ClientConnection(
            loop: loop,
            configuration: HTTP2ClientConfiguration(
                host: configuration.endpoint.host, port: configuration.endpoint.port, tls: tls.configuration,
                connectTimeoutMilliseconds: configuration.connectTimeoutMilliseconds,
                maxConcurrentStreams: configuration.maxConcurrentStreams),
            tlsContext: tls)
        state.connection = connection
        return connection
    }

    /// Closes the connection (failing what is in flight) and stops the loop thread. Idempotent.
    public func shutdown() async {
        guard shutdownStarted.compareExchange(expected: false, desired: true, ordering: .relaxed).exchanged else {
            return
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            loop.execute { [self] in
                state.isShutDown = true
                state.connection?.close(immediately: true)
                state.connection = nil
                continuation.resume()
            }
        }
        let clientLoop = self.loop
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            // shutdown() blocks until the loop thread exits: keep that off the cooperative pool.
            Thread.detachNewThread {
                clientLoop.shutdown()
                continuation.resume()
            }
        }
    }
}
