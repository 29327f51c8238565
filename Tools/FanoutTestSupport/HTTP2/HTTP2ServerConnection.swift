import CLibUV
import CNGHTTP2
import FanoutTransport
import Foundation

/// A complete request received by a server connection.
package struct HTTP2ServerRequest: Sendable {
    package var streamID: Int32
    package var method: String
    package var path: String
    /// Regular (non-pseudo) headers in arrival order, duplicates kept, names lowercase.
    package var headers: [(name: String, value: String)]
    package var body: [UInt8]
    /// The body was longer than `HTTP2ServerConnection.maxRequestBody`; `body` holds only its start.
    package var bodyTruncated = false
}

/// What a server connection asks of the application (mock-apns). Calls on the loop thread.
package protocol HTTP2ServerHandler: AnyObject {
    /// A request is complete; answer it (now or later) with `connection.respond` or `refuse`.
    func serverConnection(_ connection: HTTP2ServerConnection, didReceive request: HTTP2ServerRequest)
    /// The client opened a stream past our acknowledged MAX_CONCURRENT_STREAMS.
    func serverConnectionStreamLimitViolated(_ connection: HTTP2ServerConnection)
    /// The connection is gone.
    func serverConnectionDidClose(_ connection: HTTP2ServerConnection, error: TransportError?)
}

