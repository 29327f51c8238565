import CLibUV
import Foundation
import Synchronization

/// A tiny HTTP/1.1 server for plain-text GET endpoints (the Prometheus `/metrics` scrape), on its own loop
/// thread. One request per connection: it reads the request head (request line and headers, no body), calls the
/// handler, writes the answer with `Content-Length` and `Connection: close`, and closes.
///
/// It is built to be left open on a network: a head larger than `maxHeadBytes` or one that does not parse gets
/// 400; a client that has not sent a whole head within `requestTimeoutMilliseconds` gets 408; a client that does
/// not take its answer and close within `lingerMilliseconds` afterwards is dropped; past `maxConnections` open
/// connections, new ones are closed at once. Every wait is bounded.
package final class PlainHTTPServer: @unchecked Sendable {
    // @unchecked Sendable: `state` is touched only on `loop`; `stopped` is behind a Mutex; the rest is immutable.

    /// What the handler answers: status code, `Content-Type` and body.
    package typealias Handler = @Sendable (_ method: String, _ target: String) -> (Int, String, [UInt8])

    /// The port bound (the real one when 0 was asked).
    package let port: Int
    package let host: String
    private let loop: LoopThread
    private let state: ServerState
    private let stopped = Mutex(false)

    /// Binds `host:port` (a numeric IPv4 or IPv6 address; port 0 picks a free one) and starts serving.
    /// - Parameters:
    ///   - handler: called on the server's loop thread with the method (`GET`, `HEAD`, ...) and the request
    ///     target as sent (path and query, e.g. `/metrics?x=1`). For `HEAD` the body it returns is not sent.
    package init(
        host: String, port: Int, maxHeadBytes: Int = 8192, requestTimeoutMilliseconds: UInt64 = 5000,
        lingerMilliseconds: UInt64 = 2000, maxConnections: Int = 64, handler: @escaping Handler
    ) throws(TransportError) {
        precondition(maxHeadBytes > 0 && maxConnections > 0)
        self.host = host
        let loop = LoopThread(name: "http1-\(port)")
        let limits = PlainHTTPLimits(
            maxHeadBytes: maxHeadBytes, requestTimeoutMilliseconds: requestTimeoutMilliseconds,
            lingerMilliseconds: lingerMilliseconds, maxConnections: maxConnections)
        let state = ServerState(limits: limits, handler: handler)
        let result = loop.runAndWait { () -> Result<Int, TransportError> in
            do {
                let listener = try TCPListener(loop: loop, host: host, port: port, backlog: 128) { socket in
                    state.accept(socket)
                }
                state.listener = listener
                return .success(listener.port)
            } catch let error as TransportError {
                return .failure(error)
            } catch {
                return .failure(TransportError(.connectFailed, "\(error)"))
            }
        }
        switch result {
        case .success(let bound):
            self.port = bound
        case .failure(let error):
            loop.shutdown()
            throw error
        }
        self.loop = loop
        self.state = state
    }

    deinit {
        if !loop.inLoop { shutdown() }
    }

    /// Stops listening, drops open connections and stops the loop thread. Blocks until it exits. Idempotent.
    package func shutdown() {
        let wasStopped = stopped.withLock { stopped in
            defer { stopped = true }
            return stopped
        }
        guard !wasStopped else { return }
        let box = UncheckedSendableBox(state)
        // Only this method stops the loop, once: it cannot have stopped already.
        try? loop.execute { box.value.stop() }
        loop.shutdown()
    }
}

/// The server's bounds, fixed at start.
struct PlainHTTPLimits {
    var maxHeadBytes: Int
    var requestTimeoutMilliseconds: UInt64
    var lingerMilliseconds: UInt64
    var maxConnections: Int
}

/// What the server's loop owns: its listener and the connections it accepted, until they close.
private final class ServerState {
    let limits: PlainHTTPLimits
    let handler: PlainHTTPServer.Handler
    var listener: TCPListener?
    var connections: [ObjectIdentifier: PlainHTTPConnection] = [:]

    init(limits: PlainHTTPLimits, handler: @escaping PlainHTTPServer.Handler) {
        self.limits = limits
        self.handler = handler
    }

    func accept(_ socket: TCPSocket) {
        guard connections.count < limits.maxConnections else {
            socket.close()
            return
        }
        let connection = PlainHTTPConnection(socket: socket, limits: limits, handler: handler)
        let key = ObjectIdentifier(connection)
        connections[key] = connection
        connection.onClose = { [self] in connections[key] = nil }
        connection.start()
    }

