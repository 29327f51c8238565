import CNGHTTP2
import FanoutTestSupport
import Foundation
import Synchronization
import XCTest

@testable import FanoutTransport

/// `HTTPServer` over real sockets on port 0: HTTP/1.1 keep-alive, chunked bodies and pipelining with a raw client;
/// curl for HTTP/1.1, h2c with prior knowledge and h2 over TLS; late answers from other threads; and the limits
/// (413, 408, 503, 400), on HTTP/2 streams too with a raw frame client.
final class HTTPServerTests: XCTestCase {
    /// Answers every request with `<METHOD> <target> <body>` (and the version), at once.
    private static let echo: HTTPServer.Handler = { request, responder in
        responder.respond(echoResponse(request))
    }

    private static func echoResponse(_ request: HTTPRequest) -> HTTPResponse {
        let version =
            switch request.version {
            case .http1_0: "1.0"
            case .http1_1: "1.1"
            case .http2: "2"
            }
        let text = "\(request.method) \(request.target) \(String(decoding: request.body, as: UTF8.self))"
        return HTTPResponse(
            status: 200, headers: [("content-type", "text/plain"), ("x-version", version)], body: Array(text.utf8))
    }

    private func makeServer(
        limits: HTTPServerLimits = HTTPServerLimits(), tls: TLSServerContext? = nil,
        handler: @escaping HTTPServer.Handler = HTTPServerTests.echo
    ) throws -> HTTPServer {
        try HTTPServer(host: "127.0.0.1", port: 0, threads: 2, tls: tls, limits: limits, handler: handler)
    }

    // MARK: HTTP/1.1 over a raw socket

    func testKeepAliveServesContentLengthChunkedAndPipelinedRequestsInOrder() throws {
        let server = try makeServer()
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port)
        defer { client.close() }

