import CLibUV
package import CNGHTTP2
import Foundation

/// Which end of an HTTP/2 connection a session plays.
package enum HTTP2Role: Sendable {
    /// Opens streams (`submitRequest`) and reads responses: `HTTP2ClientConnection`.
    case client
    /// Accepts streams the peer opens and answers them (`respond`): the test-only HTTP/2 server.
    case server
}

/// HTTP/2 error codes (RFC 9113 §7), as RST_STREAM and GOAWAY carry them.
package enum HTTP2ErrorCode {
    package static let noError = UInt32(NGHTTP2_NO_ERROR.rawValue)
    package static let protocolError = UInt32(NGHTTP2_PROTOCOL_ERROR.rawValue)
    package static let internalError = UInt32(NGHTTP2_INTERNAL_ERROR.rawValue)
    package static let refusedStream = UInt32(NGHTTP2_REFUSED_STREAM.rawValue)
    package static let cancel = UInt32(NGHTTP2_CANCEL.rawValue)
}

/// What a session announces in its first SETTINGS, and how it keeps the connection alive. Start
/// from `client(pingIntervalMilliseconds:)` or `server(maxConcurrentStreams:)`.
package struct HTTP2SessionSettings: Sendable {
    /// SETTINGS_MAX_CONCURRENT_STREAMS (nil: not sent, so unlimited). A server's stream limit.
    package var maxConcurrentStreams: UInt32?
    /// SETTINGS_INITIAL_WINDOW_SIZE: each stream's receive window.
    package var initialWindowSize: UInt32 = 1 << 20
    /// SETTINGS_MAX_HEADER_LIST_SIZE (nil: not sent).
    package var maxHeaderListSize: UInt32?
    /// The connection's receive window, raised with a WINDOW_UPDATE right after SETTINGS.
    package var connectionWindowSize: Int32 = 16 << 20
    /// Send a PING after this long without hearing from the peer; close if it stays silent as long
    /// again (0: never).
    package var pingIntervalMilliseconds: UInt64 = 0
    /// Client role: the id of the first stream, 1 unless a test starts near HTTP/2's last (2^31 - 1) to see a
    /// session run out of stream ids.
    package var firstStreamID: Int32 = 1

    /// A client's: 1 MiB stream windows, 16 MiB for the connection, a keepalive PING.
    package static func client(pingIntervalMilliseconds: UInt64, firstStreamID: Int32 = 1) -> Self {
        var settings = Self()
        settings.pingIntervalMilliseconds = pingIntervalMilliseconds
        settings.firstStreamID = firstStreamID
        return settings
    }

    /// A server's: a stream limit, an 8,000-byte header list limit, no keepalive.
    package static func server(maxConcurrentStreams: UInt32) -> Self {
        var settings = Self()
        settings.maxConcurrentStreams = maxConcurrentStreams
        settings.maxHeaderListSize = 8000
        return settings
    }
}

/// What a session tells the connection built on it (client or server). All calls on the loop thread.
///
/// Streams are identified to the delegate by the context object it gave the session for them
/// (`submitRequest(_:context:)`, or `session(_:contextForStream:)` for streams the peer opens): the
/// session hands back exactly those objects, so a delegate may `unsafeDowncast` them to its own type.
package protocol HTTP2SessionDelegate: AnyObject {
    /// TLS is up (for a client: verified, h2 negotiated) and our SETTINGS are queued.
    func sessionDidBecomeReady(_ session: HTTP2Session)
    /// Server role: the peer opened stream `streamID`. Returns the context the session keeps for it.
    func session(_ session: HTTP2Session, contextForStream streamID: Int32) -> AnyObject
    /// A header of a HEADERS frame (request or response headers, or trailers). Valid during the call.
    func session(
        _ session: HTTP2Session, stream: AnyObject, didReceiveHeader name: UnsafeRawBufferPointer,
        value: UnsafeRawBufferPointer)
    /// Body bytes of a stream. Valid during the call.
    func session(_ session: HTTP2Session, stream: AnyObject, didReceiveData data: UnsafeRawBufferPointer)
    /// Server role: a request's header block is complete and the request goes on with a body (the HEADERS
    /// frame had no END_STREAM; one that had is reported as `streamDidEnd` alone). Optional.
    func session(_ session: HTTP2Session, requestHeadDidEnd stream: AnyObject, streamID: Int32)
    /// The peer ended its side of the stream (END_STREAM on HEADERS or DATA).
    func session(_ session: HTTP2Session, streamDidEnd stream: AnyObject, streamID: Int32)
    /// Server role, with `reportsAnswerEnd`: this side's last frame of stream `streamID` (END_STREAM on HEADERS or
    /// DATA) was just sent; the stream stays open if the peer has not ended its side. Optional.
    func session(_ session: HTTP2Session, answerDidEnd stream: AnyObject, streamID: Int32)
    /// Server role, with `reportsAnswerEnd`: a DATA frame of this side's answer on stream `streamID` was just sent
    /// (its flow-control window let it go). Optional.
    func session(_ session: HTTP2Session, didSendAnswerData stream: AnyObject, streamID: Int32)
    /// The stream closed, normally (`errorCode` 0) or by RST_STREAM from either side. The session has
    /// released its context.
    func session(_ session: HTTP2Session, didClose stream: AnyObject, streamID: Int32, errorCode: UInt32)
    /// The peer's SETTINGS arrived (its MAX_CONCURRENT_STREAMS may have changed).
    func sessionDidReceiveSettings(_ session: HTTP2Session)
    /// The peer sent GOAWAY. `debugData` is valid during the call.
    func session(
        _ session: HTTP2Session, didReceiveGoaway lastStreamID: Int32, errorCode: UInt32,
        debugData: UnsafeRawBufferPointer)
    /// Server role: the peer opened a stream past the MAX_CONCURRENT_STREAMS it had acknowledged
    /// (nghttp2 answers it with a PROTOCOL_ERROR).
    func sessionPeerExceededStreamLimit(_ session: HTTP2Session)
    /// The session is closed: `error` says why (nil when this side closed it). `openStreams` are the
    /// contexts of the streams that were still open, with their ids; nghttp2 will never report them.
    /// Called exactly once; the session lets go of its delegate right after.
    func session(
        _ session: HTTP2Session, didCloseWith error: TransportError?,
        openStreams: [(streamID: Int32, stream: AnyObject)])
}