/// The server side of one HTTP/2 connection over TLS: nghttp2's server session on a secure channel.
/// A malformed or hostile peer gets a GOAWAY from nghttp2 and this connection closes; nothing it
/// sends can crash the process. Confined to its loop.
///
/// `@unchecked Sendable`: referenced from any thread, used only on its loop.
package final class HTTP2ServerConnection: SecureChannelDelegate, @unchecked Sendable {
    package let loop: LoopThread
    private let channel: SecureChannel
    /// Owned: created when TLS is ready, freed with `nghttp2_session_del` in `teardown`.
    private var session: OpaquePointer?
    /// Strong: the handler does not own connections, so there is no cycle (and no weak-reference
    /// side table on the hot path).
    private let handler: HTTP2ServerHandler
    private let initialMaxStreams: UInt32
    package private(set) var isClosed = false
    package private(set) var streamsReceived = 0
    private var insideSession = 0
    private var pendingClose = false
    private var goawaySent = false
    /// The last stream a sent GOAWAY promised to process; later ones are refused, never processed
    /// (nghttp2 keeps accepting streams until the GOAWAY has actually gone out).
    private var goawayLastStreamID: Int32 = .max
    /// Owned: freed in deinit. Scratch where response header names and values are laid out for
    /// nghttp2 (which copies them on submit), so answering allocates nothing.
    private let scratchBytes = UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 8)
    /// Owned: freed in deinit. The nghttp2_nv entries pointing into `scratchBytes`.
    private let scratchFields = UnsafeMutableBufferPointer<nghttp2_nv>.allocate(capacity: 32)

    deinit {
        scratchBytes.deallocate()
        scratchFields.deallocate()
    }

    /// Lends nghttp2 the `:status` and `headers` laid out in the scratch buffers (or, when they do
    /// not fit, in temporary arrays).
    private func withResponseHeaders<R>(
        status: Int, headers: [(name: String, value: String)], _ body: (UnsafePointer<nghttp2_nv>, Int) -> R
    ) -> R {
        var used = 0
        var count = 0
        let base = scratchBytes.baseAddress!.assumingMemoryBound(to: UInt8.self)
        func place(_ bytes: UnsafeBufferPointer<UInt8>) -> UnsafeMutablePointer<UInt8>? {
            guard used + bytes.count <= scratchBytes.count else { return nil }
            let start = base + used
            if let source = bytes.baseAddress { start.update(from: source, count: bytes.count) }
            used += bytes.count
            return start
        }
        func add(_ name: String, _ value: String) -> Bool {
            guard count < scratchFields.count else { return false }
            var name = name
            var value = value
            guard let namePointer = name.withUTF8({ place($0) }), let valuePointer = value.withUTF8({ place($0) })
            else {
                return false
            }
            scratchFields[count] = nghttp2_nv(
                name: namePointer, value: valuePointer, namelen: name.utf8.count, valuelen: value.utf8.count,
                flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
            count += 1
            return true
        }
        var fits = add(":status", String(status))
        for header in headers where fits { fits = add(header.name, header.value) }
        if fits { return body(UnsafePointer(scratchFields.baseAddress!), count) }
        return withNameValueArray([(":status", String(status))] + headers.map { ($0.name, $0.value) }, body)
    }

    /// Lets the server that owns this connection forget it.
    var onClose: (() -> Void)?
    /// A free slot for the application (mock-apns keeps its per-connection state here).
    package var userInfo: AnyObject?

    /// Largest request body kept; past it the rest is dropped and the request is marked truncated
    /// (APNs's own limit is 5 KiB), so a hostile client cannot make the server buffer without bound.
    static let maxRequestBody = 64 * 1024

    /// Wraps an accepted socket. Starts the TLS handshake at once.
    init(
        socket: TCPSocket, tlsContext: TLSServerContext, handler: HTTP2ServerHandler, initialMaxStreams: UInt32,
        handshakeTimeoutMilliseconds: UInt64 = 10_000
    ) throws(TransportError) {
        loop = socket.loop
        self.handler = handler
        self.initialMaxStreams = initialMaxStreams
        let tls = try TLSEngine(context: tlsContext.context)
        channel = SecureChannel(socket: socket, tls: tls, handshakeTimeoutMilliseconds: handshakeTimeoutMilliseconds)
        channel.delegate = self
        stopActionID = loop.addStopAction { [self] in teardown(TransportError(.cancelled, "event loop stopped")) }
        channel.start()
    }

    private var stopActionID = 0

    /// Sends SETTINGS with a new MAX_CONCURRENT_STREAMS (APNs raises it after the first valid
    /// token and drops it to 1 after a rejection).
    package func setMaxConcurrentStreams(_ value: UInt32) {
        guard let session, !isClosed else { return }
        var entry = nghttp2_settings_entry(
            settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: value)
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entry, 1)
        channel.scheduleFlush()
    }

    /// Answers a stream. `body` empty sends headers only (END_STREAM on HEADERS).
    package func respond(
        streamID: Int32, status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = []
    ) {
        guard let session, !isClosed else { return }
        guard let raw = nghttp2_session_get_stream_user_data(session, streamID) else { return }
        let stream = Unmanaged<ServerStream>.fromOpaque(raw).takeUnretainedValue()
        stream.responseBody = body
        let rc = withResponseHeaders(status: status, headers: headers) { nva, count -> Int32 in
            if body.isEmpty {
                return nghttp2_submit_response(session, streamID, nva, count, nil)
            }
            var provider = nghttp2_data_provider(
                source: nghttp2_data_source(ptr: raw), read_callback: http2ServerReadBodyCallback)
            return nghttp2_submit_response(session, streamID, nva, count, &provider)
        }
        if rc != 0 {
            nghttp2_submit_rst_stream(
                session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, UInt32(NGHTTP2_INTERNAL_ERROR.rawValue))
        }
        channel.scheduleFlush()
    }

    /// Resets a stream with REFUSED_STREAM (the request was not processed).
    package func refuse(streamID: Int32) {
        guard let session, !isClosed else { return }
        nghttp2_submit_rst_stream(
            session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, UInt32(NGHTTP2_REFUSED_STREAM.rawValue))
        channel.scheduleFlush()
    }

    /// Sends GOAWAY naming the last stream processed so far, with a JSON reason as debug data as
    /// APNs does, and closes once the processed streams are answered.
    package func sendGoaway(reason: String, errorCode: UInt32 = UInt32(NGHTTP2_NO_ERROR.rawValue)) {
        guard let session, !isClosed, !goawaySent else { return }
        goawaySent = true
        let lastStreamID = nghttp2_session_get_last_proc_stream_id(session)
        goawayLastStreamID = lastStreamID
        let debug = Array("{\"reason\":\"\(reason)\"}".utf8)
        nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), lastStreamID, errorCode, debug, debug.count)
        channel.scheduleFlush()
    }

    /// The highest stream id handed to the handler so far.
    package var lastProcessedStreamID: Int32 {
        guard let session else { return 0 }
        return nghttp2_session_get_last_proc_stream_id(session)
    }

    /// Drops the TCP connection at once, as a network failure would.
    package func drop() {
        teardown(nil)
    }

    private func teardown(_ error: TransportError?) {
        guard !isClosed else { return }
        if insideSession > 0 {
            pendingClose = true
            return
        }
        isClosed = true
        loop.removeStopAction(stopActionID)
        if let session {
            nghttp2_session_del(session)
            self.session = nil
        }
        streams = [:]
        channel.delegate = nil
        channel.close(error: nil)
        handler.serverConnectionDidClose(self, error: error)
        onClose?()
        onClose = nil
    }

    // MARK: SecureChannelDelegate

    package func channelDidBecomeReady(_ channel: SecureChannel) {
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, http2ServerBeginHeadersCallback)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, http2ServerHeaderCallback)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, http2ServerDataCallback)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, http2ServerFrameCallback)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, http2ServerStreamCloseCallback)
        nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(callbacks, http2ServerInvalidFrameCallback)
        var session: OpaquePointer?
        // The session holds an unretained pointer to self; teardown deletes it first.
        guard nghttp2_session_server_new(&session, callbacks, Unmanaged.passUnretained(self).toOpaque()) == 0,
            let session
        else {
            teardown(TransportError(.protocolError, "cannot create HTTP/2 server session"))
            return
        }
        self.session = session
        var settings = [
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: initialMaxStreams),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: 1 << 20),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue), value: 8000),
        ]
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, 16 << 20)
        channel.scheduleFlush()
    }

    package func channel(_ channel: SecureChannel, didRead plaintext: UnsafeRawBufferPointer) {
        guard let session else { return }
        insideSession += 1
        let consumed = nghttp2_session_mem_recv(
            session, plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), plaintext.count)
        insideSession -= 1
        if pendingClose {
            teardown(nil)
            return
        }
        if consumed < 0 {
            // nghttp2 has queued a GOAWAY for protocol errors; send it, then close.
            channel.closeWhenFlushed()
        }
        channel.scheduleFlush()
    }

    package func channel(_ channel: SecureChannel, didCloseWith error: TransportError?) {
        teardown(error)
    }

    package func channelProduceOutput(_ channel: SecureChannel) {
        guard let session else { return }
        while channel.canWrite {
            var data: UnsafePointer<UInt8>?
            insideSession += 1
            let count = nghttp2_session_mem_send(session, &data)
            insideSession -= 1
            if pendingClose || count < 0 {
                teardown(nil)
                return
            }
            if count == 0 { break }
            channel.write(UnsafeRawBufferPointer(start: data, count: count))
        }
        if nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0 {
            channel.closeWhenFlushed()
        }
    }

    // MARK: nghttp2 events

    fileprivate func beginStream(_ streamID: Int32) {
        guard let session else { return }
        streamsReceived += 1
        // `streams` owns it; nghttp2 holds an unretained pointer as stream user data.
        let stream = ServerStream(streamID: streamID)
        streams[streamID] = stream
        nghttp2_session_set_stream_user_data(session, streamID, Unmanaged.passUnretained(stream).toOpaque())
    }

    fileprivate func stream(_ streamID: Int32) -> ServerStream? {
        guard let session, let raw = nghttp2_session_get_stream_user_data(session, streamID) else { return nil }
        return Unmanaged<ServerStream>.fromOpaque(raw).takeUnretainedValue()
    }

    fileprivate func receiveData(_ streamID: Int32, _ data: UnsafeRawBufferPointer) {
        guard let stream = stream(streamID) else { return }
        if stream.body.count + data.count > Self.maxRequestBody {
            stream.overflow = true
            return
        }
        stream.body.append(contentsOf: data)
    }

    fileprivate func requestComplete(_ streamID: Int32) {
        guard let stream = stream(streamID), !stream.delivered else { return }
        stream.delivered = true
        if goawaySent && streamID > goawayLastStreamID {
            refuse(streamID: streamID)
            return
        }
        let request = HTTP2ServerRequest(
            streamID: streamID, method: stream.method, path: stream.path, headers: stream.headers, body: stream.body,
            bodyTruncated: stream.overflow)
        stream.headers = []
        stream.body = []
        handler.serverConnection(self, didReceive: request)
    }

    fileprivate func closeStream(_ streamID: Int32) {
        streams[streamID] = nil
    }

    /// Owns every open stream (nghttp2 holds unretained pointers; nghttp2_session_del frees its
    /// streams without calling on_stream_close, so this dictionary is what releases them).
    private var streams: [Int32: ServerStream] = [:]

    fileprivate func invalidFrame(type: UInt8, errorCode: Int32) {
        guard let session, type == UInt8(NGHTTP2_HEADERS.rawValue) else { return }
        let acknowledgedLimit = nghttp2_session_get_local_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
        let open = UInt32(max(0, streamsReceived - streamsClosed))
        if errorCode == NGHTTP2_ERR_PROTO.rawValue && open >= acknowledgedLimit {
            handler.serverConnectionStreamLimitViolated(self)
        }
    }

    fileprivate var streamsClosed = 0
}

