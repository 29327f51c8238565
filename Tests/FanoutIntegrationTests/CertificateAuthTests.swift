import FanoutTestSupport
// Certificate-based provider authentication end to end: the real `fanout push` and `fanout send` binaries with the
// provider certificate mock-apns's --tls-dir writes, against a mock-apns that requires client certificates
// (--client-ca) and takes no provider token (--no-auth).
import FanoutTransport
import Foundation
import XCTest

final class CertificateAuthTests: XCTestCase {
    static let payload = #"{"aps":{"alert":"hi"}}"#
    static let passwordVariable = "FANOUT_TEST_CERT_PASSWORD"

    private var scratch = ""
    private var statsPath = ""
    private var mock: MockAPNsProcess?
    private var material: TestTLSMaterial {
        TestTLSMaterial(directory: (scratch as NSString).appendingPathComponent("tls"))
    }

    override func setUpWithError() throws {
        scratch = try ProcessSupport.temporaryDirectory(for: self, "cert")
        statsPath = (scratch as NSString).appendingPathComponent("stats.json")
        mock = try MockAPNsProcess(
            arguments: [
                "--listen", "127.0.0.1:0", "--tls-dir", material.directory, "--no-auth", "--client-ca",
                material.caPEMPath, "--stats", statsPath,
            ])
    }

    override func tearDown() {
        if let mock { _ = try? mock.stop() }
        mock = nil
        super.tearDown()
    }

    /// Stops the mock (it writes its stats on exit) and returns how many requests it received and accepted.
    private func stopMock() throws -> (requests: Int, accepted: Int, reasons: [String: Any]) {
        guard let mock else { throw ProcessSupportError("no mock running") }
        self.mock = nil
        XCTAssertEqual(try mock.stop(), 0)
        let stats = try MockAPNsProcess.readStats(statsPath)
        return (
            stats["requests"] as? Int ?? -1, stats["accepted"] as? Int ?? -1,
            stats["by_reason"] as? [String: Any] ?? [:]
        )
    }

    private func runFanout(_ arguments: [String], password: String? = TestTLSMaterial.clientP12Password) throws
        -> ProcessResult
    {
        var environment: [String: String] = [:]
        if let password { environment[Self.passwordVariable] = password }
        let result = try ProcessSupport.run(
            try ProcessSupport.builtExecutable("fanout"), arguments,
            environment: ProcessSupport.cleanEnvironment(adding: environment), timeout: 30)
        // The password never shows, whatever happened.
        XCTAssertFalse(
            (result.stdout + result.stderr).contains(TestTLSMaterial.clientP12Password), "password in output")
        XCTAssertFalse((result.stdout + result.stderr).lowercased().contains("bearer"), result.summary)
        return result
    }

    private func push(topic: String = TestTLSMaterial.clientTopic, certificate: [String]? = nil) -> [String] {
        [
            "push", "--token", testDeviceToken(1), "--topic", topic, "--payload", Self.payload, "--endpoint",
            "localhost:\(mock!.port)", "--ca-file", material.caPEMPath,
        ]
            + (certificate ?? ["--cert", material.clientP12Path, "--cert-password-env", Self.passwordVariable])
    }

    /// Exit 2 before anything was sent, with one line on stderr naming every one of `mentions`.
    private func assertRefusedBeforeSending(
        _ result: ProcessResult, mentioning mentions: [String], file: StaticString = #filePath, line: UInt = #line
    ) throws {
        XCTAssertEqual(result.exitCode, 2, result.summary, file: file, line: line)
        XCTAssertEqual(result.stderrLines.count, 1, result.summary, file: file, line: line)
        for mention in mentions {
            XCTAssertTrue(
                result.stderr.contains(mention), "'\(mention)' not in: \(result.stderr)", file: file, line: line)
        }
        XCTAssertEqual(try stopMock().requests, 0, "nothing reached the mock", file: file, line: line)
    }

    // MARK: fanout push

    func testPushWithP12Delivers() throws {
        let result = try runFanout(push())
        XCTAssertEqual(result.exitCode, 0, result.summary)
        XCTAssertTrue(result.stdout.hasPrefix("status: 200"), result.summary)
        let stats = try stopMock()
        XCTAssertEqual(stats.accepted, 1)
    }

    func testPushWithPEMCertificateAndKeyDeliversToAnotherCoveredTopic() throws {
        let result = try runFanout(
            push(
                topic: TestTLSMaterial.clientTopic + ".voip",
                certificate: ["--cert", material.clientCertPath, "--cert-key", material.clientKeyPath])
                + ["--push-type", "voip"])
        XCTAssertEqual(result.exitCode, 0, result.summary)
        XCTAssertEqual(try stopMock().accepted, 1)
    }