extension HTTP2SessionDelegate {
    package func session(_ session: HTTP2Session, contextForStream streamID: Int32) -> AnyObject {
        preconditionFailure("\(Self.self) plays a client: peers cannot open streams on it")
    }
    package func session(_ session: HTTP2Session, requestHeadDidEnd stream: AnyObject, streamID: Int32) {}
    package func session(_ session: HTTP2Session, streamDidEnd stream: AnyObject, streamID: Int32) {}
    package func session(_ session: HTTP2Session, answerDidEnd stream: AnyObject, streamID: Int32) {}
    package func session(_ session: HTTP2Session, didSendAnswerData stream: AnyObject, streamID: Int32) {}
    package func sessionDidReceiveSettings(_ session: HTTP2Session) {}
    package func session(
        _ session: HTTP2Session, didReceiveGoaway lastStreamID: Int32, errorCode: UInt32,
        debugData: UnsafeRawBufferPointer
    ) {}
    package func sessionPeerExceededStreamLimit(_ session: HTTP2Session) {}
}

/// The one nghttp2 binding: an nghttp2 session (client or server role, as swift-nio-http2's
/// `NGHTTP2Session` had) driven over a `SecureChannel` with `mem_recv`/`mem_send`, nghttp2 1.52's
/// classic API. `HTTP2ClientConnection` and the test server's connection are thin layers over it.
///
/// It owns, in one place:
/// - the nghttp2 session: created with every callback when TLS is ready, deleted on close; it allocates from
///   an `HTTP2BlockPool`, so streams reuse nghttp2's freed blocks instead of calling malloc;
/// - the stream table, the only owner of each open stream's context (see `streams`);
/// - the re-entrancy guard: a close asked for from inside an nghttp2 callback waits until nghttp2
///   has returned, so nghttp2 is never deleted under its own feet;
/// - the one data-provider reader, which sends a stream's `SharedBody` without copying it first;
/// - the end of the connection: a stop action on the loop, the keepalive PING, GOAWAY, and
///   closing once nghttp2 wants neither to read nor to write.
///
/// Confined to its loop: every method must be called on the loop thread.
package final class HTTP2Session: SecureChannelDelegate {
    package let role: HTTP2Role
    package let loop: LoopThread
    private let settings: HTTP2SessionSettings
    /// Strong (no weak side table on the hot path): cleared when the session closes, which ends the
    /// cycle with the connection that owns this session.
    @exclusivity(unchecked) package var delegate: HTTP2SessionDelegate? {
        didSet {
            delegateBox = delegate.map(DelegateBox.init)
            unretainedDelegate = delegateBox.map { Unmanaged.passUnretained($0) }
        }
    }
    /// `delegate` in an immutable box, and that box unretained, for the stream callbacks (about a dozen per request
    /// a server answers): through it they reach the delegate with no retain and no dynamic exclusivity check. Replaced
    /// whenever `delegate` is set, which only `finishClose` does after init, and a close asked for inside nghttp2
    /// waits until nghttp2 has returned.
    private var delegateBox: DelegateBox?
    private var unretainedDelegate: Unmanaged<DelegateBox>?
    @exclusivity(unchecked) private var channel: SecureChannel?
    /// Owned: created when TLS is ready, freed with `nghttp2_session_del` in `finishClose`.
    @exclusivity(unchecked) private var nghttp2: OpaquePointer?
    /// The allocator nghttp2 was made with (its blocks are reused, so streams allocate nothing in steady
    /// state). Released only after `nghttp2_session_del`, which frees through it.
    @exclusivity(unchecked) private var blockPool: HTTP2BlockPool?

    /// One open stream: the delegate's context and what the data provider is sending on it.
    struct OpenStream {
        let context: AnyObject
        var body: SharedBody?
        var bodyOffset = 0
    }

    /// Owns every open stream's context, from the stream's opening (our request, or the peer's
    /// HEADERS) to nghttp2's on_stream_close, or to `finishClose`, since `nghttp2_session_del` frees
    /// its streams without calling on_stream_close. nghttp2 holds no pointer to a context: callbacks
    /// find it here by stream id (neither stream user data nor the data source pointer is used).
    /// `@exclusivity(unchecked)`: touched several times per request, and only on the loop thread, never across a
    /// call that could reach it again; the dynamic check cost more than the lookup.
    @exclusivity(unchecked) private var streams: HTTP2StreamTable

    @exclusivity(unchecked) package private(set) var isReady = false
    @exclusivity(unchecked) package private(set) var isClosed = false
    /// The peer sent GOAWAY: it will process no stream above the one it named.
    @exclusivity(unchecked) package private(set) var goawayReceived = false
    /// This side asked the channel to close (drained, or nghttp2 is done), so a clean close is not
    /// the peer going away.
    @exclusivity(unchecked) private var closeRequested = false
    /// Closing gracefully: GOAWAY goes out once the last open stream closes.
    @exclusivity(unchecked) private var draining = false
    /// Set when nghttp2 reported a fatal error: the session stops reading, sends what nghttp2 queued
    /// (a GOAWAY naming the error) and closes with this error.
    @exclusivity(unchecked) private var failure: TransportError?
    /// Depth of calls into nghttp2 (mem_recv/mem_send) now on the stack.
    @exclusivity(unchecked) private var depth = 0
    /// A close asked for while `depth > 0`, carried out when nghttp2 returns.
    @exclusivity(unchecked) private var pendingClose: TransportError??
    @exclusivity(unchecked) private var stopActionID = 0
    @exclusivity(unchecked) private var keepaliveTimer: LoopTimer?
    @exclusivity(unchecked) private var lastReadMilliseconds: UInt64 = 0
    @exclusivity(unchecked) private var pingOutstanding = false

    /// - Parameters:
    ///   - role: client or server.
    ///   - settings: what the first SETTINGS frame announces, and the keepalive.
    package init(role: HTTP2Role, loop: LoopThread, settings: HTTP2SessionSettings) {
        loop.assertInLoop()
        self.role = role
        self.loop = loop
        self.settings = settings
        streams = HTTP2StreamTable(capacity: Int(min(settings.maxConcurrentStreams ?? 128, 1024)))
        // The loop holds the session (and so its delegate) strongly until it closes, so callers need
        // not keep a connection alive; when the loop stops first, the session closes as cancelled.
        stopActionID = loop.addStopAction { [self] in close(TransportError(.cancelled, "event loop stopped")) }
    }

    deinit {
        // The loop's stop action holds the session until it closes, so only a closed one can go.
        assert(isClosed, "an HTTP2Session must be closed before it is freed")
        scratchBytes?.deallocate()
        scratchFields?.deallocate()
        pathScratch?.deallocate()
    }

    /// Runs HTTP/2 over `channel` once its TLS handshake is done. Call once.
    package func start(_ channel: SecureChannel) {
        loop.assertInLoop()
        precondition(self.channel == nil, "a session runs over one channel")
        guard !isClosed else {
            channel.close(error: nil)
            return
        }
        self.channel = channel
        channel.delegate = self
        channel.start()
    }

    /// Runs HTTP/2 over `channel`, which is already ready (a server that read the first bytes to choose the
    /// protocol, or chose it by ALPN): the nghttp2 session starts at once and is fed `readAhead` (the bytes
    /// already read, client preface included) before anything else. Call once, instead of `start`.
    package func adopt(_ channel: SecureChannel, readAhead: UnsafeRawBufferPointer) {
        loop.assertInLoop()
        precondition(self.channel == nil, "a session runs over one channel")
        precondition(channel.isReady, "adopt takes a channel that is ready")
        guard !isClosed else {
            channel.close(error: nil)
            return
        }
        self.channel = channel
        channel.delegate = self
        channelDidBecomeReady(channel)
        if readAhead.count > 0 && !isClosed { self.channel(channel, didRead: readAhead) }
    }

    // MARK: Streams

    /// Open streams (including ones this side reset whose RST_STREAM has not gone out yet).
    package var openStreamCount: Int { streams.count }

    /// Server role: whether the delegate hears `requestHeadDidEnd` (a connection with request deadlines). Off, the
    /// per-request path makes no call for it (mock-apns answers hundreds of thousands a second).
    package var reportsRequestHeadEnd = false
    /// Server role: whether the delegate hears `answerDidEnd` and `didSendAnswerData` (a connection with request
    /// deadlines, which may answer a request before it has all come, and times out an answer that stops moving). Set
    /// before the session starts: it makes nghttp2 call back for every frame sent, which a session without it
    /// (mock-apns's) never pays for.
    package var reportsAnswerEnd = false

    /// The context of open stream `streamID` (nil when it is not open).
    package func context(ofStream streamID: Int32) -> AnyObject? {
        streams.context(of: streamID)?.takeUnretainedValue()
    }

    /// The peer's SETTINGS_MAX_CONCURRENT_STREAMS (unlimited until its SETTINGS arrive).
    package var remoteMaxConcurrentStreams: Int {
        guard let nghttp2 else { return 0 }
        return Int(nghttp2_session_get_remote_settings(nghttp2, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS))
    }

    /// The highest stream id the peer opened and this side processed (for a GOAWAY).
    package var lastProcessedStreamID: Int32 {
        guard let nghttp2 else { return 0 }
        return nghttp2_session_get_last_proc_stream_id(nghttp2)
    }

    /// Client role: opens a stream for `request`. `context` is kept in the stream table until the
    /// stream closes and handed back with the stream's events. Returns the stream id, or why no
    /// stream could be opened.
    package func submitRequest(_ request: HTTP2Request, context: AnyObject) -> Result<Int32, TransportError> {
        assert(role == .client, "only a client submits requests")
        guard let nghttp2, !isClosed, failure == nil else {
            return .failure(TransportError(.connectionClosed, "the HTTP/2 session is closed"))
        }
        // The closures below capture these, not `request`: capturing the whole struct would copy it (a retain and
        // a release of each of its references, per request).
        let head = request.head
        let apnsID = request.apnsID
        let streamID: Int32 = withPath(of: request) { pathBytes in
            func submit(_ extra: (name: StaticString, value: UnsafeRawBufferPointer, indexed: Bool)?) -> Int32 {
                // The read callback finds the body in the stream table by stream id; no source pointer. A local
                // of this function, not of submitRequest: a mutable variable the nested function captured would
                // be boxed on the heap, one allocation per request (nghttp2 copies the provider on submit).
                var provider = nghttp2_data_provider(
                    source: nghttp2_data_source(ptr: nil), read_callback: nghttp2ReadCallback)
                return head.withNameValuePairs(path: pathBytes, extra: extra) { nva, count in
                    nghttp2_submit_request(nghttp2, nil, nva, count, &provider, nil)
                }
            }
            if let apnsID {
                let name: StaticString = "apns-id"
                let indexed = uniqueFieldNames.shouldIndex(
                    UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
                var streamID: Int32 = 0
                apnsID.withUTF8 { streamID = submit((name, $0, indexed)) }
                return streamID
            }
            return submit(nil)
        }
        guard streamID > 0 else {
            return .failure(TransportError(.protocolError, "cannot open stream: \(http2ErrorName(streamID))"))
        }
        streams.insert(OpenStream(context: context, body: request.body), for: streamID)
        holdUntilSent(head)
        channel?.scheduleFlush()
        return .success(streamID)
    }

    /// The header blocks of requests whose HEADERS frames nghttp2 may not have sent yet: it reads a block's bytes then,
    /// not when the request is submitted (see `HeaderBlock`). A job's requests share one block, so this holds one
    /// entry per run of requests with the same block, and lets them all go once nghttp2's outbound queue is empty
    /// (`channelProduceOutput`). Held here, not in each open stream's entry: the stream table copies its entries, and a
    /// reference there cost three retains and releases per request.
    @exclusivity(unchecked) private var unsentHeaderBlocks: [HeaderBlock] = []
    @exclusivity(unchecked) private var lastHeldHeaderBlock: ObjectIdentifier?

    private func holdUntilSent(_ head: HeaderBlock) {
        // Safe to compare by identity: the last block held is in the array, so its address is not reused meanwhile.
        guard ObjectIdentifier(head) != lastHeldHeaderBlock else { return }
        unsentHeaderBlocks.append(head)
        lastHeldHeaderBlock = ObjectIdentifier(head)
    }

    /// Which per-message id fields (`apns-id` and the like) have had their name entered in HPACK's table.
    @exclusivity(unchecked) private var uniqueFieldNames = UniqueFieldNames()

    /// Owned: allocated on first use (grown when a path does not fit), freed in deinit. Where `withPath` joins a
    /// request's `path` and `pathSuffix`; nghttp2 copies the header on submit, so one buffer serves every request.
    @exclusivity(unchecked) private var pathScratch: UnsafeMutableRawBufferPointer?

    /// Lends `body` the request's `:path` bytes, `path` then `pathSuffix`, valid only inside `body`.
    private func withPath<R>(of request: HTTP2Request, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        var path = request.path
        guard let suffix = request.pathSuffix else { return path.withUTF8 { body(UnsafeRawBufferPointer($0)) } }
        let needed = path.utf8.count + suffix.utf8Count
        if (pathScratch?.count ?? 0) < needed {
            pathScratch?.deallocate()
            pathScratch = .allocate(byteCount: max(needed, 256), alignment: 1)
        }
        let scratch = pathScratch!
        let prefixCount = path.withUTF8 { bytes in
            scratch.copyMemory(from: UnsafeRawBufferPointer(bytes))
            return bytes.count
        }
        suffix.write(into: UnsafeMutableRawBufferPointer(rebasing: scratch[prefixCount...]))
        return body(UnsafeRawBufferPointer(rebasing: scratch[..<needed]))
    }

    /// Server role: answers stream `streamID` with `status`, `headers` and `body` (nil or empty: the
    /// HEADERS frame ends the stream). A stream that has closed is ignored.
    package func respond(
        streamID: Int32, status: Int, headers: [(name: String, value: String)], body: SharedBody?
    ) {
        withResponseHeaders(status: status, headers: headers) { nva, count in
            respond(streamID: streamID, fields: UnsafeBufferPointer(start: nva, count: count), body: body)
        }
    }

    /// Server role: answers stream `streamID` with header fields already laid out for nghttp2, `:status` first
    /// (nghttp2 copies them before this returns), and `body` as `respond(streamID:status:headers:body:)` does.
    package func respond(streamID: Int32, fields: UnsafeBufferPointer<nghttp2_nv>, body: SharedBody?) {
        assert(role == .server, "only a server responds")
        guard let nghttp2, !isClosed else { return }
        let hasBody = (body?.count ?? 0) > 0
        guard streams.update(streamID, { $0.body = hasBody ? body : nil }) != nil else { return }
        let rc = uniqueFieldNames.withNamesEntered(fields) { fields in
            if hasBody {
                var provider = nghttp2_data_provider(
                    source: nghttp2_data_source(ptr: nil), read_callback: nghttp2ReadCallback)
                return nghttp2_submit_response(nghttp2, streamID, fields.baseAddress, fields.count, &provider)
            }
            return nghttp2_submit_response(nghttp2, streamID, fields.baseAddress, fields.count, nil)
        }
        if rc != 0 {
            nghttp2_submit_rst_stream(
                nghttp2, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, HTTP2ErrorCode.internalError)
        }
        channel?.scheduleFlush()
    }

    /// Resets a stream with RST_STREAM(`errorCode`). nghttp2 closes it (on_stream_close) once the
    /// frame is sent; a reset of a stream whose HEADERS are still queued cancels them.
    package func resetStream(_ streamID: Int32, errorCode: UInt32) {
        guard let nghttp2, !isClosed else { return }
        nghttp2_submit_rst_stream(nghttp2, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, errorCode)
        channel?.scheduleFlush()
    }

    /// Sends SETTINGS with a new MAX_CONCURRENT_STREAMS.
    package func submitMaxConcurrentStreams(_ value: UInt32) {
        guard let nghttp2, !isClosed else { return }
        var entry = nghttp2_settings_entry(
            settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: value)
        nghttp2_submit_settings(nghttp2, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entry, 1)
        channel?.scheduleFlush()
    }

    /// Sends GOAWAY naming the last stream processed so far, with `debugData`. Streams up to that one
    /// may still finish; nghttp2 accepts later ones until the GOAWAY has gone out. Returns the last
    /// stream id it named (nil when the session is not running).
    @discardableResult
    package func submitGoaway(errorCode: UInt32, debugData: [UInt8]) -> Int32? {
        guard let nghttp2, !isClosed else { return nil }
        let lastStreamID = nghttp2_session_get_last_proc_stream_id(nghttp2)
        nghttp2_submit_goaway(
            nghttp2, UInt8(NGHTTP2_FLAG_NONE.rawValue), lastStreamID, errorCode, debugData, debugData.count)
        channel?.scheduleFlush()
        return lastStreamID
    }

    /// Sends a PING; with a keepalive interval, the session closes if the peer stays silent for
    /// another interval.
    package func ping() {
        guard let nghttp2, !isClosed else { return }
        nghttp2_submit_ping(nghttp2, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
        pingOutstanding = true
        channel?.scheduleFlush()
    }

    // MARK: Closing

    /// Closes gracefully: GOAWAY(NO_ERROR) goes out once no stream is open (at once if none is), and
    /// the channel closes when it has been written. Before TLS is ready it closes at once.
    package func drain() {
        guard !isClosed else { return }
        guard let nghttp2 else {
            close(nil)
            return
        }
        draining = true
        if streams.isEmpty { nghttp2_session_terminate_session(nghttp2, HTTP2ErrorCode.noError) }
        channel?.scheduleFlush()
    }

    /// Closes now: the nghttp2 session is deleted, the channel closed, and the delegate told once,
    /// with the streams still open. Idempotent. From inside an nghttp2 callback it happens as soon as
    /// nghttp2 returns.
    package func close(_ error: TransportError?) {
        guard !isClosed else { return }
        if depth > 0 {
            pendingClose = pendingClose ?? .some(error)
            return
        }
        finishClose(error)
    }

    /// Carries out a close asked for inside nghttp2. True when the session is closed.
    private func finishPendingClose() -> Bool {
        if depth == 0, let error = pendingClose {
            pendingClose = nil
            finishClose(error)
        }
        return isClosed
    }

    private func finishClose(_ error: TransportError?) {
        isClosed = true
        isReady = false
        loop.removeStopAction(stopActionID)
        keepaliveTimer?.close()
        keepaliveTimer = nil
        if let nghttp2 {
            // nghttp2_session_del frees its streams without calling on_stream_close: the streams
            // still in the table are handed to the delegate below.
            nghttp2_session_del(nghttp2)
            self.nghttp2 = nil
        }
        blockPool = nil  // after nghttp2_session_del, which returned every block
        unsentHeaderBlocks = []  // likewise: nghttp2 held the last pointers into them
        lastHeldHeaderBlock = nil
        let open = streams.removeAll().map { (streamID: $0.id, stream: $0.value.context) }
        if let channel {
            channel.delegate = nil
            channel.close(error: nil)
        }
        channel = nil
        let delegate = self.delegate
        self.delegate = nil
        delegate?.session(self, didCloseWith: error, openStreams: open)
    }

    /// nghttp2 reported a fatal error: stop reading, let what it queued (GOAWAY) go out, then close.
    private func fail(_ error: TransportError) {
        guard failure == nil else { return }
        failure = error
        closeRequested = true
        channel?.closeWhenFlushed()
    }

    // MARK: SecureChannelDelegate

    package func channelDidBecomeReady(_ channel: SecureChannel) {
        var session: OpaquePointer?
        // The session holds an unretained pointer to self as user data; `finishClose` deletes the
        // session before self can go (the loop's stop action holds self until then).
        let userData = Unmanaged.passUnretained(self).toOpaque()
        let pool = HTTP2BlockPool()
        var allocator = pool.nghttp2Allocator()
        let rc = Self.withCallbacks(role: role, reportsFramesSent: reportsAnswerEnd) { callbacks in
            switch role {
            case .client: return nghttp2_session_client_new3(&session, callbacks, userData, nil, &allocator)
            case .server: return nghttp2_session_server_new3(&session, callbacks, userData, nil, &allocator)
            }
        }
        guard rc == 0, let session else {
            close(TransportError(.protocolError, "cannot create HTTP/2 session: \(http2ErrorName(rc))"))
            return
        }
        nghttp2 = session
        blockPool = pool
        if role == .client && settings.firstStreamID > 1 {
            _ = nghttp2_session_set_next_stream_id(session, settings.firstStreamID)
        }
        withSettingsEntries { entries, count in
            _ = nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), entries, count)
        }
        nghttp2_session_set_local_window_size(
            session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, settings.connectionWindowSize)
        isReady = true
        lastReadMilliseconds = uv_now(loop.loop)
        startKeepalive()
        channel.scheduleFlush()
        delegate?.sessionDidBecomeReady(self)
    }

    package func channel(_ channel: SecureChannel, didRead plaintext: UnsafeRawBufferPointer) {
        guard let nghttp2, failure == nil else { return }
        lastReadMilliseconds = uv_now(loop.loop)
        loop.readClock()  // the time of every answer this read brings (`LoopThread.clockNanoseconds`)
        pingOutstanding = false
        depth += 1
        let consumed = nghttp2_session_mem_recv(
            nghttp2, plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), plaintext.count)
        depth -= 1
        if finishPendingClose() { return }
        if consumed < 0 {
            fail(TransportError(.protocolError, "HTTP/2 error from peer: \(http2ErrorName(Int32(consumed)))"))
            return
        }
        channel.scheduleFlush()
    }

    package func channel(_ channel: SecureChannel, didCloseWith error: TransportError?) {
        // A clean close this side did not ask for, without a GOAWAY first, is the peer going away.
        let peerLeft = closeRequested || goawayReceived ? nil : TransportError(.connectionClosed, "connection closed")
        close(error ?? failure ?? peerLeft)
    }

    package func channelProduceOutput(_ channel: SecureChannel) {
        guard let nghttp2 else { return }
        while channel.canWrite {
            var data: UnsafePointer<UInt8>?
            depth += 1
            let count = nghttp2_session_mem_send(nghttp2, &data)
            depth -= 1
            if finishPendingClose() { return }
            if count < 0 {
                close(TransportError(.protocolError, "HTTP/2 send failed: \(http2ErrorName(Int32(count)))"))
                return
            }
            if count == 0 { break }
            channel.write(UnsafeRawBufferPointer(start: data, count: count))
            // A failed TLS write closes the channel, and with it this session.
            if isClosed { return }
        }
        // Every HEADERS frame queued so far is written (or dropped with its stream): nghttp2 reads no held block again.
        if !unsentHeaderBlocks.isEmpty && nghttp2_session_get_outbound_queue_size(nghttp2) == 0 {
            unsentHeaderBlocks.removeAll(keepingCapacity: true)
            lastHeldHeaderBlock = nil
        }
        // nghttp2 is done (GOAWAY sent or received and no stream left, or a fatal error): close
        // once the last bytes are written.
        if nghttp2_session_want_read(nghttp2) == 0 && nghttp2_session_want_write(nghttp2) == 0 {
            closeRequested = true
            channel.closeWhenFlushed()
        }
    }

    // MARK: nghttp2 events (from the thunks below)

    fileprivate func didBeginHeaders(streamID: Int32) {
        guard role == .server, let box = unretainedDelegate else { return }
        // The table owns the context from here to on_stream_close.
        let context = box._withUnsafeGuaranteedRef { $0.delegate.session(self, contextForStream: streamID) }
        streams.insert(OpenStream(context: context), for: streamID)
    }

    /// Calls `body` with the delegate and open stream `streamID`'s context, neither retained (the stream table and
    /// the delegate box hold them, and nothing removes either while nghttp2 runs this callback).
    @inline(__always)
    private func withContext(ofStream streamID: Int32, _ body: (HTTP2SessionDelegate, AnyObject) -> Void) {
        guard let box = unretainedDelegate, let context = streams.context(of: streamID) else { return }
        box._withUnsafeGuaranteedRef { box in context._withUnsafeGuaranteedRef { body(box.delegate, $0) } }
    }

    fileprivate func didReceiveHeader(streamID: Int32, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        withContext(ofStream: streamID) { $0.session(self, stream: $1, didReceiveHeader: name, value: value) }
    }

    fileprivate func didReceiveData(streamID: Int32, data: UnsafeRawBufferPointer) {
        withContext(ofStream: streamID) { $0.session(self, stream: $1, didReceiveData: data) }
    }

    fileprivate func didReceiveRequestHead(streamID: Int32) {
        withContext(ofStream: streamID) { $0.session(self, requestHeadDidEnd: $1, streamID: streamID) }
    }

    fileprivate func didReceiveEndOfStream(streamID: Int32) {
        withContext(ofStream: streamID) { $0.session(self, streamDidEnd: $1, streamID: streamID) }
    }

    fileprivate func didSendData(streamID: Int32) {
        withContext(ofStream: streamID) { $0.session(self, didSendAnswerData: $1, streamID: streamID) }
    }

    fileprivate func didSendEndOfStream(streamID: Int32) {
        withContext(ofStream: streamID) { $0.session(self, answerDidEnd: $1, streamID: streamID) }
    }

    fileprivate func didCloseStream(streamID: Int32, errorCode: UInt32) {
        guard let closed = streams.remove(streamID) else { return }
        delegate?.session(self, didClose: closed.context, streamID: streamID, errorCode: errorCode)
        if draining && streams.isEmpty, let nghttp2, !isClosed {
            nghttp2_session_terminate_session(nghttp2, HTTP2ErrorCode.noError)
        }
    }

    fileprivate func didReceiveSettings() {
        delegate?.sessionDidReceiveSettings(self)
    }

    fileprivate func didReceiveGoaway(lastStreamID: Int32, errorCode: UInt32, debugData: UnsafeRawBufferPointer) {
        goawayReceived = true
        delegate?.session(self, didReceiveGoaway: lastStreamID, errorCode: errorCode, debugData: debugData)
    }

    fileprivate func didReceiveInvalidFrame(type: UInt8, errorCode: Int32) {
        // A request HEADERS refused with PROTOCOL_ERROR while as many streams as we acknowledged
        // are open: the peer ignored our MAX_CONCURRENT_STREAMS.
        guard role == .server, let nghttp2, type == UInt8(NGHTTP2_HEADERS.rawValue),
            errorCode == NGHTTP2_ERR_PROTO.rawValue
        else { return }
        let acknowledged = nghttp2_session_get_local_settings(nghttp2, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
        if streams.count >= acknowledged { delegate?.sessionPeerExceededStreamLimit(self) }
    }

    /// The one data-provider reader: copies the next bytes of the stream's body into nghttp2's frame
    /// buffer and sets EOF at the end. Returns the byte count, as the read callback must.
    fileprivate func readBody(
        streamID: Int32, into buffer: UnsafeMutablePointer<UInt8>, length: Int, flags: UnsafeMutablePointer<UInt32>
    ) -> Int {
        let read = streams.update(streamID) { stream -> Int in
            let body = stream.body?.bytes ?? UnsafeRawBufferPointer(start: nil, count: 0)
            let offset = stream.bodyOffset
            let take = min(length, body.count - offset)
            if take > 0 {
                UnsafeMutableRawPointer(buffer).copyMemory(from: body.baseAddress! + offset, byteCount: take)
                stream.bodyOffset = offset + take
            }
            if offset + take == body.count { flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
            return take
        }
        // A stream not in the table: reset just this stream.
        return read ?? Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
    }

    // MARK: Setup helpers

    /// Lends `body` an nghttp2 callbacks object with every callback of `role` set (and the frame-sent one when
    /// `reportsFramesSent`): the one place the thunks are wired up.
    private static func withCallbacks<R>(
        role: HTTP2Role, reportsFramesSent: Bool = false, _ body: (OpaquePointer?) -> R
    ) -> R {
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_header_callback(callbacks, nghttp2HeaderCallback)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, nghttp2DataChunkCallback)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, nghttp2FrameRecvCallback)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, nghttp2StreamCloseCallback)
        if role == .server {
            nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, nghttp2BeginHeadersCallback)
            nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(callbacks, nghttp2InvalidFrameCallback)
            if reportsFramesSent {
                nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, nghttp2FrameSendCallback)
            }
        }
        return body(callbacks)
    }

    /// Lends `body` the first SETTINGS frame's entries.
    private func withSettingsEntries(_ body: (UnsafePointer<nghttp2_settings_entry>, Int) -> Void) {
        func entry(_ id: nghttp2_settings_id, _ value: UInt32) -> nghttp2_settings_entry {
            nghttp2_settings_entry(settings_id: Int32(id.rawValue), value: value)
        }
        var entries = [entry(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, settings.initialWindowSize)]
        if role == .client { entries.append(entry(NGHTTP2_SETTINGS_ENABLE_PUSH, 0)) }
        if let value = settings.maxConcurrentStreams {
            entries.append(entry(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, value))
        }
        if let value = settings.maxHeaderListSize {
            entries.append(entry(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, value))
        }
        entries.withUnsafeBufferPointer { body($0.baseAddress!, $0.count) }
    }

    private func startKeepalive() {
        let interval = settings.pingIntervalMilliseconds
        guard interval > 0 else { return }
        let timer = LoopTimer(loop: loop)
        timer.unref()
        keepaliveTimer = timer
        // Strong capture (no weak side table on self): finishClose closes the timer, ending the cycle.
        timer.schedule(milliseconds: interval, repeatMilliseconds: interval) { [self] in
            guard !isClosed else { return }
            let silent = uv_now(loop.loop) - lastReadMilliseconds
            if pingOutstanding && silent >= 2 * interval {
                close(TransportError(.connectionClosed, "peer did not answer PING for \(silent) ms"))
            } else if silent >= interval && !pingOutstanding {
                ping()
            }
        }
    }

    // MARK: Response headers

    /// Owned: allocated on first use, freed in deinit. Where response header names and values are
    /// laid out for nghttp2 (which copies them on submit), so answering allocates nothing.
    @exclusivity(unchecked) private var scratchBytes: UnsafeMutableRawBufferPointer?
    /// Owned: allocated on first use, freed in deinit. The nghttp2_nv entries pointing into `scratchBytes`.
    @exclusivity(unchecked) private var scratchFields: UnsafeMutableBufferPointer<nghttp2_nv>?

    /// Lends nghttp2 the `:status` and `headers` laid out in the scratch buffers (or, when they do
    /// not fit, in temporary arrays).
    private func withResponseHeaders<R>(
        status: Int, headers: [(name: String, value: String)], _ body: (UnsafePointer<nghttp2_nv>, Int) -> R
    ) -> R {
        let scratchBytes = self.scratchBytes ?? .allocate(byteCount: 4096, alignment: 8)
        let scratchFields = self.scratchFields ?? .allocate(capacity: 32)
        self.scratchBytes = scratchBytes
        self.scratchFields = scratchFields
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
            // An id is new in every response: indexing it would only churn both sides' HPACK tables (mock-apns
            // under h2load spent a third more time in nghttp2 than with a constant header). Its name is entered
            // once per session (`respond(streamID:fields:body:)`, `UniqueFieldNames`).
            let unique = name == "apns-id" || name == "apns-unique-id" || name == "apns-request-id"
            scratchFields[count] = nghttp2_nv(
                name: namePointer, value: valuePointer, namelen: name.utf8.count, valuelen: value.utf8.count,
                flags: UInt8(unique ? NGHTTP2_NV_FLAG_NO_INDEX.rawValue : NGHTTP2_NV_FLAG_NONE.rawValue))
            count += 1
            return true
        }
        var fits = add(":status", String(status))
        for header in headers where fits { fits = add(header.name, header.value) }
        if fits { return body(UnsafePointer(scratchFields.baseAddress!), count) }
        return withNameValueArray([(":status", String(status))] + headers.map { ($0.name, $0.value) }, body)
    }
}

