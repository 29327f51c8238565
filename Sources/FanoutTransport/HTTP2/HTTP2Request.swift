/// One request for an HTTP/2 client connection: shared constant headers, the per-request path and
/// optional `apns-id`, and a shared body.
public struct HTTP2Request: Sendable {
    public var head: HeaderBlock
    /// `:path`, e.g. `/3/device/<token>`.
    public var path: String
    /// Sent as `apns-id` when set (a retry keeps its id).
    public var apnsID: String?
    public var body: SharedBody

    public init(head: HeaderBlock, path: String, apnsID: String? = nil, body: SharedBody) {
        self.head = head
        self.path = path
        self.apnsID = apnsID
        self.body = body
    }
}

/// What the server answered on one stream. Only the headers APNs clients need are kept.
public struct HTTP2Response: Sendable {
    public var status: Int
    public var apnsID: String?
    public var apnsUniqueID: String?
    public var body: [UInt8]

    public init(status: Int, apnsID: String? = nil, apnsUniqueID: String? = nil, body: [UInt8] = []) {
        self.status = status
        self.apnsID = apnsID
        self.apnsUniqueID = apnsUniqueID
        self.body = body
    }
}

/// Why a stream ended without a response. `notSent`, `refused` and `notProcessed` are safe to send
/// again at once (the server did not act on the request); `reset` and `connectionLost` may or may
/// not have been acted on.
public enum HTTP2StreamFailure: Error, Sendable, Equatable {
    /// Never left this process (the connection closed or drained first).
    case notSent(TransportError)
    /// The server reset the stream with REFUSED_STREAM.
    case refused
    /// The stream's id was above the last one a GOAWAY said was processed.
    case notProcessed(goawayErrorCode: UInt32)
    /// The server reset the stream with another error code.
    case reset(errorCode: UInt32)
    /// The connection ended while the request was in flight.
    case connectionLost(TransportError)

    /// True when the server cannot have acted on the request, so resending cannot duplicate it.
    public var isSafeToRetry: Bool {
        switch self {
        case .notSent, .refused, .notProcessed: return true
        case .reset, .connectionLost: return false
        }
    }
}

public typealias HTTP2Completion = @Sendable (Result<HTTP2Response, HTTP2StreamFailure>) -> Void