        try client.send("POST /a?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello")
        var response = try client.readResponse()
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.bodyText, "POST /a?x=1 hello")
        XCTAssertEqual(response.headers["connection"], "keep-alive")
        XCTAssertEqual(response.headers["x-version"], "1.1")

        try client.send(
            "POST /chunked HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                + "4\r\nWiki\r\n6;ext=1\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nX-Trailer: t\r\n\r\n")
        response = try client.readResponse()
        XCTAssertEqual(response.bodyText, "POST /chunked Wikipedia in \r\n\r\nchunks.")

        // Three requests in one write, one of them chunked and one HEAD: answered in order on the same connection.
        try client.send(
            "GET /1 HTTP/1.1\r\nHost: h\r\n\r\n"
                + "POST /2 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                + "HEAD /3 HTTP/1.1\r\nHost: h\r\n\r\n"
                + "PUT /4 HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nzz")
        XCTAssertEqual(try client.readResponse().bodyText, "GET /1 ")
        XCTAssertEqual(try client.readResponse().bodyText, "POST /2 abc")
        let head = try client.readResponse(bodyExpected: false)
        XCTAssertEqual(head.headers["content-length"], "8")
        XCTAssertEqual(head.body, [])
        XCTAssertEqual(try client.readResponse().bodyText, "PUT /4 zz")
        XCTAssertEqual(server.openConnections, 1)

        // Connection: close is honoured.
        try client.send("GET /last HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        response = try client.readResponse()
        XCTAssertEqual(response.headers["connection"], "close")
        XCTAssertTrue(try client.readsEndOfStream())
    }

    func testExpect100ContinueAndHTTP10() throws {
        let server = try makeServer()
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port)
        defer { client.close() }
        try client.send("POST /e HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
        XCTAssertEqual(try client.readResponse(bodyExpected: false).status, 100)
        try client.send("abc")
        XCTAssertEqual(try client.readResponse().bodyText, "POST /e abc")

        let old = try RawHTTPClient(port: server.port)
        defer { old.close() }
        try old.send("GET /old HTTP/1.0\r\n\r\n")
        let response = try old.readResponse()
        XCTAssertEqual(response.headers["x-version"], "1.0")
        XCTAssertEqual(response.headers["connection"], "close")
        XCTAssertTrue(try old.readsEndOfStream())
    }

    func testMalformedHeadsGet400AndAreClosed() throws {
        let server = try makeServer()
        defer { server.shutdown() }
        for request in [
            "GET /x HTTP/1.1\r\n\r\n",  // no Host
            "GET /x HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "GET /x HTTP/1.1\r\nHost : h\r\n\r\n",
            "GET /x HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n",
            "GET x HTTP/1.1\r\nHost: h\r\n\r\n",
            "POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ] {
            let client = try RawHTTPClient(port: server.port)
            defer { client.close() }
            try client.send(request)
            let response = try client.readResponse()
            XCTAssertEqual(response.status, 400, request.debugDescription)
            XCTAssertEqual(response.headers["connection"], "close", request.debugDescription)
            XCTAssertTrue(try client.readsEndOfStream(), request.debugDescription)
        }
    }

    func testBodyPastTheLimitGets413OnHTTP1() throws {
        let server = try makeServer()
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port)
        defer { client.close() }
        try client.send("POST /big HTTP/1.1\r\nHost: h\r\nContent-Length: \((1 << 20) + 1)\r\n\r\n")
        try? client.send(String(repeating: "a", count: 64 * 1024))  // the server may be gone already
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 413)
        XCTAssertEqual(response.headers["connection"], "close")
        XCTAssertTrue(try client.readsEndOfStream())

        // A chunked body that grows past the limit, too.
        let chunked = try RawHTTPClient(port: server.port)
        defer { chunked.close() }
        try chunked.send("POST /big HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n100000\r\n")
        try chunked.send(String(repeating: "a", count: 1 << 20) + "\r\n1\r\n")
        XCTAssertEqual(try chunked.readResponse().status, 413)
    }

    func testIncompleteHeadGets408AfterTheHeaderTimeout() throws {
        var limits = HTTPServerLimits()
        limits.headerTimeout = .milliseconds(300)
        let server = try makeServer(limits: limits)
        defer { server.shutdown() }
        let started = Date()
        let client = try RawHTTPClient(port: server.port)
        defer { client.close() }
        try client.send("GET /slow HTTP/1.1\r\nHost: h\r\n")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 408)
        XCTAssertTrue(try client.readsEndOfStream())
        XCTAssertLessThan(Date().timeIntervalSince(started), 3 * testTimeScale)

        // A prompt client on the same server is unaffected.
        let prompt = try RawHTTPClient(port: server.port)
        defer { prompt.close() }
        try prompt.send("GET /ok HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try prompt.readResponse().status, 200)
    }

    func testABodyTricklingInPastTheBodyTimeoutGets408() throws {
        var limits = HTTPServerLimits()
        limits.bodyTimeout = .milliseconds(400)
        let server = try makeServer(limits: limits)
        defer { server.shutdown() }
        let started = Date()
        let client = try RawHTTPClient(port: server.port)
        defer { client.close() }
        try client.send("POST /slow HTTP/1.1\r\nHost: h\r\nContent-Length: 1000\r\n\r\n")
        // A byte every 100 ms: each read would have re-armed an idle timer; the body's deadline does not move.
        for _ in 0..<6 {
            try client.send("x")
            usleep(100_000)
        }
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 408)
        XCTAssertTrue(try client.readsEndOfStream())
        XCTAssertLessThan(Date().timeIntervalSince(started), 3 * testTimeScale)
    }

    func testPastMaxConnectionsNewConnectionsGet503WhileTheOpenOneIsServed() throws {
        var limits = HTTPServerLimits()
        limits.maxConnections = 1
        let server = try makeServer(limits: limits)
        defer { server.shutdown() }
        let first = try RawHTTPClient(port: server.port)
        defer { first.close() }
        try first.send("GET /first HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try first.readResponse().status, 200)
        XCTAssertEqual(server.openConnections, 1)

        let second = try RawHTTPClient(port: server.port)
        defer { second.close() }
        let refused = try second.readResponse()
        XCTAssertEqual(refused.status, 503)
        XCTAssertEqual(refused.headers["connection"], "close")
        XCTAssertTrue(try second.readsEndOfStream())

        try first.send("GET /again HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try first.readResponse().bodyText, "GET /again ")
        XCTAssertEqual(server.openConnections, 1)
    }

    func testStopAcceptingLetsTheRequestInProgressFinish() throws {
        let pending = PendingResponders()
        let server = try makeServer { request, responder in pending.add(request, responder) }
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port)
        defer { client.close() }
        try client.send("GET /held HTTP/1.1\r\nHost: h\r\n\r\n")
        let (request, responder) = try XCTUnwrap(pending.wait())
        server.stopAccepting()
        responder.respond(Self.echoResponse(request))
        XCTAssertEqual(try client.readResponse().bodyText, "GET /held ")
        XCTAssertTrue(try client.readsEndOfStream())
    }

    // MARK: Late answers

    func testResponseFromAnotherThreadLaterOnBothProtocols() throws {
        let handler: HTTPServer.Handler = { request, responder in
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(50)) {
                responder.respond(Self.echoResponse(request))
                responder.respond(HTTPResponse(status: 500))  // ignored
            }
        }
        let server = try makeServer(handler: handler)
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port)
        defer { client.close() }
        try client.send("POST /late HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nx")
        XCTAssertEqual(try client.readResponse().bodyText, "POST /late x")
        try client.send("GET /late2 HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try client.readResponse().bodyText, "GET /late2 ")

        let curl = try Curl.run([
            "--http2-prior-knowledge", "--data-binary", "yz", "http://127.0.0.1:\(server.port)/late-h2",
        ])
        XCTAssertEqual(curl.versions, ["2"])
        XCTAssertEqual(curl.body, "POST /late-h2 yz")
    }

    // MARK: curl

    func testCurlSpeaksHTTP1AndH2cPlaintextAndH2OverTLS() throws {
        let material = try makeTLSMaterial()
        let tls = try TLSServerContext(
            TLSServerConfiguration(
                certificateFile: material.serverCertPath, privateKeyFile: material.serverKeyPath,
                alpnProtocols: ["h2", "http/1.1"]))
        let plain = try makeServer()
        defer { plain.shutdown() }
        let secure = try makeServer(tls: tls)
        defer { secure.shutdown() }

        let http1 = try Curl.run(["--http1.1", "http://127.0.0.1:\(plain.port)/one?q=1"])
        XCTAssertEqual(http1.versions, ["1.1"])
        XCTAssertEqual(http1.body, "GET /one?q=1 ")

        // One URL per run: curl 7.88 fails (exit 16) a second prior-knowledge request on a reused connection, with
        // nghttpd as with this server.
        let h2c = try Curl.run(["--http2-prior-knowledge", "-d", "body", "http://127.0.0.1:\(plain.port)/two"])
        XCTAssertEqual(h2c.versions, ["2"])
        XCTAssertEqual(h2c.body, "POST /two body")

        let h2 = try Curl.run([
            "--http2", "--cacert", material.caPEMPath, "--resolve", "localhost:\(secure.port):127.0.0.1",
            "https://localhost:\(secure.port)/secure",
        ])
        XCTAssertEqual(h2.versions, ["2"])
        XCTAssertEqual(h2.body, "GET /secure ")

        // A client that offers only http/1.1 by ALPN gets HTTP/1.1 over TLS.
        let tls1 = try Curl.run([
            "--http1.1", "--cacert", material.caPEMPath, "--resolve", "localhost:\(secure.port):127.0.0.1",
            "https://localhost:\(secure.port)/secure1",
        ])
        XCTAssertEqual(tls1.versions, ["1.1"])
        XCTAssertEqual(tls1.body, "GET /secure1 ")
    }

    // MARK: HTTP/2 request deadlines, with a raw frame client

    func testAStalledHTTP2StreamGets408AndIsResetAndTheConnectionServesOn() throws {
        var limits = HTTPServerLimits()
        limits.headerTimeout = .seconds(1)  // the linger before a timed-out stream is reset: 1 s
        limits.bodyTimeout = .seconds(1)
        let server = try makeServer(limits: limits)
        defer { server.shutdown() }
        let client = try RawH2Client(port: server.port)
        defer { client.close() }

        // HEADERS without END_STREAM and some DATA, then nothing.
        let started = Date()
        try client.sendHeaders(stream: 1, method: "POST", path: "/stalled", endStream: false)
        try client.sendData(stream: 1, "some of the body", endStream: false)
        let stalled = try client.waitForEnd(of: 1)
        XCTAssertEqual(stalled.status, "408")
        XCTAssertEqual(stalled.bodyText, "request timeout: the body did not arrive in time\n")
        XCTAssertLessThan(stalled.endedAt.timeIntervalSince(started), 3 * testTimeScale, "408 after the body timeout")
        XCTAssertGreaterThan(stalled.endedAt.timeIntervalSince(started), 0.9, "not before the body timeout")
        // The client never ends the stream: it is reset (NO_ERROR), freeing its slot and what it buffered.
        let reset = try client.waitForReset(of: 1)
        XCTAssertEqual(reset.code, 0)
        XCTAssertLessThan(reset.at.timeIntervalSince(started), 5 * testTimeScale)

        // The same connection serves a complete request afterwards, and later DATA on the old stream is harmless.
        try? client.sendData(stream: 1, "late", endStream: true)
        try client.sendHeaders(stream: 3, method: "GET", path: "/after", endStream: true)
        let after = try client.waitForEnd(of: 3)
        XCTAssertEqual(after.status, "200")
        XCTAssertEqual(after.bodyText, "GET /after ")
        XCTAssertFalse(client.goawayReceived)
        XCTAssertEqual(server.openConnections, 1)

        // A header block left unfinished (HEADERS without END_HEADERS, no CONTINUATION) gets 408 at the header
        // timeout.
        let unfinished = try RawH2Client(port: server.port)
        defer { unfinished.close() }
        try unfinished.waitForSettings()  // acknowledged first: no frame may come between HEADERS and CONTINUATION
        let opened = Date()
        try unfinished.sendHeaders(stream: 1, method: "GET", path: "/unfinished", endStream: false, endHeaders: false)
        let head = try unfinished.waitForEnd(of: 1)
        XCTAssertEqual(head.status, "408")
        XCTAssertEqual(head.bodyText, "request timeout\n")
        XCTAssertLessThan(head.endedAt.timeIntervalSince(opened), 3 * testTimeScale)
        // Nothing else can come on that connection: it is closed after the linger, not held for the idle time.
        let closeBy = Date().addingTimeInterval(5 * testTimeScale)
        while server.openConnections > 1 && Date() < closeBy { usleep(20_000) }
        XCTAssertEqual(server.openConnections, 1, "the connection with the unfinished header block was closed")
    }

    func testSlowButCompleteHTTP2RequestsAreAnsweredWhileAStalledOneTimesOut() throws {
        var limits = HTTPServerLimits()
        limits.headerTimeout = .seconds(1)
        limits.bodyTimeout = .seconds(1)
        // "/hold" is answered 1.5 s after it is complete: a request the handler has is not bounded by the deadline.
        let handler: HTTPServer.Handler = { request, responder in
            let delay: DispatchTimeInterval = request.target == "/hold" ? .milliseconds(1500) : .seconds(0)
            DispatchQueue.global().asyncAfter(deadline: .now() + delay) {
                responder.respond(Self.echoResponse(request))
            }
        }
        let server = try makeServer(limits: limits, handler: handler)
        defer { server.shutdown() }
        let client = try RawH2Client(port: server.port)
        defer { client.close() }

        let started = Date()
        try client.sendHeaders(stream: 1, method: "POST", path: "/stalled", endStream: false)
        try client.sendData(stream: 1, "abc", endStream: false)
        try client.sendHeaders(stream: 3, method: "POST", path: "/hold", endStream: false)
        try client.sendData(stream: 3, "held", endStream: true)
        // Stream 5 trickles its body in 6 pieces over 0.6 s, then ends it: within the 1 s limit.
        try client.sendHeaders(stream: 5, method: "POST", path: "/slow", endStream: false)
        for index in 0..<6 {
            usleep(100_000)
            try client.sendData(stream: 5, "\(index)", endStream: index == 5)
        }
        let slow = try client.waitForEnd(of: 5)
        XCTAssertEqual(slow.status, "200")
        XCTAssertEqual(slow.bodyText, "POST /slow 012345")

        let stalled = try client.waitForEnd(of: 1)
        XCTAssertEqual(stalled.status, "408")
        XCTAssertLessThan(stalled.endedAt.timeIntervalSince(started), 3 * testTimeScale)

        let held = try client.waitForEnd(of: 3)
        XCTAssertEqual(held.status, "200", "answered when the handler is done, past the body timeout")
        XCTAssertEqual(held.bodyText, "POST /hold held")
        XCTAssertGreaterThan(held.endedAt.timeIntervalSince(started), 1.4)
        XCTAssertNil(client.responses[3]?.resetCode)
        XCTAssertNil(client.responses[5]?.resetCode)
        XCTAssertFalse(client.goawayReceived)
    }

    func testBodyPastTheLimitGets413OnHTTP2AndTheConnectionStays() throws {
        let server = try makeServer()
        defer { server.shutdown() }
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("fanout-413-\(UUID().uuidString)")
        try Data(repeating: 0x61, count: (1 << 20) + 1).write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let result = try Curl.run([
            "--http2-prior-knowledge", "--data-binary", "@\(file.path)", "http://127.0.0.1:\(server.port)/big",
        ])
        XCTAssertEqual(result.versions, ["2"])
        XCTAssertEqual(result.statuses, ["413"])

        // The connection stays: nghttp sends the same body on two streams of one connection; both get 413, and
        // the server sends no GOAWAY and resets nothing but with NO_ERROR.
        let nghttp = try Curl.runTool(
            "nghttp",
            [
                "-v", "-d", file.path, "http://127.0.0.1:\(server.port)/big1", "http://127.0.0.1:\(server.port)/big2",
            ])
        XCTAssertEqual(nghttp.components(separatedBy: ":status: 413").count - 1, 2, nghttp)
        XCTAssertFalse(nghttp.contains("recv GOAWAY"), nghttp)
    }

    func testAnHTTP2StreamAnswered413IsResetAsSoonAsTheAnswerIsSent() throws {
        var limits = HTTPServerLimits()
        limits.maxBodyBytes = 16
        limits.bodyTimeout = .seconds(60)  // the reset must not wait for the body's deadline
        let server = try makeServer(limits: limits)
        defer { server.shutdown() }
        let client = try RawH2Client(port: server.port)
        defer { client.close() }
        try client.sendHeaders(stream: 1, method: "POST", path: "/big", endStream: false)
        try client.sendData(stream: 1, String(repeating: "x", count: 100), endStream: false)
        let answer = try client.waitForEnd(of: 1)
        XCTAssertEqual(answer.status, "413")
        // Then RST_STREAM(NO_ERROR), so the client stops sending the rest (RFC 9113 section 8.1). Each read waits at
        // most 5 s: without the prompt reset it came only at the body deadline, a minute later.
        let reset = try client.waitForReset(of: 1)
        XCTAssertEqual(reset.code, 0)
        // The connection goes on.
        try client.sendHeaders(stream: 3, method: "GET", path: "/after", endStream: true)
        XCTAssertEqual(try client.waitForEnd(of: 3).status, "200")
        XCTAssertFalse(client.goawayReceived)
        XCTAssertEqual(server.openConnections, 1)
    }
}

