import FanoutTestSupport
import Foundation
import Synchronization
import XCTest

@testable import FanoutTransport

/// A server handler that answers, never answers, or answers late, by the request's path:
/// `/hang/...` is never answered, `/late/<ms>/...` is answered after `<ms>` milliseconds, anything
/// else at once. It records how each stream closed.
final class ScriptedHandler: HTTP2ServerHandler, @unchecked Sendable {
    private let lock = NSLock()
    private var paths: [Int32: String] = [:]
    private var closes: [(path: String, errorCode: UInt32)] = []
    let received = Atomic<Int>(0)
    /// `/late/...` answers made so far (each when its timer fired, whether or not its stream was still open).
    let lateAnswersMade = Atomic<Int>(0)

    func serverConnection(_ connection: HTTP2ServerConnection, didReceive request: HTTP2ServerRequest) {
        received.add(1, ordering: .relaxed)
        lock.withLock { paths[request.streamID] = request.path }
        if connection.streamsReceived == 1 { connection.setMaxConcurrentStreams(1000) }
        let parts = request.path.split(separator: "/")
        if parts.first == "hang" { return }
        if parts.first == "late", parts.count > 1, let delay = UInt64(parts[1]) {
            let timer = LoopTimer(loop: connection.loop)
            timer.schedule(milliseconds: delay) {
                connection.respond(streamID: request.streamID, status: 200)
                timer.close()
                self.lateAnswersMade.add(1, ordering: .relaxed)
            }
            return
        }
        connection.respond(streamID: request.streamID, status: 200)
    }

    func serverConnection(_ connection: HTTP2ServerConnection, didCloseStream streamID: Int32, errorCode: UInt32) {
        lock.withLock { closes.append((paths[streamID] ?? "?", errorCode)) }
    }

    func serverConnectionStreamLimitViolated(_ connection: HTTP2ServerConnection) {}
    func serverConnectionDidClose(_ connection: HTTP2ServerConnection, error: TransportError?) {}

    /// The error codes the streams for `path` closed with, so far.
    func closeCodes(path: String) -> [UInt32] {
        lock.withLock { closes.filter { $0.path == path }.map(\.errorCode) }
    }

    /// Waits up to `seconds` for a stream for `path` to close, and returns its error codes.
    func waitForClose(path: String, seconds: Double = 5) -> [UInt32] {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            let codes = closeCodes(path: path)
            if !codes.isEmpty { return codes }
            usleep(2_000)
        }
        return []
    }
}

/// Completions by request tag, each with the time from submit to completion; counts every call, so a
/// second completion of one request shows.
final class TaggedResults: @unchecked Sendable {
    private let lock = NSLock()
    private var results: [String: [(result: Result<HTTP2Response, HTTP2StreamFailure>, seconds: Double)]] = [:]
    private var calls = 0

    func completion(_ tag: String, submitted: DispatchTime = .now()) -> HTTP2Completion {
        { result in
            let seconds = Double(DispatchTime.now().uptimeNanoseconds - submitted.uptimeNanoseconds) / 1e9
            self.lock.withLock {
                self.results[tag, default: []].append((result, seconds))
                self.calls += 1
            }
        }
    }

    var count: Int { lock.withLock { calls } }

    func all(_ tag: String) -> [(result: Result<HTTP2Response, HTTP2StreamFailure>, seconds: Double)] {
        lock.withLock { results[tag] ?? [] }
    }

    /// Waits up to `seconds` until `count` completions arrived.
    func wait(for count: Int, seconds: Double = 10) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if self.count >= count { return true }
            usleep(1_000)
        }
        return self.count >= count
    }
}

final class HTTP2DeadlineTests: XCTestCase {
    private var server: HTTP2Server!
    private var handler: ScriptedHandler!
    private var loop: LoopThread!
    private var tls: TLSClientContext!
    private let box = ConnectionBox()

