import FanoutTestSupport
// The real `fanout push` binary against a real `mock-apns` subprocess, both found next to the test runner.
import FanoutTransport
import Foundation
import XCTest

final class PushCommandTests: XCTestCase {
    static let topic = "com.example.app"
    static let keyID = "ABC123DEFG"
    static let teamID = "DEF123GHIJ"
    static let payload = #"{"aps":{"alert":"hi"}}"#
    static let token = testDeviceToken(1)
    static let unregisteredToken = "bbbb" + String(repeating: "0", count: 60)

    /// Per-test scratch directory, the mock's TLS directory and the running mock.
    private var scratch = ""
    private var tlsDirectory = ""
    private var statsPath = ""
    private var recordPath = ""
    private var mock: MockAPNsProcess?
    /// Files whose contents must never show up in fanout's output (signing keys).
    private var secretFiles: [String] = []

    private var material: TestTLSMaterial { TestTLSMaterial(directory: tlsDirectory) }

    override func setUpWithError() throws {
        scratch = try ProcessSupport.temporaryDirectory(for: self, "push")
        tlsDirectory = (scratch as NSString).appendingPathComponent("tls")
        statsPath = (scratch as NSString).appendingPathComponent("stats.json")
        recordPath = (scratch as NSString).appendingPathComponent("record.txt")
        secretFiles = []
    }

    override func tearDown() {
        if let mock { _ = try? mock.stop() }
        mock = nil
        super.tearDown()
    }

    // MARK: Helpers

    /// Starts mock-apns with token checks against its own key, requiring our key and team ids.
    @discardableResult
    private func startMock(extra: [String] = []) throws -> MockAPNsProcess {
        let unregisteredPath = (scratch as NSString).appendingPathComponent("unregistered.txt")
        try Data("\(Self.unregisteredToken)\n".utf8).write(to: URL(fileURLWithPath: unregisteredPath))
        let started = try MockAPNsProcess(
            arguments: [
                "--listen", "127.0.0.1:0", "--tls-dir", tlsDirectory, "--key-id", Self.keyID, "--team-id", Self.teamID,
                "--unregistered", unregisteredPath, "--stats", statsPath, "--record", recordPath,
            ] + extra)
        mock = started
        secretFiles.append(material.authKeyP8Path)
        XCTAssertEqual(started.host, "127.0.0.1")
        return started
    }

    /// Stops the mock (it writes its stats and record files on exit) and returns its stats.
    private func stopMock() throws -> [String: Any] {
        guard let mock else { throw ProcessSupportError("no mock running") }
        self.mock = nil
        XCTAssertEqual(try mock.stop(), 0, "mock-apns exit status after SIGTERM")
        return try MockAPNsProcess.readStats(statsPath)
    }

    /// `fanout push` with all the usual arguments, `overrides` replacing flags by name (nil value: flag left out).
    private func pushArguments(
        token: String = PushCommandTests.token, _ overrides: [String: String?] = [:], credentials: Bool = true,
        extra: [String] = []
    ) -> [String] {
        var flags: [(String, String?)] = [
            ("--token", token), ("--topic", Self.topic), ("--payload", Self.payload),
            ("--endpoint", "localhost:\(mock?.port ?? 9)"), ("--ca-file", material.caPEMPath),
        ]
        if credentials {
            flags += [("--key", material.authKeyP8Path), ("--key-id", Self.keyID), ("--team-id", Self.teamID)]
        }
        var arguments = ["push"]
        for (flag, value) in flags {
            let chosen = overrides.keys.contains(flag) ? overrides[flag]! : value
            if let chosen { arguments += [flag, chosen] }
        }
        for (flag, value) in overrides where !flags.contains(where: { $0.0 == flag }) {
            if let value { arguments += [flag, value] }
        }
        return arguments + extra
    }

    /// Runs the `fanout` binary and checks that no signing key or provider token appears in what it printed.
    private func runFanout(
        _ arguments: [String], environment: [String: String] = [:], file: StaticString = #filePath, line: UInt = #line
    ) throws -> ProcessResult {
        let result = try ProcessSupport.run(
            try ProcessSupport.builtExecutable("fanout"), arguments,
            environment: ProcessSupport.cleanEnvironment(adding: environment), timeout: 30)
        assertNoSecrets(in: result, file: file, line: line)
        return result
    }

