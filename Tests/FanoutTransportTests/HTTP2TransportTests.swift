import FanoutCore
import FanoutTestSupport
import Foundation
import Synchronization
import XCTest

@testable import FanoutTransport

/// A server handler that answers every request 200 with an `apns-id`, counting what it saw.
final class EchoHandler: HTTP2ServerHandler, @unchecked Sendable {
    let requests = Atomic<Int>(0)
    let violations = Atomic<Int>(0)
    let bodyBytes = Atomic<Int>(0)
    /// Reset every Nth stream with REFUSED_STREAM (0: never).
    let refuseEvery: Int
    /// Send GOAWAY after this many streams on a connection (0: never).
    let goawayAfter: Int

    init(refuseEvery: Int = 0, goawayAfter: Int = 0) {
        self.refuseEvery = refuseEvery
        self.goawayAfter = goawayAfter
    }

    func serverConnection(_ connection: HTTP2ServerConnection, didReceive request: HTTP2ServerRequest) {
        let count = requests.add(1, ordering: .relaxed).newValue
        bodyBytes.add(request.body.count, ordering: .relaxed)
        if refuseEvery > 0 && count % refuseEvery == 0 {
            connection.refuse(streamID: request.streamID)
            return
        }
        if connection.streamsReceived == 1 { connection.setMaxConcurrentStreams(100) }
        let id = request.headers.first { $0.name == "apns-id" }?.value ?? "generated"
        connection.respond(streamID: request.streamID, status: 200, headers: [("apns-id", id)])
        if goawayAfter > 0 && connection.streamsReceived == goawayAfter {
            connection.sendGoaway(reason: "Shutdown")
        }
    }

    func serverConnectionStreamLimitViolated(_ connection: HTTP2ServerConnection) {
        violations.add(1, ordering: .relaxed)
    }

    func serverConnectionDidClose(_ connection: HTTP2ServerConnection, error: TransportError?) {}
}

/// Test TLS material in a fresh temporary directory.
func makeTLSMaterial() throws -> TestTLSMaterial {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("fanout-tls-\(UUID().uuidString)")
        .path
    TemporaryDirectories.removeAtExit(directory)
    return try TestTLSMaterial.createOrReuse(in: directory)
}

/// Collects results from the loop thread and lets the test wait for a count.
final class ResultCollector: @unchecked Sendable {
    private let lock = NSLock()
    private var results: [Result<HTTP2Response, HTTP2StreamFailure>] = []
    private let expected: Int
    private let done = DispatchSemaphore(value: 0)

    init(expected: Int) {
        self.expected = expected
    }

    func add(_ result: Result<HTTP2Response, HTTP2StreamFailure>) {
        lock.lock()
        results.append(result)
        let finished = results.count == expected
        lock.unlock()
        if finished { done.signal() }
    }

    func wait(seconds: Double) -> [Result<HTTP2Response, HTTP2StreamFailure>]? {
        guard done.wait(timeout: .now() + seconds) == .success else { return nil }
        lock.lock()
        defer { lock.unlock() }
        return results
    }
}

final class HTTP2TransportTests: XCTestCase {
    func testTenThousandRequestsOverOneConnectionStayWithinTheStreamLimit() throws {
        let handler = EchoHandler()
        let (server, tls) = try startServer(handler: handler, initialMaxStreams: 1)
        defer { server.shutdown() }
        let loop = LoopThread(name: "client")
        defer { loop.shutdown() }
        let total = 10_000
        let collector = ResultCollector(expected: total)
        let body = SharedBody([UInt8](repeating: UInt8(ascii: "x"), count: 1024))
        let head = HeaderBlock([
            (":method", "POST", false), (":scheme", "https", false), (":authority", "localhost", false),
            ("apns-topic", "com.example.app", false),
        ])
        let maxOpen = Atomic<Int>(0)
        let connectionBox = ConnectionBox()
        try loop.execute {
            let connection = HTTP2ClientConnection(
                loop: loop,
                configuration: HTTP2ClientConfiguration(host: "localhost", port: server.port, tls: tls.configuration),
                tlsContext: tls)
            connectionBox.connection = connection
            for index in 0..<total {
                let request = HTTP2Request(
                    head: head, path: "/3/device/\(index)", apnsID: APNsIdentifier("id-\(index)"), body: body)
                connection.submit(request) { result in
                    maxOpen.store(connection.peakOpenStreams, ordering: .relaxed)
                    collector.add(result)
                }
            }
        }
        let results = try XCTUnwrap(collector.wait(seconds: 60), "not all responses arrived")
        var ok = 0
        var ids = Set<String>()
        for result in results {
            if case .success(let response) = result, response.status == 200 {
                ok += 1
                ids.insert(response.apnsID ?? "")
            }
        }
        XCTAssertEqual(ok, total)
        XCTAssertEqual(ids.count, total, "every response echoes its own apns-id")
        XCTAssertEqual(handler.requests.load(ordering: .relaxed), total)
        XCTAssertEqual(handler.bodyBytes.load(ordering: .relaxed), total * 1024)
        XCTAssertEqual(handler.violations.load(ordering: .relaxed), 0)
        XCTAssertEqual(maxOpen.load(ordering: .relaxed), 100, "the stream window was kept full, never past the limit")
        try loop.execute { connectionBox.connection?.close(immediately: true) }
    }
}