// MARK: - Clients that do not read

extension HTTPServerTests {
    /// A handler answering every request with `bytes` bytes, counting the requests it saw.
    private static func bigAnswers(_ bytes: Int, counting handled: HandledCount) -> HTTPServer.Handler {
        let body = [UInt8](repeating: UInt8(ascii: "a"), count: bytes)
        return { _, responder in
            handled.value.add(1, ordering: .relaxed)
            responder.respond(HTTPResponse(status: 200, headers: [("content-type", "text/plain")], body: body))
        }
    }

    /// Where an HTTP/1.1 answer's body starts in `bytes`, once its head is all there.
    private static func endOfHead(_ bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        return (0...(min(bytes.count, 4096) - 4)).first { bytes[$0..<$0 + 4].elementsEqual([13, 10, 13, 10]) }
            .map { $0 + 4 }
    }

    /// Waits, at most `seconds` (scaled), for the handler to see a request and then for the server to have no
    /// connection open.
    private func waitForNoConnection(_ server: HTTPServer, handled: HandledCount, within seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds * testTimeScale)
        while handled.value.load(ordering: .relaxed) == 0 && Date() < deadline { usleep(10_000) }
        while server.openConnections > 0 && Date() < deadline { usleep(10_000) }
        return handled.value.load(ordering: .relaxed) > 0 && server.openConnections == 0
    }

    func testAnHTTP1ClientThatPipelinesAndNeverReadsIsHeldBackThenClosedAtTheWriteTimeout() throws {
        var limits = HTTPServerLimits()
        limits.writeTimeout = .milliseconds(300)
        let handled = HandledCount()
        let server = try makeServer(limits: limits, handler: Self.bigAnswers(256 * 1024, counting: handled))
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port, receiveBufferBytes: 4096)
        defer { client.close() }
        // 100 pipelined requests in one write (3 KiB), whose answers (25 MiB) the client never reads: far more than the
        // kernel's buffers hold.
        try client.send(String(repeating: "GET /big HTTP/1.1\r\nHost: h\r\n\r\n", count: 100))
        // Without a write timeout it stayed open until the idle timeout (75 s), its answers all made and queued.
        XCTAssertTrue(
            waitForNoConnection(server, handled: handled, within: 10), "closed once its output made no progress")
        XCTAssertLessThan(
            handled.value.load(ordering: .relaxed), 100,
            "the requests behind a backlog of answers were never answered (nor buffered)")
    }

    func testAnHTTP2ClientThatNeverGrantsFlowControlCreditIsClosedAtTheWriteTimeout() throws {
        var limits = HTTPServerLimits()
        limits.writeTimeout = .milliseconds(300)
        let handled = HandledCount()
        let server = try makeServer(limits: limits, handler: Self.bigAnswers(64 * 1024, counting: handled))
        defer { server.shutdown() }
        // The default 65,535-byte window, never raised: the first answer's DATA uses it up, and the socket is left
        // empty, so the rest wait in nghttp2, not in any write queue.
        let client = try RawH2Client(port: server.port)
        defer { client.close() }
        for stream in stride(from: UInt32(1), through: 9, by: 2) {
            try client.sendHeaders(stream: stream, method: "GET", path: "/big", endStream: true)
        }
        // Without a write timeout it stayed open for good: its streams never close, so it is never idle.
        XCTAssertTrue(
            waitForNoConnection(server, handled: handled, within: 10), "closed once its answers made no progress")
        XCTAssertEqual(handled.value.load(ordering: .relaxed), 5)
    }

    func testAnHTTP2ClientThatNeverReadsStopsBeingReadThenIsClosedAtTheWriteTimeout() throws {
        var limits = HTTPServerLimits()
        limits.writeTimeout = .milliseconds(300)
        let handled = HandledCount()
        let server = try makeServer(limits: limits, handler: Self.bigAnswers(256 * 1024, counting: handled))
        defer { server.shutdown() }
        // Windows of 1 GiB, so its answers go straight to the socket, which it never reads.
        let client = try RawH2Client(port: server.port, receiveBufferBytes: 4096, windowBytes: 1 << 30)
        defer { client.close() }
        // 100 requests (fewer than the 128 streams allowed) of a 16 KiB body each, 1.6 MiB in all, so the server reads
        // them a few at a time. The answers of the first few fill the kernel's buffers; past the high-water mark the
        // server reads no more, so the rest stay in the kernel until the client's writes block (and are given up).
        let body = [UInt8](repeating: UInt8(ascii: "b"), count: 16 * 1024)
        for stream in stride(from: UInt32(1), through: 199, by: 2) {
            let request =
                RawH2Client.frame(
                    type: 1, flags: 0x4, stream: stream,
                    payload: [0x83, 0x86, 0x04, 4] + Array("/big".utf8) + [0x01, 0x01, UInt8(ascii: "h")])
                + RawH2Client.frame(type: 0, flags: 0x1, stream: stream, payload: body)
            guard (try? client.sendBytes(request)) != nil else { break }
        }
        XCTAssertTrue(
            waitForNoConnection(server, handled: handled, within: 10), "closed once its output made no progress")
        XCTAssertLessThan(
            handled.value.load(ordering: .relaxed), 100,
            "the requests sent behind a backlog of answers were not read (nor answered)")
    }

    func testClientsOverTLSThatStopReadingAreClosedAtTheWriteTimeout() throws {
        let material = try makeTLSMaterial()
        let tls = try TLSServerContext(
            TLSServerConfiguration(
                certificateFile: material.serverCertPath, privateKeyFile: material.serverKeyPath,
                alpnProtocols: ["h2", "http/1.1"]))
        var limits = HTTPServerLimits()
        limits.writeTimeout = .milliseconds(300)
        let handled = HandledCount()
        // 16 MiB: more than the kernel's buffers and a pipe's hold, and than curl's HTTP/2 windows let it refuse.
        let server = try makeServer(limits: limits, tls: tls, handler: Self.bigAnswers(16 << 20, counting: handled))
        defer { server.shutdown() }
        for flag in ["--http2", "--http1.1"] {
            // curl writes the body to a pipe this test never reads: once the pipe is full, curl stops reading.
            let curl = Process()
            curl.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            curl.arguments = [
                "curl", "-sS", flag, "--cacert", material.caPEMPath, "--resolve",
                "localhost:\(server.port):127.0.0.1", "https://localhost:\(server.port)/big",
            ]
            let output = Pipe()
            curl.standardOutput = output
            curl.standardError = FileHandle.nullDevice
            try curl.run()
            defer {
                curl.terminate()
                curl.waitUntilExit()
            }
            // Without a write timeout: HTTP/2 kept the stream, and so the connection, open for good; HTTP/1.1 until
            // the idle timeout (75 s).
            XCTAssertTrue(
                waitForNoConnection(server, handled: handled, within: 10),
                "\(flag): closed once its output made no progress")
            handled.value.store(0, ordering: .relaxed)
        }
    }

    /// A big answer on `/big`, a two-byte one on anything else.
    private static let bigAndSmallAnswers: HTTPServer.Handler = { request, responder in
        let size = request.target == "/big" ? 256 * 1024 : 2
        responder.respond(HTTPResponse(status: 200, body: [UInt8](repeating: UInt8(ascii: "a"), count: size)))
    }

    /// WINDOW_UPDATE for `stream` (0: the connection).
    private static func windowUpdate(stream: UInt32, _ increment: UInt32) -> [UInt8] {
        RawH2Client.frame(
            type: 8, flags: 0, stream: stream,
            payload: [
                UInt8(increment >> 24), UInt8((increment >> 16) & 0xFF), UInt8((increment >> 8) & 0xFF),
                UInt8(increment & 0xFF),
            ])
    }

    /// A server with a 300 ms write timeout and a client that has asked `/big` on stream 1, with the default
    /// 65,535-byte stream windows and the connection's raised, so every other stream's answer can move.
    private func startBigAnswerOnStreamOne() throws -> (server: HTTPServer, client: RawH2Client) {
        var limits = HTTPServerLimits()
        limits.writeTimeout = .milliseconds(300)
        let server = try makeServer(limits: limits, handler: Self.bigAndSmallAnswers)
        let client = try RawH2Client(port: server.port)
        try client.sendBytes(Self.windowUpdate(stream: 0, 1 << 30))
        try client.sendHeaders(stream: 1, method: "GET", path: "/big", endStream: true)
        return (server, client)
    }

    func testAnHTTP2StreamStarvedOfCreditWhileItsConnectionMovesIsResetAtTheWriteTimeout() throws {
        let start = Date()
        let (server, client) = try startBigAnswerOnStreamOne()
        defer { server.shutdown() }
        defer { client.close() }
        // Stream 1 gets its 65,535 bytes and no more credit; the client keeps the connection busy on other streams,
        // so the connection's own write timeout never sees it stuck.
        var stream: UInt32 = 3
        let deadline = Date().addingTimeInterval(5 * testTimeScale)
        while client.responses[1]?.resetCode == nil && Date() < deadline {
            try client.sendHeaders(stream: stream, method: "GET", path: "/small", endStream: true)
            XCTAssertEqual(try client.waitForEnd(of: stream).status, "200")
            stream += 2
            usleep(50_000)
        }
        // Before: stream 1 stayed open for as long as the connection, holding its answer.
        let starved = try XCTUnwrap(client.responses[1])
        XCTAssertEqual(starved.resetCode, 8, "CANCEL")
        XCTAssertEqual(starved.body.count, 65_535, "what its window allowed, and nothing after")
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(starved.resetAt).timeIntervalSince(start), 0.3, "not before its time")
        // The connection stays: a stream after it is answered.
        try client.sendHeaders(stream: stream, method: "GET", path: "/small", endStream: true)
        XCTAssertEqual(try client.waitForEnd(of: stream).status, "200")
        XCTAssertEqual(server.openConnections, 1)
    }

    func testAnHTTP2StreamThatMovesSlowlyBesideFasterOnesIsNotReset() throws {
        let (server, client) = try startBigAnswerOnStreamOne()
        defer { server.shutdown() }
        defer { client.close() }
        // 32 KiB more credit for stream 1 every 100 ms (about 1.5 s for its 256 KiB, five write timeouts), and a
        // quick stream beside it each time.
        var stream: UInt32 = 3
        let deadline = Date().addingTimeInterval(10 * testTimeScale)
        while client.responses[1]?.endedAt == nil && client.responses[1]?.resetCode == nil && Date() < deadline {
            try client.sendBytes(Self.windowUpdate(stream: 1, 32 * 1024))
            try client.sendHeaders(stream: stream, method: "GET", path: "/small", endStream: true)
            XCTAssertEqual(try client.waitForEnd(of: stream).status, "200")
            stream += 2
            usleep(100_000)
        }
        let slow = try client.waitForEnd(of: 1)
        XCTAssertEqual(slow.status, "200")
        XCTAssertEqual(slow.bodyText.utf8.count, 256 * 1024)
    }

    func testASlowReaderIsNotCutOffByTheWriteTimeoutNorTheIdleTimeoutNorTheLinger() throws {
        var limits = HTTPServerLimits()
        limits.writeTimeout = .milliseconds(300)
        limits.idleTimeout = .milliseconds(300)
        limits.headerTimeout = .milliseconds(300)  // and so the linger after a last answer
        let handled = HandledCount()
        let size = 8 << 20
        let server = try makeServer(limits: limits, handler: Self.bigAnswers(size, counting: handled))
        defer { server.shutdown() }
        // A keep-alive answer, and on another connection a last one (`Connection: close`): each read slowly, for
        // longer than all three timeouts. (Once the rest of an answer is in the kernel's buffers, the connection is
        // idle: it may be closed then, after those bytes.)
        let kept = try RawHTTPClient(port: server.port, receiveBufferBytes: 16 * 1024)
        defer { kept.close() }
        try kept.send("GET /big HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try Self.readSlowly(kept, bodyBytes: size), .complete, "not cut off as idle")
        let last = try RawHTTPClient(port: server.port, receiveBufferBytes: 16 * 1024)
        defer { last.close() }
        try last.send("GET /big HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        XCTAssertEqual(try Self.readSlowly(last, bodyBytes: size), .complete, "not cut off by the linger")
        XCTAssertTrue(try last.readsEndOfStream())
        XCTAssertEqual(handled.value.load(ordering: .relaxed), 2)
    }

    private enum SlowRead: Equatable {
        case complete
        case cutOff(received: Int)
    }

    /// Reads one HTTP/1.1 answer with a `bodyBytes` body 256 KiB at a time, 30 ms apart: about a second for 8 MiB,
    /// more than the kernel's buffers hold, so most of it waits in the server's write queue meanwhile, with some
    /// progress well within every timeout.
    private static func readSlowly(_ client: RawHTTPClient, bodyBytes: Int) throws -> SlowRead {
        var received: [UInt8] = []
        var expected = Int.max
        let deadline = Date().addingTimeInterval(30 * testTimeScale)
        while received.count < expected && Date() < deadline {
            var taken = 0
            while taken < 256 * 1024 && received.count < expected {
                let bytes = try client.readSome(upTo: min(256 * 1024 - taken, expected - received.count))
                guard !bytes.isEmpty else { return .cutOff(received: received.count) }
                taken += bytes.count
                received += bytes
                if expected == .max, let headEnd = endOfHead(received) { expected = headEnd + bodyBytes }
            }
            usleep(30_000)
        }
        return received.count == expected ? .complete : .cutOff(received: received.count)
    }
}

/// How many requests a handler saw, across its loops.
private final class HandledCount: Sendable {
    let value = Atomic<Int>(0)
}

// MARK: - Test helpers

/// Requests the handler keeps, for the test to answer.
private final class PendingResponders: @unchecked Sendable {
    private let lock = NSLock()
    private var held: [(HTTPRequest, HTTPResponder)] = []
    private let arrived = DispatchSemaphore(value: 0)

    func add(_ request: HTTPRequest, _ responder: HTTPResponder) {
        lock.withLock { held.append((request, responder)) }
        arrived.signal()
    }

    func wait() -> (HTTPRequest, HTTPResponder)? {
        guard arrived.wait(timeout: .now() + 5) == .success else { return nil }
        return lock.withLock { held.removeFirst() }
    }
}

/// curl, run with `-w` printing each transfer's version and status after its body.
private enum Curl {
    struct Result {
        var body: String
        var versions: [String]
        var statuses: [String]
    }

    static let marker = "\n@@curl@@"

    /// Runs `tool` (found on PATH) and returns its standard output; throws when it fails.
    static func runTool(_ tool: String, _ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [tool] + arguments
        let output = Pipe()
        let errors = FileManager.default.temporaryDirectory.appendingPathComponent(
            "fanout-\(tool)-\(UUID().uuidString)")
        guard FileManager.default.createFile(atPath: errors.path, contents: nil) else {
            throw CocoaError(.fileWriteUnknown)
        }
        defer { try? FileManager.default.removeItem(at: errors) }
        process.standardOutput = output
        process.standardError = try FileHandle(forWritingTo: errors)
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            let errorText = (try? String(contentsOf: errors, encoding: .utf8)) ?? ""
            throw RawHTTPClient.Failure(
                description: "\(tool) \(arguments) exited \(process.terminationStatus): \(errorText)")
        }
        return String(decoding: data, as: UTF8.self)
    }

    static func run(_ arguments: [String]) throws -> Result {
        let output = try runTool(
            "curl", ["-sS", "--max-time", "8", "-w", "\(marker)%{http_version} %{http_code}\(marker)"] + arguments)
        var body = ""
        var versions: [String] = []
        var statuses: [String] = []
        let parts = output.components(separatedBy: marker)
        for (index, part) in parts.enumerated() {
            if index % 2 == 0 {
                body += part
            } else {
                let fields = part.split(separator: " ")
                versions.append(String(fields.first ?? ""))
                statuses.append(String(fields.last ?? ""))
            }
        }
        return Result(body: body, versions: versions, statuses: statuses)
    }
}

