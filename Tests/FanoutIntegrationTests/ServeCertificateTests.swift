// `fanout serve` with an app that authenticates with its push certificate: the real binary, a config naming the
// certificate and the variable holding its password, and an in-process mock-apns that requires client
// certificates signed by the test's CA for that app (and provider tokens from the other).
import FanoutTestSupport
import FanoutTransport
import Foundation
import MockAPNsKit
import XCTest

final class ServeCertificateTests: XCTestCase {
    static let variable = "ACME_P12_PASSWORD"
    static let password = "acme-p12-password"

    private var directory = ""
    private var caPath = ""
    private var p12Path = ""

    override func setUpWithError() throws {
        directory = try ProcessSupport.temporaryDirectory(for: self, "serve-cert")
        let authority = try TestCertificateAuthority.generate()
        caPath = (directory as NSString).appendingPathComponent("client-ca.pem")
        p12Path = (directory as NSString).appendingPathComponent("acme.p12")
        try CryptoFile.write(Array(authority.certificatePEM().utf8), to: caPath, mode: 0o644)
        let certificate = try authority.issueProviderCertificate(bundleID: ServeHarness.acmeApp)
        try CryptoFile.write(try certificate.pkcs12(password: Self.password), to: p12Path, mode: 0o600)
    }

    private func harness(_ mock: MockHarness) throws -> ServeHarness {
        try ServeHarness(
            testCase: self, mock: mock, acmeCertificate: ["cert_path": p12Path, "cert_password_env": Self.variable])
    }

    func testAppWithCertificateDeliversAndShowsItsExpiry() throws {
        let caPath = self.caPath
        let mock = try MockHarness { $0.clientCAPath = caPath }
        defer { mock.stop() }
        let serve = try harness(mock)
        try serve.start(environment: [Self.variable: Self.password])
        defer { serve.stop() }

        let token = testDeviceToken(42)
        let push = try serve.curl(
            "POST", "/v1/push", key: ServeKeys.acmeServer,
            json: #"{"alert": {"title": "Hi"}, "audience": {"tokens": ["\#(token)"]}}"#)
        XCTAssertEqual(push.status, 202, push.text)
        let done = try serve.waitForDispatch(try XCTUnwrap(try push.object()["dispatch_id"] as? String))
        XCTAssertEqual(done["delivered"] as? Int, 1, "\(done)")
        XCTAssertEqual(mock.stats.accepted, 1)

        let metrics = try serve.curl("GET", "/metrics")
        XCTAssertTrue(
            metrics.text.contains(#"fanout_certificate_expiry_seconds{certificate="com.acme.app"} "#), metrics.text)
        let log = serve.log
        XCTAssertTrue(log.contains("provider certificate"), log)
        XCTAssertTrue(log.contains("covers com.acme.app"), log)
        XCTAssertFalse(log.contains(Self.password))
    }

    func testWrongPasswordStopsTheStartNamingTheApp() throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let serve = try harness(mock)
        let result = try ProcessSupport.run(
            serve.fanout,
            ["serve", "--config", serve.configPath, "--db", serve.database, "--listen", "127.0.0.1:0"],
            environment: ProcessSupport.cleanEnvironment(adding: [Self.variable: "not-it"]), timeout: 30)
        XCTAssertEqual(result.exitCode, 2, result.summary)
        XCTAssertTrue(result.stderr.contains("workspaces.acme.apps.com.acme.app"), result.summary)
        XCTAssertTrue(result.stderr.contains("wrong password"), result.summary)
        XCTAssertFalse(result.stderr.contains("not-it"))
        XCTAssertEqual(result.stdout, "", "it never listened")
    }
}