    private func assertNoSecrets(in result: ProcessResult, file: StaticString, line: UInt) {
        let output = result.stdout + "\n" + result.stderr
        let outputBytes = result.stdoutData + result.stderrData
        XCTAssertFalse(
            output.lowercased().contains("bearer"), "authorization text in output: \(result.summary)", file: file,
            line: line)
        XCTAssertFalse(output.contains("eyJ"), "a JWT in output: \(result.summary)", file: file, line: line)
        for path in secretFiles {
            guard let key = FileManager.default.contents(atPath: path), !key.isEmpty else { continue }
            XCTAssertNil(outputBytes.range(of: key), "the bytes of \(path) in output", file: file, line: line)
            // Every line of the PEM body (the base64 of the key), on its own.
            for keyLine in String(decoding: key, as: UTF8.self).split(separator: "\n")
            where !keyLine.hasPrefix("-----") && keyLine.count >= 16 {
                XCTAssertFalse(
                    output.contains(keyLine), "a line of \(path) in output: \(result.summary)", file: file, line: line)
            }
        }
    }

    /// Exit 2, nothing on stdout, exactly one line on stderr that contains every one of `mentions`.
    private func assertRefused(
        _ result: ProcessResult, mentioning mentions: [String], file: StaticString = #filePath, line: UInt = #line
    ) {
        XCTAssertEqual(result.exitCode, 2, result.summary, file: file, line: line)
        XCTAssertEqual(result.stdout, "", "stdout must be empty: \(result.summary)", file: file, line: line)
        XCTAssertTrue(
            result.stderr.hasSuffix("\n"), "stderr must be one whole line: \(result.summary)", file: file, line: line)
        XCTAssertEqual(
            result.stderr.filter { $0 == "\n" }.count, 1, "stderr must be exactly one line: \(result.summary)",
            file: file,
            line: line)
        let message = result.stderrLines.first ?? ""
        XCTAssertTrue(message.hasPrefix("fanout"), "the line names the command: \(message)", file: file, line: line)
        for mention in mentions {
            XCTAssertTrue(
                message.lowercased().contains(mention.lowercased()), "'\(mention)' not in the error line: \(message)",
                file: file, line: line)
        }
    }

    /// Exit 0 or 1 with APNs's answer on stdout and nothing on stderr; returns the `name: value` lines.
    private func assertAnswered(
        _ result: ProcessResult, exitCode: Int32, status: Int, file: StaticString = #filePath, line: UInt = #line
    ) -> [String: String] {
        XCTAssertEqual(result.exitCode, exitCode, result.summary, file: file, line: line)
        XCTAssertFalse(result.killedBySignal, "fanout crashed: \(result.summary)", file: file, line: line)
        XCTAssertEqual(
            result.stderr, "", "stderr must be empty after an answer: \(result.summary)", file: file, line: line)
        var fields: [String: String] = [:]
        for outputLine in result.stdoutLines {
            guard let colon = outputLine.firstIndex(of: ":") else { continue }
            fields[String(outputLine[..<colon])] = outputLine[outputLine.index(after: colon)...]
                .trimmingCharacters(in: .whitespaces)
        }
        XCTAssertEqual(result.stdoutLines.first, "status: \(status)", result.summary, file: file, line: line)
        XCTAssertEqual(fields["status"], "\(status)", result.summary, file: file, line: line)
        let apnsID = fields["apns-id"] ?? ""
        XCTAssertNotNil(UUID(uuidString: apnsID), "apns-id line with a UUID: \(result.summary)", file: file, line: line)
        return fields
    }

