// `--metrics-listen`: a MetricsEndpoint on 127.0.0.1:0 scraped over real sockets (curl when installed, and a raw
// socket client written here), its exposition checked by a small parser of the Prometheus text format; and the
// HTTP/1.1 server under it refusing malformed, oversized and slow requests.
import Fanout
import FanoutObservability
import FanoutTestSupport
import FanoutTransport
import Foundation
import Synchronization
import XCTest

#if canImport(Glibc)
    import Glibc
#endif

final class MetricsTests: XCTestCase {
    // MARK: Scraping

    /// Fills a FanoutMetrics with known values, including label values that need escaping.
    private func populatedMetrics() -> FanoutMetrics {
        let metrics = FanoutMetrics()
        for _ in 0..<5 { metrics.record(.delivered) }
        metrics.record(.unregistered, reason: "BadDeviceToken")
        metrics.record(.unregistered, reason: "Unregistered")
        metrics.record(.unregistered, reason: "Unregistered")
        metrics.record(.failed, reason: "TooManyRequests")
        metrics.retries.increment(by: 3)
        metrics.inFlight.increment(by: 7)
        metrics.inFlight.decrement(by: 2)
        metrics.openConnections.set(4)
        metrics.recordRateLimited(workspace: "acme", priority: 10)
        metrics.recordRateLimited(workspace: "acme", priority: 10)
        metrics.recordRateLimited(workspace: "acme", priority: 5)
        metrics.recordRateLimited(workspace: "we\"ird\\name\nline2", priority: 1)
        for seconds in [0.0005, 0.002, 0.002, 0.03, 0.7, 4, 12] { metrics.observeRoundTrip(seconds: seconds) }
        return metrics
    }

    private func checkFanoutExposition(
        _ exposition: ParsedExposition, file: StaticString = #filePath, line: UInt = #line
    ) {
        func value(_ name: String, _ labels: [String: String] = [:]) -> Double? {
            exposition.value(name, labels)
        }
        XCTAssertEqual(exposition.types["fanout_notifications_total"], "counter", file: file, line: line)
        XCTAssertEqual(exposition.types["fanout_retries_total"], "counter", file: file, line: line)
        XCTAssertEqual(exposition.types["fanout_notifications_in_flight"], "gauge", file: file, line: line)
        XCTAssertEqual(exposition.types["fanout_open_connections"], "gauge", file: file, line: line)
        XCTAssertEqual(exposition.types["fanout_rate_limited_total"], "counter", file: file, line: line)
        XCTAssertEqual(exposition.types["fanout_apns_round_trip_seconds"], "histogram", file: file, line: line)

        XCTAssertEqual(value("fanout_notifications_total", ["outcome": "delivered", "reason": ""]), 5)
        XCTAssertEqual(value("fanout_notifications_total", ["outcome": "unregistered", "reason": "Unregistered"]), 2)
        XCTAssertEqual(value("fanout_notifications_total", ["outcome": "unregistered", "reason": "BadDeviceToken"]), 1)
        XCTAssertEqual(value("fanout_notifications_total", ["outcome": "failed", "reason": "TooManyRequests"]), 1)
        // Outcomes that never happened are there at zero.
        XCTAssertEqual(value("fanout_notifications_total", ["outcome": "expired", "reason": ""]), 0)
        XCTAssertEqual(value("fanout_notifications_total", ["outcome": "rate_limited", "reason": ""]), 0)
        XCTAssertEqual(value("fanout_retries_total"), 3)
        XCTAssertEqual(value("fanout_notifications_in_flight"), 5)
        XCTAssertEqual(value("fanout_open_connections"), 4)
        XCTAssertEqual(value("fanout_rate_limited_total", ["workspace": "acme", "priority": "10"]), 2)
        XCTAssertEqual(value("fanout_rate_limited_total", ["workspace": "acme", "priority": "5"]), 1)
        XCTAssertEqual(
            value("fanout_rate_limited_total", ["workspace": "we\"ird\\name\nline2", "priority": "1"]), 1,
            "label escaping round-trips")

        let buckets = exposition.histogramBuckets("fanout_apns_round_trip_seconds")
        XCTAssertEqual(
            buckets.map(\.bound), FanoutMetrics.roundTripBuckets + [.infinity], file: file, line: line)
        let expected: [Double] = [1, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 6, 6, 7]
        XCTAssertEqual(buckets.map(\.count), expected, file: file, line: line)
        XCTAssertEqual(value("fanout_apns_round_trip_seconds_count"), 7)
        XCTAssertEqual(value("fanout_apns_round_trip_seconds_sum") ?? 0, 16.7345, accuracy: 1e-9)
    }