    override func setUpWithError() throws {
        let material = try makeTLSMaterial()
        let handler = ScriptedHandler()
        self.handler = handler
        server = try HTTP2Server(
            host: "127.0.0.1", port: 0, threads: 1,
            tls: TLSServerContext(
                TLSServerConfiguration(certificateFile: material.serverCertPath, privateKeyFile: material.serverKeyPath)
            ),
            initialMaxStreams: 100, makeHandler: { _ in handler })
        tls = try TLSClientContext(TLSClientConfiguration(caFile: material.caPEMPath))
        loop = LoopThread(name: "deadline-client")
    }

    override func tearDown() {
        let box = self.box
        loop?.runAndWait { box.connection?.close(immediately: true) }
        loop?.shutdown()
        server?.shutdown()
    }

    /// Makes the connection on the loop.
    private func connect(timeout: Duration?) {
        let (loop, tls, box, port) = (loop!, tls!, box, server.port)
        loop.runAndWait {
            box.connection = HTTP2ClientConnection(
                loop: loop,
                configuration: HTTP2ClientConfiguration(
                    host: "localhost", port: port, tls: tls.configuration, requestTimeout: timeout),
                tlsContext: tls)
        }
    }

    private static let head = HeaderBlock([
        (":method", "POST", false), (":scheme", "https", false), (":authority", "localhost", false),
    ])

    private static func request(_ path: String) -> HTTP2Request {
        HTTP2Request(head: head, path: path, body: SharedBody(Array("{}".utf8)))
    }

    /// Submits on the loop; returns the request ids.
    @discardableResult
    private func submit(_ paths: [String], into results: TaggedResults) -> [HTTP2RequestID] {
        let box = self.box
        return loop.runAndWait {
            paths.map { path in
                box.connection!.submit(Self.request(path), completion: results.completion(path))
            }
        }
    }

    /// One answered request, so the connection leaves APNs's one-stream start.
    private func warmUp() throws {
        let results = TaggedResults()
        submit(["/warm"], into: results)
        XCTAssertTrue(results.wait(for: 1))
        guard case .success(let response) = try XCTUnwrap(results.all("/warm").first).result else {
            throw XCTSkip("warm-up failed: \(results.all("/warm"))")
        }
        XCTAssertEqual(response.status, 200)
    }

    /// One request answered at once, sent after everything before it: the server answers it after every answer it
    /// made before the request came, and the client reads those first (one connection, in order). Once it is
    /// complete, no earlier answer is still on its way to the client.
    private func roundTrip() throws {
        let after = TaggedResults()
        submit(["/round-trip"], into: after)
        XCTAssertTrue(after.wait(for: 1), "the round trip was not answered")
        XCTAssertEqual(try XCTUnwrap(after.all("/round-trip").first).result.status, 200)
    }

    /// Connects with `timeout`, warms up, sends `paths` in one loop turn and waits for them all.
    private func sendAfterWarmUp(_ paths: [String], timeout: Duration) throws -> TaggedResults {
        connect(timeout: timeout)
        try warmUp()
        let results = TaggedResults()
        submit(paths, into: results)
        XCTAssertTrue(results.wait(for: paths.count, seconds: 20), "\(results.count) of \(paths.count) completed")
        return results
    }

    func testDeadlineResetsTheOpenStreamWithCancelAndFailsTimedOut() throws {
        connect(timeout: .milliseconds(300))
        try warmUp()
        let results = TaggedResults()
        submit(["/hang/1", "/answered"], into: results)
        XCTAssertTrue(results.wait(for: 2, seconds: 5))
        let hung = results.all("/hang/1")
        XCTAssertEqual(hung.count, 1)
        XCTAssertEqual(try XCTUnwrap(hung.first).result.failure, .timedOut)
        XCTAssertEqual(HTTP2StreamFailure.timedOut.isSafeToRetry, false)
        let seconds = try XCTUnwrap(hung.first).seconds
        XCTAssertGreaterThanOrEqual(seconds, 0.299)
        XCTAssertLessThan(seconds, 0.3 + 0.25 * testTimeScale, "the deadline fired late")
        XCTAssertEqual(try XCTUnwrap(results.all("/answered").first).result.status, 200)
        XCTAssertEqual(
            handler.waitForClose(path: "/hang/1"), [HTTP2ErrorCode.cancel], "the server saw RST_STREAM(CANCEL)")
        XCTAssertEqual(HTTP2ErrorCode.cancel, 8)
        // The connection is still good, and the reset stream's slot came back.
        let after = TaggedResults()
        submit(["/after"], into: after)
        XCTAssertTrue(after.wait(for: 1))
        XCTAssertEqual(try XCTUnwrap(after.all("/after").first).result.status, 200)
        XCTAssertEqual(loop.runAndWait { [box] in box.connection!.outstanding }, 0)
    }