    func testPushWithPasswordFileDelivers() throws {
        let passwordFile = (scratch as NSString).appendingPathComponent("password")
        try Data((TestTLSMaterial.clientP12Password + "\n").utf8).write(to: URL(fileURLWithPath: passwordFile))
        let result = try runFanout(
            push(certificate: ["--cert", material.clientP12Path, "--cert-password-file", passwordFile]),
            password: nil)
        XCTAssertEqual(result.exitCode, 0, result.summary)
        XCTAssertEqual(try stopMock().accepted, 1)
    }

    func testPushWithLegacyP12Delivers() throws {
        // As Keychain Access exported them before macOS 14 (RC2-40 and 3DES): `fanout` loads OpenSSL 3's legacy
        // provider for such a file.
        let pem = try String(contentsOfFile: material.clientCertPath, encoding: .utf8)
        let key = try ES256PrivateKey(pemFilePath: material.clientKeyPath)
        let legacy = (scratch as NSString).appendingPathComponent("legacy.p12")
        let bytes = try TestServerCertificate(certificatePEM: pem, key: key).pkcs12(
            password: TestTLSMaterial.clientP12Password, legacy: true)
        try CryptoFile.write(bytes, to: legacy, mode: 0o600)
        let result = try runFanout(
            push(certificate: ["--cert", legacy, "--cert-password-env", Self.passwordVariable]))
        XCTAssertEqual(result.exitCode, 0, result.summary)
        XCTAssertEqual(try stopMock().accepted, 1)
    }

    func testMissingCertificateIsRefusedBeforeSending() throws {
        let missing = (scratch as NSString).appendingPathComponent("missing.p12")
        let result = try runFanout(
            push(certificate: ["--cert", missing, "--cert-password-env", Self.passwordVariable]))
        try assertRefusedBeforeSending(result, mentioning: ["not found", missing])
    }

    func testWrongPasswordIsRefusedBeforeSending() throws {
        let result = try runFanout(push(), password: "not-the-password")
        try assertRefusedBeforeSending(result, mentioning: ["wrong password", material.clientP12Path])
        XCTAssertFalse(result.stderr.contains("not-the-password"))
    }

    func testUnsetPasswordVariableIsRefusedBeforeSending() throws {
        let result = try runFanout(push(), password: nil)
        try assertRefusedBeforeSending(result, mentioning: [Self.passwordVariable, "not set"])
    }

    func testPasswordOnTheCommandLineIsRefused() throws {
        let result = try runFanout(
            push(certificate: ["--cert", material.clientP12Path, "--cert-password", "secret-text"]))
        try assertRefusedBeforeSending(result, mentioning: ["--cert-password-env"])
        XCTAssertFalse(result.stderr.contains("secret-text"))
    }

    func testCertificateForAnotherTopicIsRefusedBeforeSending() throws {
        let result = try runFanout(push(topic: "com.other.app"))
        try assertRefusedBeforeSending(
            result, mentioning: ["com.other.app", "not covered", TestTLSMaterial.clientTopic])
    }

    func testExpiredCertificateIsRefusedBeforeSending() throws {
        // Expired yesterday.
        let certificate = try TestCertificateAuthority.generate().issueProviderCertificate(
            bundleID: TestTLSMaterial.clientTopic, validDays: -1)
        let path = (scratch as NSString).appendingPathComponent("expired.pem")
        try Data((certificate.certificatePEM + certificate.privateKeyPEM).utf8).write(to: URL(fileURLWithPath: path))
        let result = try runFanout(push(certificate: ["--cert", path]))
        try assertRefusedBeforeSending(result, mentioning: ["expired"])
    }

    func testCertificateFromAnotherCAFailsTheHandshake() throws {
        let other = try TestTLSMaterial.create(in: (scratch as NSString).appendingPathComponent("other"))
        let result = try runFanout(
            push(certificate: ["--cert", other.clientP12Path, "--cert-password-env", Self.passwordVariable]))
        XCTAssertEqual(result.exitCode, 2, result.summary)
        XCTAssertTrue(result.stderr.contains("unknown ca"), result.summary)
        XCTAssertEqual(try stopMock().accepted, 0)
    }

    func testSigningKeyWithoutCertificateGetsMissingProviderToken() throws {
        // The mock takes no token (--no-auth): without a client certificate nothing gets in.
        let result = try runFanout(
            push(certificate: ["--key", material.authKeyP8Path, "--key-id", "ABC123DEFG", "--team-id", "DEF123GHIJ"]))
        XCTAssertEqual(result.exitCode, 1, result.summary)
        XCTAssertTrue(result.stdout.contains("MissingProviderToken"), result.summary)
        XCTAssertEqual(try stopMock().accepted, 0)
    }

    // MARK: fanout send

    private func writeJobs(topic: String, tokens: Int) throws -> String {
        let path = (scratch as NSString).appendingPathComponent("jobs.jsonl")
        let list = (1...tokens).map { "\"\(testDeviceToken($0))\"" }.joined(separator: ", ")
        let line =
            #"{"id": "j1", "topic": "\#(topic)", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": [\#(list)]}"#
        try Data((line + "\n").utf8).write(to: URL(fileURLWithPath: path))
        return path
    }