    /// A connection that never becomes ready (here, refused) counts in `fanout_connection_failures_total`, which a
    /// proxy's or TLS's refusal raises as well.
    func testConnectionFailuresAreCounted() async throws {
        let mock = try MockHarness()
        let port = mock.port
        let material = mock.material
        mock.stop()
        let metrics = FanoutMetrics()
        let engine = try makeEngine(host: "127.0.0.1", port: port, material: material, loops: 1, connections: 1) {
            $0.maxConnectAttempts = 2
            $0.retryBase = .milliseconds(5)
            $0.metricsListener = metrics
        }
        _ = try await engine.run(scoreUpdateJob(id: "nowhere", tokens: [testDeviceToken(1)])) { _ in }
        await engine.shutdown()
        XCTAssertGreaterThanOrEqual(metrics.connectionFailures.value, 2, "every failed attempt")
        XCTAssertTrue(
            metrics.registry.exposition().contains(
                "fanout_connection_failures_total \(metrics.connectionFailures.value)"))
    }

    func testScrapeOverRawSocketParsesAsPrometheusExposition() throws {
        let metrics = populatedMetrics()
        let endpoint = try MetricsEndpoint(registry: metrics.registry, host: "127.0.0.1", port: 0)
        defer { endpoint.shutdown() }
        XCTAssertGreaterThan(endpoint.port, 0)

        let response = try HTTPTestClient.exchange(
            port: endpoint.port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n")
        XCTAssertTrue(response.closedByServer, "Connection: close is honoured")
        let parsed = try XCTUnwrap(response.parsed)
        XCTAssertEqual(parsed.status, 200)
        XCTAssertEqual(parsed.headers["content-type"], MetricsEndpoint.contentType)
        XCTAssertEqual(parsed.headers["connection"], "close")
        XCTAssertEqual(parsed.headers["content-length"], String(parsed.body.count))
        let exposition = try ParsedExposition(String(decoding: parsed.body, as: UTF8.self))
        checkFanoutExposition(exposition)

        // Later updates show in the next scrape.
        metrics.retries.increment()
        let again = try XCTUnwrap(
            HTTPTestClient.exchange(port: endpoint.port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n").parsed)
        let next = try ParsedExposition(String(decoding: again.body, as: UTF8.self))
        XCTAssertEqual(next.value("fanout_retries_total"), 4)
    }

    func testScrapeWithCurlParsesAsPrometheusExposition() throws {
        guard let curl = ProcessSupport.findTool("curl") else { throw XCTSkip("curl is not installed") }
        let metrics = populatedMetrics()
        let endpoint = try MetricsEndpoint(registry: metrics.registry, listen: "127.0.0.1:0")
        defer { endpoint.shutdown() }
        let result = try ProcessSupport.run(
            curl, ["-sS", "--max-time", "10", "-D", "/dev/stderr", "http://127.0.0.1:\(endpoint.port)/metrics"],
            timeout: 20)
        XCTAssertEqual(result.exitCode, 0, result.summary)
        XCTAssertTrue(result.stderr.hasPrefix("HTTP/1.1 200 OK\r\n"), result.summary)
        XCTAssertTrue(result.stderr.lowercased().contains("content-type: text/plain; version=0.0.4"), result.summary)
        checkFanoutExposition(try ParsedExposition(result.stdout))

        let missing = try ProcessSupport.run(
            curl, ["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:\(endpoint.port)/nope"],
            timeout: 20)
        XCTAssertEqual(missing.stdout, "404")
    }

    func testOtherPathsAndMethods() throws {
        let endpoint = try MetricsEndpoint(registry: FanoutMetrics().registry, host: "127.0.0.1", port: 0)
        defer { endpoint.shutdown() }
        let notFound = try XCTUnwrap(
            HTTPTestClient.exchange(port: endpoint.port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").parsed)
        XCTAssertEqual(notFound.status, 404)
        let post = try XCTUnwrap(
            HTTPTestClient.exchange(
                port: endpoint.port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
            ).parsed)
        XCTAssertEqual(post.status, 405)
        let head = try HTTPTestClient.exchange(port: endpoint.port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        let headParsed = try XCTUnwrap(head.parsed)
        XCTAssertEqual(headParsed.status, 200)
        XCTAssertGreaterThan(Int(headParsed.headers["content-length"] ?? "") ?? 0, 0)
        XCTAssertTrue(head.bytes.count == head.headLength, "HEAD gets no body")
    }

    // MARK: Hostile clients

    func testMalformedRequestsGet400AndAreClosed() throws {
        let endpoint = try MetricsEndpoint(registry: FanoutMetrics().registry, host: "127.0.0.1", port: 0)
        defer { endpoint.shutdown() }
        let malformed = [
            "GARBAGE\r\n\r\n",
            "GET /metrics\r\n\r\n",
            "GET metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /metrics HTTP/2.0\r\nHost: x\r\n\r\n",
            "GET /metrics HTTP/1.1\r\n\r\n",  // HTTP/1.1 without Host
            "GET /metrics HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: x\r\n folded: y\r\n\r\n",
            "GET /met rics HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: x\r\nX: a\u{01}b\r\n\r\n",
        ]
        for request in malformed {
            let response = try HTTPTestClient.exchange(port: endpoint.port, request)
            XCTAssertEqual(response.parsed?.status, 400, "\(request.debugDescription)")
            XCTAssertTrue(response.closedByServer, "\(request.debugDescription)")
        }
        // A head past 8 KiB, whether it ends or not: 431 (Request Header Fields Too Large).
        let big = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Filler: \(String(repeating: "a", count: 9000))\r\n\r\n"
        let bigResponse = try HTTPTestClient.exchange(port: endpoint.port, big)
        XCTAssertEqual(bigResponse.parsed?.status, 431)
        XCTAssertTrue(bigResponse.closedByServer)
        let endless = "GET /metrics HTTP/1.1\r\nHost: x\r\n" + String(repeating: "X-A: b\r\n", count: 4000)
        let endlessResponse = try HTTPTestClient.exchange(port: endpoint.port, endless)
        XCTAssertEqual(endlessResponse.parsed?.status, 431)
        XCTAssertTrue(endlessResponse.closedByServer)

        // The server is still fine.
        let good = try HTTPTestClient.exchange(port: endpoint.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertEqual(good.parsed?.status, 200)
    }

    func testSlowClientIsClosedAfterTheRequestTimeout() throws {
        var limits = HTTPServerLimits()
        limits.headerTimeout = .milliseconds(300)
        let server = try HTTPServer(host: "127.0.0.1", port: 0, threads: 1, tls: nil, limits: limits) { _, responder in
            responder.respond(
                HTTPResponse(
                    status: 200, headers: [("content-type", "text/plain"), ("connection", "close")],
                    body: Array("ok\n".utf8)))
        }
        defer { server.shutdown() }
        // Sends half a head, then nothing: gets 408 and a close, well before the test's own 5 s limit.
        let started = Date()
        let partial = try HTTPTestClient.exchange(port: server.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n")
        XCTAssertTrue(partial.closedByServer, "a client that never finishes its request is closed")
        XCTAssertEqual(partial.parsed?.status, 408)
        XCTAssertLessThan(Date().timeIntervalSince(started), 3 * testTimeScale)
        // Sends nothing at all.
        let silent = try HTTPTestClient.exchange(port: server.port, "")
        XCTAssertTrue(silent.closedByServer)
        // A prompt client is unaffected.
        let prompt = try HTTPTestClient.exchange(port: server.port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertEqual(prompt.parsed?.status, 200)
        XCTAssertEqual(prompt.parsed.map { String(decoding: $0.body, as: UTF8.self) }, "ok\n")
    }

    func testRequestSentByteByByteIsAnswered() throws {
        let endpoint = try MetricsEndpoint(registry: FanoutMetrics().registry, host: "127.0.0.1", port: 0)
        defer { endpoint.shutdown() }
        let response = try HTTPTestClient.exchange(
            port: endpoint.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", chunkSize: 1)
        XCTAssertEqual(response.parsed?.status, 200)
    }

    func testShutdownReleasesThePortAndIsIdempotent() throws {
        let endpoint = try MetricsEndpoint(registry: MetricsRegistry(), host: "127.0.0.1", port: 0)
        let port = endpoint.port
        XCTAssertTrue(ProcessSupport.canConnect(port: port))
        endpoint.shutdown()
        endpoint.shutdown()
        XCTAssertFalse(ProcessSupport.canConnect(port: port))
        XCTAssertThrowsError(try MetricsEndpoint(registry: MetricsRegistry(), listen: "127.0.0.1"))
        XCTAssertThrowsError(try MetricsEndpoint(registry: MetricsRegistry(), host: "not-an-ip", port: 0))
    }

    func testNoFileDescriptorOutlivesTheEndpoint() throws {
        func openDescriptors() -> Int {
            (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? 0
        }
        let before = openDescriptors()
        let endpoint = try MetricsEndpoint(registry: FanoutMetrics().registry, host: "127.0.0.1", port: 0)
        for index in 0..<40 {
            let request = index % 4 == 0 ? "BROKEN\r\n\r\n" : "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
            XCTAssertNotNil(try HTTPTestClient.exchange(port: endpoint.port, request).parsed)
        }
        endpoint.shutdown()
        XCTAssertEqual(openDescriptors(), before)
    }

    func testListenAddressParsing() {
        XCTAssertTrue(MetricsEndpoint.parseListenAddress("127.0.0.1:9100")! == ("127.0.0.1", 9100))
        XCTAssertTrue(MetricsEndpoint.parseListenAddress("[::1]:0")! == ("::1", 0))
        XCTAssertNil(MetricsEndpoint.parseListenAddress("::1:9100"))
        XCTAssertNil(MetricsEndpoint.parseListenAddress("127.0.0.1"))
        XCTAssertNil(MetricsEndpoint.parseListenAddress(":9100"))
        XCTAssertNil(MetricsEndpoint.parseListenAddress("127.0.0.1:70000"))
    }

    // MARK: Registry

    func testConcurrentUpdatesAreAllCounted() {
        let metrics = FanoutMetrics()
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            for index in 0..<10_000 {
                metrics.record(.delivered)
                metrics.record(.rejected, reason: index % 2 == 0 ? "BadTopic" : "PayloadTooLarge")
                metrics.inFlight.increment()
                metrics.inFlight.decrement()
                metrics.recordRateLimited(workspace: "w\(worker % 2)", priority: 10)
                metrics.observeRoundTrip(seconds: 0.001)
            }
        }
        XCTAssertEqual(metrics.notifications.labels("delivered", "").value, 80_000)
        XCTAssertEqual(metrics.notifications.labels("rejected", "BadTopic").value, 40_000)
        XCTAssertEqual(metrics.inFlight.value, 0)
        XCTAssertEqual(metrics.rateLimited.labels("w0", "10").value, 40_000)
        let snapshot = metrics.apnsRoundTrip.snapshot()
        XCTAssertEqual(snapshot.count, 80_000)
        XCTAssertEqual(snapshot.cumulativeCounts.first, 80_000, "0.001 falls in the le=0.001 bucket")
        XCTAssertEqual(snapshot.sum, 80, accuracy: 1e-6)
    }

    /// Two `FanoutMetrics` on one registry (one engine per APNs team behind one metrics endpoint) share the families,
    /// and the two engines' counts add up; the second one trapped ("metric fanout_notifications_total registered
    /// twice").
    func testTwoFanoutMetricsOnOneRegistryShareTheFamiliesAndAddUp() async throws {
        let registry = MetricsRegistry()
        let first = FanoutMetrics(registry: registry)
        let second = FanoutMetrics(registry: registry)
        XCTAssertTrue(first.notifications === second.notifications)
        XCTAssertTrue(first.apnsRoundTrip === second.apnsRoundTrip)
        let mock = try MockHarness()
        defer { mock.stop() }
        let engines = try [first, second].map { metrics in
            try makeEngine(for: mock, loops: 1, connections: 1) { $0.metricsListener = metrics }
        }
        let headers = NotificationHeaders(pushType: .alert, topic: "com.example.app")
        for (index, engine) in engines.enumerated() {
            for token in 0..<(index + 2) {
                let result = try await engine.send(
                    PushNotification(
                        deviceToken: testDeviceToken(index * 10 + token), headers: headers,
                        payload: Array(#"{"aps":{"alert":"hi"}}"#.utf8)))
                XCTAssertEqual(result.outcome, .delivered)
            }
        }
        for engine in engines { await engine.shutdown() }
        first.recordRateLimited(workspace: "acme", priority: 10)
        second.recordRateLimited(workspace: "acme", priority: 10)
        let text = registry.exposition()
        XCTAssertEqual(text.components(separatedBy: "# TYPE fanout_notifications_total ").count, 2, "one family")
        let exposition = try ParsedExposition(text)
        XCTAssertEqual(exposition.value("fanout_notifications_total", ["outcome": "delivered", "reason": ""]), 5)
        XCTAssertEqual(exposition.value("fanout_apns_round_trip_seconds_count"), 5)
        XCTAssertEqual(exposition.value("fanout_rate_limited_total", ["workspace": "acme", "priority": "10"]), 2)
    }

    func testLabelSetsPastTheLimitShareAnOverflowChild() throws {
        let registry = MetricsRegistry()
        let family = registry.counter("test_total", help: "Test.", labelNames: ["workspace"], maxLabelSets: 3)
        for index in 0..<10 { family.labels("w\(index)").increment() }
        let exposition = try ParsedExposition(registry.exposition())
        XCTAssertEqual(exposition.samples.count, 4, "three label sets and the overflow")
        XCTAssertEqual(exposition.value("test_total", ["workspace": "_overflow"]), 7)
    }

    func testHelpEscapingAndEmptyFamilies() throws {
        let registry = MetricsRegistry()
        _ = registry.counter("a_total", help: "Back\\slash and\nnewline.", labelNames: ["x"])
        _ = registry.histogram("b_seconds", help: "Empty histogram.", buckets: [0.5, 1])
        let text = registry.exposition()
        XCTAssertTrue(text.contains("# HELP a_total Back\\\\slash and\\nnewline.\n"), text)
        let exposition = try ParsedExposition(text)
        XCTAssertEqual(exposition.help["a_total"], "Back\\slash and\nnewline.")
        XCTAssertEqual(exposition.histogramBuckets("b_seconds").map(\.count), [0, 0, 0])
        XCTAssertEqual(exposition.value("b_seconds_count"), 0)
    }
}

// MARK: - A raw HTTP/1.1 client

/// A blocking socket client with bounded waits: writes a request, then reads until the server closes.
enum HTTPTestClient {
    struct Response {
        var bytes: [UInt8]
        /// The server closed (FIN or reset) before the client gave up waiting.
        var closedByServer: Bool

        struct Parsed {
            var status: Int
            var headers: [String: String]
            var body: [UInt8]
        }

        var headLength: Int {
            guard let range = find([13, 10, 13, 10], in: bytes) else { return bytes.count }
            return range + 4
        }

        var parsed: Parsed? {
            guard let end = find([13, 10, 13, 10], in: bytes) else { return nil }
            let head = String(decoding: bytes[..<end], as: UTF8.self)
            var lines = head.components(separatedBy: "\r\n")
            let statusLine = lines.removeFirst().split(separator: " ")
            guard statusLine.count >= 2, statusLine[0] == "HTTP/1.1", let status = Int(statusLine[1]) else {
                return nil
            }
            var headers: [String: String] = [:]
            for line in lines {
                guard let colon = line.firstIndex(of: ":") else { return nil }
                headers[line[..<colon].lowercased()] = line[line.index(after: colon)...]
                    .trimmingCharacters(in: .whitespaces)
            }
            return Parsed(status: status, headers: headers, body: Array(bytes[(end + 4)...]))
        }

        private func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
            guard haystack.count >= needle.count else { return nil }
            return (0...(haystack.count - needle.count)).first {
                haystack[$0..<$0 + needle.count].elementsEqual(needle)
            }
        }
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// Connects to 127.0.0.1:`port`, sends `request` (in chunks of `chunkSize` bytes when given), and reads until
    /// the server closes or `timeout` seconds pass.
    static func exchange(port: Int, _ request: String, chunkSize: Int? = nil, timeout: Double = 5) throws -> Response {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket: errno \(errno)") }
        defer { close(fd) }
        var receiveTimeout = timeval(tv_sec: 0, tv_usec: 100_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &receiveTimeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &receiveTimeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { throw Failure(description: "connect to port \(port): errno \(errno)") }

        let deadline = Date().addingTimeInterval(timeout)
        let bytes = Array(request.utf8)
        var offset = 0
        while offset < bytes.count && Date() < deadline {
            let count = min(chunkSize ?? bytes.count, bytes.count - offset)
            let sent = bytes[offset..<offset + count].withUnsafeBytes {
                send(fd, $0.baseAddress, count, Int32(MSG_NOSIGNAL))
            }
            if sent < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { continue }
                break  // the server closed on us (an oversized request): read what it answered
            }
            offset += sent
            // The scenario: a client that sends its request in pieces, each a moment after the last.
            if chunkSize != nil { usleep(2000) }
        }

        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while Date() < deadline {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                received += buffer[0..<count]
            } else if count == 0 {
                return Response(bytes: received, closedByServer: true)
            } else if errno == ECONNRESET {
                return Response(bytes: received, closedByServer: true)
            } else if errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR {
                throw Failure(description: "recv: errno \(errno)")
            }
        }
        return Response(bytes: received, closedByServer: false)
    }
}

// MARK: - A Prometheus text-format parser

/// Parses the Prometheus text exposition format (0.0.4) strictly enough to catch what a scraper would reject:
/// every sample line is `name{labels} value [timestamp]`; HELP and TYPE come at most once per family, before its
/// samples; a family's samples are contiguous; histogram buckets ascend, are cumulative, end with `+Inf`, and that
/// bucket equals `_count`.
struct ParsedExposition {
    struct Sample {
        var name: String
        var labels: [String: String]
        var value: Double
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    var samples: [Sample] = []
    var types: [String: String] = [:]
    var help: [String: String] = [:]

    init(_ text: String) throws {
        guard text.isEmpty || text.hasSuffix("\n") else { throw Failure(description: "no final line feed") }
        var finishedFamilies: Set<String> = []
        var currentFamily: String?
        var familiesWithSamples: Set<String> = []
        for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = String(line)
            func fail(_ why: String) -> Failure { Failure(description: "line \(number + 1): \(why): \(line)") }
            if line.isEmpty { continue }
            if line.hasPrefix("#") {
                let parts = line.split(separator: " ", maxSplits: 3, omittingEmptySubsequences: false).map(String.init)
                guard parts.count >= 3, parts[1] == "HELP" || parts[1] == "TYPE" else { continue }  // a comment
                let name = parts[2]
                guard Self.isMetricName(name) else { throw fail("bad metric name") }
                guard !familiesWithSamples.contains(name) else { throw fail("HELP/TYPE after samples") }
                if parts[1] == "HELP" {
                    guard help[name] == nil else { throw fail("second HELP") }
                    help[name] = Self.unescapeHelp(parts.count > 3 ? parts[3] : "")
                } else {
                    guard types[name] == nil else { throw fail("second TYPE") }
                    guard parts.count == 4, ["counter", "gauge", "histogram", "summary", "untyped"].contains(parts[3])
                    else {
                        throw fail("bad TYPE")
                    }
                    types[name] = parts[3]
                }
                continue
            }
            let sample = try Self.parseSample(line, fail: fail)
            let family = familyName(of: sample.name)
            if family != currentFamily {
                guard !finishedFamilies.contains(family) else { throw fail("samples of \(family) not contiguous") }
                if let currentFamily { finishedFamilies.insert(currentFamily) }
                currentFamily = family
            }
            familiesWithSamples.insert(family)
            if types[family] == "counter" || types[family] == "histogram" {
                guard sample.value >= 0 else { throw fail("negative counter") }
            }
            samples.append(sample)
        }
        for (family, type) in types where type == "histogram" { try checkHistogram(family) }
    }

    /// The family a sample belongs to: its name, or a histogram's name without `_bucket`, `_sum`, `_count`.
    private func familyName(of name: String) -> String {
        for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) {
            let base = String(name.dropLast(suffix.count))
            if types[base] == "histogram" || types[base] == "summary" { return base }
        }
        return name
    }

    func value(_ name: String, _ labels: [String: String] = [:]) -> Double? {
        samples.first { $0.name == name && $0.labels == labels }?.value
    }

    /// The `_bucket` samples of an unlabeled histogram, in order.
    func histogramBuckets(_ name: String) -> [(bound: Double, count: Double)] {
        samples.filter { $0.name == name + "_bucket" && $0.labels.count == 1 }.map {
            (Self.parseValue($0.labels["le"] ?? "") ?? .nan, $0.value)
        }
    }

    private func checkHistogram(_ name: String) throws {
        // Group by labels other than `le`.
        var groups: [[String: String]: [(Double, Double)]] = [:]
        var order: [[String: String]] = []
        for sample in samples where sample.name == name + "_bucket" {
            guard let leText = sample.labels["le"], let le = Self.parseValue(leText) else {
                throw Failure(description: "\(name)_bucket without a numeric le")
            }
            var key = sample.labels
            key["le"] = nil
            if groups[key] == nil { order.append(key) }
            groups[key, default: []].append((le, sample.value))
        }
        for key in order {
            let buckets = groups[key]!
            guard zip(buckets, buckets.dropFirst()).allSatisfy({ $0.0 < $1.0 }) else {
                throw Failure(description: "\(name) buckets not ascending")
            }
            guard zip(buckets, buckets.dropFirst()).allSatisfy({ $0.1 <= $1.1 }) else {
                throw Failure(description: "\(name) buckets not cumulative")
            }
            guard let last = buckets.last, last.0 == .infinity else {
                throw Failure(description: "\(name) has no +Inf bucket")
            }
            let count = samples.first { $0.name == name + "_count" && $0.labels == key }
            guard let count, count.value == last.1 else { throw Failure(description: "\(name) +Inf != _count") }
            guard samples.contains(where: { $0.name == name + "_sum" && $0.labels == key }) else {
                throw Failure(description: "\(name) has no _sum")
            }
        }
    }

    private static func parseSample(_ line: String, fail: (String) -> Failure) throws -> Sample {
        var scalars = Substring(line).unicodeScalars[...]
        var name = ""
        while let scalar = scalars.first, scalar != "{" && scalar != " " {
            name.unicodeScalars.append(scalar)
            scalars.removeFirst()
        }
        guard isMetricName(name) else { throw fail("bad metric name") }
        var labels: [String: String] = [:]
        if scalars.first == "{" {
            scalars.removeFirst()
            while scalars.first != "}" {
                var labelName = ""
                while let scalar = scalars.first, scalar != "=" {
                    labelName.unicodeScalars.append(scalar)
                    scalars.removeFirst()
                }
                guard isLabelName(labelName), scalars.popFirst() == "=", scalars.popFirst() == "\"" else {
                    throw fail("bad label")
                }
                var value = ""
                while true {
                    guard let scalar = scalars.popFirst() else { throw fail("unterminated label value") }
                    if scalar == "\"" { break }
                    if scalar == "\n" { throw fail("raw line feed in label value") }
                    if scalar == "\\" {
                        switch scalars.popFirst() {
                        case "\\": value += "\\"
                        case "\"": value += "\""
                        case "n": value += "\n"
                        default: throw fail("bad escape in label value")
                        }
                    } else {
                        value.unicodeScalars.append(scalar)
                    }
                }
                guard labels[labelName] == nil else { throw fail("duplicate label") }
                labels[labelName] = value
                if scalars.first == "," {
                    scalars.removeFirst()
                } else if scalars.first != "}" {
                    throw fail("bad label")
                }
            }
            scalars.removeFirst()
        }
        guard scalars.popFirst() == " " else { throw fail("no space before value") }
        let fields = String(String.UnicodeScalarView(scalars)).split(separator: " ", omittingEmptySubsequences: false)
        guard fields.count == 1 || (fields.count == 2 && Int64(fields[1]) != nil), let value = parseValue(fields[0])
        else {
            throw fail("bad value")
        }
        return Sample(name: name, labels: labels, value: value)
    }

    /// Go's ParseFloat subset Prometheus writes: decimals, exponents, `+Inf`, `-Inf`, `NaN`.
    static func parseValue<S: StringProtocol>(_ text: S) -> Double? {
        switch text {
        case "+Inf": return .infinity
        case "-Inf": return -.infinity
        case "NaN": return .nan
        default:
            guard !text.isEmpty, text.allSatisfy({ "0123456789.eE+-".contains($0) }) else { return nil }
            return Double(String(text))
        }
    }

    private static func unescapeHelp(_ text: String) -> String {
        var output = ""
        var escaping = false
        for character in text {
            if escaping {
                output += character == "n" ? "\n" : String(character)
                escaping = false
            } else if character == "\\" {
                escaping = true
            } else {
                output.append(character)
            }
        }
        return output
    }

    private static func isMetricName(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, first.isASCIILetter || first == "_" || first == ":" else {
            return false
        }
        return name.unicodeScalars.allSatisfy { $0.isASCIILetter || $0.isASCIIDigit || $0 == "_" || $0 == ":" }
    }

    private static func isLabelName(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, first.isASCIILetter || first == "_" else { return false }
        return name.unicodeScalars.allSatisfy { $0.isASCIILetter || $0.isASCIIDigit || $0 == "_" }
    }
}

extension Unicode.Scalar {
    fileprivate var isASCIILetter: Bool { ("a"..."z").contains(self) || ("A"..."Z").contains(self) }
    fileprivate var isASCIIDigit: Bool { ("0"..."9").contains(self) }
}