    func testDeadlineWhileWaitingForAStreamFailsNotSent() throws {
        // No response yet: the connection allows one stream, so the second request waits.
        connect(timeout: .milliseconds(200))
        let results = TaggedResults()
        submit(["/hang/open", "/hang/waiting"], into: results)
        XCTAssertTrue(results.wait(for: 2, seconds: 5))
        XCTAssertEqual(try XCTUnwrap(results.all("/hang/open").first).result.failure, .timedOut)
        let waiting = try XCTUnwrap(results.all("/hang/waiting").first)
        guard case .failure(.notSent(let error)) = waiting.result else {
            return XCTFail("expected notSent, got \(waiting.result)")
        }
        XCTAssertEqual(error.kind, .timedOut)
        XCTAssertTrue(waiting.result.failure?.isSafeToRetry ?? false)
        XCTAssertLessThan(waiting.seconds, 0.2 + 0.25 * testTimeScale)
        XCTAssertEqual(handler.received.load(ordering: .relaxed), 1, "the waiting request never reached the server")
        XCTAssertEqual(handler.waitForClose(path: "/hang/open"), [HTTP2ErrorCode.cancel])
    }

    func testCancelWaitingAndOpenRequests() throws {
        connect(timeout: nil)
        let results = TaggedResults()
        let ids = submit(["/hang/open", "/hang/waiting"], into: results)
        // Let the first stream reach the server.
        let deadline = Date().addingTimeInterval(5)
        while handler.received.load(ordering: .relaxed) < 1 && Date() < deadline { usleep(1_000) }
        let box = self.box
        loop.runAndWait {
            box.connection!.cancel(ids[1])
            box.connection!.cancel(ids[0])
            // Finished and unknown ids are no-ops.
            box.connection!.cancel(ids[0])
            box.connection!.cancel(HTTP2RequestID(rawValue: 999_999))
        }
        // Both completed at once, inside the cancel calls.
        XCTAssertEqual(results.count, 2)
        XCTAssertEqual(try XCTUnwrap(results.all("/hang/waiting").first).result.failure, .cancelled(sent: false))
        XCTAssertEqual(try XCTUnwrap(results.all("/hang/open").first).result.failure, .cancelled(sent: true))
        XCTAssertEqual(HTTP2StreamFailure.cancelled(sent: false).isSafeToRetry, true)
        XCTAssertEqual(HTTP2StreamFailure.cancelled(sent: true).isSafeToRetry, false)
        XCTAssertEqual(handler.waitForClose(path: "/hang/open"), [HTTP2ErrorCode.cancel])
        XCTAssertEqual(handler.received.load(ordering: .relaxed), 1)
        // The connection goes on serving.
        let after = TaggedResults()
        submit(["/after"], into: after)
        XCTAssertTrue(after.wait(for: 1))
        XCTAssertEqual(try XCTUnwrap(after.all("/after").first).result.status, 200)
        XCTAssertEqual(results.count, 2, "no second completion")
    }

    /// A request the connection cannot take completes inside `submit`, before `submit` returns its id; `nextRequestID`
    /// read before is that id (the engine stores it in the notification's record before submitting, since the
    /// completion may already have handed the record on).
    func testNextRequestIDIsTheIDOfARequestThatCompletesInsideSubmit() throws {
        connect(timeout: nil)
        try warmUp()
        let box = self.box
        let results = TaggedResults()
        let (announced, returned, completedInside) = loop.runAndWait {
            let connection = box.connection!
            connection.close(immediately: true)
            let announced = connection.nextRequestID
            let returned = connection.submit(Self.request("/closed"), completion: results.completion("/closed"))
            return (announced, returned, results.count == 1)
        }
        XCTAssertTrue(completedInside, "a closed connection fails a request inside submit")
        XCTAssertEqual(returned, announced)
        guard case .notSent? = try XCTUnwrap(results.all("/closed").first).result.failure else {
            return XCTFail("expected notSent: \(results.all("/closed"))")
        }
        XCTAssertEqual(loop.runAndWait { box.connection!.nextRequestID.rawValue }, returned.rawValue + 1)
    }

