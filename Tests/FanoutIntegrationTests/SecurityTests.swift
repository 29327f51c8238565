import Fanout
import Foundation
import XCTest

/// Keys and provider tokens never leak into logs, errors or results; loose key permissions are flagged.
final class SecurityTests: XCTestCase {
    /// The base64 lines of a PEM file (its secret body).
    private func secretLines(ofPEM path: String) throws -> [String] {
        try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n").map(String.init)
            .filter { !$0.hasPrefix("-----") && $0.count > 16 }
    }

    func testAWholeRunWithAuthFailuresLeaksNoKeyOrToken() throws {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "security")
        let tls = "\(directory)/tls"
        let mock = try MockAPNsProcess(
            arguments: [
                "--listen", "127.0.0.1:0", "--tls-dir", tls, "--key-id", "EXPECTED01", "--team-id", "TEAMID1234",
            ])
        defer { _ = try? mock.stop() }
        let token = "ab" + String(repeating: "0", count: 62)
        let jobs = "\(directory)/jobs.jsonl"
        try
            (#"{"id": "secret-test", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "x"}}, "tokens": ["\#(token)"]}"#
            + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let results = "\(directory)/results.jsonl"
        let fanout = try ProcessSupport.builtExecutable("fanout")
        // A key id the mock does not expect: every request is refused with InvalidProviderToken.
        let common = [
            "--endpoint", "localhost:\(mock.port)", "--ca-file", "\(tls)/ca.pem", "--key", "\(tls)/auth-key.p8",
            "--key-id", "WRONGKEY01", "--team-id", "TEAMID1234",
        ]
        let send = try ProcessSupport.run(
            fanout,
            ["send", "--jobs", jobs, "--results", results, "--log-format", "json", "--progress", "always"] + common,
            environment: ProcessSupport.cleanEnvironment(), timeout: 60)
        XCTAssertEqual(send.exitCode, 1, send.summary)
        let resultText = try String(contentsOfFile: results, encoding: .utf8)
        XCTAssertTrue(resultText.contains("InvalidProviderToken"), resultText)
        let push = try ProcessSupport.run(
            fanout,
            ["push", "--token", token, "--topic", "com.example.app", "--payload", #"{"aps":{"alert":"x"}}"#] + common,
            environment: ProcessSupport.cleanEnvironment(), timeout: 30)
        XCTAssertEqual(push.exitCode, 1, push.summary)
        XCTAssertTrue(push.stdout.contains("InvalidProviderToken"), push.summary)

        let everything = [send.stdout, send.stderr, resultText, push.stdout, push.stderr].joined(separator: "\n")
        for line in try secretLines(ofPEM: "\(tls)/auth-key.p8") {
            XCTAssertFalse(everything.contains(line), "a line of the signing key leaked")
        }
        XCTAssertFalse(everything.contains("eyJ"), "a provider token (JWT) leaked")
        XCTAssertFalse(everything.lowercased().contains("bearer "), "an authorization header leaked")
    }

    /// A gateway that reads the .p8 key from a secret store gives its contents (`ProviderCredentials(keyPEM:…)`):
    /// a send works with them, and no description, dump or error of them holds a line of the key.
    func testCredentialsFromTheKeysContentsSendAndNeverShowTheKey() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let pem = try String(contentsOfFile: mock.material.authKeyP8Path, encoding: .utf8)
        let secret = try secretLines(ofPEM: mock.material.authKeyP8Path)
        XCTAssertFalse(secret.isEmpty)
        let credentials = try ProviderCredentials(keyPEM: pem, keyID: "KEYID12345", teamID: "TEAMID1234")
        XCTAssertEqual(credentials.keyPath, "")
        XCTAssertNil(credentials.permissionWarning())
        var configuration = FanoutEngineConfiguration(
            endpoint: APNsEndpoint(host: "localhost", port: mock.port), credentials: credentials,
            caFile: mock.material.caPEMPath)
        configuration.loops = 1
        let engine = try FanoutEngine(configuration: configuration)
        let result = try await engine.send(
            PushNotification(
                deviceToken: testDeviceToken(1),
                headers: NotificationHeaders(pushType: .alert, topic: "com.example.app"),
                payload: Array(#"{"aps":{"alert":"hi"}}"#.utf8)))
        await engine.shutdown()
        XCTAssertEqual(result.outcome, .delivered)

        var dumped = ""
        dump(credentials, to: &dumped)
        var shown = [
            String(describing: credentials), String(reflecting: credentials), "\(credentials)", dumped,
            String(reflecting: configuration), String(describing: configuration),
        ]
        XCTAssertTrue(shown[0].contains("KEYID12345") && shown[0].contains("in memory"), shown[0])
        // A broken key's error says what is wrong, not what the text holds.
        let broken = pem.replacingOccurrences(of: secret[0], with: String(secret[0].reversed()))
        do {
            _ = try ProviderCredentials(keyPEM: broken, keyID: "KEYID12345", teamID: "TEAMID1234")
            XCTFail("a broken key was taken")
        } catch {
            XCTAssertEqual(error.kind, .credentials)
            shown.append(error.message)
        }
        do {
            _ = try ProviderCredentials(keyPEM: "not a key", keyID: "KEYID12345", teamID: "TEAMID1234")
            XCTFail("text that is no key was taken")
        } catch {
            XCTAssertTrue(error.message.contains("not a PEM file"), error.message)
        }
        for text in shown {
            for line in secret + secret.map({ String($0.reversed()) }) {
                XCTAssertFalse(text.contains(line), "a line of the signing key shows in: \(text)")
            }
        }
    }

    func testAKeyReadableByOthersIsWarnedAbout() throws {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "perm")
        let tls = "\(directory)/tls"
        let mock = try MockAPNsProcess(arguments: ["--listen", "127.0.0.1:0", "--tls-dir", tls])
        defer { _ = try? mock.stop() }
        let loose = "\(directory)/loose.p8"
        try FileManager.default.copyItem(atPath: "\(tls)/auth-key.p8", toPath: loose)
        chmod(loose, 0o644)
        let push = try ProcessSupport.run(
            try ProcessSupport.builtExecutable("fanout"),
            [
                "push", "--token", "ab" + String(repeating: "0", count: 62), "--topic", "com.example.app", "--payload",
                #"{"aps":{"alert":"x"}}"#, "--endpoint", "localhost:\(mock.port)", "--ca-file", "\(tls)/ca.pem",
                "--key", loose, "--key-id", "KEYID12345", "--team-id", "TEAMID1234",
            ], environment: ProcessSupport.cleanEnvironment(), timeout: 30)
        XCTAssertEqual(push.exitCode, 0, push.summary)
        XCTAssertTrue(push.stderr.contains("loose.p8 is readable by group or others (mode 644)"), push.summary)
        for line in try secretLines(ofPEM: loose) { XCTAssertFalse(push.stderr.contains(line)) }
    }
}
