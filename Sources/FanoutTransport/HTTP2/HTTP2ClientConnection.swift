import FanoutCore
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
    /// How long a request may take, counted from `submit`; nil: no limit. Past it, a request still
    /// waiting for a stream fails `.notSent` (kind `.timedOut`), and an open stream is reset with
    /// CANCEL and fails `.timedOut`. Whole milliseconds, rounded up.
    package var requestTimeout: Duration?
    /// The id of the connection's first stream: 1, but a test starts near HTTP/2's last (2^31 - 1; about a billion
    /// requests, an hour and a half at 200,000 a second), to see a connection run out of stream ids and drain.
    package var firstStreamID: Int32 = 1
    /// The HTTP proxy to reach `host` through (`CONNECT`), if any: TLS to `host` then runs inside the tunnel.
    package var proxy: HTTPProxy?

    package init(
        host: String, port: Int, tls: TLSClientConfiguration = TLSClientConfiguration(),
        connectTimeoutMilliseconds: UInt64 = 10_000, maxConcurrentStreams: Int = 1000,
        pingIntervalMilliseconds: UInt64 = 15_000, requestTimeout: Duration? = nil
    ) {
        self.host = host
        self.port = port
        self.tls = tls
        self.connectTimeoutMilliseconds = connectTimeoutMilliseconds
        self.maxConcurrentStreams = maxConcurrentStreams
        self.pingIntervalMilliseconds = pingIntervalMilliseconds
        self.requestTimeout = requestTimeout
    }
}

/// Events a connection reports to its owner, on the loop thread.
package enum HTTP2ConnectionEvent: Sendable {
    /// TLS verified, h2 negotiated, our preface sent.
    case ready
    /// The server sent GOAWAY; no new stream will be opened. `reason` is the debug data's reason.
    case goaway(lastStreamID: Int32, errorCode: UInt32, reason: String?)
    /// This side opens no more streams here (its stream ids are used up, or nghttp2 refused a new one): the open
    /// ones finish, waiting requests failed `.notSent`, and new work needs another connection.
    case draining
    /// The server raised its stream limit (SETTINGS) and there is room for more streams than are outstanding. A
    /// stream that closes says nothing here: its completion is the owner's signal, and costs no second call.
    case capacityAvailable
    /// The connection is closed; `error` is nil when we closed it.
    case closed(TransportError?)
}