/// One incoming stream: the request as it arrives, then the response body being sent.
final class ServerStream {
    let streamID: Int32
    var method = ""
    var path = ""
    var headers: [(name: String, value: String)] = []
    var body: [UInt8] = []
    var overflow = false
    var delivered = false
    var responseBody: [UInt8] = []
    var responseOffset = 0

    init(streamID: Int32) {
        self.streamID = streamID
        headers.reserveCapacity(12)  // an APNs request has up to 9 regular headers: one allocation
    }
}

/// Lends nghttp2 a header array for `fields`, valid only inside `body` (nghttp2 copies on submit).
func withNameValueArray<R>(_ fields: [(String, String)], _ body: (UnsafePointer<nghttp2_nv>, Int) -> R) -> R {
    var bytes: [UInt8] = []
    var offsets: [(Int, Int, Int, Int)] = []
    for (name, value) in fields {
        let nameOffset = bytes.count
        bytes.append(contentsOf: name.utf8)
        let valueOffset = bytes.count
        bytes.append(contentsOf: value.utf8)
        offsets.append((nameOffset, name.utf8.count, valueOffset, value.utf8.count))
    }
    bytes.append(0)
    return bytes.withUnsafeMutableBufferPointer { storage in
        withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(fields.count, 1)) { nva in
            let base = storage.baseAddress!
            for (index, entry) in offsets.enumerated() {
                nva[index] = nghttp2_nv(
                    name: base + entry.0, value: base + entry.2, namelen: entry.1, valuelen: entry.3,
                    flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
            }
            return body(UnsafePointer(nva.baseAddress!), fields.count)
        }
    }
}

