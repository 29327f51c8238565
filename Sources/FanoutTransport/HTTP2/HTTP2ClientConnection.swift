import CLibUV
import CNGHTTP2
import Foundation

/// Settings of one client connection.
package struct HTTP2ClientConfiguration: Sendable {
    package var host: String
    package var port: Int
    package var tls: TLSClientConfiguration
    package var connectTimeoutMilliseconds: UInt64
    /// Upper bound on concurrent streams, below the server's MAX_CONCURRENT_STREAMS (h2load `-m`).
    package var maxConcurrentStreams: Int
    /// Send a PING after this long without hearing from the server; close if it stays silent as long again.
    package var pingIntervalMilliseconds: UInt64

    package init(
        host: String, port: Int, tls: TLSClientConfiguration = TLSClientConfiguration(),
        connectTimeoutMilliseconds: UInt64 = 10_000, maxConcurrentStreams: Int = 1000,
        pingIntervalMilliseconds: UInt64 = 15_000
    ) {
        self.host = host
        self.port = port
        self.tls = tls
        self.connectTimeoutMilliseconds = connectTimeoutMilliseconds
        self.maxConcurrentStreams = maxConcurrentStreams
        self.pingIntervalMilliseconds = pingIntervalMilliseconds
    }
}

/// Events a connection reports to its owner, on the loop thread.
package enum HTTP2ConnectionEvent: Sendable {
    /// TLS verified, h2 negotiated, our preface sent.
    case ready
    /// The server sent GOAWAY; no new stream will be opened. `reason` is the debug data's reason.
    case goaway(lastStreamID: Int32, errorCode: UInt32, reason: String?)
    /// More streams may be opened (a stream closed or the server raised its limit).
    case capacityAvailable
    /// The connection is closed; `error` is nil when we closed it.
    case closed(TransportError?)
}

