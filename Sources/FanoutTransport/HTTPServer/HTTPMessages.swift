import Foundation
import Synchronization

/// The HTTP version a request arrived with.
package enum HTTPVersion: Sendable {
    case http1_0, http1_1, http2
}

/// One request, as `HTTPServer` hands it to its handler: the whole body is read first (bounded by
/// `HTTPServerLimits.maxBodyBytes`).
package struct HTTPRequest: Sendable {
    package var method: String
    /// Path and query as sent, e.g. `/v1/dispatches/abc?x=1`.
    package var target: String
    /// Names lowercase, in arrival order, duplicates kept (HTTP/2 pseudo-headers left out).
    package var headers: [(name: String, value: String)]
    package var body: [UInt8]
    package var version: HTTPVersion

    package init(
        method: String, target: String, headers: [(name: String, value: String)], body: [UInt8],
        version: HTTPVersion
    ) {
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.version = version
    }

    /// The first value of header `name`, matched case-insensitively.
    package func header(_ name: String) -> String? {
        for header in headers where header.name.utf8.count == name.utf8.count {
            if header.name.caseInsensitiveCompare(name) == .orderedSame { return header.value }
        }
        return nil
    }
}

/// A response. The server adds `content-length` (and, for HTTP/1.1, `connection`); the handler's own
/// `content-length`, `connection`, `transfer-encoding`, `keep-alive` and `upgrade` are dropped, and CR and LF
/// never reach the wire. A handler's `connection: close` is honoured on HTTP/1.1: the connection closes after
/// this answer.
package struct HTTPResponse: Sendable {
    package var status: Int
    package var headers: [(name: String, value: String)]
    package var body: [UInt8]

    package init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A short plain-text answer the server gives on its own (400, 408, 413, 503, ...).
    package static func plain(_ status: Int, _ message: String) -> HTTPResponse {
        HTTPResponse(
            status: status, headers: [("content-type", "text/plain; charset=utf-8")], body: Array("\(message)\n".utf8))
    }

    /// The HTTP/1.1 status line and headers, with `content-length` (unless the status has no body) and `connection`
    /// added and the handler's server-managed headers dropped; CR, LF and (in names) `:` never reach the wire.
    func http1Head(keepAlive: Bool) -> String {
        var text = "HTTP/1.1 \(wireStatus) \(Self.reasonPhrase(wireStatus))\r\n"
        for header in headers where !Self.isServerManaged(header.name) {
            let name = header.name.filter { $0 != "\r" && $0 != "\n" && $0 != ":" }
            guard !name.isEmpty else { continue }
            text += "\(name): \(header.value.filter { $0 != "\r" && $0 != "\n" })\r\n"
        }
        if hasBody { text += "content-length: \(body.count)\r\n" }
        text += keepAlive ? "connection: keep-alive\r\n\r\n" : "connection: close\r\n\r\n"
        return text
    }

    /// The status as written: a handler's out of range (not three digits) is a 500.
    private var wireStatus: Int { (100...999).contains(status) ? status : 500 }

    /// Whether the status carries a body at all (not 1xx, 204 or 304).
    var hasBody: Bool { !(wireStatus == 204 || wireStatus == 304 || wireStatus < 200) }

    /// Whether the server writes `name` itself (or, for HTTP/2, must not write it at all).
    static func isServerManaged(_ name: String) -> Bool {
        switch name.lowercased() {
        case "content-length", "connection", "transfer-encoding", "keep-alive", "upgrade", "proxy-connection":
            true
        default:
            false
        }
    }

    static func reasonPhrase(_ status: Int) -> String {
        switch status {
        case 100: "Continue"
        case 200: "OK"
        case 201: "Created"
        case 202: "Accepted"
        case 204: "No Content"
        case 301: "Moved Permanently"
        case 302: "Found"
        case 304: "Not Modified"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 408: "Request Timeout"
        case 409: "Conflict"
        case 413: "Content Too Large"
        case 415: "Unsupported Media Type"
        case 417: "Expectation Failed"
        case 422: "Unprocessable Content"
        case 429: "Too Many Requests"
        case 431: "Request Header Fields Too Large"
        case 500: "Internal Server Error"
        case 501: "Not Implemented"
        case 503: "Service Unavailable"
        case 505: "HTTP Version Not Supported"
        default: "Status"
        }
    }
}

