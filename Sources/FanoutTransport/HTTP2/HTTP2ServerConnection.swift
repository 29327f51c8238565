import CNGHTTP2
package import FanoutCore
import Foundation

/// A complete request received by a server connection.
package struct HTTP2ServerRequest: Sendable {
    package var streamID: Int32
    /// `:method`, `:path` and the regular headers as received, as byte ranges in one buffer (names lowercase).
    package var head: HeaderView
    package var body: [UInt8]
    /// The body was longer than `HTTP2ServerConnection.maxRequestBody`; `body` holds only its start.
    package var bodyTruncated = false

    package var method: String { head.methodString }
    package var path: String { head.pathString }
    /// Regular (non-pseudo) headers in arrival order, duplicates kept, names lowercase (made from `head`).
    package var headers: [(name: String, value: String)] { head.pairs }
}

/// What a server connection asks of the application (mock-apns, `HTTPServer`). Calls on the loop thread.
package protocol HTTP2ServerHandler: AnyObject {
    /// A request is complete; answer it (now or later) with `connection.respond` or `refuse`.
    func serverConnection(_ connection: HTTP2ServerConnection, didReceive request: HTTP2ServerRequest)
    /// The client opened a stream past our acknowledged MAX_CONCURRENT_STREAMS.
    func serverConnectionStreamLimitViolated(_ connection: HTTP2ServerConnection)
    /// A stream closed: `errorCode` is 0 when it ended normally, else the RST_STREAM code (the
    /// client's CANCEL is 8). Optional.
    func serverConnection(_ connection: HTTP2ServerConnection, didCloseStream streamID: Int32, errorCode: UInt32)
    /// The connection is gone.
    func serverConnectionDidClose(_ connection: HTTP2ServerConnection, error: TransportError?)
    /// Stream `streamID`'s body went past `maxRequestBody`: from here its data is dropped, and the request is
    /// delivered with `bodyTruncated` when the client ends it. Called once per stream, on the loop. Optional.
    func serverConnection(_ connection: HTTP2ServerConnection, bodyTooLarge streamID: Int32)
    /// With `requestDeadlines`: stream `streamID`'s request did not arrive in time (`headComplete` false: its header
    /// block; true: its body). Answer it now (the default answers a bare 408). Its body is freed, what more it sends is
    /// dropped, and it is never delivered; unless the client ends it, it is reset once the answer had time to go out.
    func serverConnection(_ connection: HTTP2ServerConnection, requestTimedOut streamID: Int32, headComplete: Bool)
    /// With `requestDeadlines`: an incomplete request is due at `milliseconds` (the loop's clock), which may be
    /// before any deadline reported so far; call `expireRequests(now:)` then. Optional.
    func serverConnection(_ connection: HTTP2ServerConnection, requestDeadlineAt milliseconds: UInt64)
    /// With `requestDeadlines`: a DATA frame of the answer on stream `streamID` just went out (the client's
    /// flow-control credit let it). Optional.
    func serverConnection(_ connection: HTTP2ServerConnection, answerMovedOn streamID: Int32)
}

extension HTTP2ServerHandler {
    package func serverConnection(
        _ connection: HTTP2ServerConnection, didCloseStream streamID: Int32, errorCode: UInt32
    ) {}
    package func serverConnection(_ connection: HTTP2ServerConnection, bodyTooLarge streamID: Int32) {}
    package func serverConnection(
        _ connection: HTTP2ServerConnection, requestTimedOut streamID: Int32, headComplete: Bool
    ) {
        connection.respond(streamID: streamID, status: 408)
    }
    package func serverConnection(_ connection: HTTP2ServerConnection, requestDeadlineAt milliseconds: UInt64) {}
    package func serverConnection(_ connection: HTTP2ServerConnection, answerMovedOn streamID: Int32) {}
}

/// How long a request may take to arrive on a server connection, from its first HEADERS frame to its END_STREAM
/// (`HTTPServer`'s connections; mock-apns sets none). The same limits as HTTP/1.1's, however steadily the frames
/// trickle in.
package struct HTTP2RequestDeadlines: Sendable {
    /// From the stream's start to the end of its header block.
    package var headerMilliseconds: UInt64
    /// From the end of the header block to END_STREAM.
    package var bodyMilliseconds: UInt64
    /// How long a stream answered for its timeout is kept for the answer to go out before it is reset.
    package var lingerMilliseconds: UInt64

    package init(headerMilliseconds: UInt64, bodyMilliseconds: UInt64, lingerMilliseconds: UInt64) {
        self.headerMilliseconds = headerMilliseconds
        self.bodyMilliseconds = bodyMilliseconds
        self.lingerMilliseconds = lingerMilliseconds
    }
}