/// One HTTP/2 client connection over TLS on one loop: connect, handshake, then streams.
///
/// It keeps its stream window full: requests wait in a queue and are submitted while fewer than
/// `min(server MAX_CONCURRENT_STREAMS, configured max)` streams are open, one more each time a
/// stream closes (h2load's `on_stream_close`). Until the first response it allows one stream, as
/// APNs does before it has seen a valid provider token. Confined to its loop: call everything on
/// the loop thread (use `loop.execute`).
///
/// `@unchecked Sendable`: it may be referenced from any thread, but every method must run on its loop
/// (asserted in debug builds), like a swift-nio Channel.
package final class HTTP2ClientConnection: SecureChannelDelegate, @unchecked Sendable {
    package let loop: LoopThread
    package let configuration: HTTP2ClientConfiguration
    private let tlsContext: TLSContext
    private var channel: SecureChannel?
    /// Owned: created when TLS is ready, freed with `nghttp2_session_del` in `teardown`.
    private var session: OpaquePointer?
    package var onEvent: ((HTTP2ConnectionEvent) -> Void)?

    private var waiting = FIFOQueue<PendingRequest>()
    package private(set) var openStreams = 0
    /// The most streams open at once so far.
    package private(set) var peakOpenStreams = 0
    /// Streams allowed before the first response (APNs: one until a valid token was seen).
    private var ramped = false
    package private(set) var isReady = false
    package private(set) var isClosed = false
    package private(set) var goawayReceived = false
    private var goawayLastStreamID: Int32 = .max
    private var goawayErrorCode: UInt32 = 0
    private var pingTimer: LoopTimer?
    private var lastHeardMilliseconds: UInt64 = 0
    private var pingOutstanding = false
    private var stopActionID = 0
    /// Counts of what happened, for tests and stats.
    package private(set) var responsesReceived = 0

    /// Creates a connection and starts connecting. Call on the loop thread.
    package init(loop: LoopThread, configuration: HTTP2ClientConfiguration, tlsContext: TLSClientContext) {
        loop.assertInLoop()
        self.loop = loop
        self.configuration = configuration
        self.tlsContext = tlsContext.context
        // The loop holds the connection (strongly) until it closes, so callers need not keep it
        // alive; when the loop stops first, the connection fails its requests as cancelled.
        stopActionID = loop.addStopAction { [self] in teardown(TransportError(.cancelled, "event loop stopped")) }
        connect()
    }

    private func connect() {
        TCPConnector.connect(
            loop: loop, host: configuration.host, port: configuration.port,
            timeoutMilliseconds: configuration.connectTimeoutMilliseconds
        ) { [self] result in
            switch result {
            case .failure(let error):
                teardown(error)
            case .success(let socket):
                guard !isClosed else {
                    socket.close()
                    return
                }
                do throws(TransportError) {
                    let tls = try TLSEngine(context: tlsContext, host: configuration.host)
                    let channel = SecureChannel(
                        socket: socket, tls: tls,
                        handshakeTimeoutMilliseconds: configuration.tls.handshakeTimeoutMilliseconds)
                    channel.delegate = self
                    self.channel = channel
                    channel.start()
                } catch {
                    socket.close()
                    teardown(error)
                }
            }
        }
    }

    /// The number of streams this connection may have open now.
    package var streamLimit: Int {
        guard let session, ramped else { return 1 }
        let remote = Int(nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS))
        return min(remote, configuration.maxConcurrentStreams)
    }

    /// Requests accepted but not finished (queued plus open).
    package var outstanding: Int { waiting.count + openStreams }

    /// Whether new requests are accepted (not closed, not draining after GOAWAY).
    package var isAcceptingRequests: Bool { !isClosed && !goawayReceived }

    /// Queues a request; `completion` runs on the loop thread exactly once.
    package func submit(_ request: HTTP2Request, completion: @escaping HTTP2Completion) {
        loop.assertInLoop()
        guard isAcceptingRequests else {
            completion(.failure(.notSent(TransportError(.connectionClosed, "connection is not accepting requests"))))
            return
        }
        waiting.append(PendingRequest(request: request, completion: completion))
        if isReady { fillStreams() }
    }

    /// Opens streams for waiting requests while the window allows.
    private func fillStreams() {
        guard let session, isReady, !goawayReceived else { return }
        var submitted = false
        while openStreams < streamLimit, let pending = waiting.popFirst() {
            let context = StreamContext(request: pending.request, completion: pending.completion)
            if submitStream(session: session, context: context) {
                openStreams += 1
                submitted = true
            }
        }
        peakOpenStreams = max(peakOpenStreams, openStreams)
        if submitted { channel?.scheduleFlush() }
    }

    private func submitStream(session: OpaquePointer, context: StreamContext) -> Bool {
        let request = context.request
        // nghttp2 gets an unretained pointer (stream user data and data source); `openContexts`
        // owns the context from submission until on_stream_close or teardown.
        let contextPointer = Unmanaged.passUnretained(context).toOpaque()
        var provider = nghttp2_data_provider(
            source: nghttp2_data_source(ptr: contextPointer), read_callback: http2ReadBodyCallback)
        var path = request.path
        var apnsID = request.apnsID
        let streamID: Int32 = path.withUTF8 { pathBytes in
            func submit(_ extra: (name: StaticString, value: UnsafeRawBufferPointer)?) -> Int32 {
                request.head.withNameValuePairs(path: UnsafeRawBufferPointer(pathBytes), extra: extra) { nva, count in
                    nghttp2_submit_request(session, nil, nva, count, &provider, contextPointer)
                }
            }
            if apnsID != nil {
                return apnsID!.withUTF8 { submit(("apns-id", UnsafeRawBufferPointer($0))) }
            }
            return submit(nil)
        }
        if streamID < 0 {
            context.complete(
                .failure(.notSent(TransportError(.protocolError, "cannot open stream: \(http2ErrorName(streamID))"))))
            return false
        }
        context.streamID = streamID
        openContexts[streamID] = context
        return true
    }

    /// Sends a PING; the connection closes if the server stays silent for another ping interval.
    package func ping() {
        guard let session, !isClosed else { return }
        nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
        pingOutstanding = true
        channel?.scheduleFlush()
    }

    /// Closes gracefully: sends GOAWAY, fails waiting requests as not sent, lets open streams finish
    /// unless `immediately`.
    package func close(immediately: Bool = false) {
        loop.assertInLoop()
        guard !isClosed else { return }
        if let session, !immediately {
            goawayReceived = true  // accept nothing new
            failWaiting(TransportError(.cancelled, "connection closing"))
            if openStreams == 0 {
                nghttp2_session_terminate_session(session, UInt32(NGHTTP2_NO_ERROR.rawValue))
                channel?.closeWhenFlushed()
            }
            return
        }
        teardown(nil)
    }

    private func failWaiting(_ error: TransportError) {
        while let pending = waiting.popFirst() {
            pending.completion(.failure(.notSent(error)))
        }
    }

    /// Ends everything: fails open streams as lost and waiting ones as not sent, frees the session.
    private func teardown(_ error: TransportError?) {
        guard !isClosed else { return }
        if insideSession > 0 {
            // Called from inside an nghttp2 callback (a completion closed us): nghttp2 must not be
            // deleted under its own feet, so finish right after it returns.
            pendingTeardown = pendingTeardown ?? .some(error)
            return
        }
        isClosed = true
        isReady = false
        loop.removeStopAction(stopActionID)
        pingTimer?.close()
        pingTimer = nil
        let cause = error ?? TransportError(.cancelled, "connection closed")
        closingError = cause
        if let session {
            // nghttp2_session_del frees open streams without calling on_stream_close, so the
            // streams still open are completed here, as lost: the server may have acted on them.
            nghttp2_session_del(session)
            self.session = nil
        }
        let lost = openContexts
        openContexts = [:]
        openStreams = 0
        for context in lost.values {
            // Above a GOAWAY's last stream id the server promised not to process it: safe to resend.
            if goawayReceived && context.streamID > goawayLastStreamID {
                context.complete(.failure(.notProcessed(goawayErrorCode: goawayErrorCode)))
            } else {
                context.complete(.failure(.connectionLost(cause)))
            }
        }
        failWaiting(cause)
        if let channel, !channel.isClosed {
            channel.delegate = nil
            channel.close(error: nil)
        }
        channel = nil
        onEvent?(.closed(error))
        onEvent = nil
    }

    /// Owns every open stream's context (nghttp2 holds only unretained pointers to them).
    private var openContexts: [Int32: StreamContext] = [:]
    /// Set while tearing down, so stream closes report the connection's error.
    private var closingError: TransportError?
    /// Depth of calls into nghttp2 (mem_recv/mem_send), during which the session must live.
    private var insideSession = 0
    private var pendingTeardown: TransportError??

    private func finishPendingTeardown() {
        guard insideSession == 0, let error = pendingTeardown else { return }
        pendingTeardown = nil
        teardown(error)
    }

    // MARK: SecureChannelDelegate

    package func channelDidBecomeReady(_ channel: SecureChannel) {
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_header_callback(callbacks, http2ClientHeaderCallback)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, http2ClientDataCallback)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, http2ClientStreamCloseCallback)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, http2ClientFrameCallback)
        var session: OpaquePointer?
        // The session holds an unretained pointer to self; teardown deletes it before self goes.
        let rc = nghttp2_session_client_new(&session, callbacks, Unmanaged.passUnretained(self).toOpaque())
        guard rc == 0, let session else {
            teardown(TransportError(.protocolError, "cannot create HTTP/2 session: \(http2ErrorName(rc))"))
            return
        }
        self.session = session
        var settings = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: 1 << 20),
        ]
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, 16 << 20)
        isReady = true
        lastHeardMilliseconds = uvNowMilliseconds(loop)
        startPingTimer()
        channel.scheduleFlush()
        onEvent?(.ready)
        fillStreams()
    }

    package func channel(_ channel: SecureChannel, didRead plaintext: UnsafeRawBufferPointer) {
        guard let session else { return }
        lastHeardMilliseconds = uvNowMilliseconds(loop)
        pingOutstanding = false
        insideSession += 1
        let consumed = nghttp2_session_mem_recv(
            session, plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), plaintext.count)
        insideSession -= 1
        finishPendingTeardown()
        if isClosed { return }
        if consumed < 0 {
            teardown(TransportError(.protocolError, "HTTP/2 error from server: \(http2ErrorName(Int32(consumed)))"))
            return
        }
        channel.scheduleFlush()
    }

    package func channel(_ channel: SecureChannel, didCloseWith error: TransportError?) {
        teardown(error ?? (goawayReceived ? nil : TransportError(.connectionClosed, "connection closed")))
    }

    package func channelProduceOutput(_ channel: SecureChannel) {
        guard let session else { return }
        while channel.canWrite {
            var data: UnsafePointer<UInt8>?
            insideSession += 1
            let count = nghttp2_session_mem_send(session, &data)
            insideSession -= 1
            if pendingTeardown != nil {
                finishPendingTeardown()
                return
            }
            if count < 0 {
                teardown(TransportError(.protocolError, "HTTP/2 send failed: \(http2ErrorName(Int32(count)))"))
                return
            }
            if count == 0 { break }
            channel.write(UnsafeRawBufferPointer(start: data, count: count))
        }
        // A drained, idle session after GOAWAY has nothing left to do.
        if goawayReceived && openStreams == 0 && nghttp2_session_want_write(session) == 0 {
            channel.closeWhenFlushed()
        }
    }

    // MARK: nghttp2 events

    fileprivate func didReceiveHeader(streamID: Int32, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        guard let session, let raw = nghttp2_session_get_stream_user_data(session, streamID) else { return }
        let context = Unmanaged<StreamContext>.fromOpaque(raw).takeUnretainedValue()
        context.record(name: name, value: value)
    }

    fileprivate func didReceiveData(streamID: Int32, data: UnsafeRawBufferPointer) {
        guard let session, let raw = nghttp2_session_get_stream_user_data(session, streamID) else { return }
        Unmanaged<StreamContext>.fromOpaque(raw).takeUnretainedValue().responseBody.append(contentsOf: data)
    }

    fileprivate func didCloseStream(streamID: Int32, errorCode: UInt32) {
        guard let context = openContexts.removeValue(forKey: streamID) else { return }
        openStreams -= 1
        if let status = context.status, errorCode == NGHTTP2_NO_ERROR.rawValue || context.endStreamSeen {
            responsesReceived += 1
            ramped = true
            context.complete(.success(context.makeResponse(status: status)))
        } else if let closingError {
            context.complete(.failure(.connectionLost(closingError)))
        } else if goawayReceived && streamID > goawayLastStreamID {
            context.complete(.failure(.notProcessed(goawayErrorCode: goawayErrorCode)))
        } else if errorCode == NGHTTP2_REFUSED_STREAM.rawValue {
            context.complete(.failure(.refused))
        } else {
            context.complete(.failure(.reset(errorCode: errorCode)))
        }
        if closingError == nil {
            fillStreams()
            onEvent?(.capacityAvailable)
        }
    }

    fileprivate func didReceiveSettings() {
        fillStreams()
    }

    fileprivate func didReceiveGoaway(lastStreamID: Int32, errorCode: UInt32, debugData: UnsafeRawBufferPointer) {
        goawayReceived = true
        goawayLastStreamID = lastStreamID
        goawayErrorCode = errorCode
        let reason = goawayReason(debugData)
        failWaiting(TransportError(.goaway, "server sent GOAWAY\(reason.map { " (\($0))" } ?? "")"))
        onEvent?(.goaway(lastStreamID: lastStreamID, errorCode: errorCode, reason: reason))
    }

    fileprivate func didReceiveHeadersEnd(streamID: Int32, endStream: Bool) {
        guard endStream, let session, let raw = nghttp2_session_get_stream_user_data(session, streamID) else { return }
        Unmanaged<StreamContext>.fromOpaque(raw).takeUnretainedValue().endStreamSeen = true
    }

    private func goawayReason(_ debugData: UnsafeRawBufferPointer) -> String? {
        guard debugData.count > 0,
            let object = try? JSONSerialization.jsonObject(with: Data(debugData)) as? [String: Any]
        else { return debugData.count > 0 ? String(decoding: debugData, as: UTF8.self) : nil }
        return object["reason"] as? String
    }

    private func startPingTimer() {
        let interval = configuration.pingIntervalMilliseconds
        guard interval > 0 else { return }
        let timer = LoopTimer(loop: loop)
        timer.unref()
        pingTimer = timer
        // Strong capture (no weak side table on self): teardown closes the timer, ending the cycle.
        timer.schedule(milliseconds: interval, repeatMilliseconds: interval) { [self] in
            guard !self.isClosed else { return }
            let silent = uvNowMilliseconds(self.loop) - self.lastHeardMilliseconds
            if self.pingOutstanding && silent >= 2 * interval {
                self.teardown(TransportError(.connectionClosed, "server did not answer PING for \(silent) ms"))
            } else if silent >= interval && !self.pingOutstanding {
                self.ping()
            }
        }
    }
}

