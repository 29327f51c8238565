import Foundation

/// One accepted connection of `HTTPServer`, from accept to close: it owns the connection's one timer and picks
/// the protocol, then hands the channel over.
/// - With TLS: ALPN `h2` means HTTP/2; `http/1.1` or no ALPN, HTTP/1.1.
/// - Without: it reads the first bytes. The 24-byte HTTP/2 client preface means HTTP/2 with prior knowledge
///   (h2c); anything else is HTTP/1.1, as soon as a byte differs from the preface.
///
/// For HTTP/2 it is also the `HTTP2ServerHandler` of the `HTTP2ServerConnection` it starts, turning its requests
/// into `HTTPRequest`s. Confined to its loop.
final class HTTPServerConnection: SecureChannelDelegate, HTTP2ServerHandler, HTTPResponseSink {
    private enum Mode {
        case choosing
        case http1(HTTP1ServerConnection)
        case http2(HTTP2ServerConnection)
        case closed
    }

    private let loop: LoopThread
    private let limits: HTTPServerLimits
    private let handler: HTTPServer.Handler
    private let channel: SecureChannel
    /// The connection's one timer: choosing the protocol (headerTimeout), then HTTP/1.1's phases, or for HTTP/2 the
    /// earlier of the idle time and the oldest incomplete request's deadline. Closed with the connection.
    private let timer: LoopTimer
    /// HTTP/2: when the timer is due, and when the connection counts as idle if no stream is open by then (the
    /// loop's clock).
    private var timerDue: UInt64 = 0
    private var idleDue: UInt64 = 0
    private var mode = Mode.choosing
    /// Plaintext bytes read while choosing, handed to the protocol chosen.
    private var readAhead: [UInt8] = []
    /// Called once, when the connection is gone (the server forgets it and counts it out).
    var onClose: (() -> Void)?
    private var stopRequested = false
    /// HTTP/2 streams that asked HEAD: their answers go without a body.
    private var headStreams: Set<Int32> = []
    /// HTTP/2 requests handed to the handler and not answered yet.
    private var handlersInFlight = 0
    /// HTTP/2 streams answered and still open, with when each was answered or last sent a DATA frame (the loop's
    /// clock): their answers have not all gone out (a stream closes once its last frame is sent), so the channel
    /// counts them as output it holds, for the write timeout (a client that never reads grants no flow-control
    /// credit either, and its answers wait in nghttp2, not on the socket).
    private var answeredStreams: [Int32: UInt64] = [:]
    /// When an answer of this connection last sent a DATA frame. One stream whose answer has
    /// not moved for the write timeout while this moved since (the client grants credit to its other streams only)
    /// is reset, as nghttpd times out a stream's write: the channel's own timeout sees only the connection moving.
    private var lastAnswerMoved: UInt64 = 0
    /// Some answer is past the write timeout but was left, since no other answer had moved after it.
    private var stalledAnswersWaiting = false

    /// The HTTP/2 client connection preface (RFC 9113 section 3.4).
    static let http2Preface: [UInt8] = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    init(socket: TCPSocket, tls: TLSServerContext?, limits: HTTPServerLimits, handler: @escaping HTTPServer.Handler)
        throws(TransportError)
    {
        loop = socket.loop
        self.limits = limits
        self.handler = handler
        let engine: TLSEngine?
        do {
            engine = try tls.map { context throws(TransportError) in try TLSEngine(context: context.context) }
        } catch {
            socket.close()
            throw error
        }
        channel = SecureChannel(
            socket: socket, tls: engine, handshakeTimeoutMilliseconds: limits.headerTimeoutMilliseconds)
        channel.limitOutput(writeTimeoutMilliseconds: limits.writeTimeoutMilliseconds)
        timer = LoopTimer(loop: loop)
        channel.delegate = self
        // Strong capture: the cycle ends when the timer closes, with the connection.
        timer.schedule(milliseconds: limits.headerTimeoutMilliseconds) { [self] in timerFired() }
    }

    func start() {
        channel.start()
    }

    /// `HTTPServer.stopAccepting`: idle connections close, requests in progress still get their answers.
    func stopAccepting() {
        stopRequested = true
        switch mode {
        case .choosing: channel.close(error: nil)
        case .http1(let connection): connection.stopAccepting()
        case .http2(let connection): connection.drain()
        case .closed: break
        }
    }

    /// Drops the connection now.
    func close() {
        switch mode {
        case .http2(let connection): connection.drop()
        case .closed: break
        default: channel.close(error: nil)
        }
    }