/// The server side of one HTTP/2 connection (over TLS, or plaintext h2c): the server role of `HTTP2Session`
/// (which does all the nghttp2 work) on a secure channel, turning each stream into an `HTTP2ServerRequest` for
/// the handler. Shared by the test server mock-apns runs (`HTTP2Server`, in FanoutTestSupport) and `HTTPServer`. A malformed or hostile peer gets a GOAWAY from nghttp2 and
/// this connection closes; nothing it sends can crash the process. Confined to its loop.
///
/// `@unchecked Sendable`: referenced from any thread, used only on its loop. Its state (and its streams' and
/// `HTTP2ResponseFields`') is `@exclusivity(unchecked)`: touched per request, only on the loop thread, never across
/// a call that could reach it again, so the dynamic exclusivity check is pure cost.
package final class HTTP2ServerConnection: HTTP2SessionDelegate, @unchecked Sendable {
    package let loop: LoopThread
    private let session: HTTP2Session
    /// Strong: the handler does not own connections, so there is no cycle (and no weak-reference
    /// side table on the hot path).
    private let handler: HTTP2ServerHandler
    package var streamsReceived: Int { received }
    /// Private, unlike `streamsReceived`, so counting a stream is no dynamic exclusivity check.
    @exclusivity(unchecked) private var received = 0
    @exclusivity(unchecked) private var goawaySent = false
    /// The last stream a sent GOAWAY promised to process; later ones are refused, never processed
    /// (nghttp2 keeps accepting streams until the GOAWAY has actually gone out).
    @exclusivity(unchecked) private var goawayLastStreamID: Int32 = .max

    /// Lets the server that owns this connection forget it.
    package var onClose: (() -> Void)?
    /// A free slot for the application (mock-apns keeps its per-connection state here).
    @exclusivity(unchecked) package var userInfo: AnyObject?
    /// Streams that closed, emptied with their buffers kept, for the next streams: no allocation per request.
    /// A spare exists only because that many streams were open at once, so the spares never outnumber the
    /// connection's peak of open streams: memory it held anyway. The cap is above APNs's stream limit of 1,000,
    /// so that a client keeping 1,000 streams full (Fanout, h2load `-m 1000`) finds a spare for every new one; at
    /// 256, three of four streams made and freed their record and its buffers.
    @exclusivity(unchecked) private var spareStreams: [ServerStream] = []
    private static let maxSpareStreams = 1024

    /// Largest request body kept; past it the rest is dropped, the handler hears `bodyTooLarge`, and the
    /// request is marked truncated, so a hostile client cannot make the server buffer without bound. 64 KiB for
    /// mock-apns (APNs's own limit is 5 KiB).
    package let maxRequestBody: Int
    package static let defaultMaxRequestBody = 64 * 1024

    /// Bounds on how long a request may take to arrive (nil: none). A stream past its deadline goes to the handler's
    /// `requestTimedOut`; a stream whose request is complete (the handler has it) is not bounded.
    package let requestDeadlines: HTTP2RequestDeadlines?
    /// With `requestDeadlines`, the incomplete streams: those still in their header block, and those past it waiting
    /// for END_STREAM, each list in deadline order (a stream joins the end of one with a deadline a fixed time from
    /// now). The owner's one timer looks at the first of each: no timer per stream.
    @exclusivity(unchecked) private var awaitingHead = ServerStreamDeadlines(kind: .head)
    @exclusivity(unchecked) private var awaitingBody = ServerStreamDeadlines(kind: .body)
    /// Streams answered for their timeout, to be reset once their answer has had time to go out.
    @exclusivity(unchecked) private var awaitingReset = ServerStreamDeadlines(kind: .reset)

    /// Wraps an accepted socket. Starts the TLS handshake at once; without a TLS context (`tlsContext` nil) the
    /// connection is cleartext HTTP/2 with prior knowledge and nghttp2 reads the client preface first.
    package convenience init(
        socket: TCPSocket, tlsContext: TLSServerContext?, handler: HTTP2ServerHandler, initialMaxStreams: UInt32,
        handshakeTimeoutMilliseconds: UInt64 = 10_000
    ) throws(TransportError) {
        let tls = try tlsContext.map { context throws(TransportError) in try TLSEngine(context: context.context) }
        self.init(loop: socket.loop, handler: handler, settings: .server(maxConcurrentStreams: initialMaxStreams))
        let channel = SecureChannel(
            socket: socket, tls: tls, handshakeTimeoutMilliseconds: handshakeTimeoutMilliseconds)
        self.channel = channel
        session.start(channel)
    }

    /// A connection not yet running: `start(adopting:readAhead:)` gives it its channel.
    package init(
        loop: LoopThread, handler: HTTP2ServerHandler, settings: HTTP2SessionSettings,
        maxRequestBody: Int = HTTP2ServerConnection.defaultMaxRequestBody,
        requestDeadlines: HTTP2RequestDeadlines? = nil
    ) {
        self.loop = loop
        self.handler = handler
        self.maxRequestBody = maxRequestBody
        self.requestDeadlines = requestDeadlines
        session = HTTP2Session(role: .server, loop: loop, settings: settings)
        session.delegate = self
        session.reportsRequestHeadEnd = requestDeadlines != nil
        session.reportsAnswerEnd = requestDeadlines != nil
    }

    /// Runs over `channel`, already ready (TLS with ALPN h2, or plaintext after the client preface was seen),
    /// feeding nghttp2 `readAhead` first (see `HTTP2Session.adopt`).
    package func start(adopting channel: SecureChannel, readAhead: UnsafeRawBufferPointer) {
        self.channel = channel
        session.adopt(channel, readAhead: readAhead)
    }

    /// The channel the session runs on, for what its TLS handshake learnt (the session owns it too).
    @exclusivity(unchecked) private var channel: SecureChannel?

    /// The certificate the client presented in the TLS handshake (verified against the server's client CA), or
    /// nil when it presented none, the handshake is not done, or the connection is cleartext. Read from the TLS
    /// session at each call: call it once per connection.
    package var peerCertificate: CertificateDetails? { channel?.peerCertificate }

    /// Streams open now.
    package var openStreamCount: Int { session.openStreamCount }

    /// Whether stream `streamID` is open (an answer to it has not all gone out, or its request has not all come).
    package func isOpen(streamID: Int32) -> Bool { session.context(ofStream: streamID) != nil }

    /// Closes gracefully: GOAWAY once no stream is open, then the connection closes.
    package func drain() {
        session.drain()
    }

    package var isClosed: Bool { session.isClosed }

    /// Sends SETTINGS with a new MAX_CONCURRENT_STREAMS (APNs raises it after the first valid
    /// token and drops it to 1 after a rejection).
    package func setMaxConcurrentStreams(_ value: UInt32) {
        session.submitMaxConcurrentStreams(value)
    }

    /// Answers a stream. `body` empty sends headers only (END_STREAM on HEADERS).
    package func respond(
        streamID: Int32, status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = []
    ) {
        noteAnswered(streamID)
        session.respond(
            streamID: streamID, status: status, headers: headers, body: body.isEmpty ? nil : SharedBody(body))
    }

    /// Answers a stream with `fields` (`:status` and the header fields, already laid out as bytes). `body` empty
    /// sends headers only.
    package func respond(streamID: Int32, fields: HTTP2ResponseFields, body: [UInt8] = []) {
        noteAnswered(streamID)
        session.respond(streamID: streamID, fields: fields.nameValues, body: body.isEmpty ? nil : SharedBody(body))
    }

    /// Resets a stream with REFUSED_STREAM (the request was not processed).
    package func refuse(streamID: Int32) {
        noteAnswered(streamID)
        session.resetStream(streamID, errorCode: HTTP2ErrorCode.refusedStream)
    }

    /// Resets an answered stream with CANCEL: its answer is given up (the client granted it no flow-control credit
    /// for too long).
    package func abandonAnswer(streamID: Int32) {
        session.resetStream(streamID, errorCode: HTTP2ErrorCode.cancel)
    }

    /// Sends GOAWAY naming the last stream processed so far, with a JSON reason as debug data as
    /// APNs does, and closes once the processed streams are answered.
    package func sendGoaway(reason: String, errorCode: UInt32 = HTTP2ErrorCode.noError) {
        guard !goawaySent, !session.isClosed else { return }
        guard
            let lastStreamID = session.submitGoaway(
                errorCode: errorCode, debugData: Array("{\"reason\":\"\(reason)\"}".utf8))
        else { return }
        goawaySent = true
        goawayLastStreamID = lastStreamID
    }

    /// Past its deadline, each incomplete request is answered by the handler (`requestTimedOut`), or, if it had an
    /// answer already (a 413 as its body overflowed) that has not all gone out, reset with NO_ERROR. A stream answered
    /// before its request ended is reset with NO_ERROR as soon as its answer's last frame is sent (`answerDidEnd`:
    /// the client may stop sending, RFC 9113 section 8.1); a stream answered for its timeout is also reset
    /// `lingerMilliseconds` later, unless the client ended it or it was reset already, so it frees its slot even if
    /// its answer cannot go out. `now` is the loop's clock (`LoopThread.nowMilliseconds`).
    package func expireRequests(now: UInt64) {
        guard let deadlines = requestDeadlines else { return }
        while let stream = awaitingHead.first, stream.deadline <= now {
            expire(stream, headComplete: false, now: now, deadlines: deadlines)
        }
        while let stream = awaitingBody.first, stream.deadline <= now {
            expire(stream, headComplete: true, now: now, deadlines: deadlines)
        }
        while let stream = awaitingReset.first, stream.deadline <= now {
            awaitingReset.remove(stream)
            if let streamID = stream.streamID { session.resetStream(streamID, errorCode: HTTP2ErrorCode.noError) }
        }
    }

    /// The earliest deadline of an incomplete request (nil when none is waiting).
    package var nextRequestDeadline: UInt64? {
        var earliest: UInt64?
        for stream in [awaitingHead.first, awaitingBody.first, awaitingReset.first] {
            if let deadline = stream?.deadline, deadline < earliest ?? .max { earliest = deadline }
        }
        return earliest
    }

    private func expire(_ stream: ServerStream, headComplete: Bool, now: UInt64, deadlines: HTTP2RequestDeadlines) {
        untrack(stream)
        guard let streamID = stream.streamID else { return }
        guard !stream.answered else {
            session.resetStream(streamID, errorCode: HTTP2ErrorCode.noError)
            return
        }
        stream.timedOut = true
        stream.overflow = true  // drops what more comes, as for a body past the limit
        stream.body.pointee = []  // and lets go of what came, capacity too
        _ = awaitingReset.append(stream, deadline: now + deadlines.lingerMilliseconds)
        handler.serverConnection(self, requestTimedOut: streamID, headComplete: headComplete)
    }

    /// An answer to a stream still incomplete (its body past the limit) means its deadline resets it.
    @inline(__always)
    private func noteAnswered(_ streamID: Int32) {
        // Without deadlines, or without incomplete streams (the common case), there is nothing to mark.
        guard requestDeadlines != nil, !awaitingBody.isEmpty || !awaitingHead.isEmpty else { return }
        if let context = session.context(ofStream: streamID) {
            unsafeDowncast(context, to: ServerStream.self).answered = true
        }
    }

    /// Puts `stream`, in no list, at the end of the list for `phase` (`.head` or `.body`), due `milliseconds` from
    /// now, and tells the handler when it is that list's first.
    private func track(_ stream: ServerStream, awaiting phase: ServerStream.DeadlineList, milliseconds: UInt64) {
        let deadline = loop.nowMilliseconds + milliseconds
        let isFirst =
            phase == .head
            ? awaitingHead.append(stream, deadline: deadline) : awaitingBody.append(stream, deadline: deadline)
        if isFirst { handler.serverConnection(self, requestDeadlineAt: deadline) }
    }

    /// Takes `stream` out of the deadline list it is in, if any.
    private func untrack(_ stream: ServerStream) {
        switch stream.deadlineList {
        case .none: break
        case .head: awaitingHead.remove(stream)
        case .body: awaitingBody.remove(stream)
        case .reset: awaitingReset.remove(stream)
        }
    }

    /// The highest stream id handed to the handler so far.
    package var lastProcessedStreamID: Int32 { session.lastProcessedStreamID }

    /// Drops the TCP connection at once, as a network failure would.
    package func drop() {
        session.close(nil)
    }

    // MARK: HTTP2SessionDelegate

    package func sessionDidBecomeReady(_ session: HTTP2Session) {}

    package func session(_ session: HTTP2Session, contextForStream streamID: Int32) -> AnyObject {
        received += 1
        let stream = spareStreams.popLast() ?? ServerStream()
        stream.streamID = streamID
        if let deadlines = requestDeadlines {
            track(stream, awaiting: .head, milliseconds: deadlines.headerMilliseconds)
        }
        return stream
    }

    package func session(
        _ session: HTTP2Session, stream: AnyObject, didReceiveHeader name: UnsafeRawBufferPointer,
        value: UnsafeRawBufferPointer
    ) {
        let head = unsafeDowncast(stream, to: ServerStream.self).head
        if let first = name.first, first != UInt8(ascii: ":") {
            head.pointee.append(name: name, value: value)
        } else if bytesEqual(name, ":method") {
            head.pointee.setMethod(value)
        } else if bytesEqual(name, ":path") {
            head.pointee.setPath(value)
        }
    }

    package func session(_ session: HTTP2Session, stream: AnyObject, didReceiveData data: UnsafeRawBufferPointer) {
        let stream = unsafeDowncast(stream, to: ServerStream.self)
        if stream.body.pointee.count + data.count > maxRequestBody || stream.overflow {
            if !stream.overflow {
                stream.overflow = true
                if let streamID = stream.streamID { handler.serverConnection(self, bodyTooLarge: streamID) }
            }
            return
        }
        stream.body.pointee.append(contentsOf: data)
    }

    package func session(_ session: HTTP2Session, requestHeadDidEnd stream: AnyObject, streamID: Int32) {
        guard let deadlines = requestDeadlines else { return }
        let stream = unsafeDowncast(stream, to: ServerStream.self)
        guard stream.deadlineList == .head else { return }  // timed out already: its reset deadline stands
        awaitingHead.remove(stream)
        track(stream, awaiting: .body, milliseconds: deadlines.bodyMilliseconds)
    }

    package func session(_ session: HTTP2Session, streamDidEnd stream: AnyObject, streamID: Int32) {
        let stream = unsafeDowncast(stream, to: ServerStream.self)
        untrack(stream)
        guard !stream.delivered, !stream.timedOut else { return }
        stream.delivered = true
        if goawaySent && streamID > goawayLastStreamID {
            refuse(streamID: streamID)
            return
        }
        // The request shares the stream's buffers; the handler lets go of them before the stream closes (unless it
        // keeps the request, when the stream's next use copies), so the buffers are reused without allocating.
        handler.serverConnection(
            self,
            didReceive: HTTP2ServerRequest(
                streamID: streamID, head: stream.head.pointee, body: stream.body.pointee,
                bodyTruncated: stream.overflow))
    }

    package func session(_ session: HTTP2Session, answerDidEnd stream: AnyObject, streamID: Int32) {
        let stream = unsafeDowncast(stream, to: ServerStream.self)
        // A stream still waiting for its request (a deadline list holds it) was answered early: a 413 as its body
        // overflowed, or a 408. Its answer is complete now, so the client may stop sending (RFC 9113 section 8.1)
        // rather than until the body deadline, which the reset also takes it off.
        guard stream.deadlineList != .none, stream.answered || stream.timedOut else { return }
        untrack(stream)
        session.resetStream(streamID, errorCode: HTTP2ErrorCode.noError)
    }

    package func session(_ session: HTTP2Session, didSendAnswerData stream: AnyObject, streamID: Int32) {
        handler.serverConnection(self, answerMovedOn: streamID)
    }

    package func session(_ session: HTTP2Session, didClose stream: AnyObject, streamID: Int32, errorCode: UInt32) {
        let stream = unsafeDowncast(stream, to: ServerStream.self)
        untrack(stream)
        handler.serverConnection(self, didCloseStream: streamID, errorCode: errorCode)
        if spareStreams.count < Self.maxSpareStreams {
            stream.reset()
            spareStreams.append(stream)
        }
    }

    package func sessionPeerExceededStreamLimit(_ session: HTTP2Session) {
        handler.serverConnectionStreamLimitViolated(self)
    }

    package func session(
        _ session: HTTP2Session, didCloseWith error: TransportError?,
        openStreams: [(streamID: Int32, stream: AnyObject)]
    ) {
        awaitingHead.removeAll()  // the lists link their streams to each other: unlink them
        awaitingBody.removeAll()
        awaitingReset.removeAll()
        handler.serverConnectionDidClose(self, error: error)
        onClose?()
        onClose = nil
    }
}

