import FanoutTestSupport
import Foundation
import XCTest

@testable import FanoutTransport

/// Each way a TLS connection can fail gives its own error kind and a message naming the cause.
final class TLSFailureTests: XCTestCase {
    private func temporaryDirectory() -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("fanout-tls-\(UUID().uuidString)")
            .path
        TemporaryDirectories.removeAtExit(directory)
        return directory
    }

    /// Starts a server with `serverMaterial`, connects a client trusting `caFile` to `host`, and
    /// returns the transport error the first request fails with.
    private func connectionError(
        serverCertificate: String, serverKey: String, alpn: [String] = ["h2"], caFile: String?,
        host: String = "localhost",
        handshakeTimeout: UInt64 = 5000
    ) throws -> TransportError? {
        let server = try HTTP2Server(
            host: "127.0.0.1", port: 0, threads: 1,
            tls: TLSServerContext(
                TLSServerConfiguration(
                    certificateFile: serverCertificate, privateKeyFile: serverKey, alpnProtocols: alpn)),
            initialMaxStreams: 100, makeHandler: { _ in EchoHandler() })
        defer { server.shutdown() }
        return try firstRequestError(host: host, port: server.port, caFile: caFile, handshakeTimeout: handshakeTimeout)
    }

    private func firstRequestError(host: String, port: Int, caFile: String?, handshakeTimeout: UInt64 = 5000) throws
        -> TransportError?
    {
        let tls = try TLSClientContext(
            TLSClientConfiguration(caFile: caFile, handshakeTimeoutMilliseconds: handshakeTimeout))
        let loop = LoopThread(name: "tls-test-client")
        defer { loop.shutdown() }
        let collector = ResultCollector(expected: 1)
        let head = HeaderBlock([(":method", "GET", false), (":scheme", "https", false), (":authority", host, false)])
        try loop.execute {
            let connection = HTTP2ClientConnection(
                loop: loop,
                configuration: HTTP2ClientConfiguration(
                    host: host, port: port, tls: tls.configuration, connectTimeoutMilliseconds: 5000),
                tlsContext: tls)
            connection.submit(HTTP2Request(head: head, path: "/", body: SharedBody([]))) { collector.add($0) }
        }
        let results = try XCTUnwrap(collector.wait(seconds: 20), "the request never finished")
        switch results.first {
        case .failure(.notSent(let error)), .failure(.connectionLost(let error)): return error
        default: return nil
        }
    }

    func testServerSignedByAnUnknownCAIsRefused() throws {
        let trusted = try TestTLSMaterial.createOrReuse(in: temporaryDirectory())
        let other = try TestTLSMaterial.createOrReuse(in: temporaryDirectory())
        let error = try XCTUnwrap(
            connectionError(
                serverCertificate: other.serverCertPath, serverKey: other.serverKeyPath, caFile: trusted.caPEMPath))
        XCTAssertEqual(error.kind, .tlsUnknownCA)
        XCTAssertTrue(error.message.contains("unknown CA"), error.message)
    }

    func testSelfSignedServerIsRefusedWithTheSystemTrustStore() throws {
        let material = try TestTLSMaterial.createOrReuse(in: temporaryDirectory())
        let error = try XCTUnwrap(
            connectionError(serverCertificate: material.serverCertPath, serverKey: material.serverKeyPath, caFile: nil))
        XCTAssertEqual(error.kind, .tlsUnknownCA)
    }

    func testCertificateForAnotherHostIsRefused() throws {
        let ca = try TestCertificateAuthority.generate()
        let wrongHost = try TestTLSMaterial.create(
            in: temporaryDirectory(), hostnames: ["wrong.example"], ipAddresses: [], certificateAuthority: ca)
        let error = try XCTUnwrap(
            connectionError(
                serverCertificate: wrongHost.serverCertPath, serverKey: wrongHost.serverKeyPath,
                caFile: wrongHost.caPEMPath))
        XCTAssertEqual(error.kind, .tlsHostnameMismatch)
        XCTAssertTrue(error.message.contains("not valid for localhost"), error.message)
    }

    func testIPAddressNotInTheCertificateIsRefused() throws {
        let ca = try TestCertificateAuthority.generate()
        let namesOnly = try TestTLSMaterial.create(
            in: temporaryDirectory(), hostnames: ["localhost"], ipAddresses: [], certificateAuthority: ca)
        let error = try XCTUnwrap(
            connectionError(
                serverCertificate: namesOnly.serverCertPath, serverKey: namesOnly.serverKeyPath,
                caFile: namesOnly.caPEMPath,
                host: "127.0.0.1"))
        XCTAssertEqual(error.kind, .tlsHostnameMismatch)
    }

    func testServerThatOffersNoH2IsRefused() throws {
        let material = try TestTLSMaterial.createOrReuse(in: temporaryDirectory())
        let error = try XCTUnwrap(
            connectionError(
                serverCertificate: material.serverCertPath, serverKey: material.serverKeyPath, alpn: ["http/1.1"],
                caFile: material.caPEMPath))
        XCTAssertEqual(error.kind, .tlsNoH2)
        XCTAssertTrue(error.message.contains("ALPN h2"), error.message)
    }

    func testTrustedServerOnItsIPAddressConnects() throws {
        let material = try TestTLSMaterial.createOrReuse(in: temporaryDirectory())
        let error = try connectionError(
            serverCertificate: material.serverCertPath, serverKey: material.serverKeyPath, caFile: material.caPEMPath,
            host: "127.0.0.1")
        XCTAssertNil(error, "a verified connection must carry the request")
    }

    func testSilentServerHitsTheHandshakeTimeout() throws {
        // A listening socket that accepts (through the kernel backlog) but never speaks TLS.
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = bind(fd, $0, length) }
        }
        listen(fd, 8)
        withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = getsockname(fd, $0, &length) }
        }
        let port = Int(UInt16(bigEndian: address.sin_port))
        let error = try XCTUnwrap(firstRequestError(host: "localhost", port: port, caFile: nil, handshakeTimeout: 300))
        XCTAssertEqual(error.kind, .tlsHandshakeTimeout)
    }

    func testRefusedConnectionIsReported() throws {
        // Bind a port, then close it, so nothing listens there.
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = bind(fd, $0, length) }
        }
        withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = getsockname(fd, $0, &length) }
        }
        close(fd)
        let error = try XCTUnwrap(
            firstRequestError(host: "127.0.0.1", port: Int(UInt16(bigEndian: address.sin_port)), caFile: nil))
        XCTAssertEqual(error.kind, .connectFailed)
        XCTAssertTrue(error.message.contains("ECONNREFUSED"), error.message)
    }

    func testUnreadableCAFileIsAConfigurationError() {
        XCTAssertThrowsError(try TLSClientContext(TLSClientConfiguration(caFile: "/nonexistent/ca.pem"))) { error in
            XCTAssertEqual((error as? TransportError)?.kind, .tlsConfiguration)
        }
    }
}