/// A blocking HTTP/1.1 client over one TCP connection, every wait bounded (5 s).
final class RawHTTPClient {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    struct Response {
        var status: Int
        var headers: [String: String]
        var body: [UInt8]
        var bodyText: String { String(decoding: body, as: UTF8.self) }
    }

    private let fd: Int32
    private var buffer: [UInt8] = []

    /// `receiveBufferBytes`: a small socket receive buffer (set before connecting, so TCP's window is small too), so
    /// that answers not read fill the kernel's buffers soon.
    init(port: Int, receiveBufferBytes: Int32? = nil) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket: errno \(errno)") }
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        if var size = receiveBufferBytes {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            Glibc.close(fd)
            throw Failure(description: "connect: errno \(errno)")
        }
    }

    func close() {
        Glibc.close(fd)
    }

    func send(_ text: String) throws {
        try send(bytes: Array(text.utf8))
    }

    func send(bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            guard sent > 0 else { throw Failure(description: "send: errno \(errno)") }
            offset += sent
        }
    }

    /// Reads more bytes; false at end of stream (or a reset).
    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if count > 0 {
            buffer += chunk[0..<count]
            return true
        }
        if count == 0 || errno == ECONNRESET { return false }
        throw Failure(description: "recv: errno \(errno) (timed out?)")
    }

    /// Reads up to `count` bytes, what has come (at least one); empty at end of stream.
    func readSome(upTo count: Int) throws -> [UInt8] {
        if buffer.isEmpty { guard try fill() else { return [] } }
        let bytes = Array(buffer.prefix(count))
        buffer.removeFirst(bytes.count)
        return bytes
    }

    /// Reads exactly `count` bytes.
    func read(count: Int) throws -> [UInt8] {
        while buffer.count < count {
            guard try fill() else { throw Failure(description: "closed with \(buffer.count) of \(count) bytes read") }
        }
        let bytes = Array(buffer[0..<count])
        buffer.removeFirst(count)
        return bytes
    }

    /// Reads one response: head, then `content-length` bytes of body (none when `bodyExpected` is false).
    func readResponse(bodyExpected: Bool = true) throws -> Response {
        var end: Int?
        while true {
            if buffer.count >= 4 {
                end = (0...(buffer.count - 4)).first { buffer[$0..<$0 + 4].elementsEqual([13, 10, 13, 10]) }
            }
            if end != nil { break }
            guard try fill() else { throw Failure(description: "closed before a response head") }
        }
        let headEnd = end! + 4
        var lines = String(decoding: buffer[..<end!], as: UTF8.self).components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        guard statusLine.count >= 2, statusLine[0] == "HTTP/1.1", let status = Int(statusLine[1]) else {
            throw Failure(description: "bad status line")
        }
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { throw Failure(description: "bad header \(line)") }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
                in: .whitespaces)
        }
        let length = bodyExpected ? Int(headers["content-length"] ?? "0") ?? 0 : 0
        while buffer.count < headEnd + length {
            guard try fill() else { throw Failure(description: "closed inside a body") }
        }
        let body = Array(buffer[headEnd..<(headEnd + length)])
        buffer.removeFirst(headEnd + length)
        return Response(status: status, headers: headers, body: body)
    }

    /// True when the server closes with nothing more sent.
    func readsEndOfStream() throws -> Bool {
        while try fill() {}
        return buffer.isEmpty
    }
}