/// An `HTTP2Session`'s delegate, held in a `let` so it can be read through an unretained reference to the box
/// without a retain (see `HTTP2Session.delegateBox`).
private final class DelegateBox {
    let delegate: HTTP2SessionDelegate
    init(_ delegate: HTTP2SessionDelegate) { self.delegate = delegate }
}

/// Lends nghttp2 a header array for `fields`, valid only inside `body` (nghttp2 copies on submit).
private func withNameValueArray<R>(_ fields: [(String, String)], _ body: (UnsafePointer<nghttp2_nv>, Int) -> R) -> R {
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

package func bytesEqual(_ bytes: UnsafeRawBufferPointer, _ literal: StaticString) -> Bool {
    guard bytes.count == literal.utf8CodeUnitCount else { return false }
    return memcmp(bytes.baseAddress!, literal.utf8Start, bytes.count) == 0
}

func http2ErrorName(_ code: Int32) -> String {
    String(cString: nghttp2_strerror(code))
}

// MARK: nghttp2 callback thunks
//
// Each is defined once, for both roles: a file-level function matching nghttp2's C typedef (so it is
// @convention(c)) that recovers the session from `user_data` and forwards to one of its methods.

/// Calls `body` with the session behind nghttp2's `user_data`: an unretained pointer set in
/// `channelDidBecomeReady`, valid until `finishClose` deletes the nghttp2 session. Lent without a retain (a
/// retain and release per callback, about fifteen per request a server answers, showed in mock-apns's profile):
/// the loop's stop action holds the session, and a close asked for inside nghttp2 waits until it returns.
@inline(__always)
private func withSession<R>(_ userData: UnsafeMutableRawPointer?, _ body: (HTTP2Session) -> R) -> R {
    guard let userData else { preconditionFailure("nghttp2 callback without user data") }
    return Unmanaged<HTTP2Session>.fromOpaque(userData)._withUnsafeGuaranteedRef(body)
}

private func nghttp2BeginHeadersCallback(
    _ nghttp2: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue),
        frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST
    else { return 0 }
    withSession(userData) { $0.didBeginHeaders(streamID: frame.pointee.hd.stream_id) }
    return 0
}

