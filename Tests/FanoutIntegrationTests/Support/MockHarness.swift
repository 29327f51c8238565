import FanoutCore
import FanoutTestSupport
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
        directory =
            FileManager.default.temporaryDirectory.appendingPathComponent("fanout-mock-\(UUID().uuidString)").path
        TemporaryDirectories.removeAtExit(directory)
        var options = MockOptions()
        options.host = "127.0.0.1"
        options.port = 0
        options.tls = .directory(directory)
        configure(&options)
        server = try MockAPNsServer(options: options)
        material = server.tlsMaterial ?? TestTLSMaterial(directory: directory)
    }

    private let stopLock = NSLock()
    private var stopped = false

    /// Shuts the mock down, waiting at most `timeout` seconds: a loop thread that never stops fails
    /// the test instead of hanging the suite (the mock is then leaked). Idempotent: a second call
    /// (e.g. an explicit stop plus a `defer`) does nothing. Returns whether shutdown finished.
    @discardableResult
    func stop(timeout: Double = 10, file: StaticString = #filePath, line: UInt = #line) -> Bool {
        let first = stopLock.withLock { () -> Bool in
            defer { stopped = true }
            return !stopped
        }
        guard first else { return true }
        let done = DispatchSemaphore(value: 0)
        let server = self.server
        Thread.detachNewThread {
            server.shutdown()
            done.signal()
        }
        guard done.wait(timeout: .now() + timeout) == .success else {
            XCTFail("mock-apns did not shut down within \(timeout) s: a loop thread is stuck", file: file, line: line)
            return false
        }
        return true
    }

    /// A RawClient trusting this mock's CA.
    func makeClient() throws -> RawClient {
        try RawClient(port: port, caFile: material.caPEMPath)
    }

    /// A RawClient for the management listener (`MockOptions.manageListen` must be set).
    func makeManageClient() throws -> RawClient {
        try RawClient(
            port: XCTUnwrap(server.managePort, "start the mock with options.manageListen"), caFile: material.caPEMPath)
    }

    /// A provider token signed with the mock's own key.
    func providerToken(keyID: String = "KEYID12345", teamID: String = "TEAMID1234", issuedAt: Int64? = nil) throws
        -> String
    {
        let key = try ES256PrivateKey(pemFilePath: material.authKeyP8Path)
        return try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: issuedAt ?? Int64(time(nil)))
    }
}

/// A raw HTTP/2 client for tests: one loop, one connection, requests built from header lists so
/// that tests can send what Fanout itself never would (bad headers, duplicates, wrong methods).
final class RawClient: @unchecked Sendable {
    let loop = LoopThread(name: "raw-client")
    private var current: HTTP2ClientConnection?
    /// Connections opened so far (loop thread only; read it with `onLoop`).
    private(set) var connectionsOpened = 0
    /// Every event of every connection, tagged with the connection's number (1 = first).
    let events = ConnectionEventLog()
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
        try! loop.execute { [self] in  // the client loop runs until close()
            connection().submit(request) { result in
                box.result = result
                done.signal()
            }
        }
        guard done.wait(timeout: .now() + timeout) == .success else { return nil }
        return box.result
    }

    /// Submits one request per path in a single loop turn (so they share the connection's stream
    /// window at once) and waits for all outcomes, in path order; nil entries timed out.
    func sendConcurrently(
        paths: [String], headers: [(String, String)], body: [UInt8], timeout: Double = 10
    ) -> [Result<HTTP2Response, HTTP2StreamFailure>?] {
        let group = DispatchGroup()
        let boxes = paths.map { _ in OutcomeBox() }
        let head = HeaderBlock(
            [(":method", "POST", false), (":scheme", "https", false), (":authority", "\(host):\(port)", false)]
                + headers.map { ($0.0, $0.1, $0.0 == "authorization") })
        let requests = paths.map { HTTP2Request(head: head, path: $0, body: SharedBody(body)) }
        for _ in paths { group.enter() }
        try! loop.execute { [self] in
            let connection = connection()
            for (request, box) in zip(requests, boxes) {
                connection.submit(request) { result in
                    box.result = result
                    group.leave()
                }
            }
        }
        _ = group.wait(timeout: .now() + timeout)
        return boxes.map { $0.result }
    }

    private func connection() -> HTTP2ClientConnection {
        if let current, current.isAcceptingRequests { return current }
        let connection = HTTP2ClientConnection(
            loop: loop,
            configuration: HTTP2ClientConfiguration(
                host: host, port: port, tls: tls.configuration, connectTimeoutMilliseconds: 5000),
            tlsContext: tls)
        current = connection
        connectionsOpened += 1
        let number = connectionsOpened
        let events = self.events
        connection.onEvent = { event in events.append(connection: number, event) }
        return connection
    }

    /// Runs `body` on the loop with the current connection (nil before the first request) and
    /// returns its result; nil if the loop did not answer within `timeout` seconds.
    func onLoop<T>(timeout: Double = 5, _ body: @escaping @Sendable (HTTP2ClientConnection?) -> T) -> T? {
        let done = DispatchSemaphore(value: 0)
        let box = ValueBox<T>()
        try! loop.execute { [self] in
            box.value = body(current)
            done.signal()
        }
        guard done.wait(timeout: .now() + timeout) == .success else { return nil }
        return box.value
    }

    /// The current connection's `streamLimit`, read on the loop thread.
    func streamLimit() -> Int? {
        onLoop { $0?.streamLimit }.flatMap { $0 }
    }

    /// Polls (on the loop thread) until `condition` holds for the current connection, at most `timeout` seconds.
    func wait(timeout: Double = 5, until condition: @escaping @Sendable (HTTP2ClientConnection?) -> Bool) -> Bool {
        let deadline = DispatchTime.now() + timeout
        while DispatchTime.now() < deadline {
            if onLoop(timeout: 1, condition) == true { return true }
            usleep(2_000)
        }
        return false
    }

    private let closeLock = NSLock()
    private var closed = false

    /// Idempotent. Closes the connection and stops the loop, waiting at most `timeout` seconds (a stuck loop
    /// fails the test and is leaked rather than hanging the suite).
    func close(timeout: Double = 10, file: StaticString = #filePath, line: UInt = #line) {
        let first = closeLock.withLock { () -> Bool in
            defer { closed = true }
            return !closed
        }
        guard first else { return }
        let done = DispatchSemaphore(value: 0)
        try! loop.execute { [self] in
            current?.close(immediately: true)
            current = nil
            done.signal()
        }
        guard done.wait(timeout: .now() + timeout) == .success else {
            XCTFail("RawClient loop did not answer within \(timeout) s: it is stuck", file: file, line: line)
            return
        }
        loop.shutdown()
    }
}

