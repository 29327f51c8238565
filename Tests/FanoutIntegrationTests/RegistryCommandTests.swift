// The real `fanout registry` binary on registry files in a scratch directory: every subcommand, the import's
// idempotence, the change feed followed across processes, and the one-line errors for bad input and bad files.
import FanoutTestSupport
import Foundation
import XCTest

class RegistryCommandTests: XCTestCase {
    static let app = "com.acme.app"

    private var scratch = ""
    private var database = ""
    /// The registry on Redis (`--redis`) instead of the file, in `RegistryCommandRedisTests`.
    class var onRedis: Bool { false }
    private var redisURL: String?

    override func setUpWithError() throws {
        scratch = try ProcessSupport.temporaryDirectory(for: self, "registry")
        database = path("registry.db")
        if Self.onRedis { redisURL = try RedisServerProcess(for: self).url }
    }

    /// `--db FILE`, or `--redis URL` in the Redis subclass (unless a test names a file).
    private func location(_ database: String? = nil) -> [String] {
        if database == nil, let redisURL { return ["--redis", redisURL] }
        return ["--db", database ?? self.database]
    }

    // MARK: Helpers

    fileprivate func path(_ name: String) -> String {
        (scratch as NSString).appendingPathComponent(name)
    }

    private static func token(_ number: Int) -> String {
        String(repeating: "0", count: 48) + String(format: "%016x", number)
    }

    /// Runs `fanout registry --db <database> ARGUMENTS`.
    private func registry(_ arguments: [String], database: String? = nil, timeout: TimeInterval = 20) throws
        -> ProcessResult
    {
        try ProcessSupport.run(
            try ProcessSupport.builtExecutable("fanout"), ["registry"] + location(database) + arguments,
            environment: ProcessSupport.cleanEnvironment(), timeout: timeout)
    }

    /// Runs it and expects exit 0; returns stdout's lines as JSON objects.
    @discardableResult
    private func succeed(_ arguments: [String], file: StaticString = #filePath, line: UInt = #line) throws
        -> [[String: Any]]
    {
        let result = try registry(arguments)
        XCTAssertEqual(result.exitCode, 0, result.summary, file: file, line: line)
        return try Self.objects(result.stdoutLines)
    }

    /// Runs it and expects exit 2 with exactly one line on stderr and nothing on stdout; returns the line.
    private func refuse(
        _ arguments: [String], database: String? = nil, file: StaticString = #filePath, line: UInt = #line
    ) throws -> String {
        let result = try registry(arguments, database: database)
        XCTAssertEqual(result.exitCode, 2, result.summary, file: file, line: line)
        XCTAssertEqual(result.stderrLines.count, 1, result.summary, file: file, line: line)
        XCTAssertEqual(result.stdout, "", result.summary, file: file, line: line)
        return result.stderrLines.first ?? ""
    }

    private static func objects(_ lines: [String]) throws -> [[String: Any]] {
        try lines.map { line in
            guard let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
                throw ProcessSupportError("not a JSON object: \(line)")
            }
            return object
        }
    }

    /// The events as (change, reason or "", token) triples, for comparisons.
    private func events(after: Int? = nil) throws -> [(change: String, reason: String, token: String)] {
        let arguments = ["events"] + (after.map { ["--after", String($0)] } ?? [])
        return try succeed(arguments).map {
            ($0["change"] as? String ?? "?", $0["reason"] as? String ?? "", $0["token"] as? String ?? "?")
        }
    }

    fileprivate func stats() throws -> [String: Int] {
        let objects = try succeed(["stats"])
        XCTAssertEqual(objects.count, 1)
        return (objects.first ?? [:]).compactMapValues { $0 as? Int }
    }

    private func write(_ text: String, to name: String) throws -> String {
        let file = path(name)
        try Data(text.utf8).write(to: URL(fileURLWithPath: file))
        return file
    }

    // MARK: Register, rotate, stop