    private func timerFired() {
        switch mode {
        case .choosing:
            // No complete head (nor preface) in time.
            if channel.isReady && !readAhead.isEmpty && !channel.isSecure {
                startHTTP1()
                if case .http1(let connection) = mode { connection.timerFired() }
            } else {
                channel.close(error: nil)
            }
        case .http1(let connection):
            connection.timerFired()
        case .http2(let connection):
            let now = loop.nowMilliseconds
            connection.expireRequests(now: now)
            abandonStalledAnswers(of: connection, now: now)
            if connection.openStreamCount > 0 {
                // Requests in progress: looked at again at the oldest incomplete one's deadline (or stalled answer's),
                // or an idle time on.
                armHTTP2(
                    at: min(
                        connection.nextRequestDeadline ?? .max, nextStalledAnswerDeadline(now: now) ?? .max,
                        now + limits.idleTimeoutMilliseconds))
            } else if now >= idleDue {
                connection.drain()
            } else {
                armHTTP2(at: idleDue)  // woken for a deadline that passed with its stream
            }
        case .closed:
            break
        }
    }

    // MARK: Choosing the protocol

    func channelDidBecomeReady(_ channel: SecureChannel) {
        guard channel.isSecure else { return }  // plaintext: wait for the first bytes
        if channel.negotiatedProtocol == "h2" {
            startHTTP2()
        } else {
            startHTTP1()
        }
    }

    func channel(_ channel: SecureChannel, didRead plaintext: UnsafeRawBufferPointer) {
        guard case .choosing = mode else { return }
        readAhead.append(contentsOf: plaintext)
        let preface = Self.http2Preface
        let compared = min(readAhead.count, preface.count)
        if readAhead[0..<compared].elementsEqual(preface[0..<compared]) {
            if readAhead.count >= preface.count { startHTTP2() }
        } else {
            startHTTP1()
        }
    }

    func channel(_ channel: SecureChannel, didCloseWith error: TransportError?) {
        // Closed before a protocol took the channel over.
        finish()
    }

    func channelProduceOutput(_ channel: SecureChannel) {}

    private func startHTTP1() {
        let connection = HTTP1ServerConnection(
            channel: channel, limits: limits, handler: handler, timer: timer,
            onClose: { [self] in finish() })
        mode = .http1(connection)
        let bytes = readAhead
        readAhead = []
        bytes.withUnsafeBytes { connection.start(readAhead: $0) }
        if stopRequested { connection.stopAccepting() }
    }

    private func startHTTP2() {
        var settings = HTTP2SessionSettings.server(maxConcurrentStreams: limits.maxConcurrentStreams)
        settings.maxHeaderListSize = UInt32(clamping: limits.maxHeadBytes)
        // Each stream gets HTTP/1.1's limits: its header block within the header timeout of its start, its body
        // within the body timeout of the header block's end.
        let deadlines = HTTP2RequestDeadlines(
            headerMilliseconds: limits.headerTimeoutMilliseconds, bodyMilliseconds: limits.bodyTimeoutMilliseconds,
            lingerMilliseconds: limits.lingerMilliseconds)
        let connection = HTTP2ServerConnection(
            loop: loop, handler: self, settings: settings, maxRequestBody: limits.maxBodyBytes,
            requestDeadlines: deadlines)
        mode = .http2(connection)
        idleDue = loop.nowMilliseconds + limits.idleTimeoutMilliseconds
        armHTTP2(at: idleDue)
        let bytes = readAhead
        readAhead = []
        bytes.withUnsafeBytes { connection.start(adopting: channel, readAhead: $0) }
        if stopRequested { connection.drain() }
    }

    /// HTTP/2: resets each answered stream whose answer has not moved for the write timeout while another answer of
    /// the connection did. When none moved, the connection as a whole made no progress, and the channel's write
    /// timeout closes it; such a stream is left with `stalledAnswersWaiting` set, and the next answer to move looks
    /// again.
    private func abandonStalledAnswers(of connection: HTTP2ServerConnection, now: UInt64) {
        let timeout = limits.writeTimeoutMilliseconds
        stalledAnswersWaiting = false
        guard timeout > 0 else { return }
        for (streamID, moved) in answeredStreams where moved + timeout <= now {
            if lastAnswerMoved > moved {
                answeredStreams.removeValue(forKey: streamID)
                connection.abandonAnswer(streamID: streamID)
            } else {
                stalledAnswersWaiting = true
            }
        }
        if answeredStreams.isEmpty { channel.holdsOutput = false }
    }

    /// When the next answer still in its time is due to be looked at (nil without a write timeout or such an answer).
    /// Those past it wait for the connection to move (`stalledAnswersWaiting`), not for the timer.
    private func nextStalledAnswerDeadline(now: UInt64) -> UInt64? {
        let timeout = limits.writeTimeoutMilliseconds
        guard timeout > 0 else { return nil }
        var earliest: UInt64?
        for moved in answeredStreams.values where moved + timeout > now && moved + timeout < earliest ?? .max {
            earliest = moved + timeout
        }
        return earliest
    }

    /// HTTP/2: the timer fires at `due` (the loop's clock).
    private func armHTTP2(at due: UInt64) {
        let now = loop.nowMilliseconds
        timerDue = due
        timer.restart(milliseconds: due > now ? due - now : 0)
    }