    func stop() {
        listener?.close()
        listener = nil
        for connection in Array(connections.values) { connection.close() }
    }
}

/// One accepted connection: read the head, answer, half-close, wait (bounded) for the peer to close.
/// Confined to its loop.
final class PlainHTTPConnection: TCPSocketDelegate {
    private enum Phase {
        case readingHead
        /// The answer is written (or queued) and our side is shut down; input is discarded until the peer closes.
        case lingering
        case closed
    }

    private let socket: TCPSocket
    private let limits: PlainHTTPLimits
    private let handler: PlainHTTPServer.Handler
    private let timer: LoopTimer
    private var head: [UInt8] = []
    private var phase = Phase.readingHead
    var onClose: (() -> Void)?

    init(socket: TCPSocket, limits: PlainHTTPLimits, handler: @escaping PlainHTTPServer.Handler) {
        self.socket = socket
        self.limits = limits
        self.handler = handler
        timer = LoopTimer(loop: socket.loop)
    }

    func start() {
        socket.delegate = self
        timer.schedule(milliseconds: limits.requestTimeoutMilliseconds) { [unowned self] in
            // Still no complete head: tell the client, then close.
            respond(PlainHTTPResponse(status: 408, contentType: "text/plain", body: Array("request timeout\n".utf8)))
        }
        socket.startReading()
    }

    // MARK: TCPSocketDelegate

    func tcpSocket(_ socket: TCPSocket, didRead bytes: UnsafeRawBufferPointer) {
        guard case .readingHead = phase else { return }  // lingering: discard
        let searchFrom = max(0, head.count - 3)
        head.append(contentsOf: bytes)
        guard let end = PlainHTTPRequestHead.endOfHead(in: head, from: searchFrom) else {
            if head.count > limits.maxHeadBytes { respond(.badRequest("request head too large")) }
            return
        }
        guard end <= limits.maxHeadBytes else {
            respond(.badRequest("request head too large"))
            return
        }
        switch PlainHTTPRequestHead.parse(head[..<end]) {
        case .failure(let message):
            respond(.badRequest(message))
        case .success(let request):
            let (status, contentType, body) = handler(request.method, request.target)
            var response = PlainHTTPResponse(status: status, contentType: contentType, body: body)
            response.omitBody = request.method == "HEAD"
            respond(response)
        }
    }

    func tcpSocket(_ socket: TCPSocket, didCloseWith error: TransportError?) {
        finish()
    }

    func tcpSocketDidDrainWrites(_ socket: TCPSocket) {}

    // MARK: Answer and close

    private func respond(_ response: PlainHTTPResponse) {
        guard case .readingHead = phase else { return }
        phase = .lingering
        head = []
        let bytes = response.serialized()
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(bytes.count, 1), alignment: 1)
        buffer.copyBytes(from: bytes)
        socket.write(taking: buffer, count: bytes.count)
        guard !socket.isClosed else {
            finish()
            return
        }
        // Half-close after the queued answer (libuv orders the shutdown after pending writes), then give the peer
        // a bounded time to read it and close; closing at once with unread input could reset the connection and
        // lose the answer.
        let request = UnsafeMutablePointer<uv_shutdown_t>.allocate(capacity: 1)
        // Owned by libuv until the callback (called with UV_ECANCELED if the handle closes first), which frees it.
        if uv_shutdown(request, socket.streamHandle, plainHTTPShutdownCallback) != 0 {
            request.deallocate()
        }
        timer.schedule(milliseconds: limits.lingerMilliseconds) { [unowned self] in close() }
    }

    /// Closes now. Idempotent.
    func close() {
        socket.close()
        finish()
    }

    private func finish() {
        guard !isFinished else { return }
        phase = .closed
        timer.close()
        let onClose = self.onClose
        self.onClose = nil
        onClose?()
    }

    private var isFinished: Bool {
        if case .closed = phase { return true }
        return false
    }
}

private func plainHTTPShutdownCallback(_ request: UnsafeMutablePointer<uv_shutdown_t>?, _ status: Int32) {
    request?.deallocate()
}

/// A parsed request head: what the handler sees.
struct PlainHTTPRequestHead {
    var method: String
    var target: String
    var version: String
    var headers: [(name: String, value: String)]

    enum ParseResult {
        case success(PlainHTTPRequestHead)
        case failure(String)
    }