// MARK: nghttp2 callback thunks (server)

private func serverConnection(_ userData: UnsafeMutableRawPointer?) -> HTTP2ServerConnection {
    guard let userData else { preconditionFailure("nghttp2 callback without user data") }
    return Unmanaged<HTTP2ServerConnection>.fromOpaque(userData).takeUnretainedValue()
}

private func http2ServerBeginHeadersCallback(
    _ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue),
        frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST
    else { return 0 }
    serverConnection(userData).beginStream(frame.pointee.hd.stream_id)
    return 0
}

private func http2ServerHeaderCallback(
    _ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ name: UnsafePointer<UInt8>?,
    _ nameLength: Int, _ value: UnsafePointer<UInt8>?, _ valueLength: Int, _ flags: UInt8,
    _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame, let stream = serverConnection(userData).stream(frame.pointee.hd.stream_id) else { return 0 }
    let nameBytes = UnsafeRawBufferPointer(start: name, count: nameLength)
    let valueString = String(decoding: UnsafeRawBufferPointer(start: value, count: valueLength), as: UTF8.self)
    if bytesEqual(nameBytes, ":method") {
        stream.method = valueString
    } else if bytesEqual(nameBytes, ":path") {
        stream.path = valueString
    } else if nameLength > 0 && name![0] != UInt8(ascii: ":") {
        stream.headers.append((String(decoding: nameBytes, as: UTF8.self), valueString))
    }
    return 0
}

private func http2ServerDataCallback(
    _ session: OpaquePointer?, _ flags: UInt8, _ streamID: Int32, _ data: UnsafePointer<UInt8>?, _ length: Int,
    _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    serverConnection(userData).receiveData(streamID, UnsafeRawBufferPointer(start: data, count: length))
    return 0
}

private func http2ServerFrameCallback(
    _ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame else { return 0 }
    let header = frame.pointee.hd
    let isRequestFrame = header.type == UInt8(NGHTTP2_HEADERS.rawValue) || header.type == UInt8(NGHTTP2_DATA.rawValue)
    if isRequestFrame && header.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0 {
        serverConnection(userData).requestComplete(header.stream_id)
    }
    return 0
}

private func http2ServerStreamCloseCallback(
    _ session: OpaquePointer?, _ streamID: Int32, _ errorCode: UInt32, _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    let connection = serverConnection(userData)
    connection.streamsClosed += 1
    connection.closeStream(streamID)
    return 0
}

private func http2ServerInvalidFrameCallback(
    _ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ errorCode: Int32,
    _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame else { return 0 }
    serverConnection(userData).invalidFrame(type: frame.pointee.hd.type, errorCode: errorCode)
    return 0
}

private func http2ServerReadBodyCallback(
    _ session: OpaquePointer?, _ streamID: Int32, _ buffer: UnsafeMutablePointer<UInt8>?, _ length: Int,
    _ flags: UnsafeMutablePointer<UInt32>?, _ source: UnsafeMutablePointer<nghttp2_data_source>?,
    _ userData: UnsafeMutableRawPointer?
) -> Int {
    guard let source, let raw = source.pointee.ptr, let buffer, let flags else {
        return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue)
    }
    let stream = Unmanaged<ServerStream>.fromOpaque(raw).takeUnretainedValue()
    return stream.responseBody.withUnsafeBytes { body in
        readBody(body, offset: &stream.responseOffset, into: buffer, length: length, flags: flags)
    }
}
