import Fanout
import FanoutObservability
import FanoutTestSupport
import FanoutTransport
import Foundation
import Synchronization
import XCTest

@testable import FanoutService

/// `fanout serve`'s per-app push certificates: the config keys, and the check at start (the log line, the warning,
/// the gauge in /metrics, and the refusals).
final class AppCertificateTests: XCTestCase {
    private static let digest = SHA256Digest.hexHash("sk_test")
    private static let variable = "FANOUT_TEST_CERT_PASSWORD"

    private func parse(_ app: String, directory: String = "/etc/fanout") throws(ServiceConfigurationError)
        -> ServiceConfiguration
    {
        let json =
            #"{"workspaces": {"acme": {"server_keys_sha256": ["\#(Self.digest)"], "apps": {"com.example.app": \#(app)}}}}"#
        return try ServiceConfiguration.parse(Array(json.utf8), relativeTo: directory)
    }

    private func message(_ app: String) -> String {
        do {
            _ = try parse(app)
            return "accepted"
        } catch {
            return error.description
        }
    }

    func testReadsACertificateInsteadOfAKey() throws {
        let config = try parse(
            #"{"cert_path": "certs/app.p12", "cert_password_file": "secrets/p12-password", "endpoint": "sandbox"}"#)
        let app = try XCTUnwrap(config.app("com.example.app"))
        XCTAssertEqual(
            app.certificate,
            AppCertificate(
                path: "/etc/fanout/certs/app.p12", keyPath: nil, passwordEnv: nil,
                passwordFile: "/etc/fanout/secrets/p12-password"))
        XCTAssertEqual(app.keyPath, "")
        XCTAssertEqual(app.keyID, "")
        XCTAssertEqual(app.engineKey, "certificate com.example.app")
        let pem = try parse(#"{"cert_path": "app.pem", "cert_key_path": "app-key.pem"}"#).app("com.example.app")
        XCTAssertEqual(pem?.certificate?.keyPath, "/etc/fanout/app-key.pem")
    }

    func testRefusesAPasswordInTheConfigAndMixedCredentials() {
        XCTAssertEqual(
            message(#"{"cert_path": "a.p12", "cert_password": "hunter2"}"#),
            "workspaces.acme.apps.com.example.app.cert_password: the certificate's password is not kept in the config: "
                + "give cert_password_env or cert_password_file")
        XCTAssertTrue(
            message(#"{"cert_path": "a.p12", "key_path": "k.p8", "cert_password_env": "V"}"#).contains("not both"))
        XCTAssertTrue(
            message(#"{"team_id": "T", "key_id": "K", "key_path": "k.p8", "cert_password_env": "V"}"#).hasSuffix(
                "cert_password_env: goes with cert_path"))
        XCTAssertTrue(
            message(#"{"cert_path": "a.p12", "cert_password_env": "V", "cert_password_file": "f"}"#).contains(
                "one way"))
    }

    func testStartCheckLogsExpirySetsTheGaugeAndRefusesWhatCannotWork() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("fanout-cert-\(UUID())").path
        TemporaryDirectories.removeAtExit(directory)
        let material = try TestTLSMaterial.create(in: directory)
        let config = try parse(
            #"{"cert_path": "\#(material.clientP12Path)", "cert_password_env": "\#(Self.variable)"}"#)
        let lines = FanoutMutex<[String]>([])
        let logger = FanoutLogger(
            sink: .init { bytes in lines.withLock { $0.append(String(decoding: bytes, as: UTF8.self)) } })
        let metrics = FanoutMetrics()
        try AppCertificates.check(
            config, logger: logger, metrics: metrics, environment: [Self.variable: TestTLSMaterial.clientP12Password])
        let certificate = try XCTUnwrap(
            try ProviderCredentials(pkcs12Path: material.clientP12Path, password: TestTLSMaterial.clientP12Password)
                .certificate())
        let logged = lines.withLock { $0.joined() }
        XCTAssertTrue(logged.contains("covers com.example.app"), logged)
        XCTAssertTrue(logged.contains(certificate.expiryText), logged)
        XCTAssertFalse(logged.contains(TestTLSMaterial.clientP12Password))
        XCTAssertTrue(
            metrics.registry.exposition().contains(
                #"fanout_certificate_expiry_seconds{certificate="com.example.app"} \#(certificate.notAfter)"#),
            metrics.registry.exposition())

        // Within 30 days of the expiry: a warning.
        let soon = Date(timeIntervalSince1970: TimeInterval(certificate.notAfter - 5 * 86_400))
        try AppCertificates.check(
            config, logger: logger, metrics: metrics, environment: [Self.variable: TestTLSMaterial.clientP12Password],
            now: soon)
        XCTAssertTrue(lines.withLock { $0.last ?? "" }.contains("expires in 5 days"), lines.withLock { $0.last ?? "" })

        func refusal(_ config: ServiceConfiguration, environment: [String: String], now: Date = Date()) -> String {
            do {
                try AppCertificates.check(config, logger: logger, metrics: metrics, environment: environment, now: now)
                return "accepted"
            } catch {
                return error.description
            }
        }
        let right = [Self.variable: TestTLSMaterial.clientP12Password]
        XCTAssertTrue(refusal(config, environment: [:]).contains("\(Self.variable) is not set"))
        let wrong = refusal(config, environment: [Self.variable: "nope"])
        XCTAssertTrue(wrong.hasPrefix("workspaces.acme.apps.com.example.app: certificate: wrong password"), wrong)
        let expired = Date(timeIntervalSince1970: TimeInterval(certificate.notAfter + 1))
        XCTAssertTrue(refusal(config, environment: right, now: expired).contains("expired"))
        let json =
            #"{"workspaces": {"acme": {"server_keys_sha256": ["\#(Self.digest)"], "apps": {"com.other.app": {"cert_path": "\#(material.clientP12Path)", "cert_password_env": "\#(Self.variable)"}}}}}"#
        let other = try ServiceConfiguration.parse(Array(json.utf8), relativeTo: directory)
        let notCovered = refusal(other, environment: right)
        XCTAssertTrue(notCovered.contains("topic com.other.app is not covered"), notCovered)
    }
}