/// One incoming request as it arrives. The session's stream table owns it while the stream is open; then the
/// connection keeps it, emptied, for a later stream (see `spareStreams`).
private final class ServerStream {
    /// Owned: allocated in init, freed in deinit. The head and body sit behind pointers rather than in `var`s:
    /// every header and data callback modifies them, and each modification of a class's `var` is a dynamic
    /// exclusivity check (swift_beginAccess, a thread-local lookup), which showed in mock-apns's profile.
    let head: UnsafeMutablePointer<HeaderView>
    let body: UnsafeMutablePointer<[UInt8]>
    @exclusivity(unchecked) var overflow = false
    @exclusivity(unchecked) var delivered = false
    @exclusivity(unchecked) var streamID: Int32?
    /// With request deadlines: which list the stream is in (see `HTTP2ServerConnection.awaitingHead`), its links
    /// there, and when it is due (the loop's clock).
    @exclusivity(unchecked) var deadlineList = DeadlineList.none
    @exclusivity(unchecked) var previous: ServerStream?
    @exclusivity(unchecked) var next: ServerStream?
    @exclusivity(unchecked) var deadline: UInt64 = 0
    /// An answer was submitted (tracked only while some stream of the connection is incomplete).
    @exclusivity(unchecked) var answered = false
    /// Its request missed its deadline: never delivered.
    @exclusivity(unchecked) var timedOut = false

