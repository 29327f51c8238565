import FanoutCore
import FanoutTransport
import Foundation
import MockAPNsKit
import XCTest

/// A mock-apns started in-process on 127.0.0.1, port 0, with fresh TLS material (CA, server
/// certificate, signing key) in a temporary directory. Shut it down with `stop()`.
final class MockHarness: @unchecked Sendable {
    let server: MockAPNsServer
    let material: TestTLSMaterial
    let directory: String
    var port: Int { server.port }
    var stats: MockStats { server.stats }

    /// - Parameter configure: adjusts the options (faults, auth, ...) before start.
    init(_ configure: (inout MockOptions) -> Void = { _ in }) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("fanout-mock-\(UUID().uuidString)").path
        var options = MockOptions()
        options.host = "127.0.0.1"
        options.port = 0
        options.tls = .directory(directory)
        configure(&options)
        server = try MockAPNsServer(options: options)
        material = server.tlsMaterial ?? TestTLSMaterial(directory: directory)
    }

    func stop() {
        server.shutdown()
    }

    /// A provider token signed with the mock's own key.
    func providerToken(keyID: String = "KEYID12345", teamID: String = "TEAMID1234", issuedAt: Int64? = nil) throws -> String {
        let key = try ES256PrivateKey(pemFilePath: material.authKeyP8Path)
        return try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: issuedAt ?? Int64(time(nil)))
    }
}

/// A raw HTTP/2 client for tests: one loop, one connection, requests built from header lists so
/// that tests can send what Fanout itself never would (bad headers, duplicates, wrong methods).
final class RawClient: @unchecked Sendable {
    let loop = LoopThread(name: "raw-client")
    private var current: HTTP2ClientConnection?
    let host: String
    let port: Int
    let tls: TLSClientContext

    init(host: String = "localhost", port: Int, caFile: String) throws {
        self.host = host
        self.port = port
        tls = try TLSClientContext(TLSClientConfiguration(caFile: caFile, handshakeTimeoutMilliseconds: 5000))
    }

    /// Sends one request and waits for its outcome.
    func send(
        method: String = "POST", path: String, headers: [(String, String)], body: [UInt8], timeout: Double = 10
    ) -> Result<HTTP2Response, HTTP2StreamFailure>? {
        let done = DispatchSemaphore(value: 0)
        let box = OutcomeBox()
        let head = HeaderBlock(
            [(":method", method, false), (":scheme", "https", false), (":authority", "\(host):\(port)", false)]
                + headers.map { ($0.0, $0.1, $0.0 == "authorization") })
        let request = HTTP2Request(head: head, path: path, body: SharedBody(body))
        loop.execute { [self] in
            connection().submit(request) { result in
                box.result = result
                done.signal()
            }
        }
        guard done.wait(timeout: .now() + timeout) == .success else { return nil }
        return box.result
    }

    private func connection() -> HTTP2ClientConnection {
        if let current, current.isAcceptingRequests { return current }
        let connection = HTTP2ClientConnection(
            loop: loop,
            configuration: HTTP2ClientConfiguration(host: host, port: port, tls: tls.configuration, connectTimeoutMilliseconds: 5000),
            tlsContext: tls)
        current = connection
        return connection
    }

    func close() {
        let done = DispatchSemaphore(value: 0)
        loop.execute { [self] in
            current?.close(immediately: true)
            current = nil
            done.signal()
        }
        done.wait()
        loop.shutdown()
    }
}

private final class OutcomeBox: @unchecked Sendable {
    var result: Result<HTTP2Response, HTTP2StreamFailure>?
}

/// A valid 64-hex-digit device token, different for each `index`.
func testDeviceToken(_ index: Int = 0) -> String {
    let hex = String(index, radix: 16)
    return String(repeating: "a", count: 64 - hex.count) + hex
}
