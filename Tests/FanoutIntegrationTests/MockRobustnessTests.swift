import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation
import XCTest

#if canImport(Glibc)
    import Glibc
#endif

/// A malformed or hostile peer never takes mock-apns down: after each abuse below, a normal request
/// to the same mock still gets 200. Every wait is bounded.
///
/// - (a) plain TCP: bytes that are not a TLS ClientHello, a truncated ClientHello, idle connections;
/// - (b) a valid TLS handshake (`openssl s_client -alpn h2`) then garbage instead of the HTTP/2 preface;
/// - (c) a valid preface followed by a malformed frame: the peer must receive GOAWAY and the connection close.
final class MockRobustnessTests: XCTestCase {
    private var mock: MockHarness!

    override func setUpWithError() throws {
        signal(SIGPIPE, SIG_IGN)  // writes to a peer that has gone must fail, not kill the test process
        mock = try MockHarness()
    }

    override func tearDown() {
        mock?.stop()
        mock = nil
    }

    /// A fresh client (new TCP + TLS connection) sends a valid push: the mock is alive and serving.
    private func assertMockServes(_ context: String, file: StaticString = #filePath, line: UInt = #line) throws {
        let client = try mock.makeClient()
        defer { client.close() }
        let outcome = client.send(
            path: "/3/device/\(testDeviceToken())",
            headers: [("apns-topic", "com.example.app"), ("authorization", "bearer \(try mock.providerToken())")],
            body: Array(#"{"aps":{"alert":"hi"}}"#.utf8), timeout: 5)
        XCTAssertEqual(
            try? outcome?.get().status, 200, "after \(context): \(String(describing: outcome))", file: file, line: line)
    }

    // MARK: (a) not TLS

    func testRandomBytesInsteadOfClientHelloAreRefused() throws {
        var generator = SystemRandomNumberGenerator()
        let garbage: [(String, [UInt8])] = [
            ("random bytes", (0..<512).map { _ in UInt8.random(in: 0...255, using: &generator) }),
            ("HTTP/1.1 request", Array("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n".utf8)),
            ("h2c preface", Array(http2Preface) + frame(type: 4, flags: 0, stream: 0, payload: [])),
            ("TLS record of a wrong type", [0x17, 0x03, 0x03, 0x00, 0x05, 1, 2, 3, 4, 5]),
        ]
        for (name, bytes) in garbage {
            let socket = try XCTUnwrap(RawSocket(port: mock.port), "connect for \(name)")
            XCTAssertTrue(socket.send(bytes), name)
            let (_, closed) = socket.readUntilClosed(timeout: 5)
            XCTAssertTrue(closed, "the mock closes a connection that sent \(name)")
            socket.close()
            try assertMockServes(name)
        }
    }

    func testTruncatedClientHelloAndAbruptCloseDoNotHurt() throws {
        // A handshake record header announcing 512 bytes, then only 10 of them, then RST.
        let socket = try XCTUnwrap(RawSocket(port: mock.port))
        XCTAssertTrue(socket.send([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03, 0, 0, 0, 0]))
        socket.close(reset: true)
        // Connect and vanish without a byte.
        try XCTUnwrap(RawSocket(port: mock.port)).close()
        try XCTUnwrap(RawSocket(port: mock.port)).close(reset: true)
        try assertMockServes("truncated ClientHello and abrupt closes")
    }

    func testIdleConnectionsDoNotBlockOthers() throws {
        let idle = try (0..<20).map { _ in try XCTUnwrap(RawSocket(port: mock.port)) }
        defer { idle.forEach { $0.close() } }
        try assertMockServes("20 idle TCP connections")
    }

    // MARK: (b) TLS, then not HTTP/2

    func testGarbageInsteadOfPrefaceClosesTheConnection() throws {
        try requireOpenSSL()
        var generator = SystemRandomNumberGenerator()
        let cases: [(String, [UInt8])] = [
            ("HTTP/1.1 request over h2", Array("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n".utf8)),
            ("random bytes", (0..<300).map { _ in UInt8.random(in: 0...255, using: &generator) }),
            (
                "a truncated preface then frames",
                Array("PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n".utf8) + frame(type: 4, flags: 0, stream: 0, payload: [])
            ),
        ]
        for (name, bytes) in cases {
            let peer = try TLSPeer(port: mock.port, caFile: mock.material.caPEMPath)
            peer.send(bytes)
            let exited = peer.waitForExit(timeout: 5)
            XCTAssertTrue(exited, "the mock closes the connection after \(name)")
            let frames = peer.receivedFrames()
            XCTAssertEqual(frames.first?.type, 4, "the mock's own SETTINGS came first (\(name))")
            if let goaway = frames.first(where: { $0.type == 7 }) {
                XCTAssertNotEqual(goaway.goawayErrorCode, 0, "a GOAWAY for garbage carries an error code")
            }
            peer.finish()
            try assertMockServes(name)
        }
    }

    // MARK: (c) preface, then a malformed frame

    func testMalformedFramesAfterPrefaceGetGoawayAndClose() throws {
        try requireOpenSSL()
        let settings = frame(type: 4, flags: 0, stream: 0, payload: [])
        let cases: [(String, [UInt8], UInt32)] = [
            // FRAME_SIZE_ERROR
            ("SETTINGS of 5 bytes", frame(type: 4, flags: 0, stream: 0, payload: [0, 1, 0, 0, 0]), 6),
            ("DATA on stream 0", frame(type: 0, flags: 0, stream: 0, payload: [1, 2, 3]), 1),  // PROTOCOL_ERROR
            ("WINDOW_UPDATE of 0 on the connection", frame(type: 8, flags: 0, stream: 0, payload: [0, 0, 0, 0]), 1),
            (
                "HEADERS with a broken HPACK block",
                frame(type: 1, flags: 0x5, stream: 1, payload: [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]), 9
            ),  // COMPRESSION_ERROR
            ("HEADERS on an even stream", frame(type: 1, flags: 0x5, stream: 2, payload: [0x83, 0x87]), 1),
            ("PING of 4 bytes", frame(type: 6, flags: 0, stream: 0, payload: [1, 2, 3, 4]), 6),
            (
                "frame larger than MAX_FRAME_SIZE",
                frameHeader(length: 1 << 20, type: 0, flags: 0, stream: 1) + [UInt8](repeating: 0, count: 64), 6
            ),
        ]
        for (name, malformed, expectedError) in cases {
            let peer = try TLSPeer(port: mock.port, caFile: mock.material.caPEMPath)
            peer.send(Array(http2Preface) + settings + malformed)
            let exited = peer.waitForExit(timeout: 5)
            XCTAssertTrue(exited, "the mock closes the connection after \(name)")
            let frames = peer.receivedFrames()
            let goaway = frames.first { $0.type == 7 }
            XCTAssertNotNil(goaway, "\(name): GOAWAY expected, got frame types \(frames.map(\.type))")
            XCTAssertEqual(goaway?.goawayErrorCode, expectedError, name)
            peer.finish()
            try assertMockServes(name)
        }
    }

    func testValidPeerCanStillTalkAfterHostilePeersOnOtherConnections() throws {
        try requireOpenSSL()
        // A long-lived good connection survives other connections' protocol errors.
        let client = try mock.makeClient()
        defer { client.close() }
        let headers = [("apns-topic", "com.example.app"), ("authorization", "bearer \(try mock.providerToken())")]
        let body = Array(#"{"aps":{"alert":"hi"}}"#.utf8)
        XCTAssertEqual(
            try client.send(path: "/3/device/\(testDeviceToken(1))", headers: headers, body: body, timeout: 5)?.get()
                .status, 200)
        let peer = try TLSPeer(port: mock.port, caFile: mock.material.caPEMPath)
        peer.send(Array(http2Preface) + frame(type: 0, flags: 0, stream: 0, payload: [0]))
        XCTAssertTrue(peer.waitForExit(timeout: 5))
        peer.finish()
        XCTAssertEqual(
            try client.send(path: "/3/device/\(testDeviceToken(2))", headers: headers, body: body, timeout: 5)?.get()
                .status, 200)
        XCTAssertEqual(client.onLoop { _ in client.connectionsOpened }, 1, "the good connection was not disturbed")
    }

    private func requireOpenSSL() throws {
        guard TLSPeer.opensslPath != nil else { throw XCTSkip("the openssl command is not installed") }
    }
}

// MARK: HTTP/2 bytes

private let http2Preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

private func frameHeader(length: Int, type: UInt8, flags: UInt8, stream: UInt32) -> [UInt8] {
    [
        UInt8((length >> 16) & 0xFF), UInt8((length >> 8) & 0xFF), UInt8(length & 0xFF), type, flags,
        UInt8((stream >> 24) & 0x7F), UInt8((stream >> 16) & 0xFF), UInt8((stream >> 8) & 0xFF), UInt8(stream & 0xFF),
    ]
}

private func frame(type: UInt8, flags: UInt8, stream: UInt32, payload: [UInt8]) -> [UInt8] {
    frameHeader(length: payload.count, type: type, flags: flags, stream: stream) + payload
}

/// One frame read back from the mock.
private struct ReceivedFrame {
    var type: UInt8
    var flags: UInt8
    var stream: UInt32
    var payload: [UInt8]

    /// The error code of a GOAWAY frame.
    var goawayErrorCode: UInt32? {
        guard type == 7, payload.count >= 8 else { return nil }
        return payload[4..<8].reduce(0) { $0 << 8 | UInt32($1) }
    }

    /// Splits a server byte stream (no preface on the server side) into frames; a truncated tail is dropped.
    static func parse(_ bytes: [UInt8]) -> [ReceivedFrame] {
        var frames: [ReceivedFrame] = []
        var offset = 0
        while offset + 9 <= bytes.count {
            let length = Int(bytes[offset]) << 16 | Int(bytes[offset + 1]) << 8 | Int(bytes[offset + 2])
            guard offset + 9 + length <= bytes.count else { break }
            let stream = bytes[offset + 5..<offset + 9].reduce(0) { $0 << 8 | UInt32($1) } & 0x7FFF_FFFF
            frames.append(
                ReceivedFrame(
                    type: bytes[offset + 3], flags: bytes[offset + 4], stream: stream,
                    payload: Array(bytes[offset + 9..<offset + 9 + length])))
            offset += 9 + length
        }
        return frames
    }
}

// MARK: Peers

/// A blocking TCP client socket to 127.0.0.1 (no TLS).
private final class RawSocket {
    private var fd: Int32

    init?(port: Int) {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard rc == 0 else {
            Glibc.close(fd)
            return nil
        }
    }

    func send(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { buffer in
            Glibc.send(fd, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL)) == buffer.count
        }
    }

    /// Reads until the peer closes (EOF or reset) or `timeout` seconds pass.
    func readUntilClosed(timeout: Double) -> (bytes: [UInt8], closed: Bool) {
        var received: [UInt8] = []
        let deadline = Date().addingTimeInterval(timeout)
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let remaining = deadline.timeIntervalSinceNow
            if remaining <= 0 { return (received, false) }
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&poller, 1, Int32(remaining * 1000) + 1)
            if ready < 0 && errno == EINTR { continue }
            if ready <= 0 { return (received, false) }
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count == 0 { return (received, true) }
            if count < 0 {
                if errno == EINTR || errno == EAGAIN { continue }
                return (received, true)  // ECONNRESET and friends: closed
            }
            received += buffer[0..<count]
        }
    }