/// One HTTP/2 client connection over TLS on one loop: connect, handshake, then streams. The client
/// role over `HTTP2Session`, which does all the nghttp2 work.
///
/// It keeps its stream window full: requests wait in a queue and are submitted while fewer than
/// `min(server MAX_CONCURRENT_STREAMS, configured max)` streams are open, one more each time a
/// stream closes (h2load's `on_stream_close`). Until the first response it allows one stream, as
/// APNs does before it has seen a valid provider token.
///
/// Every request gets an `HTTP2RequestID` for `cancel(_:)` and, with a `requestTimeout`, a deadline.
/// Both are served by one ledger of requests in submit order, which is id order and (the timeout
/// being fixed) deadline order: cancel finds a request by binary search, and one timer armed to the
/// oldest unfinished request's deadline serves them all, with no timer or closure per request.
///
/// Confined to its loop: call everything on the loop thread (use `loop.execute`).
/// `@unchecked Sendable`: it may be referenced from any thread, but every method must run on its loop
/// (asserted in debug builds), like a swift-nio Channel.
package final class HTTP2ClientConnection: HTTP2SessionDelegate, @unchecked Sendable {
    package let loop: LoopThread
    package let configuration: HTTP2ClientConfiguration
    private let tlsContext: TLSContext
    private let session: HTTP2Session
    @exclusivity(unchecked) package var onEvent: ((HTTP2ConnectionEvent) -> Void)?

    /// Requests waiting for a stream, oldest first. A request cancelled or timed out while waiting
    /// stays here, finished, until it reaches the front (`waitingCount` does not count it).
    @exclusivity(unchecked) private var waiting = FIFOQueue<ClientStream>()
    @exclusivity(unchecked) private var waitingCount = 0
    /// Every unfinished request, waiting or open, in submit order.
    @exclusivity(unchecked) private var ledger = RequestLedger()
    /// Streams done with (see `recycle`), reused for later requests: once warm, a request makes no
    /// ClientStream. At most `maxConcurrentStreams` are kept.
    @exclusivity(unchecked) private var spareStreams: [ClientStream] = []
    @exclusivity(unchecked) private var lastRequestID: UInt64 = 0
    /// `configuration.requestTimeout` in milliseconds.
    private let timeoutMilliseconds: UInt64?
    /// Fires at the oldest unfinished request's deadline. Created with the first deadline.
    @exclusivity(unchecked) private var deadlineTimer: LoopTimer?
    /// The deadline the timer is armed for, nil when it is not armed.
    @exclusivity(unchecked) private var deadlineTimerDue: UInt64?

    /// The most streams open at once so far.
    @exclusivity(unchecked) package private(set) var peakOpenStreams = 0
    /// Streams allowed before the first response (APNs: one until a valid token was seen).
    @exclusivity(unchecked) private var ramped = false
    @exclusivity(unchecked) package private(set) var isClosed = false
    /// `close` was called: no new request is accepted.
    @exclusivity(unchecked) private var isClosing = false
    @exclusivity(unchecked) package private(set) var goawayReceived = false
    @exclusivity(unchecked) private var goawayLastStreamID: Int32 = .max
    @exclusivity(unchecked) private var goawayErrorCode: UInt32 = 0
    /// Counts of what happened, for tests and stats.
    @exclusivity(unchecked) package private(set) var responsesReceived = 0
    /// When the connection became ready, on the loop's clock (`LoopThread.nowMilliseconds`); 0 until then.
    @exclusivity(unchecked) package private(set) var readyAtMilliseconds: UInt64 = 0

    /// Creates a connection and starts connecting. Call on the loop thread.
    package init(loop: LoopThread, configuration: HTTP2ClientConfiguration, tlsContext: TLSClientContext) {
        loop.assertInLoop()
        self.loop = loop
        self.configuration = configuration
        self.tlsContext = tlsContext.context
        timeoutMilliseconds = configuration.requestTimeout.map(wholeMilliseconds)
        // The loop holds the session, and the session its delegate (self), until it closes, so callers
        // need not keep the connection alive; when the loop stops first, requests fail as cancelled.
        session = HTTP2Session(
            role: .client, loop: loop,
            settings: .client(
                pingIntervalMilliseconds: configuration.pingIntervalMilliseconds,
                firstStreamID: configuration.firstStreamID))
        session.delegate = self
        connect()
    }

    private func connect() {
        let timeout = configuration.connectTimeoutMilliseconds
        guard let proxy = configuration.proxy else {
            TCPConnector.connect(
                loop: loop, host: configuration.host, port: configuration.port, timeoutMilliseconds: timeout
            ) { [self] result in startTLS(result) }
            return
        }
        // Through the proxy: TCP to it, then CONNECT, each within the connect timeout.
        TCPConnector.connect(loop: loop, host: proxy.host, port: proxy.port, timeoutMilliseconds: timeout) {
            [self] result in
            switch result {
            case .failure(let error):
                session.close(TransportError(error.kind, "proxy \(proxy): \(error.message)"))
            case .success(let socket):
                guard !isClosed else {
                    socket.close()
                    return
                }
                ProxyTunnel.open(
                    socket: socket, proxy: proxy, host: configuration.host, port: configuration.port,
                    timeoutMilliseconds: timeout
                ) { [self] tunnel in startTLS(tunnel) }
            }
        }
    }

    /// Starts TLS to `configuration.host` on a connected socket (directly, or through the proxy's tunnel).
    private func startTLS(_ connected: Result<TCPSocket, TransportError>) {
        switch connected {
        case .failure(let error):
            session.close(error)
        case .success(let socket):
            guard !isClosed else {
                socket.close()
                return
            }
            do throws(TransportError) {
                let tls = try TLSEngine(context: tlsContext, host: configuration.host)
                session.start(
                    SecureChannel(
                        socket: socket, tls: tls,
                        handshakeTimeoutMilliseconds: configuration.tls.handshakeTimeoutMilliseconds))
            } catch {
                socket.close()
                session.close(error)
            }
        }
    }

    /// TLS verified, h2 negotiated, our SETTINGS sent.
    package var isReady: Bool { session.isReady }

    /// Streams open now (including ones reset by a timeout or cancel whose RST_STREAM has not gone out).
    package var openStreams: Int { session.openStreamCount }

    /// The number of streams this connection may have open now.
    package var streamLimit: Int {
        guard session.isReady, ramped else { return 1 }
        return min(session.remoteMaxConcurrentStreams, configuration.maxConcurrentStreams)
    }

    /// Requests accepted but not finished (queued plus open).
    package var outstanding: Int { waitingCount + openStreams }

    /// Whether new requests are accepted (not closed, not draining after GOAWAY or `close`).
    package var isAcceptingRequests: Bool { !isClosed && !isClosing && !goawayReceived }

    /// The id the next `submit` returns. A request can complete inside `submit` (one the connection cannot take
    /// fails at once, `.notSent`), before its id is returned: a caller whose completion needs the id reads it here
    /// first. Loop thread.
    package var nextRequestID: HTTP2RequestID { HTTP2RequestID(rawValue: lastRequestID + 1) }

    // MARK: Requests

    /// Queues a request; `completion` runs on the loop thread exactly once, with the response or an
    /// `HTTP2StreamFailure`. The request's deadline, if any, counts from now.
    /// - Returns: the request's id, for `cancel(_:)`.
    @discardableResult
    package func submit(_ request: consuming HTTP2Request, completion: @escaping HTTP2Completion) -> HTTP2RequestID {
        submit(request, .closure(completion))
    }

    /// Queues a request like `submit(_:completion:)`, but tells `handler` of its end, with `context`, instead of
    /// calling a closure: a caller with many requests (the engine's loop) then makes no closure per request.
    /// The request holds `handler` and `context` strongly until it completes.
    @discardableResult
    package func submit(
        _ request: consuming HTTP2Request, context: AnyObject, handler: HTTP2ResponseHandler
    ) -> HTTP2RequestID {
        submit(request, .handler(handler, context))
    }

    private func submit(_ request: consuming HTTP2Request, _ completion: ClientStream.Completion) -> HTTP2RequestID {
        loop.assertInLoop()
        lastRequestID += 1
        let id = HTTP2RequestID(rawValue: lastRequestID)
        guard isAcceptingRequests else {
            complete(
                completion,
                .failure(.notSent(TransportError(.connectionClosed, "connection is not accepting requests"))))
            return id
        }
        var deadline = UInt64.max
        if let timeoutMilliseconds { deadline = loop.nowMilliseconds + timeoutMilliseconds }
        let stream: ClientStream
        if let spare = spareStreams.popLast() {
            spare.reuse(id: id.rawValue, request: request, deadline: deadline, completion: completion)
            stream = spare
        } else {
            stream = ClientStream(id: id.rawValue, request: request, deadline: deadline, completion: completion)
        }
        ledger.append(stream)
        waiting.append(stream)
        waitingCount += 1
        if deadline != .max { armDeadlineTimer() }
        if session.isReady { fillStreams() }
        return id
    }

    /// Cancels a request. Still waiting for a stream: it is dropped and fails
    /// `.cancelled(sent: false)`. Open: its stream is reset with CANCEL and it fails
    /// `.cancelled(sent: true)` at once (a response arriving later is ignored). Finished or unknown:
    /// nothing happens.
    package func cancel(_ id: HTTP2RequestID) {
        loop.assertInLoop()
        guard let stream = ledger.find(id.rawValue) else { return }
        if stream.streamID > 0 {
            session.resetStream(stream.streamID, errorCode: HTTP2ErrorCode.cancel)
            finish(stream, .failure(.cancelled(sent: true)))
        } else {
            finish(stream, .failure(.cancelled(sent: false)))
        }
    }

    /// Opens streams for waiting requests while the window allows.
    private func fillStreams() {
        guard session.isReady, isAcceptingRequests else { return }
        let limit = streamLimit
        while isAcceptingRequests, session.openStreamCount < limit, let stream = waiting.popFirst() {
            guard !stream.isFinished else { continue }  // cancelled or timed out while waiting
            waitingCount -= 1
            stream.streamID = -1  // leaving the queue
            switch session.submitRequest(stream.takeRequest(), context: stream) {
            case .success(let streamID):
                stream.streamID = streamID
                // Client stream ids are odd and only grow: the next one would be past HTTP/2's last.
                if streamID > Int32.max - 2 { stopOpeningStreams() }
            case .failure(let error):
                finish(stream, .failure(.notSent(error)))
                stopOpeningStreams()
            }
        }
        peakOpenStreams = max(peakOpenStreams, session.openStreamCount)
    }

    /// Opens no more streams here: lets the open ones finish, fails the waiting ones as not sent and tells the owner
    /// (`.draining`), which sends them elsewhere. Without it a request nghttp2 refuses would be failed, offered to this
    /// connection again and refused again, for ever (a session whose stream ids ran out refuses every one).
    private func stopOpeningStreams() {
        guard !isClosed, !isClosing else { return }
        close()
        onEvent?(.draining)
    }

    /// Completes a request, once: later calls for it do nothing.
    private func finish(_ stream: ClientStream, _ result: Result<HTTP2Response, HTTP2StreamFailure>) {
        guard let completion = stream.takeCompletion() else { return }
        if stream.streamID == 0 { waitingCount -= 1 }
        ledger.didFinish()
        complete(completion, result)
    }

    private func complete(_ completion: ClientStream.Completion, _ result: Result<HTTP2Response, HTTP2StreamFailure>) {
        switch completion {
        case .closure(let body): body(result)
        case .handler(let handler, let context): handler.request(context, didComplete: result, on: self)
        }
    }

    /// Keeps a finished stream for a later request. Only from `session(_:didClose:...)`: by then nothing holds it
    /// for its old request but the ledger, which tells an old entry from a reused object by id. Not the waiting
    /// queue (it left it for a stream), not the session (its stream closed), not its caller (its completion ran,
    /// or ran at a cancel or timeout before the stream closed).
    private func recycle(_ stream: ClientStream) {
        guard stream.isFinished, spareStreams.count < configuration.maxConcurrentStreams else { return }
        stream.clear()
        spareStreams.append(stream)
    }

    private func failWaiting(_ error: TransportError) {
        while let stream = waiting.popFirst() {
            finish(stream, .failure(.notSent(error)))
        }
    }

    // MARK: Deadlines

    /// Arms the timer for the oldest unfinished request, unless it is armed for that time or earlier.
    private func armDeadlineTimer() {
        guard !isClosed, let oldest = ledger.oldest, oldest.deadline != .max else { return }
        if let due = deadlineTimerDue, due <= oldest.deadline { return }
        let now = loop.nowMilliseconds
        let delay = oldest.deadline > now ? oldest.deadline - now : 0
        deadlineTimerDue = oldest.deadline
        if let deadlineTimer {
            deadlineTimer.restart(milliseconds: delay)
            return
        }
        let timer = LoopTimer(loop: loop)
        timer.unref()
        deadlineTimer = timer
        // Strong capture (no weak side table on self): closing the connection closes the timer. This
        // one closure serves every later `restart`.
        timer.schedule(milliseconds: delay) { [self] in deadlinesPassed() }
    }

    /// Expires every request whose deadline has passed, oldest first, then re-arms for the next.
    private func deadlinesPassed() {
        deadlineTimerDue = nil
        let now = loop.nowMilliseconds
        while !isClosed, let oldest = ledger.oldest, oldest.deadline <= now {
            if oldest.streamID > 0 {
                session.resetStream(oldest.streamID, errorCode: HTTP2ErrorCode.cancel)
                finish(oldest, .failure(.timedOut))
            } else {
                let error = TransportError(
                    .timedOut, "request timed out after \(timeoutMilliseconds ?? 0) ms waiting for a stream")
                finish(oldest, .failure(.notSent(error)))
            }
        }
        armDeadlineTimer()
    }

    // MARK: Closing

    /// Sends a PING; the connection closes if the server stays silent for another ping interval.
    package func ping() {
        session.ping()
    }

    /// Closes gracefully: fails waiting requests as not sent, lets open streams finish, then sends
    /// GOAWAY and closes. `immediately`: closes now, failing open streams as lost.
    package func close(immediately: Bool = false) {
        loop.assertInLoop()
        guard !isClosed else { return }
        isClosing = true
        if immediately {
            session.close(nil)
        } else {
            failWaiting(TransportError(.cancelled, "connection closing"))
            session.drain()
        }
    }

    // MARK: HTTP2SessionDelegate

    package func sessionDidBecomeReady(_ session: HTTP2Session) {
        readyAtMilliseconds = loop.nowMilliseconds
        onEvent?(.ready)
        fillStreams()
    }

    package func session(
        _ session: HTTP2Session, stream: AnyObject, didReceiveHeader name: UnsafeRawBufferPointer,
        value: UnsafeRawBufferPointer
    ) {
        unsafeDowncast(stream, to: ClientStream.self).record(name: name, value: value)
    }

    package func session(_ session: HTTP2Session, stream: AnyObject, didReceiveData data: UnsafeRawBufferPointer) {
        unsafeDowncast(stream, to: ClientStream.self).responseBody.append(contentsOf: data)
    }

    package func session(_ session: HTTP2Session, streamDidEnd stream: AnyObject, streamID: Int32) {
        unsafeDowncast(stream, to: ClientStream.self).endStreamSeen = true
    }

    package func session(_ session: HTTP2Session, didClose stream: AnyObject, streamID: Int32, errorCode: UInt32) {
        let stream = unsafeDowncast(stream, to: ClientStream.self)
        // A request cancelled or timed out is already finished: whatever came for it is dropped.
        if !stream.isFinished {
            if let status = stream.status, errorCode == HTTP2ErrorCode.noError || stream.endStreamSeen {
                responsesReceived += 1
                ramped = true
                finish(stream, .success(stream.makeResponse(status: status)))
            } else if goawayReceived && streamID > goawayLastStreamID {
                finish(stream, .failure(.notProcessed(goawayErrorCode: goawayErrorCode)))
            } else if errorCode == HTTP2ErrorCode.refusedStream {
                finish(stream, .failure(.refused))
            } else {
                finish(stream, .failure(.reset(errorCode: errorCode)))
            }
        }
        guard !isClosed else { return }
        recycle(stream)
        fillStreams()
    }

    package func sessionDidReceiveSettings(_ session: HTTP2Session) {
        fillStreams()
        // Room the owner's queue can use now: no stream may close to say so (all could be waiting on the server).
        if isAcceptingRequests && outstanding < streamLimit { onEvent?(.capacityAvailable) }
    }

    package func session(
        _ session: HTTP2Session, didReceiveGoaway lastStreamID: Int32, errorCode: UInt32,
        debugData: UnsafeRawBufferPointer
    ) {
        goawayReceived = true
        goawayLastStreamID = lastStreamID
        goawayErrorCode = errorCode
        let reason = goawayReason(debugData)
        failWaiting(TransportError(.goaway, "server sent GOAWAY\(reason.map { " (\($0))" } ?? "")"))
        onEvent?(.goaway(lastStreamID: lastStreamID, errorCode: errorCode, reason: reason))
    }

    /// Ends everything: fails open streams as lost (or not processed, above a GOAWAY's last stream)
    /// and waiting ones as not sent.
    package func session(
        _ session: HTTP2Session, didCloseWith error: TransportError?,
        openStreams: [(streamID: Int32, stream: AnyObject)]
    ) {
        isClosed = true
        deadlineTimer?.close()
        deadlineTimer = nil
        let cause = error ?? TransportError(.cancelled, "connection closed")
        for (streamID, stream) in openStreams {
            let stream = unsafeDowncast(stream, to: ClientStream.self)
            // Above a GOAWAY's last stream id the server promised not to process it: safe to resend.
            if goawayReceived && streamID > goawayLastStreamID {
                finish(stream, .failure(.notProcessed(goawayErrorCode: goawayErrorCode)))
            } else {
                finish(stream, .failure(.connectionLost(cause)))
            }
        }
        failWaiting(cause)
        onEvent?(.closed(error))
        onEvent = nil
    }

    private func goawayReason(_ debugData: UnsafeRawBufferPointer) -> String? {
        guard debugData.count > 0,
            let object = try? JSONSerialization.jsonObject(with: Data(debugData)) as? [String: Any]
        else { return debugData.count > 0 ? String(decoding: debugData, as: UTF8.self) : nil }
        return object["reason"] as? String
    }
}