/// A blocking HTTP/2 client over one plaintext connection (prior knowledge) that writes frames by hand, so a test can
/// leave a stream open mid-request; it reads responses with nghttp2's HPACK decoder. Every wait is bounded (5 s per
/// read). It acknowledges SETTINGS and PING and grants no flow-control credit beyond the default window.
private final class RawH2Client {
    struct Response {
        var headers: [(name: String, value: String)] = []
        var body: [UInt8] = []
        var endedAt: Date?
        var resetCode: UInt32?
        var resetAt: Date?
        var status: String? { headers.first { $0.name == ":status" }?.value }
        var bodyText: String { String(decoding: body, as: UTF8.self) }
    }

    struct Ended {
        var status: String?
        var bodyText: String
        var endedAt: Date
    }

    private let socket: RawHTTPClient
    private var inflater: OpaquePointer?
    private(set) var responses: [UInt32: Response] = [:]
    private(set) var goawayReceived = false
    private var settingsReceived = false

    /// `windowBytes`: the stream and connection receive windows it announces (SETTINGS_INITIAL_WINDOW_SIZE and a
    /// WINDOW_UPDATE), instead of the default 65,535 bytes.
    init(port: Int, receiveBufferBytes: Int32? = nil, windowBytes: UInt32? = nil) throws {
        socket = try RawHTTPClient(port: port, receiveBufferBytes: receiveBufferBytes)
        guard nghttp2_hd_inflate_new(&inflater) == 0 else {
            throw RawHTTPClient.Failure(description: "nghttp2_hd_inflate_new")
        }
        func bigEndian(_ value: UInt32) -> [UInt8] {
            [UInt8(value >> 24), UInt8((value >> 16) & 0xFF), UInt8((value >> 8) & 0xFF), UInt8(value & 0xFF)]
        }
        var opening = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
        if let window = windowBytes {
            opening += Self.frame(type: 4, flags: 0, stream: 0, payload: [0, 4] + bigEndian(window))
            opening += Self.frame(type: 8, flags: 0, stream: 0, payload: bigEndian(window - 65_535))
        } else {
            opening += Self.frame(type: 4, flags: 0, stream: 0)
        }
        try socket.send(bytes: opening)
    }