    /// Closes; with `reset`, abortively (SO_LINGER 0 sends RST).
    func close(reset: Bool = false) {
        guard fd >= 0 else { return }
        if reset {
            var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
        }
        Glibc.close(fd)
        fd = -1
    }

    deinit { close() }
}

/// `openssl s_client -alpn h2 -quiet` connected to the mock: a verified TLS connection whose
/// plaintext we write raw through its stdin; what the mock sends comes back in a file.
private final class TLSPeer {
    static let opensslPath: String? = {
        for directory in (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":") {
            let path = "\(directory)/openssl"
            if FileManager.default.isExecutableFile(atPath: path) { return path }
        }
        return nil
    }()

    private let process = Process()
    private let input = Pipe()
    private let outputPath: String
    private let errorPath: String
    private let exited = DispatchSemaphore(value: 0)

    init(port: Int, caFile: String) throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("fanout-tlspeer-\(UUID().uuidString)")
            .path
        outputPath = base + ".out"
        errorPath = base + ".err"
        _ = FileManager.default.createFile(atPath: outputPath, contents: nil)
        _ = FileManager.default.createFile(atPath: errorPath, contents: nil)
        process.executableURL = URL(fileURLWithPath: try XCTUnwrap(Self.opensslPath))
        process.arguments = [
            "s_client", "-connect", "127.0.0.1:\(port)", "-servername", "localhost", "-alpn", "h2", "-CAfile", caFile,
            "-verify_return_error", "-quiet",
        ]
        process.standardInput = input
        process.standardOutput = try XCTUnwrap(FileHandle(forWritingAtPath: outputPath))
        process.standardError = try XCTUnwrap(FileHandle(forWritingAtPath: errorPath))
        let exited = self.exited
        process.terminationHandler = { _ in exited.signal() }
        try process.run()
    }

    /// Writes plaintext for s_client to send once the handshake is done.
    func send(_ bytes: [UInt8]) {
        let fd = input.fileHandleForWriting.fileDescriptor
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    }

    /// True when s_client exited (the mock closed the connection) within `timeout` seconds.
    func waitForExit(timeout: Double) -> Bool {
        exited.wait(timeout: .now() + timeout) == .success
    }

    /// The frames the mock sent (valid after exit).
    func receivedFrames() -> [ReceivedFrame] {
        ReceivedFrame.parse(Array((try? Data(contentsOf: URL(fileURLWithPath: outputPath))) ?? Data()))
    }

    /// Stops s_client if it still runs (bounded), and removes the files.
    func finish() {
        if process.isRunning {
            process.terminate()
            _ = exited.wait(timeout: .now() + 2)
        }
        try? input.fileHandleForWriting.close()
        try? FileManager.default.removeItem(atPath: outputPath)
        try? FileManager.default.removeItem(atPath: errorPath)
    }

    deinit { finish() }
}
