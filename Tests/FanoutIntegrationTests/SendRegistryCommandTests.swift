// `fanout send --registry` as users run it: registrations imported with the real `fanout registry import`, a job
// file addressing an activity by id and devices by user, the real binary against a mock-apns subprocess that
// answers some of the tokens 410 Unregistered, and the registry pruned of them afterwards.
import FanoutTestSupport
import Foundation
import XCTest

class SendRegistryCommandTests: XCTestCase {
    private static let app = "com.acme.app"
    /// Update tokens registered for match-7, and for match-8 (which the jobs never name).
    private static let match7 = 300
    private static let match8 = 20
    /// Every 20th match-7 token is answered 410 Unregistered: 15 of them.
    private static let unregisteredEvery = 20
    /// Devices with a regular push token: two per user, users u-0 to u-4.
    private static let pushDevices = 10

    private var scratch = ""
    private var database = ""
    private var fanout = ""
    /// The registry on Redis (`--redis URL`, `--registry redis://…`) instead of the file, in the Redis subclass.
    class var onRedis: Bool { false }
    private var redisURL: String?

    override func setUpWithError() throws {
        scratch = try ProcessSupport.temporaryDirectory(for: self, "send-registry")
        database = path("registry.db")
        fanout = try ProcessSupport.builtExecutable("fanout")
        if Self.onRedis { redisURL = try RedisServerProcess(for: self).url }
    }

    /// `fanout registry`'s location flag: `--db FILE`, or `--redis URL`.
    private var location: [String] { redisURL.map { ["--redis", $0] } ?? ["--db", database] }

    // MARK: Helpers

    fileprivate func path(_ name: String) -> String {
        (scratch as NSString).appendingPathComponent(name)
    }

    /// A 64-hex-digit token: a two-digit kind prefix, then the number.
    private static func token(_ kind: String, _ number: Int) -> String {
        let hex = String(number, radix: 16)
        return kind + String(repeating: "0", count: 62 - hex.count) + hex
    }

    fileprivate func write(_ lines: [String], to name: String) throws -> String {
        let file = path(name)
        try (lines.joined(separator: "\n") + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        return file
    }

    fileprivate func runFanout(_ arguments: [String], timeout: TimeInterval = 30) throws -> ProcessResult {
        try ProcessSupport.run(fanout, arguments, environment: ProcessSupport.cleanEnvironment(), timeout: timeout)
    }

    private static func object(_ line: String) throws -> [String: Any] {
        guard let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
            throw ProcessSupportError("not a JSON object: \(line)")
        }
        return object
    }

    /// `fanout registry --db <database> stats` as integers.
    private func registryStats() throws -> [String: Int] {
        let result = try runFanout(["registry"] + location + ["stats"])
        XCTAssertEqual(result.exitCode, 0, result.summary)
        let line = try XCTUnwrap(result.stdoutLines.last, result.summary)
        return try Self.object(line).compactMapValues { $0 as? Int }
    }

    /// Imports the registrations: match-7's and match-8's update tokens (devices without users), and the push
    /// devices' regular push tokens (device p-N of user u-(N % 5)).
    private func importRegistrations() throws {
        // Registered two minutes ago, before the 410s mock-apns dates at the time it answers.
        let at = ", \"registered_at\": \(Int(Date().timeIntervalSince1970) - 120)"
        var lines: [String] = []
        for index in 0..<Self.match7 {
            lines.append(
                #"{"app": "\#(Self.app)", "activity_id": "match-7", "token": "\#(Self.token("a7", index))", "device": "a-\#(index)"\#(at)}"#
            )
        }
        for index in 0..<Self.match8 {
            lines.append(
                #"{"app": "\#(Self.app)", "activity_id": "match-8", "token": "\#(Self.token("a8", index))", "device": "b-\#(index)"\#(at)}"#
            )
        }
        for index in 0..<Self.pushDevices {
            lines.append(
                #"{"app": "\#(Self.app)", "device": "p-\#(index)", "user": "u-\#(index % 5)", "push_token": "\#(Self.token("c1", index))"\#(at)}"#
            )
        }
        let file = try write(lines, to: "registrations.jsonl")
        let result = try runFanout(["registry"] + location + ["import", file])
        XCTAssertEqual(result.exitCode, 0, result.summary)
        let summary = try Self.object(try XCTUnwrap(result.stdoutLines.last, result.summary))
        XCTAssertEqual(summary["added"] as? Int, lines.count, result.summary)
    }

    // MARK: Tests