/// A request waiting for a stream.
private struct PendingRequest {
    let request: HTTP2Request
    let completion: HTTP2Completion
}

/// State of one open stream: the request being sent and the response being collected. nghttp2
/// holds a +1 on it (stream user data) from submission to on_stream_close.
final class StreamContext {
    let request: HTTP2Request
    private var completion: HTTP2Completion?
    var streamID: Int32 = -1
    var bodyOffset = 0
    var status: Int?
    var apnsID: String?
    var apnsUniqueID: String?
    var responseBody: [UInt8] = []
    var endStreamSeen = false

    init(request: HTTP2Request, completion: @escaping HTTP2Completion) {
        self.request = request
        self.completion = completion
    }

    func record(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if bytesEqual(name, ":status") {
            status = parseDecimal(value)
        } else if bytesEqual(name, "apns-id") {
            apnsID = String(decoding: value, as: UTF8.self)
        } else if bytesEqual(name, "apns-unique-id") {
            apnsUniqueID = String(decoding: value, as: UTF8.self)
        }
    }

    func makeResponse(status: Int) -> HTTP2Response {
        HTTP2Response(status: status, apnsID: apnsID, apnsUniqueID: apnsUniqueID, body: responseBody)
    }

    func complete(_ result: Result<HTTP2Response, HTTP2StreamFailure>) {
        guard let completion else { return }
        self.completion = nil
        completion(result)
    }
}