    func testRegisterRotateStopThenListAndEvents() throws {
        let base = ["--app", Self.app, "--activity", "match-7"]
        var output = try succeed(["register"] + base + ["--token", Self.token(1), "--device", "d1", "--user", "u1"])
        XCTAssertEqual(output.first?["added"] as? Int, 1)
        try succeed(["register"] + base + ["--token", Self.token(2), "--device", "d2"])
        output = try succeed(["register"] + base + ["--token", Self.token(3), "--device", "d1", "--user", "u1"])
        XCTAssertEqual(output.first?["rotated"] as? Int, 1)

        let listed = try succeed(["list", "--app", Self.app, "--activity", "match-7"])
        XCTAssertEqual(Set(listed.compactMap { $0["token"] as? String }), [Self.token(2), Self.token(3)])
        XCTAssertEqual(Set(listed.compactMap { $0["device"] as? String }), ["d1", "d2"])
        XCTAssertTrue(listed.allSatisfy { $0["app"] as? String == Self.app && $0["registered_at"] is NSNumber })

        output = try succeed(["stop"] + base + ["--device", "d1"])
        XCTAssertEqual(output.first?["removed"] as? Int, 1)
        XCTAssertEqual(
            try succeed(["list", "--app", Self.app, "--activity", "match-7"]).compactMap { $0["token"] as? String },
            [Self.token(2)])

        let log = try events()
        XCTAssertEqual(log.map(\.change), ["added", "added", "rotated", "removed"])
        XCTAssertEqual(log.map(\.token), [Self.token(1), Self.token(2), Self.token(3), Self.token(3)])
        XCTAssertEqual(log.last?.reason, "stopped")
        // The lines have the shape docs/REGISTRY.md gives, plus kind and seq; --after resumes after a seq.
        let lines = try succeed(["events"])
        XCTAssertEqual(
            Set(lines[0].keys), ["at", "app", "activity_id", "token", "change", "reason", "kind", "seq"])
        XCTAssertTrue(lines[0]["reason"] is NSNull)
        XCTAssertEqual(lines[0]["kind"] as? String, "update")
        let second = try XCTUnwrap(lines[1]["seq"] as? Int)
        XCTAssertEqual(try events(after: second).map(\.change), ["rotated", "removed"])

        // By user and by device: the device line, then its tokens.
        try succeed([
            "register", "--app", Self.app, "--push-to-start", Self.token(9), "--device", "d1", "--user", "u1",
            "--attributes-type", "MatchAttributes",
        ])
        try succeed(["register", "--app", Self.app, "--device", "d3", "--user", "u1", "--push-token", Self.token(8)])
        let byUser = try succeed(["list", "--app", Self.app, "--user", "u1"])
        XCTAssertEqual(Set(byUser.compactMap { $0["device"] as? String }), ["d1", "d3"])
        XCTAssertEqual(byUser.compactMap { $0["push_token"] as? String }, [Self.token(8)])
        XCTAssertEqual(byUser.compactMap { $0["push_to_start_token"] as? String }, [Self.token(9)])
        let byDevice = try succeed(["list", "--app", Self.app, "--device", "d2"])
        XCTAssertEqual(byDevice.compactMap { $0["token"] as? String }, [Self.token(2)])

        let counts = try stats()
        XCTAssertEqual(counts["update_tokens"], 1)
        XCTAssertEqual(counts["push_to_start_tokens"], 1)
        XCTAssertEqual(counts["devices"], 3)
    }

    // MARK: Import

