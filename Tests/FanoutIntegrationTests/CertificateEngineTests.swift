import Fanout
import FanoutCore
import FanoutTestSupport
import Foundation
import MockAPNsKit
import XCTest

/// The library's certificate-based authentication: `ProviderCredentials` with a provider certificate, against an
/// in-process mock-apns that requires client certificates and takes no provider token.
final class CertificateEngineTests: XCTestCase {
    private var mock: MockHarness!

    override func setUpWithError() throws {
        mock = try MockHarness { options in
            guard case .directory(let directory) = options.tls else { return }
            options.clientCAPath = TestTLSMaterial(directory: directory).caPEMPath
            options.noAuth = true
        }
    }

    override func tearDown() {
        mock.stop()
        super.tearDown()
    }

    private var p12: ProviderCredentials {
        ProviderCredentials(pkcs12Path: mock.material.clientP12Path, password: TestTLSMaterial.clientP12Password)
    }

    private func engine(_ credentials: ProviderCredentials) throws -> FanoutEngine {
        var configuration = FanoutEngineConfiguration(
            endpoint: APNsEndpoint(host: "localhost", port: mock.port), credentials: credentials,
            caFile: mock.material.caPEMPath)
        configuration.loops = 1
        configuration.connectionsPerLoop = 2
        return try FanoutEngine(configuration: configuration)
    }

    private func job(_ id: String, topic: String, tokens: Int) -> FanoutJob {
        FanoutJob(
            id: id, headers: NotificationHeaders(pushType: .alert, topic: topic),
            payload: .raw(Array(#"{"aps":{"alert":"hi"}}"#.utf8)),
            recipients: .tokens((1...tokens).map { testDeviceToken($0) }))
    }

    func testPKCS12CertificateDeliversWithoutProviderToken() async throws {
        let engine = try engine(p12)
        let summary = try await engine.run(job("p12", topic: TestTLSMaterial.clientTopic, tokens: 500)) { _ in }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.delivered, 500)
        XCTAssertEqual(mock.stats.accepted, 500)
    }

    func testPEMCertificateAndKeyDeliver() async throws {
        let credentials = ProviderCredentials(
            certificatePath: mock.material.clientCertPath, privateKeyPath: mock.material.clientKeyPath)
        let engine = try engine(credentials)
        let summary = try await engine.run(job("pem", topic: TestTLSMaterial.clientTopic + ".voip", tokens: 3)) { _ in
        }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.delivered, 3)
    }

    func testJobForAnotherTopicIsRefusedBeforeSending() async throws {
        let engine = try engine(p12)
        do {
            _ = try await engine.run(job("other", topic: "com.other.app", tokens: 3)) { _ in }
            XCTFail("a job for a topic the certificate does not cover must be refused")
        } catch {
            XCTAssertEqual(error.kind, .invalidNotification)
            XCTAssertTrue(error.message.contains("com.other.app"), error.message)
            XCTAssertTrue(error.message.contains("covers com.example.app, com.example.app.voip"), error.message)
        }
        // A Live Activity update of the certificate's app: APNs takes those with token authentication only.
        do {
            _ = try await engine.run(
                job("activity", topic: TestTLSMaterial.clientTopic + ".push-type.liveactivity", tokens: 1)
            ) { _ in }
            XCTFail("a Live Activity push must be refused with a certificate")
        } catch {
            XCTAssertTrue(error.message.contains("token authentication"), error.message)
        }
        let covered = try await engine.run(job("covered", topic: TestTLSMaterial.clientTopic, tokens: 1)) { _ in }
        await engine.shutdown()
        XCTAssertEqual(covered.counts.delivered, 1)
        XCTAssertEqual(mock.stats.requests, 1, "only the covered job reached APNs")
    }

    func testCertificateDescribesItselfAndHidesThePassword() throws {
        let certificate = try XCTUnwrap(try p12.certificate())
        XCTAssertEqual(
            certificate.topics,
            [
                TestTLSMaterial.clientTopic, TestTLSMaterial.clientTopic + ".voip",
                TestTLSMaterial.clientTopic + ".complication",
            ])
        XCTAssertEqual(certificate.commonName, "Apple Push Services: \(TestTLSMaterial.clientTopic)")
        XCTAssertTrue(certificate.development && certificate.production)
        let now = Int64(Date().timeIntervalSince1970)
        XCTAssertGreaterThan(certificate.notAfter, now + 3000 * 86_400)
        XCTAssertLessThanOrEqual(certificate.notBefore, now)
        XCTAssertTrue(p12.usesCertificate)
        XCTAssertNil(
            try ProviderCredentials(keyPath: mock.material.authKeyP8Path, keyID: "K", teamID: "T").certificate())
        var dumped = ""
        dump(p12, to: &dumped)
        for text in [p12.description, String(reflecting: p12), dumped] {
            XCTAssertTrue(text.contains(mock.material.clientP12Path), text)
            XCTAssertFalse(text.contains(TestTLSMaterial.clientP12Password), text)
        }
    }

    func testUnusableCertificatesAreCredentialErrorsNamingTheCause() throws {
        let cases: [(ProviderCredentials, String)] = [
            (ProviderCredentials(pkcs12Path: mock.material.clientP12Path, password: "nope"), "wrong password"),
            (ProviderCredentials(pkcs12Path: mock.material.directory + "/none.p12", password: "x"), "not found"),
            (ProviderCredentials(pkcs12Path: mock.material.caPEMPath, password: "x"), "not a PKCS#12"),
            (
                ProviderCredentials(
                    certificatePath: mock.material.clientCertPath, privateKeyPath: mock.material.serverKeyPath),
                "does not belong"
            ),
            (
                ProviderCredentials(
                    certificatePath: mock.material.clientCertPath, privateKeyPath: mock.material.caPEMPath),
                "no PEM private key"
            ),
        ]
        for (credentials, cause) in cases {
            XCTAssertThrowsError(try engine(credentials)) { error in
                let error = error as! FanoutError
                XCTAssertEqual(error.kind, .credentials)
                XCTAssertTrue(error.message.contains(cause), "\(cause) not in \(error.message)")
                XCTAssertFalse(error.message.contains("nope"))
            }
        }
        XCTAssertEqual(mock.stats.snapshot()["connections"] as? Int, 0)
    }

    func testExpiryIsWarnedOfWithinThirtyDays() throws {
        let authority = try TestCertificateAuthority.generate()
        let path = mock.material.directory + "/soon.pem"
        let soon = try authority.issueProviderCertificate(bundleID: "com.example.soon", validDays: 10)
        try Data((soon.certificatePEM + soon.privateKeyPEM).utf8).write(to: URL(fileURLWithPath: path))
        let certificate = try XCTUnwrap(
            try ProviderCredentials(certificatePath: path, privateKeyPath: path).certificate())
        let now = Int64(Date().timeIntervalSince1970)
        let status = certificate.expiryStatus(now: now)
        XCTAssertFalse(status.expired)
        XCTAssertTrue(status.warning)
        let days = (certificate.notAfter - now) / 86_400
        XCTAssertTrue((9...10).contains(days), "\(days)")
        XCTAssertTrue(status.message.contains("expires in \(days) days (\(certificate.expiryText))"), status.message)
        XCTAssertTrue(certificate.expiryStatus(now: certificate.notAfter).expired)
        XCTAssertFalse(certificate.expiryStatus(now: certificate.notAfter - 31 * 86_400).warning)
    }
}