    deinit {
        nghttp2_hd_inflate_del(inflater)
    }

    func close() {
        socket.close()
    }

    static func frame(type: UInt8, flags: UInt8, stream: UInt32, payload: [UInt8] = []) -> [UInt8] {
        let length = payload.count
        return [
            UInt8((length >> 16) & 0xFF), UInt8((length >> 8) & 0xFF), UInt8(length & 0xFF), type, flags,
            UInt8((stream >> 24) & 0x7F), UInt8((stream >> 16) & 0xFF), UInt8((stream >> 8) & 0xFF),
            UInt8(stream & 0xFF),
        ] + payload
    }

    /// HEADERS (END_HEADERS unless told otherwise) with `:method`, `:scheme: http`, `:path` and `:authority`, HPACK without indexing.
    func sendHeaders(stream: UInt32, method: String, path: String, endStream: Bool, endHeaders: Bool = true) throws {
        func literal(nameIndex: UInt8, _ value: String) -> [UInt8] {
            precondition(value.utf8.count < 127)
            return [nameIndex, UInt8(value.utf8.count)] + Array(value.utf8)
        }
        let block = literal(nameIndex: 2, method) + [0x86] + literal(nameIndex: 4, path) + literal(nameIndex: 1, "h")
        try socket.send(
            bytes: Self.frame(
                type: 1, flags: (endHeaders ? 0x4 : 0) | (endStream ? 0x1 : 0), stream: stream, payload: block))
    }