/// One request from `submit` to its completion: the request, its deadline, and the response being
/// collected once it has a stream.
///
/// Who holds it: `waiting` until it gets a stream; the session's stream table (the one owner of
/// stream contexts) while its stream is open; and `ledger`, for cancel and deadlines, until it
/// finishes.
final class ClientStream {
    /// Who is told of the end: a closure, or a handler with the caller's context (no closure per request).
    enum Completion {
        case closure(HTTP2Completion)
        case handler(HTTP2ResponseHandler, AnyObject)
    }

    /// Set anew when the connection reuses the object for another request (`reuse`).
    @exclusivity(unchecked) private(set) var id: UInt64
    /// Until the stream opens: then it moves into the session (`takeRequest`), which needs only its body after.
    @exclusivity(unchecked) private var request: HTTP2Request?
    /// In `uv_now` milliseconds; `.max`: none.
    @exclusivity(unchecked) private(set) var deadline: UInt64
    @exclusivity(unchecked) private var completion: Completion?
    /// 0 while waiting for a stream; the stream id once it has one.
    @exclusivity(unchecked) var streamID: Int32 = 0
    @exclusivity(unchecked) var status: Int?
    @exclusivity(unchecked) var apnsID: APNsIdentifier?
    @exclusivity(unchecked) var apnsUniqueID: APNsIdentifier?
    /// Channel management's answer headers (the create's new channel, the echoed request id).
    @exclusivity(unchecked) var channelID: String?
    @exclusivity(unchecked) var requestID: String?
    @exclusivity(unchecked) var responseBody: [UInt8] = []
    @exclusivity(unchecked) var endStreamSeen = false