package func bytesEqual(_ bytes: UnsafeRawBufferPointer, _ literal: StaticString) -> Bool {
    guard bytes.count == literal.utf8CodeUnitCount else { return false }
    return memcmp(bytes.baseAddress!, literal.utf8Start, bytes.count) == 0
}

func parseDecimal(_ bytes: UnsafeRawBufferPointer) -> Int? {
    guard !bytes.isEmpty, bytes.count < 19 else { return nil }
    var value = 0
    for byte in bytes {
        guard byte >= 48 && byte <= 57 else { return nil }
        value = value * 10 + Int(byte - 48)
    }
    return value
}

func http2ErrorName(_ code: Int32) -> String {
    String(cString: nghttp2_strerror(code))
}

func uvNowMilliseconds(_ loop: LoopThread) -> UInt64 {
    uv_now(loop.loop)
}

// MARK: nghttp2 callback thunks (client)

private func clientConnection(_ userData: UnsafeMutableRawPointer?) -> HTTP2ClientConnection {
    guard let userData else { preconditionFailure("nghttp2 callback without user data") }
    return Unmanaged<HTTP2ClientConnection>.fromOpaque(userData).takeUnretainedValue()
}

private func http2ReadBodyCallback(
    _ session: OpaquePointer?, _ streamID: Int32, _ buffer: UnsafeMutablePointer<UInt8>?, _ length: Int,
    _ flags: UnsafeMutablePointer<UInt32>?, _ source: UnsafeMutablePointer<nghttp2_data_source>?,
    _ userData: UnsafeMutableRawPointer?
) -> Int {
    guard let source, let raw = source.pointee.ptr, let buffer, let flags else {
        return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue)
    }
    let context = Unmanaged<StreamContext>.fromOpaque(raw).takeUnretainedValue()
    return readBody(context.request.body.bytes, offset: &context.bodyOffset, into: buffer, length: length, flags: flags)
}