    /// The index just past the blank line that ends the head (`CRLF CRLF`, or bare `LF LF`), searching from `start`.
    static func endOfHead(in bytes: [UInt8], from start: Int) -> Int? {
        var index = start
        while index < bytes.count {
            if bytes[index] == 0x0A {
                if index + 1 < bytes.count, bytes[index + 1] == 0x0A { return index + 2 }
                if index + 2 < bytes.count, bytes[index + 1] == 0x0D, bytes[index + 2] == 0x0A { return index + 3 }
            }
            index += 1
        }
        return nil
    }

    /// Parses a request head (RFC 9112 section 2-5), blank line included. Strict: anything odd is a 400.
    static func parse(_ bytes: ArraySlice<UInt8>) -> ParseResult {
        var lines: [ArraySlice<UInt8>] = []
        var lineStart = bytes.startIndex
        for index in bytes.indices where bytes[index] == 0x0A {
            var line = bytes[lineStart..<index]
            if line.last == 0x0D { line = line.dropLast() }
            lines.append(line)
            lineStart = index + 1
        }
        // A leading empty line before the request line is tolerated (RFC 9112 section 2.2).
        if lines.first?.isEmpty == true { lines.removeFirst() }
        guard let requestLine = lines.first, !requestLine.isEmpty else { return .failure("empty request") }
        let parts = requestLine.split(separator: 0x20, omittingEmptySubsequences: false)
        guard parts.count == 3 else { return .failure("malformed request line") }
        guard !parts[0].isEmpty, parts[0].allSatisfy(isTokenByte) else { return .failure("malformed method") }
        let target = parts[1]
        guard let first = target.first, first == UInt8(ascii: "/") || (target.count == 1 && first == UInt8(ascii: "*")),
            target.allSatisfy({ $0 > 0x20 && $0 < 0x7F })
        else {
            return .failure("malformed request target")
        }
        let version = String(decoding: parts[2], as: UTF8.self)
        guard version == "HTTP/1.1" || version == "HTTP/1.0" else { return .failure("unsupported HTTP version") }

        var headers: [(name: String, value: String)] = []
        for line in lines.dropFirst() where !line.isEmpty {
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { return .failure("malformed header") }
            let name = line[line.startIndex..<colon]
            // No whitespace before the colon, no obsolete line folding (RFC 9112 section 5.1, 5.2).
            guard !name.isEmpty, name.allSatisfy(isTokenByte) else { return .failure("malformed header name") }
            var value = line[(colon + 1)...]
            while let byte = value.first, byte == 0x20 || byte == 0x09 { value = value.dropFirst() }
            while let byte = value.last, byte == 0x20 || byte == 0x09 { value = value.dropLast() }
            guard value.allSatisfy({ $0 == 0x09 || ($0 >= 0x20 && $0 != 0x7F) }) else {
                return .failure("malformed header value")
            }
            headers.append((String(decoding: name, as: UTF8.self).lowercased(), String(decoding: value, as: UTF8.self)))
        }
        if version == "HTTP/1.1" {
            let hosts = headers.filter { $0.name == "host" }.count
            guard hosts == 1 else { return .failure("HTTP/1.1 request needs exactly one Host header") }
        }
        return .success(
            PlainHTTPRequestHead(
                method: String(decoding: parts[0], as: UTF8.self), target: String(decoding: target, as: UTF8.self),
                version: version, headers: headers))
    }

    /// `tchar` of RFC 9110 section 5.6.2.
    private static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default:
            return "!#$%&'*+-.^_`|~".utf8.contains(byte)
        }
    }
}

/// A response as written on the wire.
struct PlainHTTPResponse {
    var status: Int
    var contentType: String
    var body: [UInt8]
    var omitBody = false

    static func badRequest(_ message: String) -> PlainHTTPResponse {
        PlainHTTPResponse(status: 400, contentType: "text/plain; charset=utf-8", body: Array("\(message)\n".utf8))
    }

    func serialized() -> [UInt8] {
        let status = (100...599).contains(status) ? status : 500
        // Header values come from the handler: keep CR and LF out so it cannot split the response.
        let contentType = contentType.filter { $0 != "\r" && $0 != "\n" }
        var text = "HTTP/1.1 \(status) \(Self.reasonPhrase(status))\r\n"
        text += "Content-Type: \(contentType)\r\n"
        text += "Content-Length: \(body.count)\r\n"
        text += "Connection: close\r\n\r\n"
        var bytes = Array(text.utf8)
        if !omitBody { bytes += body }
        return bytes
    }

    static func reasonPhrase(_ status: Int) -> String {
        switch status {
        case 200: "OK"
        case 204: "No Content"
        case 400: "Bad Request"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 408: "Request Timeout"
        case 500: "Internal Server Error"
        case 503: "Service Unavailable"
        default: "Status"
        }
    }
}