    func testImportingThousandsOfJSONLinesTwiceChangesNothingTheSecondTime() throws {
        var lines = ""
        for index in 0..<3_000 {
            lines +=
                #"{"app": "com.acme.app", "activity_id": "match-\#(index % 3)", "token": ""#
                + Self.token(index + 1) + #"", "device": "d\#(index)", "user": "u\#(index % 100)"}"# + "\n"
        }
        for index in 0..<200 {
            lines +=
                #"{"app": "com.acme.other", "push_to_start_token": ""# + Self.token(10_000 + index)
                + #"", "attributes_type": "MatchAttributes", "device": "p\#(index)"}"# + "\n"
        }
        let file = try write(lines, to: "registrations.jsonl")

        let first = try registry(["import", file])
        XCTAssertEqual(first.exitCode, 0, first.summary)
        let summary = try XCTUnwrap(try Self.objects(first.stdoutLines).first)
        XCTAssertEqual(summary["registrations"] as? Int, 3_200)
        XCTAssertEqual(summary["added"] as? Int, 3_200)
        XCTAssertEqual(summary["invalid"] as? Int, 0)
        XCTAssertTrue(first.stderr.contains("3200 registrations committed"), first.summary)
        XCTAssertTrue(first.stderr.contains("defined app com.acme.other in workspace default"), first.summary)
        let statsAfterFirst = try stats()
        XCTAssertEqual(statsAfterFirst["apps"], 2)
        XCTAssertEqual(statsAfterFirst["update_tokens"], 3_000)
        XCTAssertEqual(statsAfterFirst["push_to_start_tokens"], 200)
        XCTAssertEqual(statsAfterFirst["activities"], 3)
        let eventCount = try events().count
        XCTAssertEqual(eventCount, 3_200)

        let second = try registry(["import", file, "--format", "jsonl"])
        XCTAssertEqual(second.exitCode, 0, second.summary)
        let again = try XCTUnwrap(try Self.objects(second.stdoutLines).first)
        XCTAssertEqual(again["unchanged"] as? Int, 3_200)
        XCTAssertEqual(again["added"] as? Int, 0)
        XCTAssertEqual(try stats(), statsAfterFirst)
        XCTAssertEqual(try events().count, eventCount, "no new events")
        XCTAssertEqual(try succeed(["list", "--app", Self.app, "--activity", "match-1"]).count, 1_000)
    }

    func testCSVImportAndBadLinesAreSkippedNamingTheirField() throws {
        let csv = """
            app,activity_id,token,device,user
            com.acme.app,match-7,\(Self.token(1)),d1,u1
            com.acme.app,match-7,\(Self.token(2)),d2,
            com.acme.app,match-7,not-hex,d3,u3
            com.acme.app,match-8,\(Self.token(4)),,

            """
        let file = try write(csv, to: "registrations.csv")
        let result = try registry(["import", file, "--workspace", "acme"])
        XCTAssertEqual(result.exitCode, 1, "a skipped line: " + result.summary)
        let summary = try XCTUnwrap(try Self.objects(result.stdoutLines).first)
        XCTAssertEqual(summary["added"] as? Int, 3)
        XCTAssertEqual(summary["invalid"] as? Int, 1)
        XCTAssertTrue(result.stderr.contains("line 4: token: "), result.summary)
        XCTAssertEqual(
            Set(
                try succeed(["list", "--app", Self.app, "--activity", "match-7"]).compactMap { $0["token"] as? String }),
            [Self.token(1), Self.token(2)])
        // A list is itself an import file.
        let listed = try registry(["list", "--app", Self.app, "--activity", "match-7"])
        let copy = try write(listed.stdout, to: "copy.jsonl")
        let imported = try registry(["import", copy], database: path("copy.db"))
        XCTAssertEqual(imported.exitCode, 0, imported.summary)
        XCTAssertEqual(try Self.objects(imported.stdoutLines).first?["added"] as? Int, 2)
    }

    // MARK: Bad input and bad files