    private func recordedLines() -> [String] {
        let text = (try? String(contentsOfFile: recordPath, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").map(String.init)
    }

    // MARK: Delivered

    func testPushWithFlagsIsDeliveredAndPrintsStatusAndApnsID() throws {
        try startMock()
        let result = try runFanout(pushArguments())
        let fields = assertAnswered(result, exitCode: 0, status: 200)
        XCTAssertNil(fields["reason"], result.summary)
        let stats = try stopMock()
        XCTAssertEqual(stats["accepted"] as? Int, 1, "\(stats)")
        XCTAssertEqual(stats["requests"] as? Int, 1, "\(stats)")
        // The mock recorded the same notification: our token and the apns-id fanout printed.
        XCTAssertEqual(recordedLines(), ["\(Self.token) \(fields["apns-id"] ?? "?")"])
    }

    func testPushWithCredentialsFromEnvironmentIsDelivered() throws {
        try startMock()
        let result = try runFanout(
            pushArguments(credentials: false),
            environment: [
                "APNS_KEY_PATH": material.authKeyP8Path, "APNS_KEY_ID": Self.keyID, "APNS_TEAM_ID": Self.teamID,
            ])
        _ = assertAnswered(result, exitCode: 0, status: 200)
        let stats = try stopMock()
        XCTAssertEqual(stats["accepted"] as? Int, 1, "\(stats)")
    }

    func testPushWithPayloadFromFileSendsTheFileContents() throws {
        try startMock()
        let good = (scratch as NSString).appendingPathComponent("payload.json")
        try Data(#"{"aps":{"alert":{"title":"Goal!","body":"2-1"},"sound":"default"}}"#.utf8)
            .write(to: URL(fileURLWithPath: good))
        let delivered = try runFanout(pushArguments(["--payload": "@\(good)"]))
        _ = assertAnswered(delivered, exitCode: 0, status: 200)

        // A JSON object without `aps`: fanout accepts it, the mock answers BadPayload, which shows that the
        // file's bytes (not the literal "@path") were sent.
        let noAPS = (scratch as NSString).appendingPathComponent("no-aps.json")
        try Data(#"{"data":{"x":1}}"#.utf8).write(to: URL(fileURLWithPath: noAPS))
        let rejected = try runFanout(pushArguments(["--payload": "@\(noAPS)"]))
        let fields = assertAnswered(rejected, exitCode: 1, status: 400)
        XCTAssertEqual(fields["reason"], "BadPayload", rejected.summary)

        let missing = (scratch as NSString).appendingPathComponent("missing.json")
        assertRefused(try runFanout(pushArguments(["--payload": "@\(missing)"])), mentioning: ["--payload", missing])

        let stats = try stopMock()
        XCTAssertEqual(stats["accepted"] as? Int, 1, "\(stats)")
        XCTAssertEqual(stats["requests"] as? Int, 2, "\(stats)")
    }

    // MARK: APNs errors

    func testUnregisteredTokenExitsOneWithStatusAndReason() throws {
        try startMock()
        let result = try runFanout(pushArguments(token: Self.unregisteredToken))
        let fields = assertAnswered(result, exitCode: 1, status: 410)
        XCTAssertEqual(fields["reason"], "Unregistered", result.summary)
        XCTAssertTrue(result.stdoutLines.contains("reason: Unregistered"), result.summary)
        XCTAssertNotNil(fields["timestamp"].flatMap { Int64($0) }, "410 carries a timestamp: \(result.summary)")
        let stats = try stopMock()
        XCTAssertEqual(stats["accepted"] as? Int, 0, "\(stats)")
        XCTAssertEqual((stats["by_status"] as? [String: Int])?["410"], 1, "\(stats)")
        XCTAssertEqual(recordedLines(), [])
    }

    // MARK: Deadlines

    /// A server that accepts the stream and never answers it: push gives up at its deadline, says so
    /// in one line, and exits non-zero (the notification may have been delivered, so not 2).
    func testNeverAnsweredPushEndsAtItsDeadlineWithOneLineNamingTheTimeout() throws {
        try startMock(extra: ["--blackhole-every", "1"])
        let started = Date()
        let result = try runFanout(pushArguments(["--request-timeout": "2"]))
        let elapsed = Date().timeIntervalSince(started)
        XCTAssertLessThan(elapsed, 2 + 1 * testTimeScale, "push took \(elapsed) s against a 2 s deadline")
        XCTAssertGreaterThanOrEqual(elapsed, 1.9, "push gave up before its deadline")
        XCTAssertEqual(result.exitCode, 1, result.summary)
        XCTAssertEqual(result.stdout, "", result.summary)
        XCTAssertEqual(result.stderrLines.count, 1, result.summary)
        XCTAssertTrue(result.stderr.contains("Timeout"), result.summary)
        XCTAssertTrue(result.stderr.contains("2"), result.summary)
        let stats = try stopMock()
        XCTAssertEqual(stats["streams_blackholed"] as? Int, 1)
        XCTAssertEqual(stats["accepted"] as? Int, 0)
    }

    /// With --attempts 3 a timed-out push is sent again (same apns-id) and the second answer counts.
    func testTimedOutPushIsRetriedWithAttempts() throws {
        try startMock(extra: ["--blackhole-every", "2"])  // the mock's 2nd, 4th, ... streams hang
        XCTAssertEqual(try runFanout(pushArguments()).exitCode, 0, "the 1st stream is answered")
        let apnsID = "3F2504E0-4F89-11D3-9A0C-0305E82C3301"
        let result = try runFanout(
            pushArguments(["--request-timeout": "1", "--attempts": "3", "--apns-id": apnsID]))
        XCTAssertEqual(result.exitCode, 0, result.summary)
        XCTAssertTrue(result.stdoutLines.contains("apns-id: \(apnsID)"), result.summary)
        let stats = try stopMock()
        XCTAssertEqual(stats["accepted"] as? Int, 2)
        XCTAssertEqual(stats["streams_blackholed"] as? Int, 1, "the retry went out after the deadline")
    }

    // MARK: Refused before anything is delivered (exit 2)

    func testMissingKeyFileExitsTwoWithOneLine() throws {
        try startMock()
        let missing = (scratch as NSString).appendingPathComponent("no-such-key.p8")
        let result = try runFanout(pushArguments(["--key": missing]))
        assertRefused(result, mentioning: [missing, "not found"])
        XCTAssertEqual(try stopMock()["requests"] as? Int, 0)
    }

    func testMalformedKeyFilesExitTwoWithOneLineAndAreNotEchoed() throws {
        try startMock()
        let garbage = (scratch as NSString).appendingPathComponent("garbage.p8")
        try Data("not a key at all: 3q2+7w== Zm9vYmFyYmF6cXV4\n".utf8).write(to: URL(fileURLWithPath: garbage))
        let armored = (scratch as NSString).appendingPathComponent("armored.p8")
        // A well-formed PEM frame around a body that is not a key (header split for secret scanners).
        let armoredText =
            "-----BEGIN PRIVATE " + "KEY-----\nTUlJQ2FHVnNiRzhnZDI5eWJHUWdkR2hwY3lCcGN5QnViM1FnWVNCclpYaz0=\n"
            + "-----END PRIVATE KEY-----\n"
        try Data(armoredText.utf8).write(to: URL(fileURLWithPath: armored))
        secretFiles += [garbage, armored]
        for path in [garbage, armored] {
            let result = try runFanout(pushArguments(["--key": path]))
            assertRefused(result, mentioning: [path])
            XCTAssertFalse(result.stderr.contains("Zm9vYmFyYmF6cXV4"), result.summary)
        }
        XCTAssertEqual(try stopMock()["requests"] as? Int, 0)
    }

    func testBadTokenExitsTwoWithOneLine() throws {
        try startMock()
        assertRefused(try runFanout(pushArguments(token: "xyz")), mentioning: ["--token"])
        XCTAssertEqual(try stopMock()["requests"] as? Int, 0)
    }

    func testUnreachableEndpointExitsTwoWithOneLine() throws {
        try startMock()  // for the key; the endpoint is elsewhere
        let result = try runFanout(pushArguments(["--endpoint": "127.0.0.1:1"]))
        assertRefused(result, mentioning: ["127.0.0.1:1", "refused"])
    }

    func testUntrustedServerCertificateExitsTwoWithUnknownCA() throws {
        try startMock()
        let otherDirectory = (scratch as NSString).appendingPathComponent("other-tls")
        let other = try TestTLSMaterial.createOrReuse(in: otherDirectory)
        XCTAssertNotEqual(
            FileManager.default.contents(atPath: other.caPEMPath),
            FileManager.default.contents(atPath: material.caPEMPath))
        let result = try runFanout(pushArguments(["--ca-file": other.caPEMPath]))
        assertRefused(result, mentioning: ["unknown CA"])
        XCTAssertEqual(try stopMock()["requests"] as? Int, 0)
    }

    func testMissingTopicExitsTwoWithOneLine() throws {
        try startMock()
        assertRefused(try runFanout(pushArguments(["--topic": nil])), mentioning: ["--topic"])
        XCTAssertEqual(try stopMock()["requests"] as? Int, 0)
    }

    func testUnknownOptionExitsTwoWithOneLine() throws {
        try startMock()
        assertRefused(try runFanout(pushArguments(extra: ["--bogus-flag"])), mentioning: ["--bogus-flag"])
        XCTAssertEqual(try stopMock()["requests"] as? Int, 0)
    }

    func testUnknownCommandExitsTwoWithOneLine() throws {
        assertRefused(try runFanout(["pusj"]), mentioning: ["pusj"])
    }

    // MARK: Usage

    func testHelpPrintsUsageAndExitsZero() throws {
        let fanout = try ProcessSupport.builtExecutable("fanout")
        let mockAPNs = try ProcessSupport.builtExecutable("mock-apns")
        let cases: [(String, [String], String)] = [
            (fanout, ["--help"], "usage: fanout <command>"),
            (fanout, ["push", "--help"], "usage: fanout push --token HEX"),
            (mockAPNs, ["--help"], "usage: mock-apns --listen HOST:PORT"),
        ]
        for (executable, arguments, expected) in cases {
            let result = try ProcessSupport.run(executable, arguments, environment: ProcessSupport.cleanEnvironment())
            XCTAssertEqual(result.exitCode, 0, result.summary)
            XCTAssertTrue(result.stdout.contains(expected), result.summary)
            XCTAssertEqual(result.stderr, "", result.summary)
        }
    }

    /// Bad arguments give a one-line error and exit status 2 (each command's guide, e.g. docs/SEND.md). Every
    /// command given nothing says what is missing on one line of stderr and exits 2 (`fanout channels` printed its
    /// 32-line usage on stdout).
    func testEveryCommandGivenNoArgumentsExitsTwoWithOneLine() throws {
        let fanout = try ProcessSupport.builtExecutable("fanout")
        let commands = [
            "send", "validate", "push", "registry", "channels", "serve", "enqueue", "worker", "results", "status",
        ]
        for command in commands {
            let result = try ProcessSupport.run(fanout, [command], environment: ProcessSupport.cleanEnvironment())
            XCTAssertEqual(result.exitCode, 2, "\(command): \(result.summary)")
            XCTAssertEqual(result.stdout, "", "\(command): \(result.summary)")
            XCTAssertEqual(result.stderrLines.count, 1, "\(command): \(result.summary)")
            XCTAssertTrue(result.stderr.hasPrefix("fanout \(command): "), "\(command): \(result.summary)")
        }
    }

    func testMockAPNsWithoutListenExitsTwoWithOneLine() throws {
        let mockAPNs = try ProcessSupport.builtExecutable("mock-apns")
        let unusedDirectory = (scratch as NSString).appendingPathComponent("unused-tls")
        for arguments in [[], ["--tls-dir", unusedDirectory]] {
            let result = try ProcessSupport.run(mockAPNs, arguments, environment: ProcessSupport.cleanEnvironment())
            XCTAssertEqual(result.exitCode, 2, result.summary)
            XCTAssertEqual(result.stdout, "", result.summary)
            XCTAssertEqual(result.stderr.filter { $0 == "\n" }.count, 1, result.summary)
            XCTAssertTrue(result.stderr.hasPrefix("mock-apns: "), result.summary)
            XCTAssertTrue(result.stderr.contains("--listen"), result.summary)
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: unusedDirectory), "nothing is created on a usage error")
    }

    /// `--h2c` is one of the three transports: TLS flags beside it are refused, and so are token checks it could not
    /// make.
    func testMockAPNsH2CRefusesTLSBesideIt() throws {
        let mockAPNs = try ProcessSupport.builtExecutable("mock-apns")
        let unusedDirectory = (scratch as NSString).appendingPathComponent("unused-tls")
        let cases: [([String], [String])] = [
            (["--h2c", "--tls-dir", unusedDirectory, "--no-auth"], ["--h2c", "--tls-dir"]),
            (["--h2c", "--cert", "c.pem", "--key", "k.pem", "--no-auth"], ["--h2c", "--cert"]),
            // Without a key it checks no token, so it cannot check these either.
            (["--h2c", "--key-id", "KEYID12345"], ["--key-id", "--auth-key"]),
        ]
        for (arguments, mentions) in cases {
            let result = try ProcessSupport.run(
                mockAPNs, ["--listen", "127.0.0.1:0"] + arguments, environment: ProcessSupport.cleanEnvironment())
            XCTAssertEqual(result.exitCode, 2, result.summary)
            XCTAssertEqual(result.stdout, "", result.summary)
            XCTAssertEqual(result.stderr.filter { $0 == "\n" }.count, 1, result.summary)
            for mention in mentions { XCTAssertTrue(result.stderr.contains(mention), result.summary) }
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: unusedDirectory), "nothing is created on a usage error")
    }
}