    /// An update by activity_id reaches exactly match-7's live tokens, an alert by users reaches those users'
    /// devices, a job naming an unknown app gets one `invalid` result naming `app`, and the tokens the mock
    /// answered 410 are gone from the registry afterwards.
    func testActivityAndUsersJobsResolveFromTheRegistryAndUnregisteredTokensArePruned() throws {
        try importRegistrations()
        let before = try registryStats()
        XCTAssertEqual(before["update_tokens"], Self.match7 + Self.match8)

        // The mock answers 410 for every 20th match-7 token, and for user u-1's device p-1.
        let unregistered = stride(from: 0, to: Self.match7, by: Self.unregisteredEvery).map { Self.token("a7", $0) }
        let unregisteredPush = Self.token("c1", 1)
        let unregisteredFile = try write(unregistered + [unregisteredPush], to: "unregistered.txt")
        let tls = path("tls")
        let stats = path("stats.json")
        let mock = try MockAPNsProcess(arguments: [
            "--listen", "127.0.0.1:0", "--tls-dir", tls, "--threads", "2", "--stats", stats,
            "--unregistered", unregisteredFile,
        ])
        addTeardownBlock { _ = try? mock.stop() }

        let jobs = try write(
            [
                #"{"id": "update", "workspace": "acme", "topic": "com.acme.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "update", "content_state": {"home": 1, "away": 0}}, "activity_id": "match-7"}"#,
                #"{"id": "alert", "workspace": "acme", "topic": "com.acme.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "users": ["u-0", "u-1"]}"#,
                #"{"id": "unknown-app", "workspace": "acme", "topic": "com.acme.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "update", "content_state": {"home": 1, "away": 0}}, "activity_id": "match-7", "app": "com.other.app"}"#,
            ], to: "jobs.jsonl")
        let results = path("results.jsonl")
        let run = try runFanout([
            "send", "--jobs", jobs, "--registry", redisURL ?? database, "--results", results, "--endpoint",
            "localhost:\(mock.port)",
            "--ca-file", "\(tls)/ca.pem", "--key", "\(tls)/auth-key.p8", "--key-id", "KEYID12345",
            "--team-id", "TEAMID1234", "--progress", "never",
        ])
        XCTAssertEqual(run.exitCode, 1, "some tokens were unregistered: \(run.summary)")

        // One results line per (job, token).
        let lines = try String(contentsOfFile: results, encoding: .utf8).split(separator: "\n").map {
            try Self.object(String($0))
        }
        func outcomes(_ job: String) -> [String: [String]] {
            Dictionary(
                grouping: lines.filter { $0["job"] as? String == job },
                by: { $0["outcome"] as? String ?? "?" }
            ).mapValues { $0.map { $0["token"] as? String ?? "null" } }
        }
        let update = outcomes("update")
        let updateTokens = (update["delivered"] ?? []) + (update["unregistered"] ?? [])
        XCTAssertEqual(update.keys.sorted(), ["delivered", "unregistered"])
        XCTAssertEqual(updateTokens.count, Self.match7, "one line per match-7 token")
        XCTAssertEqual(
            Set(updateTokens), Set((0..<Self.match7).map { Self.token("a7", $0) }), "exactly match-7's tokens")
        XCTAssertEqual(Set(update["unregistered"] ?? []), Set(unregistered))

        let alert = outcomes("alert")
        XCTAssertEqual(
            Set(alert["delivered"] ?? []), Set([0, 5, 6].map { Self.token("c1", $0) }), "u-0's and u-1's other devices")
        XCTAssertEqual(alert["unregistered"] ?? [], [unregisteredPush])
        XCTAssertEqual(lines.filter { $0["job"] as? String == "alert" }.count, 4)

        let invalid = lines.filter { $0["job"] as? String == "unknown-app" }
        XCTAssertEqual(invalid.count, 1, "one invalid result for the unknown app")
        XCTAssertEqual(invalid.first?["outcome"] as? String, "invalid")
        XCTAssertTrue(invalid.first?["token"] is NSNull, "\(invalid)")
        let reason = invalid.first?["reason"] as? String ?? ""
        XCTAssertTrue(reason.contains("app") && reason.contains("com.other.app"), reason)

        let keys = Set(lines.map { "\($0["job"] as? String ?? "")/\($0["token"] as? String ?? "")" })
        XCTAssertEqual(keys.count, lines.count, "no (job, token) twice")

        // The summary (stdout's last line) agrees with the results, and the mock accepted the delivered ones.
        let delivered = Self.match7 - unregistered.count + 3
        let summary = try Self.object(try XCTUnwrap(run.stdoutLines.last, run.summary))
        XCTAssertEqual(summary["jobs"] as? Int, 3)
        XCTAssertEqual(summary["notifications"] as? Int, lines.count)
        XCTAssertEqual(summary["delivered"] as? Int, delivered)
        XCTAssertEqual(summary["unregistered"] as? Int, unregistered.count + 1)
        XCTAssertEqual(summary["invalid"] as? Int, 1)
        XCTAssertEqual(summary["payload_encodings"] as? Int, 2)
        try mock.stop()
        let mockStats = try MockAPNsProcess.readStats(stats)
        XCTAssertEqual(mockStats["accepted"] as? Int, delivered)

        // The registry no longer holds the unregistered tokens.
        let after = try registryStats()
        XCTAssertEqual(after["update_tokens"], Self.match7 + Self.match8 - unregistered.count)
        let listed = try runFanout(["registry"] + location + ["list", "--app", Self.app, "--activity", "match-7"])
        XCTAssertEqual(listed.exitCode, 0, listed.summary)
        let live = Set(try listed.stdoutLines.map { try Self.object($0)["token"] as? String ?? "?" })
        XCTAssertEqual(live.count, Self.match7 - unregistered.count)
        XCTAssertTrue(live.isDisjoint(with: unregistered))
        let events = try runFanout(["registry"] + location + ["events"])
        XCTAssertEqual(events.exitCode, 0, events.summary)
        let removed = try events.stdoutLines.map { try Self.object($0) }.filter {
            $0["change"] as? String == "removed" && $0["reason"] as? String == "unregistered"
        }
        XCTAssertEqual(
            Set(removed.map { $0["token"] as? String ?? "?" }), Set(unregistered + [unregisteredPush]),
            "one removed/unregistered event per token")
        XCTAssertEqual(removed.count, unregistered.count + 1)
    }