    init(id: UInt64, request: consuming HTTP2Request, deadline: UInt64, completion: Completion) {
        self.id = id
        self.request = request
        self.deadline = deadline
        self.completion = completion
    }

    convenience init(id: UInt64, request: HTTP2Request, deadline: UInt64, completion: @escaping HTTP2Completion) {
        self.init(id: id, request: request, deadline: deadline, completion: .closure(completion))
    }

    /// Completed (answered, failed, cancelled or timed out).
    var isFinished: Bool { completion == nil }

    /// The request, moved out for submitting it: no copy of its headers, path, id and body (five retains) and no
    /// release of them when the stream is recycled. Once only, when the stream opens.
    func takeRequest() -> HTTP2Request {
        guard let request = request.take() else { preconditionFailure("a stream's request is submitted once") }
        return request
    }

    /// Lets go of the last request's headers, body and response, once it is finished.
    func clear() {
        request = nil
        streamID = 0
        status = nil
        apnsID = nil
        apnsUniqueID = nil
        channelID = nil
        requestID = nil
        responseBody.removeAll(keepingCapacity: true)
        endStreamSeen = false
    }

    /// Serves another request (after `clear`), under a new id.
    func reuse(id: UInt64, request: consuming HTTP2Request, deadline: UInt64, completion: Completion) {
        precondition(isFinished, "a stream is reused only once its request is finished")
        self.id = id
        self.request = request
        self.deadline = deadline
        self.completion = completion
    }