private func nghttp2HeaderCallback(
    _ nghttp2: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ name: UnsafePointer<UInt8>?,
    _ nameLength: Int, _ value: UnsafePointer<UInt8>?, _ valueLength: Int, _ flags: UInt8,
    _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue) else { return 0 }
    withSession(userData) {
        $0.didReceiveHeader(
            streamID: frame.pointee.hd.stream_id, name: UnsafeRawBufferPointer(start: name, count: nameLength),
            value: UnsafeRawBufferPointer(start: value, count: valueLength))
    }
    return 0
}

private func nghttp2DataChunkCallback(
    _ nghttp2: OpaquePointer?, _ flags: UInt8, _ streamID: Int32, _ data: UnsafePointer<UInt8>?, _ length: Int,
    _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    withSession(userData) {
        $0.didReceiveData(streamID: streamID, data: UnsafeRawBufferPointer(start: data, count: length))
    }
    return 0
}

private func nghttp2FrameRecvCallback(
    _ nghttp2: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame else { return 0 }
    let header = frame.pointee.hd
    withSession(userData) { owner in
        switch UInt32(header.type) {
        case NGHTTP2_SETTINGS.rawValue:
            if header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0 { owner.didReceiveSettings() }
        case NGHTTP2_GOAWAY.rawValue:
            let goaway = frame.pointee.goaway
            owner.didReceiveGoaway(
                lastStreamID: goaway.last_stream_id, errorCode: goaway.error_code,
                debugData: UnsafeRawBufferPointer(start: goaway.opaque_data, count: goaway.opaque_data_len))
        case NGHTTP2_HEADERS.rawValue, NGHTTP2_DATA.rawValue:
            if header.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0 {
                owner.didReceiveEndOfStream(streamID: header.stream_id)
            } else if owner.reportsRequestHeadEnd && UInt32(header.type) == NGHTTP2_HEADERS.rawValue
                && frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST
            {
                owner.didReceiveRequestHead(streamID: header.stream_id)
            }
        default:
            break
        }
    }
    return 0
}