extension HTTP2TransportTests {
    /// nghttp2 reads a header block's bytes when it sends the HEADERS frame, not when the request is submitted
    /// (`HeaderBlock` asks it not to copy them): each request here has a block of its own that nothing else holds, with
    /// a name in mixed case and a value that names the request, and most wait for one of 50 streams. Every request
    /// must arrive with its own value under the lowercase name.
    func testEachRequestArrivesWithItsOwnHeaderBlockWhenNothingElseHoldsIt() throws {
        let handler = HeaderCheckingHandler()
        let (server, tls) = try startServer(handler: handler, initialMaxStreams: 50)
        defer { server.shutdown() }
        let loop = LoopThread(name: "client")
        defer { loop.shutdown() }
        let total = 2_000
        let collector = ResultCollector(expected: total)
        let body = SharedBody(Array("{}".utf8))
        let connectionBox = ConnectionBox()
        try loop.execute {
            let connection = HTTP2ClientConnection(
                loop: loop,
                configuration: HTTP2ClientConfiguration(host: "localhost", port: server.port, tls: tls.configuration),
                tlsContext: tls)
            connectionBox.connection = connection
            for index in 0..<total {
                let head = HeaderBlock([
                    (":method", "POST", false), (":scheme", "https", false), (":authority", "localhost", false),
                    ("X-Request-Index", "request-\(index)-" + String(repeating: "x", count: index % 97), false),
                ])
                connection.submit(HTTP2Request(head: head, path: "/3/device/\(index)", body: body)) { result in
                    collector.add(result)
                }
            }
        }
        let results = try XCTUnwrap(collector.wait(seconds: 60), "not all responses arrived")
        XCTAssertEqual(results.filter { (try? $0.get().status) == 200 }.count, total)
        XCTAssertEqual(handler.matched.load(ordering: .relaxed), total)
        XCTAssertEqual(handler.mismatches.withLock { $0 }, [], "requests whose header was not their own")
        try loop.execute { connectionBox.connection?.close(immediately: true) }
    }
}

/// Answers 200, and checks that each request's `x-request-index` names the request its path does.
final class HeaderCheckingHandler: HTTP2ServerHandler, @unchecked Sendable {
    let matched = Atomic<Int>(0)
    let mismatches = FanoutMutex<[String]>([])

    func serverConnection(_ connection: HTTP2ServerConnection, didReceive request: HTTP2ServerRequest) {
        let index = request.path.split(separator: "/").last.map(String.init) ?? "?"
        let expected = "request-\(index)-" + String(repeating: "x", count: (Int(index) ?? 0) % 97)
        let value = request.headers.first { $0.name == "x-request-index" }?.value
        if value == expected {
            matched.add(1, ordering: .relaxed)
        } else {
            mismatches.withLock { $0.append("\(request.path): \(value ?? "none")") }
        }
        connection.respond(streamID: request.streamID, status: 200, headers: [])
    }

    func serverConnectionStreamLimitViolated(_ connection: HTTP2ServerConnection) {}

    func serverConnectionDidClose(_ connection: HTTP2ServerConnection, error: TransportError?) {}
}

/// A TLS HTTP/2 server on a free loopback port that answers with `handler`, and a client TLS context that trusts it.
private func startServer<Handler: HTTP2ServerHandler & Sendable>(handler: Handler, initialMaxStreams: UInt32) throws
    -> (HTTP2Server, TLSClientContext)
{
    let material = try makeTLSMaterial()
    let server = try HTTP2Server(
        host: "127.0.0.1", port: 0, threads: 1,
        tls: TLSServerContext(
            TLSServerConfiguration(certificateFile: material.serverCertPath, privateKeyFile: material.serverKeyPath)),
        initialMaxStreams: initialMaxStreams, makeHandler: { _ in handler })
    return (server, try TLSClientContext(TLSClientConfiguration(caFile: material.caPEMPath)))
}

/// Holds a loop-confined connection for closures that run on that loop.
final class ConnectionBox: @unchecked Sendable {
    var connection: HTTP2ClientConnection?
}
