import FanoutTestSupport
import FanoutTransport
import Foundation
import XCTest

/// The webhook client: one kept-alive connection for many POSTs, a new one when the server closes it, a deadline
/// that holds against a server that never answers.
final class HTTP1PostTests: XCTestCase {
    private final class Seen: @unchecked Sendable {
        let lock = NSLock()
        var bodies: [String] = []
        var held: [HTTPResponder] = []
    }

    private func server(
        _ seen: Seen, limits: HTTPServerLimits = HTTPServerLimits(), tls: TLSServerContext? = nil,
        answer: @escaping @Sendable (HTTPRequest, Int) -> HTTPResponse?
    ) throws -> HTTPServer {
        try HTTPServer(host: "127.0.0.1", port: 0, threads: 1, tls: tls, limits: limits) {
            request, responder in
            let index = seen.lock.withLock { () -> Int in
                seen.bodies.append(String(decoding: request.body, as: UTF8.self))
                return seen.bodies.count - 1
            }
            if let response = answer(request, index) {
                responder.respond(response)
            } else {
                seen.lock.withLock { seen.held.append(responder) }
            }
        }
    }

    func testPostsShareOneConnectionAndAClosedOneIsReplaced() throws {
        let seen = Seen()
        // The third answer closes the connection; the others keep it, with bodies of both framings.
        let http = try server(seen) { _, index in
            switch index {
            case 2: HTTPResponse(status: 500, headers: [("connection", "close")], body: Array("no".utf8))
            case 1: HTTPResponse(status: 204)
            default: HTTPResponse(status: 200, body: Array(String(repeating: "x", count: 10_000).utf8))
            }
        }
        defer { http.shutdown() }
        let target = try XCTUnwrap(HTTP1Post.Target(url: "http://127.0.0.1:\(http.port)/hook?a=1"))
        let client = HTTP1Post.Client(target: target)
        defer { client.close() }
        var statuses: [Int] = []
        for index in 0..<5 {
            statuses.append(
                try client.post(
                    headers: [("Content-Type", "text/plain")], body: Array("b\(index)".utf8), timeout: .seconds(5)))
            if index == 1 { XCTAssertEqual(http.openConnections, 1, "one connection for the first two") }
        }
        XCTAssertEqual(statuses, [200, 204, 500, 200, 200])
        XCTAssertEqual(seen.lock.withLock { seen.bodies }, ["b0", "b1", "b2", "b3", "b4"])
    }

    func testAKeptConnectionTheServerClosedWhileIdleIsReplaced() throws {
        var limits = HTTPServerLimits()
        limits.idleTimeout = .milliseconds(200)
        let http = try server(Seen(), limits: limits) { _, _ in HTTPResponse(status: 202) }
        defer { http.shutdown() }
        let client = HTTP1Post.Client(target: try XCTUnwrap(HTTP1Post.Target(url: "http://127.0.0.1:\(http.port)/")))
        defer { client.close() }
        XCTAssertEqual(try client.post(headers: [], body: [], timeout: .seconds(5)), 202)
        let deadline = Date().addingTimeInterval(10)
        while http.openConnections > 0 && Date() < deadline { usleep(10_000) }
        XCTAssertEqual(http.openConnections, 0, "the server closed the idle connection")
        XCTAssertEqual(try client.post(headers: [], body: [], timeout: .seconds(5)), 202)
    }

    /// https: the server's certificate is verified (against `caFile`, else the system's CAs, which do not know
    /// the test CA) with its host name, and the kept connection carries the next request through TLS.
    func testHTTPSVerifiesTheServerAndKeepsTheConnection() throws {
        let material = try makeTLSMaterial()
        let tls = try TLSServerContext(
            TLSServerConfiguration(
                certificateFile: material.serverCertPath, privateKeyFile: material.serverKeyPath,
                alpnProtocols: ["http/1.1"]))
        let seen = Seen()
        let https = try server(seen, tls: tls) { _, _ in HTTPResponse(status: 200, body: Array("ok".utf8)) }
        defer { https.shutdown() }
        let target = try XCTUnwrap(HTTP1Post.Target(url: "https://localhost:\(https.port)/hook"))
        let client = HTTP1Post.Client(target: target, caFile: material.caPEMPath)
        defer { client.close() }
        for index in 0..<3 {
            XCTAssertEqual(try client.post(headers: [], body: Array("s\(index)".utf8), timeout: .seconds(5)), 200)
        }
        XCTAssertEqual(https.openConnections, 1)
        XCTAssertEqual(seen.lock.withLock { seen.bodies }, ["s0", "s1", "s2"])
        XCTAssertThrowsError(try HTTP1Post.post(target, headers: [], body: [], timeout: .seconds(5))) { error in
            XCTAssertEqual((error as? HTTP1Post.Failure)?.kind, .tls, "\(error)")
        }
        // An IP address is checked against the certificate's IP addresses.
        let address = try XCTUnwrap(HTTP1Post.Target(url: "https://127.0.0.1:\(https.port)/hook"))
        XCTAssertEqual(
            try HTTP1Post.post(address, headers: [], body: [], timeout: .seconds(5), caFile: material.caPEMPath), 200)
        // A name the certificate does not cover ("127.1" reaches 127.0.0.1, but it is neither of its names).
        let otherName = try XCTUnwrap(HTTP1Post.Target(url: "https://127.1:\(https.port)/hook"))
        XCTAssertThrowsError(
            try HTTP1Post.post(otherName, headers: [], body: [], timeout: .seconds(5), caFile: material.caPEMPath)
        ) { error in
            XCTAssertEqual((error as? HTTP1Post.Failure)?.kind, .tls, "\(error)")
        }
    }

    func testAServerThatNeverAnswersIsATimeout() throws {
        let seen = Seen()
        let http = try server(seen) { _, _ in nil }
        defer { http.shutdown() }
        let target = try XCTUnwrap(HTTP1Post.Target(url: "http://127.0.0.1:\(http.port)/"))
        let started = ContinuousClock.now
        XCTAssertThrowsError(try HTTP1Post.post(target, headers: [], body: [], timeout: .milliseconds(300))) { error in
            XCTAssertEqual((error as? HTTP1Post.Failure)?.kind, .timeout)
        }
        let elapsed = ContinuousClock.now - started
        XCTAssertGreaterThanOrEqual(elapsed, .milliseconds(300))
        XCTAssertLessThan(elapsed, .seconds(3))
    }

    func testARefusedConnectionIsAConnectFailure() throws {
        // A port with nothing listening: take one from the kernel and close it.
        let http = try server(Seen()) { _, _ in HTTPResponse(status: 200) }
        let port = http.port
        http.shutdown()
        let target = try XCTUnwrap(HTTP1Post.Target(url: "http://127.0.0.1:\(port)/"))
        XCTAssertThrowsError(try HTTP1Post.post(target, headers: [], body: [], timeout: .seconds(2))) { error in
            XCTAssertEqual((error as? HTTP1Post.Failure)?.kind, .connect)
        }
    }

    func testTargetsRefuseUserInfoAndOtherSchemes() {
        XCTAssertNil(HTTP1Post.Target(url: "http://user:pw@host/x"))
        XCTAssertNil(HTTP1Post.Target(url: "ftp://host/x"))
        XCTAssertNil(HTTP1Post.Target(url: "http:///x"))
        XCTAssertEqual(HTTP1Post.Target(url: "https://[::1]:8443/a/b?c=d")?.origin, "https://[::1]:8443")
        XCTAssertEqual(HTTP1Post.Target(url: "https://[::1]:8443/a/b?c=d")?.pathAndQuery, "/a/b?c=d")
    }
}