    /// An update and the end after it in one file, neither with a `timestamp`: read in the same second, they had one
    /// default timestamp, and the end was refused as `superseded` (the activity stayed on screen). The end goes out
    /// to every token, with a later timestamp than the update's.
    func testAnUpdateAndTheEndAfterItInOneFileAreBothSentInOrder() throws {
        try importRegistrations()
        let mock = try MockHarness { $0.capturePayloads = true }
        addTeardownBlock { mock.stop() }
        let tls = mock.material
        let jobs = try write(
            [
                #"{"id": "update", "topic": "com.acme.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "update", "content_state": {"home": 1, "away": 0}}, "activity_id": "match-7"}"#,
                #"{"id": "end", "topic": "com.acme.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "end", "content_state": {"home": 2, "away": 0}}, "activity_id": "match-7"}"#,
            ], to: "jobs.jsonl")
        let results = path("results.jsonl")
        let run = try runFanout([
            "send", "--jobs", jobs, "--registry", redisURL ?? database, "--results", results, "--endpoint",
            "localhost:\(mock.port)", "--ca-file", tls.caPEMPath, "--key", tls.authKeyP8Path, "--key-id",
            "KEYID12345", "--team-id", "TEAMID1234", "--progress", "never",
        ])
        // The update may be superseded on the tokens it had not reached when the end went out (latest wins).
        XCTAssertTrue([0, 1].contains(run.exitCode), run.summary)
        let lines = try String(contentsOfFile: results, encoding: .utf8).split(separator: "\n").map {
            try Self.object(String($0))
        }
        let end = lines.filter { $0["job"] as? String == "end" }
        XCTAssertEqual(end.count, Self.match7, run.summary)
        XCTAssertEqual(Set(end.map { $0["outcome"] as? String ?? "?" }), ["delivered"], "\(end.prefix(3))")
        // Each token's last payload is the end, with a later timestamp than any update it got.
        let payloads = mock.stats.payloadsByToken
        for index in [0, 150, 299] {
            let sent = try XCTUnwrap(payloads[Self.token("a7", index)], "token \(index)").map {
                try XCTUnwrap(try Self.object(String(decoding: $0, as: UTF8.self))["aps"] as? [String: Any])
            }
            XCTAssertEqual(sent.last?["event"] as? String, "end")
            let stamps = sent.compactMap { $0["timestamp"] as? Int }
            XCTAssertEqual(stamps, stamps.sorted(), "in order")
            XCTAssertEqual(Set(stamps).count, stamps.count, "no two with one timestamp: \(stamps)")
        }
    }