    func sendBytes(_ bytes: [UInt8]) throws {
        try socket.send(bytes: bytes)
    }

    func sendData(stream: UInt32, _ text: String, endStream: Bool) throws {
        try socket.send(
            bytes: Self.frame(type: 0, flags: endStream ? 0x1 : 0, stream: stream, payload: Array(text.utf8)))
    }

    /// Reads until stream `stream`'s response has ended (END_STREAM); fails if it is reset first.
    func waitForEnd(of stream: UInt32) throws -> Ended {
        while true {
            if let response = responses[stream], let endedAt = response.endedAt {
                return Ended(status: response.status, bodyText: response.bodyText, endedAt: endedAt)
            }
            if let code = responses[stream]?.resetCode {
                throw RawHTTPClient.Failure(description: "stream \(stream) reset (\(code)) before its response ended")
            }
            try readFrame()
        }
    }

    /// Reads until the server's SETTINGS have come (and been acknowledged).
    func waitForSettings() throws {
        while !settingsReceived { try readFrame() }
    }

    /// Reads until stream `stream` is reset.
    func waitForReset(of stream: UInt32) throws -> (code: UInt32, at: Date) {
        while true {
            if let response = responses[stream], let code = response.resetCode, let at = response.resetAt {
                return (code, at)
            }
            try readFrame()
        }
    }