private func http2ClientHeaderCallback(
    _ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ name: UnsafePointer<UInt8>?,
    _ nameLength: Int, _ value: UnsafePointer<UInt8>?, _ valueLength: Int, _ flags: UInt8,
    _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue) else { return 0 }
    clientConnection(userData).didReceiveHeader(
        streamID: frame.pointee.hd.stream_id, name: UnsafeRawBufferPointer(start: name, count: nameLength),
        value: UnsafeRawBufferPointer(start: value, count: valueLength))
    return 0
}

private func http2ClientDataCallback(
    _ session: OpaquePointer?, _ flags: UInt8, _ streamID: Int32, _ data: UnsafePointer<UInt8>?, _ length: Int,
    _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    clientConnection(userData).didReceiveData(
        streamID: streamID, data: UnsafeRawBufferPointer(start: data, count: length))
    return 0
}

private func http2ClientStreamCloseCallback(
    _ session: OpaquePointer?, _ streamID: Int32, _ errorCode: UInt32, _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    let connection = clientConnection(userData)
    connection.didCloseStream(streamID: streamID, errorCode: errorCode)
    return 0
}

private func http2ClientFrameCallback(
    _ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame else { return 0 }
    let connection = clientConnection(userData)
    let header = frame.pointee.hd
    switch UInt32(header.type) {
    case NGHTTP2_SETTINGS.rawValue:
        if header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0 { connection.didReceiveSettings() }
    case NGHTTP2_GOAWAY.rawValue:
        let goaway = frame.pointee.goaway
        connection.didReceiveGoaway(
            lastStreamID: goaway.last_stream_id, errorCode: goaway.error_code,
            debugData: UnsafeRawBufferPointer(start: goaway.opaque_data, count: goaway.opaque_data_len))
    case NGHTTP2_HEADERS.rawValue, NGHTTP2_DATA.rawValue:
        let endStream = header.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
        connection.didReceiveHeadersEnd(streamID: header.stream_id, endStream: endStream)
    default:
        break
    }
    return 0
}