    enum DeadlineList {
        case none, head, body, reset
    }

    init() {
        head = .allocate(capacity: 1)
        head.initialize(to: HeaderView())
        body = .allocate(capacity: 1)
        body.initialize(to: [])
        // An APNs request has up to 9 regular headers, a few hundred bytes with the pseudo-headers, and a body of up
        // to 4 KiB (5 KiB for voip): room for the common case at once.
        head.pointee.reserveCapacity(bytes: 512, fields: 12)
        body.pointee.reserveCapacity(1024)
    }

    deinit {
        head.deinitialize(count: 1)
        head.deallocate()
        body.deinitialize(count: 1)
        body.deallocate()
    }

    /// Ready for another stream, keeping the storage.
    func reset() {
        head.pointee.removeAll()
        body.pointee.removeAll(keepingCapacity: true)
        overflow = false
        delivered = false
        streamID = nil
        deadlineList = .none
        // Cleared only when set: assigning nil releases the old value even when it is nil, two runtime calls per
        // request on a connection without deadlines (mock-apns's).
        if previous != nil { previous = nil }
        if next != nil { next = nil }
        answered = false
        timedOut = false
    }
}

/// Incomplete streams in deadline order, linked through the streams themselves: appending, removing any one and
/// finding the first are O(1), without allocating. Each stream is in at most one list (`ServerStream.deadlineList`
/// names it).
private struct ServerStreamDeadlines {
    let kind: ServerStream.DeadlineList
    private(set) var first: ServerStream?
    private var last: ServerStream?