    func testBadArgumentsAndBadInputExit2WithOneLineAndWriteNothing() throws {
        var line = try refuse(["register", "--app", Self.app, "--activity", "match-7", "--token", "abc123"])
        XCTAssertTrue(line.contains("token: "), line)
        XCTAssertTrue(line.contains("--token"), line)
        XCTAssertFalse(FileManager.default.fileExists(atPath: database), "nothing written, not even the file")

        line = try refuse([
            "register", "--app", Self.app, "--activity", String(repeating: "a", count: 257), "--token", Self.token(1),
        ])
        XCTAssertTrue(line.contains("activity_id: "), line)
        line = try refuse(["register", "--app", Self.app, "--activity", "m", "--token", Self.token(1), "--colour", "x"])
        XCTAssertTrue(line.contains("--colour"), line)
        line = try refuse(["register", "--activity", "m", "--token", Self.token(1)])
        XCTAssertTrue(line.contains("--app"), line)
        line = try refuse(["register", "--app", Self.app, "--push-to-start", Self.token(1)])
        XCTAssertTrue(line.contains("--device"), line)
        line = try refuse(["list", "--app", Self.app])
        XCTAssertTrue(line.contains("--activity"), line)
        XCTAssertFalse(FileManager.default.fileExists(atPath: database))

        if Self.onRedis {
            // A registry on Redis always exists: reads, stop and end of an app it does not hold refuse the app.
            for arguments in [
                ["list", "--app", Self.app, "--activity", "m"], ["end", "--app", Self.app, "--activity", "m"],
                ["stop", "--app", Self.app, "--activity", "m"],
            ] {
                line = try refuse(arguments)
                XCTAssertTrue(line.contains("unknown app \"\(Self.app)\""), line)
            }
        } else {
            // Reads, stop and end refuse a missing registry instead of creating one.
            for arguments in [
                ["stats"], ["prune"], ["events"], ["list", "--app", Self.app, "--activity", "m"],
                ["end", "--app", Self.app, "--activity", "m"], ["stop", "--app", Self.app, "--activity", "m"],
            ] {
                line = try refuse(arguments)
                XCTAssertTrue(line.contains("does not exist"), line)
            }
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: database))

        // Help for the command and each subcommand.
        for subcommand in ["", "register", "stop", "end", "import", "list", "stats", "prune", "events"] {
            let result = try ProcessSupport.run(
                try ProcessSupport.builtExecutable("fanout"),
                ["registry"] + (subcommand.isEmpty ? [] : [subcommand]) + ["--help"])
            XCTAssertEqual(result.exitCode, 0, result.summary)
            XCTAssertTrue(result.stdout.hasPrefix("fanout registry"), result.summary)
        }

        // An unknown field in an import line: skipped, naming it; nothing written for it.
        let file = try write(#"{"app": "com.acme.app", "activity_id": "m", "tokne": "ab"}"# + "\n", to: "bad.jsonl")
        let result = try registry(["import", file])
        XCTAssertEqual(result.exitCode, 1, result.summary)
        XCTAssertTrue(result.stderr.contains("line 1: tokne: unknown field"), result.summary)
        XCTAssertEqual(try stats()["update_tokens"], 0)
    }