    private func finish() {
        if case .closed = mode { return }
        mode = .closed
        timer.close()
        let onClose = self.onClose
        self.onClose = nil
        onClose?()
    }

    // MARK: HTTP2ServerHandler

    func serverConnection(_ connection: HTTP2ServerConnection, didReceive request: HTTP2ServerRequest) {
        guard !request.bodyTruncated else { return }  // answered 413 when it went past the limit
        // A client that resets its streams right after sending them frees their slots while their handlers still
        // run ("rapid reset"); past this many unanswered requests new streams are refused (the client may retry),
        // so one connection cannot start handlers without bound.
        guard handlersInFlight < Int(limits.maxConcurrentStreams) else {
            connection.refuse(streamID: request.streamID)
            return
        }
        handlersInFlight += 1
        if request.method == "HEAD" { headStreams.insert(request.streamID) }
        let httpRequest = HTTPRequest(
            method: request.method, target: request.path, headers: request.headers, body: request.body,
            version: .http2)
        handler(httpRequest, HTTPResponder(loop: loop, sink: self, requestID: Int64(request.streamID)))
    }

    func serverConnection(_ connection: HTTP2ServerConnection, bodyTooLarge streamID: Int32) {
        handlersInFlight += 1  // `deliver` counts every answer out
        deliver(limits.answer(413, "request body larger than \(limits.maxBodyBytes) bytes"), for: Int64(streamID))
    }

    func serverConnection(_ connection: HTTP2ServerConnection, requestTimedOut streamID: Int32, headComplete: Bool) {
        handlersInFlight += 1  // `deliver` counts every answer out
        let message = headComplete ? "request timeout: the body did not arrive in time" : "request timeout"
        deliver(limits.answer(408, message), for: Int64(streamID))
        // An unfinished header block stops the whole connection: only its CONTINUATION may come next. Closed once
        // the stream is reset after the linger (GOAWAY, then close), as HTTP/1.1 closes after its 408, rather than
        // holding a `max_connections` place for the idle timeout.
        if !headComplete { connection.drain() }
    }

    func serverConnection(_ connection: HTTP2ServerConnection, requestDeadlineAt milliseconds: UInt64) {
        if milliseconds < timerDue { armHTTP2(at: milliseconds) }
    }

    func serverConnectionStreamLimitViolated(_ connection: HTTP2ServerConnection) {}

    func serverConnection(_ connection: HTTP2ServerConnection, didCloseStream streamID: Int32, errorCode: UInt32) {
        headStreams.remove(streamID)
        if answeredStreams.removeValue(forKey: streamID) != nil && answeredStreams.isEmpty {
            channel.holdsOutput = false
        }
        if connection.openStreamCount == 0 {
            idleDue = loop.nowMilliseconds + limits.idleTimeoutMilliseconds
            armHTTP2(at: idleDue)
        }
    }

    func serverConnection(_ connection: HTTP2ServerConnection, answerMovedOn streamID: Int32) {
        guard answeredStreams[streamID] != nil else { return }
        let now = loop.nowMilliseconds
        answeredStreams[streamID] = now
        lastAnswerMoved = now
        if stalledAnswersWaiting { abandonStalledAnswers(of: connection, now: now) }
    }

    func serverConnectionDidClose(_ connection: HTTP2ServerConnection, error: TransportError?) {
        finish()
    }

    // MARK: HTTPResponseSink (HTTP/2; HTTP/1.1 answers go to its own connection)

    func deliver(_ response: HTTPResponse, for requestID: Int64) {
        guard case .http2(let connection) = mode else { return }
        handlersInFlight = max(0, handlersInFlight - 1)
        var headers: [(name: String, value: String)] = []
        headers.reserveCapacity(response.headers.count + 1)
        for header in response.headers where !HTTPResponse.isServerManaged(header.name) {
            let name = header.name.lowercased().filter { $0 != "\r" && $0 != "\n" && $0 != ":" }
            guard !name.isEmpty else { continue }
            headers.append((name, header.value.filter { $0 != "\r" && $0 != "\n" }))
        }
        let streamID = Int32(truncatingIfNeeded: requestID)
        let bodyless = response.status == 204 || response.status == 304
        if !bodyless { headers.append(("content-length", String(response.body.count))) }
        let omitBody = bodyless || headStreams.remove(streamID) != nil
        let status = (100...999).contains(response.status) ? response.status : 500
        connection.respond(streamID: streamID, status: status, headers: headers, body: omitBody ? [] : response.body)
        if connection.isOpen(streamID: streamID) {  // not when the client reset it meanwhile
            let now = loop.nowMilliseconds
            answeredStreams[streamID] = now
            channel.holdsOutput = true
            let timeout = limits.writeTimeoutMilliseconds
            if timeout > 0 && now + timeout < timerDue { armHTTP2(at: now + timeout) }
        }
    }
}
