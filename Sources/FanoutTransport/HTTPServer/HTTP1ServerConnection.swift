import FanoutHTTP1
import Foundation

/// HTTP/1.1 (and 1.0) over one channel of `HTTPServer`: keep-alive, bodies by Content-Length or chunked,
/// `Expect: 100-continue`, one request at a time. Pipelined bytes wait in `input` until the previous answer is
/// written, so answers go out in request order. A pipelined request also waits while the channel cannot take more
/// output (a client that sends and does not read): its answers are not made, the channel stops reading, and the
/// write timeout, not the header timeout, decides when to give up. Confined to its loop.
///
/// The connection's one timer (owned by `HTTPServerConnection`, re-armed, never one per request) bounds each
/// phase: `headerTimeout` from the start of a head (or of the connection), `bodyTimeout` from the end of a head to the
/// end of its body, `idleTimeout` while a kept-alive connection waits for its next request, and the linger after a
/// last answer.
final class HTTP1ServerConnection: SecureChannelDelegate, HTTPResponseSink {
    private enum Phase {
        /// Waiting for (the rest of) a request head.
        case head
        /// Reading a body of known length.
        case body(HTTP1RequestHead, remaining: Int)
        /// Reading a chunked body.
        case chunked(HTTP1RequestHead, HTTP1ChunkedDecoder)
        /// The handler has the request; its answer has not come yet.
        case responding(HTTP1RequestHead, requestID: Int64)
        /// The last answer is written (or queued); waiting, bounded, for the peer to close.
        case lingering
        case closed
    }

    /// What the timer means now.
    private enum TimerUse {
        case none, header, idle, body, linger
    }

    let channel: SecureChannel
    private let loop: LoopThread
    private let limits: HTTPServerLimits
    private let handler: HTTPServer.Handler
    private let timer: LoopTimer
    private let onClose: () -> Void
    private var phase = Phase.head
    private var timerUse = TimerUse.none
    /// Unconsumed input from `inputStart` on.
    private var input: [UInt8] = []
    private var inputStart = 0
    /// Where the search for the end of the head resumes.
    private var headScanned = 0
    private var body: [UInt8] = []
    private var nextRequestID: Int64 = 0
    /// Inside `processInput`: an answer delivered meanwhile lets the loop there go on instead of recursing.
    private var processing = false
    /// `HTTPServer.stopAccepting`: close once the request in progress (if any) is answered.
    private var stopRequested = false
    /// A pipelined request waits for the channel to take output again (`channelProduceOutput`).
    private var waitingForOutput = false

    init(
        channel: SecureChannel, limits: HTTPServerLimits, handler: @escaping HTTPServer.Handler, timer: LoopTimer,
        onClose: @escaping () -> Void
    ) {
        self.channel = channel
        self.loop = channel.loop
        self.limits = limits
        self.handler = handler
        self.timer = timer
        self.onClose = onClose
    }

    /// Takes over the channel with the bytes already read. `headStarted`: the timer already runs for this head
    /// (from the connection's start).
    func start(readAhead: UnsafeRawBufferPointer) {
        channel.delegate = self
        timerUse = .header
        if readAhead.count > 0 {
            input.append(contentsOf: readAhead)
            processInput()
        }
    }

    /// Called by the connection's timer.
    func timerFired() {
        switch timerUse {
        case .none:
            break
        case .header:
            if case .head = phase {
                finish(with: limits.answer(408, "request timeout"))
            } else {
                close()
            }
        case .idle:
            if case .head = phase, input.count == inputStart {
                // Not idle while the last answer is still going out (a slow reader): the write timeout bounds that.
                if answerStillLeaving { arm(.idle) } else { close() }
            } else {
                finish(with: limits.answer(408, "request timeout"))
            }
        case .body:
            finish(with: limits.answer(408, "request timeout: the body did not arrive in time"))
        case .linger:
            // Likewise: the last answer is not cut off while it still leaves; the write timeout bounds a stalled one.
            if answerStillLeaving { arm(.linger) } else { close() }
        }
    }

    /// Stop taking requests: close now when idle, else after the answer in progress.
    func stopAccepting() {
        stopRequested = true
        switch phase {
        case .head where input.count == inputStart: close()
        case .lingering, .closed: break
        default: break
        }
    }