    init(kind: ServerStream.DeadlineList) {
        self.kind = kind
    }

    var isEmpty: Bool { first == nil }

    /// Appends `stream`, in no list, due at `deadline` (no earlier than the last one's). True when it is the first.
    mutating func append(_ stream: ServerStream, deadline: UInt64) -> Bool {
        stream.deadlineList = kind
        stream.deadline = deadline
        stream.previous = last
        stream.next = nil
        if let last {
            last.next = stream
        } else {
            first = stream
        }
        last = stream
        return first === stream
    }

    /// Takes `stream`, which is in this list, out of it.
    mutating func remove(_ stream: ServerStream) {
        if let previous = stream.previous {
            previous.next = stream.next
        } else {
            first = stream.next
        }
        if let next = stream.next {
            next.previous = stream.previous
        } else {
            last = stream.previous
        }
        stream.previous = nil
        stream.next = nil
        stream.deadlineList = .none
    }

    mutating func removeAll() {
        while let stream = first { remove(stream) }
    }
}

/// A response's `:status` and header fields laid out for nghttp2, for
/// `HTTP2ServerConnection.respond(streamID:fields:body:)`: kept by the caller (one per loop) and refilled for each
/// answer, so answering makes no `String` per field and, once its buffers have grown, allocates nothing. Values are
/// written in place (`appendValue`), and the `nghttp2_nv` entries are kept with the bytes they point to.
/// Confined to one thread.
package final class HTTP2ResponseFields {
    /// Owned: allocated in init (and when growing), freed in deinit. Every name and value, back to back.
    @exclusivity(unchecked) private var bytes: UnsafeMutableRawBufferPointer
    @exclusivity(unchecked) private var used = 0
    /// Owned, likewise. The entries, pointing into `bytes`.
    @exclusivity(unchecked) private var entries: UnsafeMutableBufferPointer<nghttp2_nv>
    @exclusivity(unchecked) private var count = 0

    package init() {
        bytes = .allocate(byteCount: 512, alignment: 8)
        entries = .allocate(capacity: 8)
    }

    deinit {
        bytes.deallocate()
        entries.deallocate()
    }

    /// Starts a new response: `:status` alone.
    package func reset(status: Int) {
        used = 0
        count = 0
        if (100...999).contains(status) {
            let digits = appendValue(name: ":status", count: 3)
            digits[0] = UInt8(ascii: "0") + UInt8(status / 100)
            digits[1] = UInt8(ascii: "0") + UInt8(status / 10 % 10)
            digits[2] = UInt8(ascii: "0") + UInt8(status % 10)
        } else {
            var text = String(status)
            text.withUTF8 { append(name: ":status", value: UnsafeRawBufferPointer($0)) }
        }
    }

    /// Appends a field. `indexed: false` keeps a value new in every response (an id) out of both sides' HPACK
    /// tables, where it would only churn them.
    package func append(name: StaticString, value: UnsafeRawBufferPointer, indexed: Bool = true) {
        let destination = appendValue(name: name, count: value.count, indexed: indexed)
        if value.count > 0 { destination.copyMemory(from: value) }
    }

    /// Appends a field with a `count`-byte value and returns where the caller writes that value (valid until the
    /// next call on these fields).
    package func appendValue(name: StaticString, count valueCount: Int, indexed: Bool = true)
        -> UnsafeMutableRawBufferPointer
    {
        let nameCount = name.utf8CodeUnitCount
        reserve(bytes: nameCount + valueCount)
        let start = bytes.baseAddress! + used
        start.copyMemory(from: name.utf8Start, byteCount: nameCount)
        used += nameCount + valueCount
        entries[count] = nghttp2_nv(
            name: start.assumingMemoryBound(to: UInt8.self),
            value: (start + nameCount).assumingMemoryBound(to: UInt8.self), namelen: nameCount, valuelen: valueCount,
            flags: UInt8(indexed ? NGHTTP2_NV_FLAG_NONE.rawValue : NGHTTP2_NV_FLAG_NO_INDEX.rawValue))
        count += 1
        return UnsafeMutableRawBufferPointer(start: start + nameCount, count: valueCount)
    }

    /// The entries, for nghttp2 (which copies them on submit).
    fileprivate var nameValues: UnsafeBufferPointer<nghttp2_nv> {
        UnsafeBufferPointer(start: entries.baseAddress, count: count)
    }

    /// Room for one more field of `extra` bytes: larger buffers when needed, the entries moved to point into them.
    private func reserve(bytes extra: Int) {
        if count == entries.count {
            let larger = UnsafeMutableBufferPointer<nghttp2_nv>.allocate(capacity: 2 * entries.count)
            _ = larger.initialize(from: entries)
            entries.deallocate()
            entries = larger
        }
        guard used + extra > bytes.count else { return }
        let larger = UnsafeMutableRawBufferPointer.allocate(
            byteCount: max(2 * bytes.count, used + extra), alignment: 8)
        larger.baseAddress!.copyMemory(from: bytes.baseAddress!, byteCount: used)
        let old = UnsafeMutablePointer<UInt8>(bytes.baseAddress!.assumingMemoryBound(to: UInt8.self))
        let new = larger.baseAddress!.assumingMemoryBound(to: UInt8.self)
        for index in 0..<count {
            entries[index].name = new + (entries[index].name - old)
            entries[index].value = new + (entries[index].value - old)
        }
        bytes.deallocate()
        bytes = larger
    }
}