/// The bounds `HTTPServer` keeps every connection within.
package struct HTTPServerLimits: Sendable {
    /// A larger body gets 413: HTTP/1.1 answers with `Connection: close` and closes; HTTP/2 answers on that
    /// stream and the connection stays.
    package var maxBodyBytes = 1 << 20
    /// A larger HTTP/1.1 request head gets 431 and the connection closes; it is also HTTP/2's
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    package var maxHeadBytes = 16 * 1024
    /// A request head not complete within this of its first byte (or of the connection's start): 408 and close.
    /// Also bounds the TLS handshake. HTTP/2: a stream's header block not complete within this of the stream's
    /// start gets 408 on that stream.
    package var headerTimeout: Duration = .seconds(10)
    /// A keep-alive connection with nothing in progress this long is closed (HTTP/2: GOAWAY).
    package var idleTimeout: Duration = .seconds(75)
    /// A body not complete within this of the end of its head gets 408, however steadily it trickles in: HTTP/1.1
    /// closes the connection, HTTP/2 answers on that stream (see `HTTP2RequestDeadlines`).
    package var bodyTimeout: Duration = .seconds(30)
    /// Open connections across all loops. Past it a new plain-TCP connection gets an immediate 503
    /// (`Connection: close`) and is closed after a bounded linger; a TLS one is just closed.
    package var maxConnections = 10_000
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS.
    package var maxConcurrentStreams: UInt32 = 128
    /// A connection whose pending output (answers the client has not taken: queued on the socket, or HTTP/2 answers
    /// waiting for its flow-control credit) sees none of it leave for this long is closed, as nginx's `send_timeout`
    /// does; a slow reader that takes some of it now and then is not. Meanwhile, past `SecureChannel.highWaterMark`
    /// bytes queued, the connection reads and answers no more requests. Zero: no timeout (the backpressure stays).
    package var writeTimeout: Duration = .seconds(30)
    /// How the server words the answers it gives itself, before or instead of the handler (400, 408, 413, 431, and
    /// the 503 past `maxConnections`): plain text by default; `fanout serve` answers JSON, as its API does.
    package var ownAnswer: @Sendable (_ status: Int, _ message: String) -> HTTPResponse = { status, message in
        .plain(status, message)
    }

    package init() {}

    /// The server's own answer (`ownAnswer`).
    func answer(_ status: Int, _ message: String) -> HTTPResponse { ownAnswer(status, message) }

    var headerTimeoutMilliseconds: UInt64 { Self.milliseconds(headerTimeout) }
    var idleTimeoutMilliseconds: UInt64 { Self.milliseconds(idleTimeout) }
    var bodyTimeoutMilliseconds: UInt64 { Self.milliseconds(bodyTimeout) }
    var writeTimeoutMilliseconds: UInt64 { Self.milliseconds(writeTimeout) }
    /// How long a connection that got its last answer may keep the socket before it is closed.
    var lingerMilliseconds: UInt64 { min(headerTimeoutMilliseconds, 2000) }

    private static func milliseconds(_ duration: Duration) -> UInt64 {
        let (seconds, attoseconds) = duration.components
        return UInt64(max(0, seconds)) * 1000 + UInt64(max(0, attoseconds) / 1_000_000_000_000_000)
    }
}

/// What a connection does with the answer to one of its requests. Loop thread only.
protocol HTTPResponseSink: AnyObject {
    func deliver(_ response: HTTPResponse, for requestID: Int64)
}

/// Answers one request: call `respond` once, from any thread (it hops to the connection's loop). Later calls
/// are ignored. If the connection closed meanwhile the response is dropped.
package final class HTTPResponder: Sendable {
    private let loop: LoopThread
    /// The connection (loop-confined: touched only in the task run on `loop`).
    private let sink: UncheckedSendableBox<HTTPResponseSink>
    /// HTTP/1.1: the connection's request sequence number; HTTP/2: the stream id.
    private let requestID: Int64
    private let responded = Atomic<Bool>(false)

    init(loop: LoopThread, sink: HTTPResponseSink, requestID: Int64) {
        self.loop = loop
        self.sink = UncheckedSendableBox(sink)
        self.requestID = requestID
    }

    package func respond(_ response: HTTPResponse) {
        guard !responded.exchange(true, ordering: .acquiringAndReleasing) else { return }
        if loop.inLoop {
            sink.value.deliver(response, for: requestID)
            return
        }
        let sink = self.sink
        let requestID = self.requestID
        let response = UncheckedSendableBox(response)
        // A stopped loop refuses the task: the connection is gone, so is the answer.
        try? loop.execute { sink.value.deliver(response.value, for: requestID) }
    }
}
