package import FanoutCore

/// One request for an HTTP/2 client connection: shared constant headers, the per-request path and
/// optional `apns-id`, and a shared body.
package struct HTTP2Request: Sendable {
    package let head: HeaderBlock
    /// `:path`, e.g. `/3/device/<token>`, or its first part when `pathSuffix` is set.
    package let path: String
    /// The rest of `:path` after `path`: a device push sends `path` "/3/device/" (a literal) and the token
    /// here, and the session spells them into a buffer it reuses, so no path String is made per request.
    package let pathSuffix: RecipientToken?
    /// Sent as `apns-id` when set (a retry keeps its id).
    package let apnsID: APNsIdentifier?
    package let body: SharedBody

    package init(
        head: HeaderBlock, path: String, pathSuffix: RecipientToken? = nil, apnsID: APNsIdentifier? = nil,
        body: SharedBody
    ) {
        self.head = head
        self.path = path
        self.pathSuffix = pathSuffix
        self.apnsID = apnsID
        self.body = body
    }
}

/// What the server answered on one stream. Only the headers APNs clients need are kept.
package struct HTTP2Response: Sendable {
    package let status: Int
    /// The answer's `apns-id` and `apns-unique-id`, kept without a String (see `APNsIdentifier`).
    package let apnsIDValue: APNsIdentifier?
    package let apnsUniqueIDValue: APNsIdentifier?
    /// What most answers lack (a 200 to a push has none of it): held apart, so that such an answer holds one
    /// reference, nil, and passing it on costs one reference-counting call, not one per field
    /// (scripts/count-arc.sh).
    private let rest: Rest?

    private final class Rest: Sendable {
        let channelID: String?
        let requestID: String?
        let body: [UInt8]

        init(channelID: String?, requestID: String?, body: [UInt8]) {
            self.channelID = channelID
            self.requestID = requestID
            self.body = body
        }
    }

    /// One expression for every field (a client stream builds its answer so, with no local copied out).
    package init(
        status: Int, apnsID: APNsIdentifier? = nil, apnsUniqueID: APNsIdentifier? = nil, channelID: String? = nil,
        requestID: String? = nil, body: [UInt8] = []
    ) {
        self.status = status
        apnsIDValue = apnsID
        apnsUniqueIDValue = apnsUniqueID
        rest =
            channelID == nil && requestID == nil && body.isEmpty
            ? nil : Rest(channelID: channelID, requestID: requestID, body: body)
    }

    /// `apns-channel-id` and `apns-request-id` (broadcast channel management).
    package var channelID: String? { rest?.channelID }
    package var requestID: String? { rest?.requestID }
    package var body: [UInt8] { rest?.body ?? [] }
    package var apnsID: String? { apnsIDValue?.string }
    package var apnsUniqueID: String? { apnsUniqueIDValue?.string }
}

/// Names one request handed to an `HTTP2ClientConnection`, for `cancel(_:)`: the connection's serial
/// number for it, unique for the connection's lifetime. A plain value; holding one keeps nothing alive.
package struct HTTP2RequestID: Hashable, Sendable, CustomStringConvertible {
    package let rawValue: UInt64

    package init(rawValue: UInt64) {
        self.rawValue = rawValue
    }

    package var description: String { "request \(rawValue)" }
}

/// Why a stream ended without a response. `notSent`, `refused`, `notProcessed` and
/// `cancelled(sent: false)` are safe to send again at once (the server did not act on the request);
/// `reset`, `connectionLost`, `timedOut` and `cancelled(sent: true)` may or may not have been acted on.
package enum HTTP2StreamFailure: Error, Sendable, Equatable {
    /// Never left this process (the connection closed or drained first, or the request's deadline
    /// passed while it waited for a stream: `TransportError.Kind.timedOut`).
    case notSent(TransportError)
    /// The server reset the stream with REFUSED_STREAM.
    case refused
    /// The stream's id was above the last one a GOAWAY said was processed.
    case notProcessed(goawayErrorCode: UInt32)
    /// The server reset the stream with another error code.
    case reset(errorCode: UInt32)
    /// The connection ended while the request was in flight.
    case connectionLost(TransportError)
    /// The request's deadline (`HTTP2ClientConfiguration.requestTimeout`) passed while its stream was
    /// open; the stream was reset with CANCEL. The server may have acted on it, as with a lost connection.
    case timedOut
    /// The caller cancelled the request (`HTTP2ClientConnection.cancel`). `sent: false`: it was still
    /// waiting for a stream and never left this process. `sent: true`: its stream was open and was
    /// reset with CANCEL; the server may have acted on it.
    case cancelled(sent: Bool)

    /// True when the server cannot have acted on the request, so resending cannot duplicate it.
    package var isSafeToRetry: Bool {
        switch self {
        case .notSent, .refused, .notProcessed: return true
        case .cancelled(let sent): return !sent
        case .reset, .connectionLost, .timedOut: return false
        }
    }
}

package typealias HTTP2Completion = @Sendable (Result<HTTP2Response, HTTP2StreamFailure>) -> Void

/// Told of a request's end by `HTTP2ClientConnection.submit(_:context:handler:)`, on the loop thread, exactly
/// once per request, with the context it was submitted with.
package protocol HTTP2ResponseHandler: AnyObject {
    func request(
        _ context: AnyObject, didComplete result: Result<HTTP2Response, HTTP2StreamFailure>,
        on connection: HTTP2ClientConnection)
}