    func close() {
        channel.close(error: nil)
    }

    // MARK: SecureChannelDelegate

    func channelDidBecomeReady(_ channel: SecureChannel) {}

    func channel(_ channel: SecureChannel, didRead plaintext: UnsafeRawBufferPointer) {
        switch phase {
        case .lingering, .closed:
            return  // discarded while the peer takes its last answer
        default:
            break
        }
        if input.count == inputStart, case .head = phase, timerUse != .header {
            arm(.header)  // the first byte of a new head
        }
        if inputStart > 0 && inputStart == input.count {
            input.removeAll(keepingCapacity: true)
            inputStart = 0
            headScanned = 0
        } else if inputStart >= 16 * 1024 {
            input.removeSubrange(0..<inputStart)  // headScanned counts from inputStart: unchanged
            inputStart = 0
        }
        input.append(contentsOf: plaintext)
        // Pipelined input waits while a request is answered or its answer waits to be written, but not without bound
        // (the channel stops reading meanwhile, so this holds at most what was read before it did).
        if isResponding || waitingForOutput, input.count - inputStart > limits.maxHeadBytes + limits.maxBodyBytes {
            close()
            return
        }
        processInput()
    }

    func channel(_ channel: SecureChannel, didCloseWith error: TransportError?) {
        guard !isClosed else { return }
        phase = .closed
        timerUse = .none
        input = []
        body = []
        onClose()
    }

    /// The channel takes output again: a pipelined request held back for it goes on.
    func channelProduceOutput(_ channel: SecureChannel) {
        guard waitingForOutput else { return }
        waitingForOutput = false
        guard case .head = phase else { return }
        arm(.header)  // the head's time starts now: the wait was this side's
        processInput()
    }

    private var isClosed: Bool {
        if case .closed = phase { return true }
        return false
    }

    /// Output is still waiting for the socket, and the write timeout will close the connection if it stalls.
    private var answerStillLeaving: Bool { limits.writeTimeoutMilliseconds > 0 && channel.hasPendingOutput }

    private var isResponding: Bool {
        if case .responding = phase { return true }
        return false
    }

    // MARK: Input

    /// Moves through the buffered input as far as it goes: heads, bodies, and the handler's calls.
    private func processInput() {
        guard !processing else { return }
        processing = true
        defer { processing = false }
        while true {
            switch phase {
            case .head:
                if input.count > inputStart && !channel.canWrite {
                    // A pipelined request, and the answers before it not yet taken: it waits, its answer unmade, so a
                    // client that does not read cannot make this connection buffer without bound.
                    waitingForOutput = true
                    arm(.none)
                    return
                }
                guard parseHead() else { return }
            case .body(let head, let remaining):
                let take = min(remaining, input.count - inputStart)
                if take > 0 {
                    body.append(contentsOf: input[inputStart..<(inputStart + take)])
                    inputStart += take
                }
                if take == remaining {
                    dispatch(head)
                } else {
                    phase = .body(head, remaining: remaining - take)
                    armBodyDeadline()
                    return
                }
            case .chunked(let head, var decoder):
                let (consumed, outcome) = input.withUnsafeBytes { bytes in
                    decoder.decode(UnsafeRawBufferPointer(rebasing: bytes[inputStart...]), into: &body)
                }
                inputStart += consumed
                switch outcome {
                case .needMore:
                    phase = .chunked(head, decoder)
                    armBodyDeadline()
                    return
                case .done:
                    dispatch(head)
                case .tooLarge:
                    finish(with: limits.answer(413, "request body larger than \(limits.maxBodyBytes) bytes"))
                    return
                case .malformed(let message):
                    finish(with: limits.answer(400, message))
                    return
                }
            case .responding, .lingering, .closed:
                return
            }
        }
    }

