import FanoutTestSupport
import Foundation
import XCTest

@testable import FanoutTransport

/// What becomes of plaintext TLS cannot take: a write TLS must retry after reading waits for it, and
/// a write that fails tears the channel down with an error naming it.
final class TLSWriteTests: XCTestCase {
    /// Moves ciphertext between two engines until neither has any left to send.
    private func pump(_ client: TLSEngine, _ server: TLSEngine) {
        for _ in 0..<20 {
            _ = client.advanceHandshake()
            var moved = false
            client.withCiphertext {
                server.feed($0)
                moved = true
            }
            _ = server.advanceHandshake()
            server.withCiphertext {
                client.feed($0)
                moved = true
            }
            if !moved { return }
        }
    }

    private func makeEngines() throws -> (client: TLSEngine, server: TLSEngine) {
        let material = try makeTLSMaterial()
        let clientContext = try TLSClientContext(TLSClientConfiguration(caFile: material.caPEMPath))
        let serverContext = try TLSServerContext(
            TLSServerConfiguration(certificateFile: material.serverCertPath, privateKeyFile: material.serverKeyPath))
        return (
            try TLSEngine(context: clientContext.context, host: "localhost"),
            try TLSEngine(context: serverContext.context)
        )
    }

    func testWriteBeforeTheHandshakeIsRetriedOnceTLSHasRead() throws {
        let (client, server) = try makeEngines()
        let message = Array("hello over TLS".utf8)
        // SSL_write on a fresh client starts the handshake and must wait for the server's answer.
        XCTAssertEqual(message.withUnsafeBytes { client.writePlaintext($0) }, .retryLater)
        pump(client, server)
        XCTAssertEqual(message.withUnsafeBytes { client.writePlaintext($0) }, .written)
        pump(client, server)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1024, alignment: 1)
        defer { buffer.deallocate() }
        let count = try XCTUnwrap(server.readPlaintext(into: buffer))
        XCTAssertEqual(Array(buffer[0..<count]), message)
    }

    func testWriteAfterTheSessionWasShutDownFailsWithANamedError() throws {
        let (client, server) = try makeEngines()
        pump(client, server)
        XCTAssertEqual(Array("ready".utf8).withUnsafeBytes { client.writePlaintext($0) }, .written)
        client.shutdown()
        guard case .failed(let error) = Array("too late".utf8).withUnsafeBytes({ client.writePlaintext($0) }) else {
            return XCTFail("a write after close_notify must fail")
        }
        XCTAssertEqual(error.kind, .tlsWriteFailed)
        XCTAssertTrue(error.message.hasPrefix("TLS write failed"), error.message)
    }

    /// A SecureChannel whose TLS write fails closes, telling its delegate why, and takes no more output.
    func testFailedWriteTearsTheChannelDown() throws {
        let material = try makeTLSMaterial()
        let server = try HTTP2Server(
            host: "127.0.0.1", port: 0, threads: 1,
            tls: TLSServerContext(
                TLSServerConfiguration(certificateFile: material.serverCertPath, privateKeyFile: material.serverKeyPath)
            ),
            initialMaxStreams: 10, makeHandler: { _ in EchoHandler() })
        defer { server.shutdown() }
        let tls = try TLSClientContext(TLSClientConfiguration(caFile: material.caPEMPath))
        let loop = LoopThread(name: "tls-write-test")
        defer { loop.shutdown() }
        let delegate = ChannelRecorder()
        try loop.execute {
            TCPConnector.connect(loop: loop, host: "localhost", port: server.port, timeoutMilliseconds: 5000) {
                result in
                guard case .success(let socket) = result,
                    let engine = try? TLSEngine(context: tls.context, host: "localhost")
                else { return delegate.finish(nil) }
                let channel = SecureChannel(socket: socket, tls: engine, handshakeTimeoutMilliseconds: 5000)
                delegate.onReady = { channel in
                    engine.shutdown()
                    [UInt8](repeating: 1, count: 32).withUnsafeBytes { channel.write($0) }
                }
                channel.delegate = delegate
                channel.start()
            }
        }
        let error = try XCTUnwrap(delegate.wait(seconds: 10), "the channel did not close with an error")
        XCTAssertEqual(error.kind, .tlsWriteFailed)
        XCTAssertTrue(error.message.contains("TLS write failed"), error.message)
        XCTAssertEqual(delegate.canWriteAfterFailure, false)
    }

    /// A flush that produces far more than the socket takes at once hands TLS's output to the socket in pieces of
    /// `ciphertextWriteThreshold`, not all at its end, stops producing once the socket's queue is past the
    /// high-water mark, and goes on when it drains: the peer gets every byte, in order.
    func testALargeFlushLeavesInPiecesAndAllArrives() throws {
        let material = try makeTLSMaterial()
        let serverTLS = try TLSServerContext(
            TLSServerConfiguration(certificateFile: material.serverCertPath, privateKeyFile: material.serverKeyPath))
        let clientTLS = try TLSClientContext(TLSClientConfiguration(caFile: material.caPEMPath))
        let loop = LoopThread(name: "tls-pieces-test")
        defer { loop.shutdown() }
        let total = 8 << 20
        let sender = PatternSender(total: total)
        let receiver = PatternReceiver(total: total)
        let listenPort = loop.runAndWait { () -> Int in
            let listener = try? TCPListener(loop: loop, host: "127.0.0.1", port: 0) { socket in
                guard let engine = try? TLSEngine(context: serverTLS.context) else { return }
                let channel = SecureChannel(socket: socket, tls: engine, handshakeTimeoutMilliseconds: 5000)
                receiver.channel = channel
                channel.delegate = receiver
                channel.start()
            }
            receiver.listener = listener
            return listener?.port ?? 0
        }
        XCTAssertNotEqual(listenPort, 0, "the test listener did not bind")
        try loop.execute {
            TCPConnector.connect(loop: loop, host: "127.0.0.1", port: listenPort, timeoutMilliseconds: 5000) { result in
                guard case .success(let socket) = result,
                    let engine = try? TLSEngine(context: clientTLS.context, host: "localhost")
                else {
                    receiver.done.signal()
                    return
                }
                let channel = SecureChannel(socket: socket, tls: engine, handshakeTimeoutMilliseconds: 5000)
                sender.channel = channel
                channel.delegate = sender
                channel.start()
            }
        }
        XCTAssertEqual(receiver.done.wait(timeout: .now() + 60), .success, "the peer did not get all the bytes")
        let (received, mismatch, produceCalls, largestHeld, sawBackPressure) = loop.runAndWait {
            (receiver.received, receiver.firstMismatch, sender.produceCalls, sender.largestHeld, sender.sawBackPressure)
        }
        XCTAssertEqual(received, total)
        XCTAssertNil(mismatch, "a byte arrived out of order or changed")
        // A piece leaves as soon as the threshold is reached, so at most one more TLS record (16 KiB of plaintext and
        // its framing) is ever held on top of it.
        XCTAssertLessThan(largestHeld, SecureChannel.ciphertextWriteThreshold + SecureChannel.stagingSize + 1024)
        XCTAssertTrue(sawBackPressure, "8 MiB never filled the socket past the high-water mark")
        XCTAssertGreaterThan(produceCalls, 1, "all the output was produced in one flush despite the back-pressure")
        loop.runAndWait {
            sender.channel?.close(error: nil)
            receiver.channel?.close(error: nil)
            receiver.listener?.close()
        }
    }
}