    /// Five timestamp-less updates of one activity in one file take five seconds of defaults, ahead of the clock; an
    /// `end` in a file sent right after is still later than the last of them (the registry's record), not
    /// `superseded`.
    func testAnEndInALaterFileIsLaterThanAnEarlierFilesDefaults() throws {
        try importRegistrations()
        let mock = try MockHarness()
        addTeardownBlock { mock.stop() }
        let tls = mock.material
        let update =
            #"{"id": "update-N", "topic": "com.acme.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "update", "content_state": {"home": N, "away": 0}}, "activity_id": "match-7"}"#
        let updates = try write(
            (1...5).map { update.replacingOccurrences(of: "N", with: String($0)) }, to: "updates.jsonl")
        let end = try write(
            [
                #"{"id": "end", "topic": "com.acme.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "end", "content_state": {"home": 5, "away": 0}}, "activity_id": "match-7"}"#
            ], to: "end.jsonl")
        func send(_ jobs: String, _ results: String) throws -> [[String: Any]] {
            let run = try runFanout([
                "send", "--jobs", jobs, "--registry", redisURL ?? database, "--results", path(results),
                "--endpoint", "localhost:\(mock.port)", "--ca-file", tls.caPEMPath, "--key", tls.authKeyP8Path,
                "--key-id", "KEYID12345", "--team-id", "TEAMID1234", "--progress", "never",
            ])
            XCTAssertTrue([0, 1].contains(run.exitCode), run.summary)
            return try String(contentsOfFile: path(results), encoding: .utf8).split(separator: "\n").map {
                try Self.object(String($0))
            }
        }
        _ = try send(updates, "updates-results.jsonl")
        let ended = try send(end, "end-results.jsonl")
        XCTAssertEqual(ended.count, Self.match7)
        XCTAssertEqual(Set(ended.map { $0["outcome"] as? String ?? "?" }), ["delivered"], "\(ended.prefix(2))")
    }

    /// `--registry` naming a file that does not exist: exit 2, one line on stderr, nothing sent.
    func testMissingRegistryFileExitsTwoWithOneLine() throws {
        let jobs = try write(
            [
                #"{"id": "update", "topic": "com.acme.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "update", "content_state": {"home": 1, "away": 0}}, "activity_id": "match-7"}"#
            ], to: "jobs.jsonl")
        let missing = path("no-such-registry.db")
        let run = try runFanout([
            "send", "--jobs", jobs, "--registry", missing, "--endpoint", "localhost:9", "--key", path("auth-key.p8"),
            "--key-id", "KEYID12345", "--team-id", "TEAMID1234", "--progress", "never",
        ])
        XCTAssertEqual(run.exitCode, 2, run.summary)
        XCTAssertEqual(run.stderrLines.count, 1, run.summary)
        let line = run.stderrLines.first ?? ""
        XCTAssertTrue(line.contains("registry") && line.contains(missing), run.summary)
        XCTAssertEqual(run.stdout, "", run.summary)
        XCTAssertFalse(FileManager.default.fileExists(atPath: missing), "the registry is not created")
    }
}

/// The same send with the registry on Redis (`fanout send --registry redis://…`, registrations imported with
/// `fanout registry --redis`).
final class SendRegistryRedisCommandTests: SendRegistryCommandTests {
    override class var onRedis: Bool { true }

    override func testActivityAndUsersJobsResolveFromTheRegistryAndUnregisteredTokensArePruned() throws {
        try super.testActivityAndUsersJobsResolveFromTheRegistryAndUnregisteredTokensArePruned()
    }

    override func testAnUpdateAndTheEndAfterItInOneFileAreBothSentInOrder() throws {
        try super.testAnUpdateAndTheEndAfterItInOneFileAreBothSentInOrder()
    }

    override func testAnEndInALaterFileIsLaterThanAnEarlierFilesDefaults() throws {
        try super.testAnEndInALaterFileIsLaterThanAnEarlierFilesDefaults()
    }

    /// Redis's counterpart of a missing file: a server that cannot be reached. Exit 2, one line, nothing sent.
    override func testMissingRegistryFileExitsTwoWithOneLine() throws {
        let jobs = try write(
            [
                #"{"id": "update", "topic": "com.acme.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "update", "content_state": {"home": 1, "away": 0}}, "activity_id": "match-7"}"#
            ], to: "jobs.jsonl")
        let port = try LoopbackPort.free()
        let run = try runFanout([
            "send", "--jobs", jobs, "--registry", "redis://127.0.0.1:\(port)", "--endpoint", "localhost:9", "--key",
            path("auth-key.p8"), "--key-id", "KEYID12345", "--team-id", "TEAMID1234", "--progress", "never",
        ])
        XCTAssertEqual(run.exitCode, 2, run.summary)
        XCTAssertEqual(run.stderrLines.count, 1, run.summary)
        XCTAssertTrue(run.stderr.contains("cannot reach Redis at redis://127.0.0.1:\(port)"), run.summary)
    }
}