    /// Parses a head when the whole of it is buffered; true when it moved on (to a body or the handler).
    private func parseHead() -> Bool {
        let available = input.count - inputStart
        guard available > 0 else { return false }
        let end = input.withUnsafeBytes { bytes in
            HTTP1RequestHead.endOfHead(
                in: UnsafeRawBufferPointer(rebasing: bytes[inputStart...]), from: max(0, headScanned - 3))
        }
        guard let end else {
            headScanned = available
            if available > limits.maxHeadBytes { finish(with: limits.answer(431, "request head too large")) }
            return false
        }
        headScanned = 0
        guard end <= limits.maxHeadBytes else {
            finish(with: limits.answer(431, "request head too large"))
            return false
        }
        let parsed = input.withUnsafeBytes { bytes in
            HTTP1RequestHead.parse(UnsafeRawBufferPointer(rebasing: bytes[inputStart..<(inputStart + end)]))
        }
        inputStart += end
        switch parsed {
        case .failure(let error):
            finish(with: limits.answer(error.status, error.message))
            return false
        case .success(let head):
            body = []
            switch head.framing {
            case .none:
                dispatch(head)
            case .contentLength(let length):
                guard length <= limits.maxBodyBytes else {
                    finish(with: limits.answer(413, "request body larger than \(limits.maxBodyBytes) bytes"))
                    return false
                }
                body.reserveCapacity(length)
                continueIfExpected(head)
                phase = .body(head, remaining: length)
            case .chunked:
                continueIfExpected(head)
                phase = .chunked(head, HTTP1ChunkedDecoder(maxBodyBytes: limits.maxBodyBytes))
            }
            return true
        }
    }

    private func continueIfExpected(_ head: HTTP1RequestHead) {
        guard head.expectsContinue, input.count == inputStart else { return }  // the body is already coming
        writeRaw("HTTP/1.1 100 Continue\r\n\r\n")
    }

    /// The request is complete: hand it to the handler.
    private func dispatch(_ head: HTTP1RequestHead) {
        nextRequestID += 1
        let requestID = nextRequestID
        phase = .responding(head, requestID: requestID)
        arm(.none)
        let request = HTTPRequest(
            method: head.method, target: head.target, headers: head.headers, body: body,
            version: head.minorVersion == 0 ? .http1_0 : .http1_1)
        body = []
        handler(request, HTTPResponder(loop: loop, sink: self, requestID: requestID))
    }

    // MARK: Output

    func deliver(_ response: HTTPResponse, for requestID: Int64) {
        guard case .responding(let head, let current) = phase, current == requestID else { return }
        let keepAlive = head.keepAlive && !stopRequested && !Self.asksToClose(response)
        write(response, keepAlive: keepAlive, omitBody: head.method == "HEAD")
        if keepAlive {
            phase = .head
            if input.count == inputStart {
                arm(.idle)
            } else {
                arm(.header)  // a pipelined request is already waiting
            }
            if !processing { processInput() }
        } else {
            linger()
        }
    }

    /// Answers on the server's own (400, 408, 413, 431) and closes.
    private func finish(with response: HTTPResponse) {
        switch phase {
        case .lingering, .closed: return
        default: break
        }
        write(response, keepAlive: false, omitBody: false)
        linger()
    }

    private func linger() {
        phase = .lingering
        input = []
        inputStart = 0
        channel.shutdownWhenFlushed()
        arm(.linger)
    }

    /// One deadline for the whole body, armed when it starts and not moved by later reads.
    private func armBodyDeadline() {
        if timerUse != .body { arm(.body) }
    }

    private func arm(_ use: TimerUse) {
        timerUse = use
        switch use {
        case .none: timer.stop()
        case .header: timer.restart(milliseconds: limits.headerTimeoutMilliseconds)
        case .idle: timer.restart(milliseconds: limits.idleTimeoutMilliseconds)
        case .body: timer.restart(milliseconds: limits.bodyTimeoutMilliseconds)
        case .linger: timer.restart(milliseconds: limits.lingerMilliseconds)
        }
    }

    private func write(_ response: HTTPResponse, keepAlive: Bool, omitBody: Bool) {
        writeRaw(response.http1Head(keepAlive: keepAlive))
        if !omitBody && response.hasBody && !response.body.isEmpty {
            response.body.withUnsafeBytes { channel.write($0) }
        }
        channel.scheduleFlush()
    }

    /// The handler's `Connection: close`: the connection closes after this answer.
    private static func asksToClose(_ response: HTTPResponse) -> Bool {
        response.headers.contains {
            $0.name.lowercased() == "connection" && $0.value.lowercased().contains("close")
        }
    }

    private func writeRaw(_ text: String) {
        var text = text
        text.withUTF8 { channel.write(UnsafeRawBufferPointer($0)) }
        channel.scheduleFlush()
    }
}