private final class OutcomeBox: @unchecked Sendable {
    var result: Result<HTTP2Response, HTTP2StreamFailure>?
}

private final class ValueBox<T>: @unchecked Sendable {
    var value: T?
}

/// Connection events recorded by RawClient, readable from any thread.
final class ConnectionEventLog: @unchecked Sendable {
    private let lock = NSLock()
    private var entries: [(connection: Int, event: HTTP2ConnectionEvent)] = []

    func append(connection: Int, _ event: HTTP2ConnectionEvent) {
        lock.withLock { entries.append((connection, event)) }
    }

    var all: [(connection: Int, event: HTTP2ConnectionEvent)] { lock.withLock { entries } }

    /// The GOAWAYs received so far: connection number, last stream id, error code, reason.
    var goaways: [(connection: Int, lastStreamID: Int32, errorCode: UInt32, reason: String?)] {
        all.compactMap { entry in
            if case .goaway(let lastStreamID, let errorCode, let reason) = entry.event {
                return (entry.connection, lastStreamID, errorCode, reason)
            }
            return nil
        }
    }
}

/// The APNs view of a RawClient outcome: nil (after an XCTest failure) when there was no HTTP response.
func apnsResponse(
    _ outcome: Result<HTTP2Response, HTTP2StreamFailure>?, file: StaticString = #filePath, line: UInt = #line
) -> APNsResponse? {
    switch outcome {
    case .success(let response):
        return APNsResponse.parse(
            status: response.status, apnsID: response.apnsID, apnsUniqueID: response.apnsUniqueID, body: response.body)
    case .failure(let failure):
        XCTFail("stream failed: \(failure)", file: file, line: line)
        return nil
    case nil:
        XCTFail("no response within the timeout", file: file, line: line)
        return nil
    }
}

/// A JSON body of exactly `size` bytes: `{"aps":{"alert":"xxx…"}}` (size ≥ 24).
func paddedAlertPayload(size: Int) -> [UInt8] {
    let prefix = #"{"aps":{"alert":""#
    let suffix = #""}}"#
    precondition(size >= prefix.utf8.count + suffix.utf8.count)
    return Array((prefix + String(repeating: "x", count: size - prefix.utf8.count - suffix.utf8.count) + suffix).utf8)
}

/// A valid 64-hex-digit device token, different for each `index` (zero-padded, so no two collide).
func testDeviceToken(_ index: Int = 0) -> String {
    let hex = String(index, radix: 16)
    return "f" + String(repeating: "0", count: 63 - hex.count) + hex
}