    /// The completion, the first time only.
    func takeCompletion() -> Completion? {
        defer { completion = nil }
        return completion
    }

    func record(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if bytesEqual(name, ":status") {
            status = parseDecimal(value)
        } else if bytesEqual(name, "apns-id") {
            apnsID = APNsIdentifier(utf8: value)
        } else if bytesEqual(name, "apns-unique-id") {
            apnsUniqueID = APNsIdentifier(utf8: value)
        } else if bytesEqual(name, "apns-channel-id") {
            channelID = String(decoding: value, as: UTF8.self)
        } else if bytesEqual(name, "apns-request-id") {
            requestID = String(decoding: value, as: UTF8.self)
        }
    }

    /// Built in one expression: a local made first and then filled would be copied into the result and destroyed
    /// (a retain and a release of each of its references, twice per response).
    func makeResponse(status: Int) -> HTTP2Response {
        HTTP2Response(
            status: status, apnsID: apnsID, apnsUniqueID: apnsUniqueID, channelID: channelID, requestID: requestID,
            body: responseBody)
    }
}

/// The unfinished requests of a connection in submit order, which is id order and, with one fixed
/// timeout, deadline order. `find` is a binary search; `oldest` is the front. Finished requests are
/// released from the front as they finish, and the dead slots (released, or finished behind a slow
/// request at the front) are compacted away once they are most of the array, so it stays within a
/// small multiple of the requests in flight. Once warm it allocates nothing per request.
struct RequestLedger {
    /// One request: its id, and its stream object, which the connection may reuse for a later request once
    /// this one is finished; an entry whose stream has moved on to another id counts as finished.
    private struct Entry {
        let id: UInt64
        let stream: ClientStream