    /// The server answers A and B together; A's completion cancels B while B's answer is on its way
    /// (nghttp2 drops frames for a stream with a RST_STREAM queued): B completes once, cancelled.
    func testAResponseAfterCancelDoesNotCompleteTwice() throws {
        connect(timeout: nil)
        try warmUp()
        let results = TaggedResults()
        let ids = IDBox()
        let box = self.box
        for round in 0..<20 {
            let (first, second) = ("/pair/\(round)/a", "/pair/\(round)/b")
            loop.runAndWait {
                let connection = box.connection!
                let record = results.completion(first)
                connection.submit(Self.request(first)) { result in
                    record(result)
                    connection.cancel(ids.value!)
                }
                ids.value = connection.submit(Self.request(second), completion: results.completion(second))
            }
            XCTAssertTrue(results.wait(for: 2 * (round + 1)))
        }
        // Each B's answer left the server before the round trip's: once that is in, a B answered after its cancel
        // has been read (and dropped) by the client.
        try roundTrip()
        XCTAssertEqual(results.count, 40, "no request completed twice")
        for round in 0..<20 {
            XCTAssertEqual(results.all("/pair/\(round)/a").first?.result.status, 200)
            XCTAssertEqual(results.all("/pair/\(round)/b").map(\.result.failure), [.cancelled(sent: true)])
        }
    }

    func testAnswersAroundTheDeadlineCompleteEachRequestOnce() throws {
        // Answers due from 90 to 110 ms after arrival: some beat the deadline, some come after the
        // reset (nghttp2 drops them).
        let paths = (0..<200).map { "/late/\(90 + $0 % 21)/\($0)" }
        let results = try sendAfterWarmUp(paths, timeout: .milliseconds(100))
        // Every late answer made by the server (its timer fired; a reset stream's answer goes nowhere), then a round
        // trip behind them: no answer to these requests can still reach the client.
        let deadline = Date().addingTimeInterval(5 * testTimeScale)
        while handler.lateAnswersMade.load(ordering: .relaxed) < paths.count && Date() < deadline { usleep(1_000) }
        XCTAssertEqual(handler.lateAnswersMade.load(ordering: .relaxed), paths.count, "the server made every answer")
        try roundTrip()
        XCTAssertEqual(results.count, paths.count, "every request completed exactly once")
        var answered = 0
        var timedOut = 0
        for path in paths {
            let outcomes = results.all(path)
            XCTAssertEqual(outcomes.count, 1, path)
            switch outcomes.first?.result {
            case .success(let response): if response.status == 200 { answered += 1 }
            case .failure(.timedOut): timedOut += 1
            default: XCTFail("\(path): \(String(describing: outcomes.first?.result))")
            }
        }
        XCTAssertEqual(answered + timedOut, paths.count)
        XCTAssertGreaterThan(timedOut, 0, "some answers came after the deadline")
        XCTAssertEqual(loop.runAndWait { [box] in box.connection!.isAcceptingRequests }, true)
    }

    func testAThousandRequestsAnsweredInTimeNeverTimeOut() throws {
        let paths = (0..<1000).map { "/device/\($0)" }
        let results = try sendAfterWarmUp(paths, timeout: .seconds(5))
        let ok = paths.filter { results.all($0).count == 1 && results.all($0).first?.result.status == 200 }
        XCTAssertEqual(ok.count, paths.count)
        XCTAssertEqual(results.count, paths.count)
        XCTAssertEqual(handler.closeCodes(path: "/device/0"), [HTTP2ErrorCode.noError])
    }
}

