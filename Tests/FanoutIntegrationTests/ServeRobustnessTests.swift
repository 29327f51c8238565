// `fanout serve` left open on a network: oversized bodies, slow heads, too many connections, and HTTP/2 from a
// real client, each answered as the README says while the server keeps serving everyone else.
import Foundation
import XCTest

final class ServeRobustnessTests: XCTestCase {
    private var mock: MockHarness!
    private var serve: ServeHarness!

    override func setUpWithError() throws {
        mock = try MockHarness()
        serve = try ServeHarness(
            testCase: self, mock: mock, extraConfig: ["max_connections": 3, "header_timeout_seconds": 1])
        try serve.start()
    }

    override func tearDown() {
        serve?.stop()
        mock?.stop()
    }

    /// A plain TCP connection to the server, with a receive timeout so no read can hang the test.
    private func connect() throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw ProcessSupportError("socket: errno \(errno)") }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(serve.port).bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Foundation.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard rc == 0 else {
            close(fd)
            throw ProcessSupportError("connect: errno \(errno)")
        }
        return fd
    }

    private func send(_ fd: Int32, _ text: String) {
        _ = text.withCString { Foundation.send(fd, $0, strlen($0), 0) }
    }

    /// Everything the server sends until it closes the connection (or 10 s pass).
    private func readAll(_ fd: Int32) -> String {
        var data = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = recv(fd, &buffer, buffer.count, 0)
            if count <= 0 { break }
            data += buffer[0..<count]
        }
        return String(decoding: data, as: UTF8.self)
    }

    func testBodyOverOneMebibyteGets413() throws {
        let path = (serve.directory as NSString).appendingPathComponent("big.json")
        let body = #"{"content_state": {"padding": ""# + String(repeating: "x", count: 1 << 20) + #""}}"#
        try body.write(toFile: path, atomically: true, encoding: .utf8)
        let response = try serve.curl(
            "POST", "/v1/activities/m/update", key: ServeKeys.acmeServer,
            extra: ["-H", "Content-Type: application/json", "--data-binary", "@" + path])
        XCTAssertEqual(response.status, 413, response.text)
        // In the API's error shape, as every other refusal (it was plain text, from the HTTP layer).
        XCTAssertEqual(response.headers["content-type"], "application/json", "\(response.headers)")
        XCTAssertEqual(
            try response.object()["error"] as? String, "request body larger than 1048576 bytes", response.text)
        // Pushwoosh's SDK reads status_code, and resets its base URL to Pushwoosh's own when a body has none: the
        // server's own answers carry one, whichever API the path is for.
        let pushwoosh = try serve.curl(
            "POST", "/json/1.3/updateLiveActivity",
            extra: ["-H", "Content-Type: application/json", "--data-binary", "@" + path])
        XCTAssertEqual(pushwoosh.status, 413, pushwoosh.text)
        XCTAssertEqual(try pushwoosh.object()["status_code"] as? Int, 413, pushwoosh.text)
        XCTAssertEqual(
            try pushwoosh.object()["status_message"] as? String, "request body larger than 1048576 bytes",
            pushwoosh.text)
        XCTAssertEqual(try serve.curl("GET", "/healthz").status, 200, "the server goes on")
        XCTAssertEqual(mock.stats.requests, 0)
    }

    func testHeadNotCompleteInTimeGets408AndIsClosed() throws {
        let fd = try connect()
        defer { close(fd) }
        let started = Date()
        send(fd, "POST /v1/devices HTTP/1.1\r\nHost: fanout\r\n")  // and never the blank line
        let answer = readAll(fd)
        XCTAssertTrue(answer.hasPrefix("HTTP/1.1 408"), answer)
        XCTAssertTrue(answer.contains(#"{"error":"request timeout","status_code":408"#), answer)
        XCTAssertLessThan(Date().timeIntervalSince(started), 8, "408 after header_timeout_seconds (1), not never")
    }

    func testPastMaxConnectionsNewOnesGet503AndTheOthersAreServed() throws {
        // Three keep-alive connections, each with a request answered: the server's limit.
        var open: [Int32] = []
        defer { open.forEach { close($0) } }
        for _ in 0..<3 {
            let fd = try connect()
            open.append(fd)
            send(fd, "GET /healthz HTTP/1.1\r\nHost: fanout\r\n\r\n")
            var buffer = [UInt8](repeating: 0, count: 4096)
            let count = recv(fd, &buffer, buffer.count, 0)
            XCTAssertTrue(count > 0 && String(decoding: buffer[0..<count], as: UTF8.self).hasPrefix("HTTP/1.1 200"))
        }
        let refused = try connect()
        defer { close(refused) }
        let answer = readAll(refused)
        XCTAssertTrue(answer.hasPrefix("HTTP/1.1 503"), answer)
        // In the service's JSON shape (status_code for Pushwoosh's SDK), with when to come back.
        XCTAssertTrue(answer.lowercased().contains("retry-after: 1\r\n"), answer)
        XCTAssertTrue(answer.contains(#""status_code":503"#), answer)
        XCTAssertTrue(answer.contains(#""error":"too many connections""#), answer)
        // An open connection is still served.
        send(open[0], "GET /healthz HTTP/1.1\r\nHost: fanout\r\nConnection: close\r\n\r\n")
        XCTAssertTrue(readAll(open[0]).hasPrefix("HTTP/1.1 200"))
    }

    func testHTTP2PriorKnowledgeFromCurl() throws {
        let response = try serve.curl(
            "POST", "/v1/devices", key: ServeKeys.acmeDevice, json: #"{"device_id": "d-h2"}"#,
            extra: ["--http2-prior-knowledge"])
        XCTAssertEqual(response.status, 200, response.text)
        XCTAssertNotNil(response.headers["x-ratelimit-limit"], "the headers come over HTTP/2 too")
    }
}

final class ServeLifecycleTests: XCTestCase {
    func testHTTPSWithALPNChoosesHTTP2AndHTTP11() throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let serve = try ServeHarness(testCase: self, mock: mock)
        try serve.start(arguments: [
            "--tls-cert", mock.material.serverCertPath, "--tls-key", mock.material.serverKeyPath,
        ])
        defer { serve.stop() }
        serve.scheme = "https"
        for (flag, version) in [("--http2", "2"), ("--http1.1", "1.1")] {
            let response = try serve.curl(
                "GET", "/healthz", extra: [flag, "--cacert", mock.material.caPEMPath, "-w", "\n%{http_version}"])
            XCTAssertEqual(response.status, 200, response.text)
            XCTAssertEqual(response.text.split(separator: "\n").last.map(String.init), version, response.text)
        }
    }

    func testSIGTERMLeavesWhatIsNotSentQueuedAndTheNextStartFinishesIt() throws {
        // A slow APNs (20 ms per answer, 10 streams per connection: about 1,000 answers a second over the engine's
        // two connections) so the dispatch is still sending when SIGTERM comes; a 1 s grace period.
        let mock = try RestartableMock {
            $0.latencyMilliseconds = 20
            $0.maxStreams = 10
        }
        defer { _ = mock.stop() }
        let serve = try ServeHarness(
            testCase: self, mockPort: mock.port, material: mock.material, extraConfig: ["grace_seconds": 1])
        try serve.start()
        let tokens = (0..<6_000).map { testDeviceToken($0) }
        let tokensJSON = "[" + tokens.map { "\"\($0)\"" }.joined(separator: ",") + "]"
        let accepted = try serve.curl(
            "POST", "/v1/push", key: ServeKeys.acmeServer,
            json: #"{"alert": {"title": "t", "body": "b"}, "audience": {"tokens": \#(tokensJSON)}}"#)
        XCTAssertEqual(accepted.status, 202, accepted.text)
        let id = try XCTUnwrap(try accepted.object()["dispatch_id"] as? String)
        let deadline = Date().addingTimeInterval(60)
        while mock.totals().accepted < 1_000 && Date() < deadline { usleep(5_000) }
        let started = Date()
        XCTAssertEqual(serve.stop(), 0, "SIGTERM exits 0: \(serve.log)")
        XCTAssertLessThan(Date().timeIntervalSince(started), 15, "within the grace period and the engines' drain")
        let sentBeforeStop = mock.totals().accepted
        XCTAssertLessThan(sentBeforeStop, tokens.count, "the stop came before the end")

        try serve.start()
        let done = try serve.waitForDispatch(id, timeout: 120)
        XCTAssertEqual(done["notifications"] as? Int, tokens.count, "\(done)")
        XCTAssertEqual(done["delivered"] as? Int, tokens.count, "\(done)")
        XCTAssertEqual(done["cancelled"] as? Int, 0, "a graceful stop records no cancelled outcome")
        serve.stop()
        XCTAssertTrue(mock.stop())
        let counts = try mock.acceptedPerToken(count: tokens.count)
        XCTAssertEqual(counts.distinct, tokens.count)
        XCTAssertLessThanOrEqual(counts.duplicates, 20, "only what was in flight at the stop (2 × 10 streams)")
    }
}

final class ServeProgressTests: XCTestCase {
    func testTheStatusOfARunningDispatchSaysHowManyResultsItWillHave() throws {
        // A slow APNs (20 ms an answer, 10 streams per connection): 1,000 tokens take about half a second.
        let mock = try MockHarness {
            $0.latencyMilliseconds = 20
            $0.maxStreams = 10
        }
        defer { mock.stop() }
        let serve = try ServeHarness(testCase: self, mock: mock)
        try serve.start()
        defer { serve.stop() }
        let tokens = (0..<1_000).map { "\"\(testDeviceToken($0))\"" }.joined(separator: ",")
        let accepted = try serve.curl(
            "POST", "/v1/push", key: ServeKeys.acmeServer,
            json: #"{"alert": {"title": "t", "body": "b"}, "audience": {"tokens": [\#(tokens)]}}"#)
        let id = try XCTUnwrap(try accepted.object()["dispatch_id"] as? String, accepted.text)
        var seen: [String: Any]?
        let deadline = Date().addingTimeInterval(30)
        while seen == nil && Date() < deadline {
            let status = try serve.curl("GET", "/v1/status", key: ServeKeys.acmeServer).object()
            let dispatch = (status["dispatches"] as? [[String: Any]])?.first { $0["id"] as? String == id }
            if dispatch?["state"] as? String == "running", (dispatch?["notifications"] as? Int ?? 0) > 0 {
                seen = dispatch
            }
            if dispatch?["state"] as? String == "done" { break }
        }
        let running = try XCTUnwrap(seen, "the dispatch was seen running with results")
        XCTAssertEqual(running["expected"] as? Int, 1_000)
        XCTAssertLessThanOrEqual(running["notifications"] as? Int ?? .max, 1_000)
        let done = try serve.waitForDispatch(id)
        XCTAssertEqual(done["delivered"] as? Int, 1_000)
    }
}