        var isFinished: Bool { stream.id != id || stream.isFinished }
    }

    /// Requests in id order from `head`; slots before `head` are nil (released).
    private var entries: [Entry?] = []
    private var head = 0
    /// Finished requests at `head` or after, not yet compacted away.
    private var finishedInside = 0

    mutating func append(_ stream: ClientStream) {
        entries.append(Entry(id: stream.id, stream: stream))
    }

    /// The oldest unfinished request.
    var oldest: ClientStream? { head < entries.count ? entries[head]!.stream : nil }

    /// The unfinished request with this id, if any.
    func find(_ id: UInt64) -> ClientStream? {
        var low = head
        var high = entries.count
        while low < high {
            let middle = (low + high) / 2
            let candidate = entries[middle]!
            if candidate.id == id { return candidate.isFinished ? nil : candidate.stream }
            if candidate.id < id { low = middle + 1 } else { high = middle }
        }
        return nil
    }

    /// Call when one of the requests finished.
    mutating func didFinish() {
        finishedInside += 1
        while head < entries.count, entries[head]!.isFinished {
            entries[head] = nil
            head += 1
            finishedInside -= 1
        }
        if head == entries.count {
            entries.removeAll(keepingCapacity: true)
            head = 0
        } else if head + finishedInside >= 1024 && (head + finishedInside) * 2 >= entries.count {
            // Most slots are dead (released at the front, or finished behind a slow request): a
            // connection that always has requests in flight never empties, so reclaim them here.
            compact()
        }
    }

    /// Slots in use, live or dead (for tests: it must stay proportional to the requests in flight).
    var storageCount: Int { entries.count }

    /// Drops the finished requests and the released front, keeping order.
    private mutating func compact() {
        var write = 0
        for read in head..<entries.count where !entries[read]!.isFinished {
            entries[write] = entries[read]
            write += 1
        }
        entries.removeSubrange(write...)
        head = 0
        finishedInside = 0
    }
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

/// `duration` in whole milliseconds, rounded up (a deadline is never early); at least 1.
private func wholeMilliseconds(_ duration: Duration) -> UInt64 {
    let (seconds, attoseconds) = duration.components
    guard seconds >= 0 else { return 1 }
    let milliseconds = UInt64(seconds) * 1000 + UInt64((attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000)
    return max(milliseconds, 1)
}