/// A request id handed from the loop to a completion that runs there later.
private final class IDBox: @unchecked Sendable {
    var value: HTTP2RequestID?
}

extension Result where Success == HTTP2Response, Failure == HTTP2StreamFailure {
    var failure: HTTP2StreamFailure? {
        if case .failure(let failure) = self { return failure }
        return nil
    }

    var status: Int? {
        if case .success(let response) = self { return response.status }
        return nil
    }
}

/// The ledger behind cancel and deadlines: ordered lookups stay right while it drops finished
/// requests from the front and compacts them out of the middle.
final class RequestLedgerTests: XCTestCase {
    private func stream(_ id: UInt64, deadline: UInt64 = .max) -> ClientStream {
        ClientStream(
            id: id, request: HTTP2Request(head: HeaderBlock([]), path: "/", body: SharedBody([])), deadline: deadline,
            completion: { _ in })
    }

    func testFindAndOldestAcrossFinishingAndCompaction() {
        var ledger = RequestLedger()
        let streams = (1...10_000).map { stream(UInt64($0)) }
        for stream in streams { ledger.append(stream) }
        XCTAssertTrue(ledger.find(1) === streams[0])
        XCTAssertTrue(ledger.find(10_000) === streams[9_999])
        XCTAssertNil(ledger.find(10_001))
        // The first stays open (a stuck request); every other one finishes, most in order.
        for stream in streams.dropFirst() where stream.id % 7 != 0 {
            _ = stream.takeCompletion()
            ledger.didFinish()
        }
        XCTAssertTrue(ledger.oldest === streams[0])
        XCTAssertNil(ledger.find(2))
        XCTAssertTrue(ledger.find(7) === streams[6])
        XCTAssertTrue(ledger.find(9_996) === streams[9_995])
        _ = streams[0].takeCompletion()
        ledger.didFinish()
        XCTAssertTrue(ledger.oldest === streams[6], "the front moved to the oldest unfinished request")
        for stream in streams where stream.id % 7 == 0 {
            XCTAssertTrue(ledger.find(stream.id) === stream)
            _ = stream.takeCompletion()
            ledger.didFinish()
        }
        XCTAssertNil(ledger.oldest)
        XCTAssertNil(ledger.find(7))
        ledger.append(stream(10_001))
        XCTAssertEqual(ledger.oldest?.id, 10_001)
    }

    /// A connection that always has requests in flight never empties its ledger: the slots of
    /// finished requests must still be reclaimed.
    func testStorageStaysProportionalToRequestsInFlight() {
        var ledger = RequestLedger()
        var inFlight: [ClientStream] = []
        for id in 1...100_000 {
            let next = stream(UInt64(id))
            ledger.append(next)
            inFlight.append(next)
            if inFlight.count > 100 {
                _ = inFlight.removeFirst().takeCompletion()
                ledger.didFinish()
            }
            XCTAssertLessThanOrEqual(ledger.storageCount, 2_500)
        }
        XCTAssertTrue(ledger.oldest === inFlight[0])
        XCTAssertTrue(ledger.find(inFlight[50].id) === inFlight[50])
    }

    /// The connection reuses a finished stream object for a later request while the ledger may still hold its
    /// old entry: that entry counts as finished, and the old id finds nothing.
    func testAReusedStreamIsFoundOnlyUnderItsNewID() {
        var ledger = RequestLedger()
        let first = stream(1)
        let second = stream(2)
        ledger.append(first)
        ledger.append(second)
        _ = second.takeCompletion()
        ledger.didFinish()
        second.clear()
        second.reuse(
            id: 3, request: HTTP2Request(head: HeaderBlock([]), path: "/", body: SharedBody([])), deadline: .max,
            completion: .closure { _ in })
        ledger.append(second)
        XCTAssertNil(ledger.find(2))
        XCTAssertTrue(ledger.find(3) === second)
        XCTAssertTrue(ledger.oldest === first)
        _ = first.takeCompletion()
        ledger.didFinish()
        XCTAssertTrue(ledger.oldest === second, "the reused stream's old entry was released with the front")
        XCTAssertEqual(ledger.oldest?.id, 3)
    }
}