    private func readFrame() throws {
        let head = try socket.read(count: 9)
        let length = Int(head[0]) << 16 | Int(head[1]) << 8 | Int(head[2])
        let type = head[3]
        let flags = head[4]
        let stream = (UInt32(head[5]) & 0x7F) << 24 | UInt32(head[6]) << 16 | UInt32(head[7]) << 8 | UInt32(head[8])
        let payload = try socket.read(count: length)
        switch type {
        case 0:  // DATA
            responses[stream, default: Response()].body += payload
            if flags & 0x1 != 0 { responses[stream, default: Response()].endedAt = Date() }
        case 1:  // HEADERS, unpadded, without priority, in one frame (as nghttp2 sends a short answer)
            guard flags & 0x4 != 0, flags & 0x28 == 0 else {
                throw RawHTTPClient.Failure(description: "HEADERS with flags \(flags)")
            }
            responses[stream, default: Response()].headers += try decode(payload)
            if flags & 0x1 != 0 { responses[stream, default: Response()].endedAt = Date() }
        case 3:  // RST_STREAM
            let code = payload.reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
            responses[stream, default: Response()].resetCode = code
            responses[stream, default: Response()].resetAt = Date()
        case 4:  // SETTINGS
            if flags & 0x1 == 0 {
                settingsReceived = true
                try socket.send(bytes: Self.frame(type: 4, flags: 0x1, stream: 0))
            }
        case 6:  // PING
            if flags & 0x1 == 0 { try socket.send(bytes: Self.frame(type: 6, flags: 0x1, stream: 0, payload: payload)) }
        case 7:  // GOAWAY
            goawayReceived = true
        default:
            break
        }
    }

    private func decode(_ block: [UInt8]) throws -> [(name: String, value: String)] {
        var fields: [(name: String, value: String)] = []
        var offset = 0
        while true {
            var field = nghttp2_nv()
            var inflateFlags: Int32 = 0
            let used = block.withUnsafeBufferPointer { bytes in
                nghttp2_hd_inflate_hd2(
                    inflater, &field, &inflateFlags, bytes.baseAddress! + offset, bytes.count - offset, 1)
            }
            guard used >= 0 else { throw RawHTTPClient.Failure(description: "HPACK error \(used)") }
            offset += used
            if inflateFlags & Int32(NGHTTP2_HD_INFLATE_EMIT.rawValue) != 0 {
                fields.append(
                    (
                        String(decoding: UnsafeBufferPointer(start: field.name, count: field.namelen), as: UTF8.self),
                        String(decoding: UnsafeBufferPointer(start: field.value, count: field.valuelen), as: UTF8.self)
                    ))
            }
            if inflateFlags & Int32(NGHTTP2_HD_INFLATE_FINAL.rawValue) != 0 {
                nghttp2_hd_inflate_end_headers(inflater)
                return fields
            }
            if used == 0 && offset >= block.count { return fields }
        }
    }
}
