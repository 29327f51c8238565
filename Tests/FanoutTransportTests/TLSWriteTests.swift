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