/// Records what a SecureChannel tells its delegate; `wait` returns the close error.
private final class ChannelRecorder: SecureChannelDelegate, @unchecked Sendable {
    var onReady: ((SecureChannel) -> Void)?
    var canWriteAfterFailure: Bool?
    private let done = DispatchSemaphore(value: 0)
    private var error: TransportError?

    func finish(_ error: TransportError?) {
        self.error = error
        done.signal()
    }

    func wait(seconds: Double) -> TransportError? {
        guard done.wait(timeout: .now() + seconds) == .success else { return nil }
        return error
    }

    func channelDidBecomeReady(_ channel: SecureChannel) { onReady?(channel) }
    func channel(_ channel: SecureChannel, didRead plaintext: UnsafeRawBufferPointer) {}
    func channel(_ channel: SecureChannel, didCloseWith error: TransportError?) {
        canWriteAfterFailure = channel.canWrite
        finish(error)
    }
    func channelProduceOutput(_ channel: SecureChannel) {}
}

/// Writes `total` bytes of a known pattern, 1 KiB at a time, whenever the channel asks for output and can take it;
/// notes the most ciphertext TLS held mid-flush and whether the socket ever pushed back. Loop thread only.
private final class PatternSender: SecureChannelDelegate, @unchecked Sendable {
    let total: Int
    var channel: SecureChannel?
    var produced = 0
    /// Calls that wrote something.
    var produceCalls = 0
    var largestHeld = 0
    var sawBackPressure = false

    init(total: Int) { self.total = total }

    func channelDidBecomeReady(_ channel: SecureChannel) { channel.scheduleFlush() }
    func channel(_ channel: SecureChannel, didRead plaintext: UnsafeRawBufferPointer) {}
    func channel(_ channel: SecureChannel, didCloseWith error: TransportError?) {}
    func channelProduceOutput(_ channel: SecureChannel) {
        if produced < total && channel.canWrite { produceCalls += 1 }
        var chunk = [UInt8](repeating: 0, count: 1024)
        while produced < total {
            guard channel.canWrite else {
                sawBackPressure = true
                return
            }
            let count = min(chunk.count, total - produced)
            for index in 0..<count { chunk[index] = patternByte(produced + index) }
            chunk.withUnsafeBytes { channel.write(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
            produced += count
            largestHeld = max(largestHeld, channel.heldCiphertextBytes)
        }
    }
}

/// Counts and checks what arrives. Loop thread only; `done` is signalled once all `total` bytes are in.
private final class PatternReceiver: SecureChannelDelegate, @unchecked Sendable {
    let total: Int
    let done = DispatchSemaphore(value: 0)
    var listener: TCPListener?
    var channel: SecureChannel?
    var received = 0
    var firstMismatch: Int?

    init(total: Int) { self.total = total }

    func channelDidBecomeReady(_ channel: SecureChannel) {}
    func channel(_ channel: SecureChannel, didRead plaintext: UnsafeRawBufferPointer) {
        for (offset, byte) in plaintext.enumerated()
        where firstMismatch == nil && byte != patternByte(received + offset) {
            firstMismatch = received + offset
        }
        received += plaintext.count
        if received == total { done.signal() }
    }
    func channel(_ channel: SecureChannel, didCloseWith error: TransportError?) {
        if received < total { done.signal() }
    }
    func channelProduceOutput(_ channel: SecureChannel) {}
}

private func patternByte(_ position: Int) -> UInt8 { UInt8(truncatingIfNeeded: position % 251) }
