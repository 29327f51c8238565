import FanoutTestSupport
import Foundation
import XCTest

@testable import FanoutTransport

final class CryptoTestCertificateAuthorityTests: XCTestCase {
    private func text(of certificatePath: String) throws -> String {
        let run = try CryptoTestSupport.openssl(["x509", "-in", certificatePath, "-noout", "-text"])
        XCTAssertEqual(run.status, 0, run.output)
        return run.stdout
    }

    private func verify(caFile: String, certificate: String, hostname: String? = nil) throws -> OpenSSLRun {
        var arguments = ["verify", "-CAfile", caFile]
        if let hostname { arguments += ["-verify_hostname", hostname] }
        return try CryptoTestSupport.openssl(arguments + [certificate])
    }

    func testCreatesVerifiableMaterialWithSANsAndModes() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self) + "/tls/nested"
        let material = try TestTLSMaterial.createOrReuse(in: directory)
        XCTAssertEqual(material.directory, directory)
        XCTAssertEqual(material.caPEMPath, directory + "/ca.pem")
        XCTAssertEqual(material.serverCertPath, directory + "/server.pem")
        XCTAssertEqual(material.serverKeyPath, directory + "/server-key.pem")
        XCTAssertEqual(material.authKeyP8Path, directory + "/auth-key.p8")
        XCTAssertEqual(material.authKeyPublicPEMPath, directory + "/auth-key.pub.pem")
        for path in material.allPaths { XCTAssertTrue(FileManager.default.fileExists(atPath: path), path) }

        let ok = try verify(caFile: material.caPEMPath, certificate: material.serverCertPath)
        XCTAssertEqual(ok.status, 0, ok.output)
        XCTAssertTrue(ok.stdout.contains("server.pem: OK"), ok.output)
        XCTAssertEqual(
            try verify(caFile: material.caPEMPath, certificate: material.serverCertPath, hostname: "localhost").status,
            0)
        let byIP = try CryptoTestSupport.openssl([
            "verify", "-CAfile", material.caPEMPath, "-verify_ip", "127.0.0.1", material.serverCertPath,
        ])
        XCTAssertEqual(byIP.status, 0, byIP.output)

        let server = try text(of: material.serverCertPath)
        XCTAssertTrue(server.contains("DNS:localhost"), server)
        XCTAssertTrue(server.contains("IP Address:127.0.0.1"), server)
        XCTAssertTrue(server.contains("Subject: CN = localhost"), server)
        XCTAssertTrue(server.contains("Issuer: CN = Fanout Test CA"), server)
        XCTAssertTrue(server.contains("CA:FALSE"), server)
        XCTAssertTrue(server.contains("TLS Web Server Authentication"), server)
        XCTAssertTrue(server.contains("X509v3 Authority Key Identifier"), server)
        XCTAssertTrue(server.contains("ASN1 OID: prime256v1"), server)
        XCTAssertTrue(server.contains("Version: 3"), server)

        let ca = try text(of: material.caPEMPath)
        XCTAssertTrue(ca.contains("CA:TRUE"), ca)
        XCTAssertTrue(ca.contains("X509v3 Basic Constraints: critical"), ca)
        XCTAssertTrue(ca.contains("Certificate Sign, CRL Sign"), ca)
        XCTAssertTrue(ca.contains("X509v3 Subject Key Identifier"), ca)
        // Valid for years from now.
        let checkEnd = try CryptoTestSupport.openssl([
            "x509", "-in", material.caPEMPath, "-noout", "-checkend", String(9 * 365 * 86_400),
        ])
        XCTAssertEqual(checkEnd.status, 0, checkEnd.output)

        // The server key matches the certificate.
        let certificateKey = try CryptoTestSupport.openssl([
            "x509", "-in", material.serverCertPath, "-noout", "-pubkey",
        ])
        let privateKey = try CryptoTestSupport.openssl(["pkey", "-in", material.serverKeyPath, "-pubout"])
        XCTAssertEqual(certificateKey.stdout, privateKey.stdout)
        XCTAssertTrue(
            try CryptoTestSupport.read(material.serverKeyPath).hasPrefix("-----BEGIN PRIVATE " + "KEY-----"))

        // The auth key pair loads and matches.
        let authKey = try ES256PrivateKey(pemFilePath: material.authKeyP8Path)
        XCTAssertEqual(authKey.publicKey, try ES256PublicKey(pemFilePath: material.authKeyPublicPEMPath))

        XCTAssertEqual(try CryptoTestSupport.mode(of: material.serverKeyPath), 0o600)
        XCTAssertEqual(try CryptoTestSupport.mode(of: material.authKeyP8Path), 0o600)
        XCTAssertEqual(try CryptoTestSupport.mode(of: material.caPEMPath), 0o644)
        XCTAssertEqual(try CryptoTestSupport.mode(of: material.serverCertPath), 0o644)
        XCTAssertEqual(try CryptoTestSupport.mode(of: material.authKeyPublicPEMPath), 0o644)
        // No temporary files are left behind.
        let names = try FileManager.default.contentsOfDirectory(atPath: directory).filter { !$0.hasPrefix(".") }
        XCTAssertEqual(
            Set(names),
            [
                "ca.pem", "server.pem", "server-key.pem", "auth-key.p8", "auth-key.pub.pem", "client.pem",
                "client-key.pem",
                "client.p12",
            ])
    }

    func testReuseLeavesFilesUnchanged() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let first = try TestTLSMaterial.createOrReuse(in: directory)
        let before = try first.allPaths.map { try CryptoTestSupport.read($0) }
        let modified = try first.allPaths.map {
            try FileManager.default.attributesOfItem(atPath: $0)[.modificationDate] as? Date
        }
        let second = try TestTLSMaterial.createOrReuse(in: directory)
        XCTAssertEqual(first, second)
        XCTAssertEqual(try second.allPaths.map { try CryptoTestSupport.read($0) }, before)
        XCTAssertEqual(
            try second.allPaths.map {
                try FileManager.default.attributesOfItem(atPath: $0)[.modificationDate] as? Date
            },
            modified)

        // With one file missing, the whole set is regenerated (a new CA).
        try FileManager.default.removeItem(atPath: first.serverKeyPath)
        let third = try TestTLSMaterial.createOrReuse(in: directory)
        XCTAssertNotEqual(try CryptoTestSupport.read(third.caPEMPath), before[0])
        XCTAssertEqual(try verify(caFile: third.caPEMPath, certificate: third.serverCertPath).status, 0)
    }

    func testWrongHostnameUnderSameCAAndUnrelatedCA() throws {
        let root = try CryptoTestSupport.temporaryDirectory(for: self)
        let ca = try TestCertificateAuthority.generate()
        let good = try TestTLSMaterial.create(in: root + "/good", certificateAuthority: ca)
        let wrong = try TestTLSMaterial.create(
            in: root + "/wrong", hostnames: ["wrong.example"], ipAddresses: [], certificateAuthority: ca)
        let other = try TestTLSMaterial.create(in: root + "/other")  // a different CA

        // (a) localhost under the CA.
        XCTAssertEqual(
            try verify(caFile: good.caPEMPath, certificate: good.serverCertPath, hostname: "localhost").status, 0)
        // (b) wrong.example under the same CA: chain OK, hostname localhost fails.
        XCTAssertEqual(try CryptoTestSupport.read(wrong.caPEMPath), try CryptoTestSupport.read(good.caPEMPath))
        XCTAssertEqual(try verify(caFile: good.caPEMPath, certificate: wrong.serverCertPath).status, 0)
        let mismatch = try verify(caFile: good.caPEMPath, certificate: wrong.serverCertPath, hostname: "localhost")
        XCTAssertNotEqual(mismatch.status, 0)
        XCTAssertTrue(mismatch.output.contains("hostname mismatch"), mismatch.output)
        XCTAssertEqual(
            try verify(caFile: good.caPEMPath, certificate: wrong.serverCertPath, hostname: "wrong.example").status, 0)
        let wrongText = try text(of: wrong.serverCertPath)
        XCTAssertTrue(wrongText.contains("DNS:wrong.example"), wrongText)
        XCTAssertFalse(wrongText.contains("localhost"), wrongText)
        XCTAssertFalse(wrongText.contains("IP Address"), wrongText)
        // (c) a different CA does not vouch for the first CA's server, nor the reverse.
        XCTAssertNotEqual(try CryptoTestSupport.read(other.caPEMPath), try CryptoTestSupport.read(good.caPEMPath))
        XCTAssertNotEqual(try verify(caFile: other.caPEMPath, certificate: good.serverCertPath).status, 0)
        XCTAssertNotEqual(try verify(caFile: good.caPEMPath, certificate: other.serverCertPath).status, 0)
        XCTAssertEqual(try verify(caFile: other.caPEMPath, certificate: other.serverCertPath).status, 0)
    }

    func testInMemoryIssueAndSelfSigned() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let ca = try TestCertificateAuthority.generate(commonName: "Other Test CA")
        let caPath = directory + "/ca.pem"
        try CryptoTestSupport.write(ca.certificatePEM(), to: caPath)

        let issued = try ca.issueServerCertificate(
            hostnames: ["localhost", "api.push.test"], ipAddresses: ["127.0.0.1", "::1"])
        XCTAssertTrue(issued.privateKeyPEM.hasPrefix("-----BEGIN PRIVATE " + "KEY-----"))
        let issuedPath = directory + "/issued.pem"
        try CryptoTestSupport.write(issued.certificatePEM, to: issuedPath)
        XCTAssertEqual(try verify(caFile: caPath, certificate: issuedPath, hostname: "api.push.test").status, 0)
        let issuedText = try text(of: issuedPath)
        XCTAssertTrue(issuedText.contains("IP Address:0:0:0:0:0:0:0:1"), issuedText)
        XCTAssertTrue(issuedText.contains("Issuer: CN = Other Test CA"), issuedText)

        let selfSigned = try TestCertificateAuthority.generateSelfSigned()
        let selfSignedPath = directory + "/self.pem"
        try CryptoTestSupport.write(selfSigned.certificatePEM, to: selfSignedPath)
        XCTAssertNotEqual(try verify(caFile: caPath, certificate: selfSignedPath).status, 0)
        XCTAssertTrue(try text(of: selfSignedPath).contains("Issuer: CN = localhost"))

        // Serials are random.
        func serial(_ path: String) throws -> String {
            try CryptoTestSupport.openssl(["x509", "-in", path, "-noout", "-serial"]).stdout
        }
        XCTAssertNotEqual(try serial(caPath), try serial(issuedPath))

        XCTAssertThrowsError(try ca.issueServerCertificate(hostnames: [], ipAddresses: [])) { error in
            XCTAssertEqual((error as! CryptoError).kind, .invalidArgument)
        }
        XCTAssertThrowsError(try ca.issueServerCertificate(hostnames: ["a,b"], ipAddresses: [])) { error in
            XCTAssertEqual((error as! CryptoError).kind, .invalidArgument)
        }
        XCTAssertThrowsError(try ca.issueServerCertificate(hostnames: [], ipAddresses: ["not-an-ip"])) { error in
            XCTAssertEqual((error as! CryptoError).kind, .certificateFailed)
        }
    }

    func testCreateFailsClearlyWhenDirectoryCannotBeMade() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let file = directory + "/plain-file"
        try CryptoTestSupport.write("x", to: file)
        XCTAssertThrowsError(try TestTLSMaterial.createOrReuse(in: file + "/tls")) { error in
            let error = error as! CryptoError
            XCTAssertEqual(error.kind, .fileWriteFailed)
            XCTAssertTrue(error.message.contains(file), error.message)
        }
    }
}