    func testAFileThatIsNotARegistryExits2WithOneLineAndIsLeftAlone() throws {
        let text = try write(String(repeating: "just some text, not a database\n", count: 100), to: "notes.txt")
        var random = [UInt8](repeating: 0, count: 16_384)
        var generator = SystemRandomNumberGenerator()
        for index in random.indices { random[index] = generator.next() }
        let bytes = path("random.bin")
        try Data(random).write(to: URL(fileURLWithPath: bytes))

        for file in [text, bytes] {
            let before = try Data(contentsOf: URL(fileURLWithPath: file))
            for arguments in [
                ["stats"], ["register", "--app", Self.app, "--activity", "m", "--token", Self.token(1)],
                ["events"],
            ] {
                let line = try refuse(arguments, database: file)
                XCTAssertTrue(line.contains("is not a Fanout registry"), line)
            }
            XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: file)), before)
        }
    }

    func testARegistryLockedByAnotherProcessExits2AfterTheBusyTimeout() throws {
        guard let python = ProcessSupport.findTool("python3") else { throw XCTSkip("python3 is not installed") }
        try succeed(["register", "--app", Self.app, "--activity", "match-7", "--token", Self.token(1)])
        let script = """
            import sqlite3, sys, time
            connection = sqlite3.connect(sys.argv[1], isolation_level=None)
            connection.execute("BEGIN EXCLUSIVE")
            print("locked", flush=True)
            time.sleep(30)  # holds the lock until the test kills it (the scenario, not a wait)
            """
        let holder = try RunningProcess(python, ["-c", script, database])
        defer { holder.kill(SIGKILL) }
        guard (try? holder.firstStdoutLine(timeout: 10)) == "locked" else {
            throw XCTSkip("python3 cannot lock the registry: \(holder.stderrText())")
        }
        let started = Date()
        let line = try refuse(["register", "--app", Self.app, "--activity", "match-7", "--token", Self.token(2)])
        XCTAssertTrue(line.contains("is locked by another process"), line)
        XCTAssertGreaterThan(Date().timeIntervalSince(started), 4, "waited for the busy timeout first")
        // Reads do not wait for a writer.
        XCTAssertEqual(try stats()["update_tokens"], 1)
    }

    // MARK: The change feed across processes

    func testEventsFollowPrintsARegistrationMadeByAnotherProcess() throws {
        try succeed(["register", "--app", Self.app, "--activity", "match-7", "--token", Self.token(1)])
        let follower = try RunningProcess(
            try ProcessSupport.builtExecutable("fanout"), ["registry"] + location() + ["events", "--follow"],
            environment: ProcessSupport.cleanEnvironment())
        // The event already in the log comes first.
        let first = try follower.firstStdoutLine(timeout: 10)
        XCTAssertTrue(first.contains(Self.token(1)), first)

        try succeed(["register", "--app", Self.app, "--activity", "match-7", "--token", Self.token(2)])
        let deadline = Date().addingTimeInterval(10)
        var seen = false
        while Date() < deadline, follower.isRunning {
            if follower.stdoutText().contains(Self.token(2)) {
                seen = true
                break
            }
            usleep(20_000)
        }
        let status = try follower.stop(timeout: 5)
        XCTAssertTrue(
            seen, "the follower did not print the new event: \(follower.stdoutText()) \(follower.stderrText())")
        XCTAssertEqual(status, 0, "SIGTERM ends --follow cleanly")
        let lines = try Self.objects(follower.stdoutText().split(separator: "\n").map(String.init))
        XCTAssertEqual(lines.compactMap { $0["token"] as? String }, [Self.token(1), Self.token(2)])
        XCTAssertEqual(lines.last?["change"] as? String, "added")
    }

    // MARK: End and prune

    func testEndWithADismissalDateInThePastRemovesTheTokensAsEndedAndPruneRemovesTheActivity() throws {
        for number in 1...3 {
            try succeed([
                "register", "--app", Self.app, "--activity", "match-7", "--token", Self.token(number), "--device",
                "d\(number)",
            ])
        }
        try succeed(["register", "--app", Self.app, "--activity", "match-8", "--token", Self.token(4)])

        // The default dismissal date: 4 hours from now; the tokens stay until then.
        var output = try succeed(["end", "--app", Self.app, "--activity", "match-8"])
        let now = Int(Date().timeIntervalSince1970)
        let dismissal = try XCTUnwrap(output.first?["dismissal_date"] as? Int)
        XCTAssertEqual(Double(dismissal - now), 4 * 3600, accuracy: 60)
        XCTAssertEqual(output.first?["removed"] as? Int, 0)
        XCTAssertEqual(try succeed(["list", "--app", Self.app, "--activity", "match-8"]).count, 1)

        output = try succeed(["end", "--app", Self.app, "--activity", "match-7", "--dismissal-date", "1000"])
        XCTAssertEqual(output.first?["state"] as? String, "ended")
        XCTAssertEqual(output.first?["dismissal_date"] as? Int, 1000)
        XCTAssertEqual(try succeed(["list", "--app", Self.app, "--activity", "match-7"]).count, 0)

        let pruned = try XCTUnwrap(try succeed(["prune"]).first)
        XCTAssertEqual(pruned["activities_removed"] as? Int, 1)
        XCTAssertEqual(pruned["expired"] as? Int, 0)

        let removed = try events().filter { $0.change == "removed" }
        XCTAssertEqual(removed.count, 3)
        XCTAssertTrue(removed.allSatisfy { $0.reason == "ended" }, "\(removed)")
        XCTAssertEqual(Set(removed.map(\.token)), [Self.token(1), Self.token(2), Self.token(3)])
        let counts = try stats()
        XCTAssertEqual(counts["activities"], 1)
        XCTAssertEqual(counts["update_tokens"], 1)

        // The activity is gone: ending it again names the field.
        let line = try refuse(["end", "--app", Self.app, "--activity", "match-7"])
        XCTAssertTrue(line.contains("activity_id: "), line)
    }
}