/// Set only for a session that `reportsAnswerEnd`.
private func nghttp2FrameSendCallback(
    _ nghttp2: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame else { return 0 }
    let header = frame.pointee.hd
    let type = UInt32(header.type)
    if type == NGHTTP2_DATA.rawValue { withSession(userData) { $0.didSendData(streamID: header.stream_id) } }
    guard type == NGHTTP2_DATA.rawValue || type == NGHTTP2_HEADERS.rawValue,
        header.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
    else { return 0 }
    withSession(userData) { $0.didSendEndOfStream(streamID: header.stream_id) }
    return 0
}

private func nghttp2StreamCloseCallback(
    _ nghttp2: OpaquePointer?, _ streamID: Int32, _ errorCode: UInt32, _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    withSession(userData) { $0.didCloseStream(streamID: streamID, errorCode: errorCode) }
    return 0
}

private func nghttp2InvalidFrameCallback(
    _ nghttp2: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ errorCode: Int32,
    _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame else { return 0 }
    withSession(userData) { $0.didReceiveInvalidFrame(type: frame.pointee.hd.type, errorCode: errorCode) }
    return 0
}

private func nghttp2ReadCallback(
    _ nghttp2: OpaquePointer?, _ streamID: Int32, _ buffer: UnsafeMutablePointer<UInt8>?, _ length: Int,
    _ flags: UnsafeMutablePointer<UInt32>?, _ source: UnsafeMutablePointer<nghttp2_data_source>?,
    _ userData: UnsafeMutableRawPointer?
) -> Int {
    guard let buffer, let flags else { return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue) }
    return withSession(userData) { $0.readBody(streamID: streamID, into: buffer, length: length, flags: flags) }
}