    private func send(jobs: String, configPath: String? = nil, flags: [String]? = nil) -> [String] {
        let results = (scratch as NSString).appendingPathComponent("results.jsonl")
        let certificate = flags ?? ["--cert", material.clientP12Path, "--cert-password-env", Self.passwordVariable]
        return [
            "send", "--jobs", jobs, "--results", results, "--endpoint", "localhost:\(mock!.port)", "--ca-file",
            material.caPEMPath, "--progress", "never",
        ] + (configPath.map { ["--config", $0] } ?? []) + certificate
    }

    func testSendWithP12Delivers() throws {
        let jobs = try writeJobs(topic: TestTLSMaterial.clientTopic, tokens: 200)
        let result = try runFanout(send(jobs: jobs))
        XCTAssertEqual(result.exitCode, 0, result.summary)
        // The expiry is logged at start.
        XCTAssertTrue(result.stderr.contains("provider certificate"), result.summary)
        XCTAssertTrue(result.stderr.contains("expires"), result.summary)
        XCTAssertEqual(try stopMock().accepted, 200)
    }

    func testSendWithCertificateFromConfigFileDelivers() throws {
        let jobs = try writeJobs(topic: TestTLSMaterial.clientTopic, tokens: 10)
        let config = (scratch as NSString).appendingPathComponent("send.json")
        let json = #"{"cert_path": "\#(material.clientP12Path)", "cert_password_env": "\#(Self.passwordVariable)"}"#
        try Data(json.utf8).write(to: URL(fileURLWithPath: config))
        let result = try runFanout(send(jobs: jobs, configPath: config, flags: []))
        XCTAssertEqual(result.exitCode, 0, result.summary)
        XCTAssertEqual(try stopMock().accepted, 10)
    }

    func testCertificateFlagWinsOverTheConfigFilesKey() throws {
        // The mock lets in no token: delivering shows the certificate was used, not the config's key.
        let jobs = try writeJobs(topic: TestTLSMaterial.clientTopic, tokens: 3)
        let config = (scratch as NSString).appendingPathComponent("send.json")
        let json = #"{"key_path": "\#(material.authKeyP8Path)", "key_id": "ABC123DEFG", "team_id": "DEF123GHIJ"}"#
        try Data(json.utf8).write(to: URL(fileURLWithPath: config))
        let result = try runFanout(send(jobs: jobs, configPath: config))
        XCTAssertEqual(result.exitCode, 0, result.summary)
        XCTAssertEqual(try stopMock().accepted, 3)
    }

    func testSendConfigFileRefusesAPassword() throws {
        let jobs = try writeJobs(topic: TestTLSMaterial.clientTopic, tokens: 1)
        let config = (scratch as NSString).appendingPathComponent("send.json")
        let json = #"{"cert_path": "\#(material.clientP12Path)", "cert_password": "secret-text"}"#
        try Data(json.utf8).write(to: URL(fileURLWithPath: config))
        let result = try runFanout(send(jobs: jobs, configPath: config, flags: []))
        try assertRefusedBeforeSending(result, mentioning: ["cert_password_env"])
        XCTAssertFalse(result.stderr.contains("secret-text"))
    }

    func testSendWithWrongPasswordIsRefusedBeforeSending() throws {
        let jobs = try writeJobs(topic: TestTLSMaterial.clientTopic, tokens: 5)
        let result = try runFanout(send(jobs: jobs), password: "wrong")
        try assertRefusedBeforeSending(result, mentioning: ["wrong password", material.clientP12Path])
    }

    func testSendWithMissingCertificateIsRefusedBeforeSending() throws {
        let jobs = try writeJobs(topic: TestTLSMaterial.clientTopic, tokens: 5)
        let missing = (scratch as NSString).appendingPathComponent("gone.p12")
        let result = try runFanout(
            send(jobs: jobs, flags: ["--cert", missing, "--cert-password-env", Self.passwordVariable]))
        try assertRefusedBeforeSending(result, mentioning: ["not found", missing])
    }

    func testSendJobForAnotherTopicIsRefusedWithoutSending() throws {
        // The job file is read while sending, so its topics are not known at start: the job is refused (invalid,
        // naming its topic and what the certificate covers) and none of its notifications goes out.
        let jobs = try writeJobs(topic: "com.other.app", tokens: 5)
        let result = try runFanout(send(jobs: jobs))
        XCTAssertNotEqual(result.exitCode, 0, result.summary)
        let results = try String(
            contentsOfFile: (scratch as NSString).appendingPathComponent("results.jsonl"), encoding: .utf8)
        XCTAssertTrue(results.contains("com.other.app"), results)
        XCTAssertTrue(results.contains("not covered by the provider certificate"), results)
        XCTAssertEqual(try stopMock().requests, 0)
    }
}