/// The subcommands again on the registry on Redis (`fanout registry --redis URL`), each declared here so the list is
/// explicit; the file's own failures (not a registry, locked) are replaced by Redis's (two locations, unreachable).
final class RegistryCommandRedisTests: RegistryCommandTests {
    override class var onRedis: Bool { true }

    override func testRegisterRotateStopThenListAndEvents() throws {
        try super.testRegisterRotateStopThenListAndEvents()
    }
    override func testImportingThousandsOfJSONLinesTwiceChangesNothingTheSecondTime() throws {
        try super.testImportingThousandsOfJSONLinesTwiceChangesNothingTheSecondTime()
    }
    override func testCSVImportAndBadLinesAreSkippedNamingTheirField() throws {
        try super.testCSVImportAndBadLinesAreSkippedNamingTheirField()
    }
    override func testEventsFollowPrintsARegistrationMadeByAnotherProcess() throws {
        try super.testEventsFollowPrintsARegistrationMadeByAnotherProcess()
    }
    override func testEndWithADismissalDateInThePastRemovesTheTokensAsEndedAndPruneRemovesTheActivity() throws {
        try super.testEndWithADismissalDateInThePastRemovesTheTokensAsEndedAndPruneRemovesTheActivity()
    }
    override func testBadArgumentsAndBadInputExit2WithOneLineAndWriteNothing() throws {
        try super.testBadArgumentsAndBadInputExit2WithOneLineAndWriteNothing()
        XCTAssertEqual(try stats()["apps"], 0, "bad input defined no app on Redis either")
    }

    // The file's own failures have Redis counterparts: a server that cannot be reached, and two locations at once.

    override func testAFileThatIsNotARegistryExits2WithOneLineAndIsLeftAlone() throws {
        let result = try ProcessSupport.run(
            try ProcessSupport.builtExecutable("fanout"),
            ["registry", "--db", path("registry.db"), "--redis", "redis://127.0.0.1:1", "stats"],
            environment: ProcessSupport.cleanEnvironment(), timeout: 20)
        XCTAssertEqual(result.exitCode, 2, result.summary)
        XCTAssertEqual(result.stderrLines, ["fanout registry stats: --db and --redis cannot be combined: give one"])
    }

    override func testARegistryLockedByAnotherProcessExits2AfterTheBusyTimeout() throws {
        let port = try LoopbackPort.free()
        let result = try ProcessSupport.run(
            try ProcessSupport.builtExecutable("fanout"),
            ["registry", "--redis", "redis://:s3cret@127.0.0.1:\(port)", "stats"],
            environment: ProcessSupport.cleanEnvironment(), timeout: 20)
        XCTAssertEqual(result.exitCode, 2, result.summary)
        XCTAssertEqual(result.stderrLines.count, 1, result.summary)
        XCTAssertTrue(result.stderr.contains("cannot reach Redis at redis://"), result.summary)
        XCTAssertFalse(result.stderr.contains("s3cret"), "the password never appears: \(result.stderr)")
    }
}
