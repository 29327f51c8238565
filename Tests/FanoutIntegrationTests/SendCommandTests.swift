import FanoutTestSupport
import Foundation
import XCTest

@testable import FanoutJobFile

/// `fanout send` as users run it: the real binary against a mock-apns subprocess.
final class SendCommandTests: XCTestCase {
    private struct Setup {
        let directory: String
        let mock: MockAPNsProcess
        let tls: String
        let stats: String
        let record: String
        let fanout: String

        func sendArguments(jobs: String, results: String, extra: [String] = []) -> [String] {
            [
                "send", "--jobs", jobs, "--results", results, "--endpoint", "localhost:\(mock.port)",
                "--ca-file", "\(tls)/ca.pem", "--key", "\(tls)/auth-key.p8", "--key-id", "KEYID12345",
                "--team-id", "TEAMID1234", "--progress", "never",
            ] + extra
        }
    }

    private func start(_ extraMockArguments: [String] = []) throws -> Setup {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "send")
        let tls = "\(directory)/tls"
        let stats = "\(directory)/stats.json"
        let record = "\(directory)/record.txt"
        let mock = try MockAPNsProcess(
            arguments: [
                "--listen", "127.0.0.1:0", "--tls-dir", tls, "--threads", "2", "--stats", stats, "--record", record,
            ]
                + extraMockArguments)
        addTeardownBlock { _ = try? mock.stop() }
        return Setup(
            directory: directory, mock: mock, tls: tls, stats: stats, record: record,
            fanout: try ProcessSupport.builtExecutable("fanout"))
    }

    private func token(_ index: Int) -> String {
        let hex = String(index, radix: 16)
        return "e" + String(repeating: "0", count: 63 - hex.count) + hex
    }

    private func writeLines(_ lines: [String], to path: String) throws {
        try (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: true, encoding: .utf8)
    }

    /// The results file's lines as (job, token, outcome).
    private func readResults(_ path: String) throws -> [(job: String, token: String?, outcome: String, reason: String?)]
    {
        let text = try String(contentsOfFile: path, encoding: .utf8)
        return try text.split(separator: "\n").map { line in
            let object = try XCTUnwrap(
                try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], String(line))
            return (
                object["job"] as! String, object["token"] as? String, object["outcome"] as! String,
                object["reason"] as? String
            )
        }
    }

    private func summary(_ result: ProcessResult) throws -> [String: Any] {
        let line = try XCTUnwrap(result.stdoutLines.last, result.summary)
        return try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], line)
    }

    func testThreeJobsGiveOneResultLinePerJobAndTokenMatchingSummaryAndMock() throws {
        let setup = try start()
        let tokensFile = "\(setup.directory)/tokens.txt"
        try writeLines((0..<50_000).map { token(10_000 + $0) }, to: tokensFile)
        let jobs = "\(setup.directory)/jobs.jsonl"
        try writeLines(
            [
                #"{"id": "inline", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "update", "content_state": {"home": 1, "away": 0}}, "tokens": ["\#(token(1))", "\#(token(2))", "\#(token(3))"]}"#,
                #"{"id": "file", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "update", "content_state": {"home": 2, "away": 0}}, "tokens_file": "tokens.txt"}"#,
                #"{"id": "raw", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": ["\#(token(4))", "\#(token(5))"]}"#,
            ], to: jobs)
        let results = "\(setup.directory)/results.jsonl"
        let summaryFile = "\(setup.directory)/summary.json"
        let run = try ProcessSupport.run(
            setup.fanout, setup.sendArguments(jobs: jobs, results: results, extra: ["--summary", summaryFile]),
            timeout: 120)
        XCTAssertEqual(run.exitCode, 0, run.summary)
        let lines = try readResults(results)
        XCTAssertEqual(lines.count, 50_005)
        let keys = Set(lines.map { "\($0.job)/\($0.token ?? "")" })
        XCTAssertEqual(keys.count, 50_005, "exactly one line per (job, token)")
        XCTAssertEqual(lines.filter { $0.job == "file" }.count, 50_000)
        let summary = try summary(run)
        XCTAssertEqual(summary["jobs"] as? Int, 3)
        XCTAssertEqual(summary["notifications"] as? Int, 50_005)
        XCTAssertEqual(summary["delivered"] as? Int, lines.filter { $0.outcome == "delivered" }.count)
        XCTAssertEqual(summary["payload_encodings"] as? Int, 3)
        let fileSummary = try String(contentsOfFile: summaryFile, encoding: .utf8)
        XCTAssertEqual(fileSummary.trimmingCharacters(in: .newlines), run.stdoutLines.last)
        try setup.mock.stop()
        let stats = try MockAPNsProcess.readStats(setup.stats)
        XCTAssertEqual(stats["accepted"] as? Int, 50_005)
        XCTAssertEqual(stats["duplicate_apns_ids"] as? Int, 0)
    }

    /// Without `--results` the results lines go to stdout and the summary is still its last line (docs/SEND.md), so
    /// `fanout send ... | tail -1` is the summary either way. Before, it went to stderr.
    func testWithoutAResultsFileTheSummaryFollowsTheResultsOnStdout() throws {
        let setup = try start()
        let jobs = "\(setup.directory)/jobs.jsonl"
        try writeLines(
            [
                #"{"id": "stdout", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": ["\#(token(1))", "\#(token(2))", "\#(token(3))"]}"#
            ], to: jobs)
        var arguments = setup.sendArguments(jobs: jobs, results: "unused")
        let resultsFlag = try XCTUnwrap(arguments.firstIndex(of: "--results"))
        arguments.removeSubrange(resultsFlag...(resultsFlag + 1))
        let run = try ProcessSupport.run(setup.fanout, arguments, timeout: 60)
        XCTAssertEqual(run.exitCode, 0, run.summary)
        XCTAssertEqual(run.stdoutLines.count, 4, run.summary)
        let objects = try run.stdoutLines.map {
            try XCTUnwrap(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any], $0)
        }
        XCTAssertEqual(
            objects.prefix(3).compactMap { $0["outcome"] as? String }, ["delivered", "delivered", "delivered"])
        XCTAssertEqual(objects.last?["jobs"] as? Int, 1, run.summary)
        XCTAssertEqual(objects.last?["delivered"] as? Int, 3, run.summary)
        XCTAssertFalse(run.stderrLines.contains { $0.contains("\"payload_encodings\"") }, "no second summary on stderr")
    }

    // MARK: Job files that are streams

    /// Writes jobs `a` and `b` (one alert token each) to two files, and runs `shell` (a `sh -c` script in which
    /// `"$@"` is `fanout send` with the setup's arguments and `--jobs JOBS`) as the producer and the sender of a
    /// stream. The producer writes job `a`, pauses 2 s (longer than any of the sender's timers and deadlines), then
    /// writes job `b` and closes: both must be read and sent, once.
    private func sendThroughAPausingProducer(jobsArgument: String, shell: String) throws {
        let setup = try start()
        for (name, index) in [("a", 1), ("b", 2)] {
            try writeLines(
                [
                    #"{"id": "\#(name)", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": ["\#(token(index))"]}"#
                ], to: "\(setup.directory)/\(name).jsonl")
        }
        let results = "\(setup.directory)/results.jsonl"
        var arguments = setup.sendArguments(jobs: jobsArgument, results: results)
        arguments.insert(setup.fanout, at: 0)
        let run = try ProcessSupport.run(
            "/bin/sh", ["-c", shell, "sh"] + arguments, currentDirectory: setup.directory, timeout: 60)
        XCTAssertEqual(run.exitCode, 0, run.summary)
        let lines = try readResults(results)
        XCTAssertEqual(lines.map(\.job).sorted(), ["a", "b"], run.summary)
        XCTAssertEqual(lines.map(\.outcome), ["delivered", "delivered"], run.summary)
        let summary = try summary(run)
        XCTAssertEqual(summary["jobs"] as? Int, 2, run.summary)
        XCTAssertEqual(summary["notifications"] as? Int, 2, run.summary)
    }

    func testAFIFOIsReadUntilItsWriterClosesIt() throws {
        try sendThroughAPausingProducer(
            jobsArgument: "q", shell: #"mkfifo q && { (cat a.jsonl; sleep 2; cat b.jsonl) > q & } && exec "$@""#)
    }

    func testAPipeNamedAsDevStdinIsReadUntilItsWriterClosesIt() throws {
        try sendThroughAPausingProducer(
            jobsArgument: "/dev/stdin", shell: #"(cat a.jsonl; sleep 2; cat b.jsonl) | "$@""#)
    }

    func testADashReadsTheJobsFromStandardInput() throws {
        try sendThroughAPausingProducer(jobsArgument: "-", shell: #"(cat a.jsonl; sleep 2; cat b.jsonl) | "$@""#)
    }

    func testResumeRefusesAJobFileThatIsAStream() throws {
        let setup = try start()
        var arguments = setup.sendArguments(jobs: "-", results: "\(setup.directory)/results.jsonl", extra: ["--resume"])
        arguments.insert(setup.fanout, at: 0)
        let run = try ProcessSupport.run("/bin/sh", ["-c", #"echo | "$@""#, "sh"] + arguments, timeout: 30)
        XCTAssertEqual(run.exitCode, 2, run.summary)
        XCTAssertTrue(run.stderr.contains("cannot be read again"), run.summary)
    }

    /// The one-job file both pipe tests send: two alert tokens.
    private func writePipedJob(_ setup: Setup) throws -> String {
        let jobs = "\(setup.directory)/jobs.jsonl"
        try writeLines(
            [
                #"{"id": "piped", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": ["\#(token(1))", "\#(token(2))"]}"#
            ], to: jobs)
        return jobs
    }

    /// Runs `fanout` with `gone` (stdout or stderr) a pipe whose reader is closed before the first line; the other
    /// stream goes to a file. Returns how it ended and what it wrote to that file.
    private enum StandardStream { case output, error }

    private func runWithReaderGone(_ setup: Setup, _ arguments: [String], gone: StandardStream) throws -> (
        reason: Process.TerminationReason, status: Int32, other: String
    ) {
        let other = "\(setup.directory)/other-stream.txt"
        _ = FileManager.default.createFile(atPath: other, contents: nil)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: setup.fanout)
        process.arguments = arguments
        process.environment = ProcessSupport.cleanEnvironment()
        let pipe = Pipe()
        let stdoutGone = gone == .output
        process.standardOutput = stdoutGone ? pipe : FileHandle(forWritingAtPath: other)
        process.standardError = stdoutGone ? FileHandle(forWritingAtPath: other) : pipe
        try process.run()
        try pipe.fileHandleForReading.close()
        let deadline = Date().addingTimeInterval(60)
        while process.isRunning && Date() < deadline { usleep(20_000) }
        if process.isRunning { process.terminate() }
        process.waitUntilExit()
        return (
            process.terminationReason, process.terminationStatus, try String(contentsOfFile: other, encoding: .utf8)
        )
    }

    /// A reader of stderr that has gone (`fanout send ... 2>&1 | head`) does not stop the send: its progress lines are
    /// dropped. Before, Foundation's FileHandle.write trapped on EPIPE at the first progress line, mid-run.
    func testASendWhoseStderrReaderIsGoneRunsToTheEnd() throws {
        let setup = try start()
        let results = "\(setup.directory)/results.jsonl"
        var arguments = setup.sendArguments(jobs: try writePipedJob(setup), results: results)
        arguments[arguments.count - 1] = "always"  // --progress always: lines on stderr whatever it is
        let run = try runWithReaderGone(setup, arguments, gone: .error)
        XCTAssertEqual(run.reason, .exit, "not killed by a signal")
        XCTAssertEqual(run.status, 0)
        XCTAssertEqual(try readResults(results).filter { $0.outcome == "delivered" }.count, 2)
    }

    /// Without `--results`, a stdout whose reader has gone (`fanout send ... | head`) cuts the run short once it is
    /// seen: exit 1 (notifications were sent), the reason on stderr. Before, the run sent every job, then exited 2
    /// ("nothing sent") at the last flush.
    func testASendWhoseResultsCannotBeWrittenExitsOneSayingSo() throws {
        let setup = try start()
        var arguments = setup.sendArguments(jobs: try writePipedJob(setup), results: "unused")
        let resultsFlag = try XCTUnwrap(arguments.firstIndex(of: "--results"))
        arguments.removeSubrange(resultsFlag...(resultsFlag + 1))
        let run = try runWithReaderGone(setup, arguments, gone: .output)
        XCTAssertEqual(run.reason, .exit, run.other)
        XCTAssertEqual(run.status, 1, run.other)
        XCTAssertTrue(run.other.contains("cannot write the results file"), run.other)
    }

    /// Cut short before anything was recorded (the only job's tokens file fails at its first read): nothing was sent,
    /// so the exit status is 2, as for an unreadable file; the summary still says `cut_short`.
    func testACutShortRunThatSentNothingExitsTwo() throws {
        let setup = try start()
        let jobs = "\(setup.directory)/jobs.jsonl"
        try FileManager.default.createSymbolicLink(
            atPath: "\(setup.directory)/tokens.txt", withDestinationPath: "/proc/self/mem")
        try writeLines(
            [
                #"{"id": "eio", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens_file": "tokens.txt"}"#
            ], to: jobs)
        let results = "\(setup.directory)/results.jsonl"
        let run = try ProcessSupport.run(setup.fanout, setup.sendArguments(jobs: jobs, results: results), timeout: 60)
        XCTAssertEqual(run.exitCode, 2, run.summary)
        XCTAssertTrue(run.stderr.contains(#"job "eio" (line 1)"#), run.summary)
        XCTAssertTrue(run.stdoutLines.last?.contains(#""cut_short": true"#) == true, run.summary)
    }

    /// Every 50th stream is accepted and never answered: the deadline resets it and the retry (same
    /// apns-id) delivers it, or after the last attempt it ends failed/Timeout. Every token still has
    /// exactly one result, and the run ends within a bound set by the deadline and the retry policy.
    func testNeverAnsweredStreamsTimeOutAndAreRetriedWithOneResultPerToken() throws {
        let setup = try start(["--blackhole-every", "50"])
        let total = 20_000
        let tokensFile = "\(setup.directory)/tokens.txt"
        try writeLines((0..<total).map { token(30_000 + $0) }, to: tokensFile)
        let jobs = "\(setup.directory)/jobs.jsonl"
        try writeLines(
            [
                #"{"id": "hung", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens_file": "tokens.txt"}"#
            ], to: jobs)
        let config = "\(setup.directory)/config.json"
        // Only the blackholed streams may outlive the deadline: 1 s in a plain build. Under ThreadSanitizer on a loaded
        // machine both processes are so slow that answers the mock sent took over 1 s (they were timed out, sent
        // again and accepted twice), so it grows with the sanitizer's slow-down, but to 3 s at most: a hung stream's
        // retries must come well within the retry budget's 10 s window of first attempts, which they are counted
        // against (20% of them, plus 10); at 10 s the last ones found the window empty and were refused.
        let deadline = min(1 * testTimeScale, 3)
        try writeLines(
            [#"{"max_attempts": 3, "request_timeout_seconds": \#(deadline), "loops": 1, "connections": 2}"#],
            to: config)
        let results = "\(setup.directory)/results.jsonl"
        let started = Date()
        let run = try ProcessSupport.run(
            setup.fanout, setup.sendArguments(jobs: jobs, results: results, extra: ["--config", config]),
            timeout: 60 * testTimeScale)
        let elapsed = Date().timeIntervalSince(started)
        // Three attempts, each at most the deadline plus a backoff of at most 5 s, after the sending itself (well
        // under 10 s here): a run that waited on a hung stream would take far longer.
        XCTAssertLessThan(elapsed, 3 * (deadline + 5) + 10 * testTimeScale, "the run took \(elapsed) s")
        XCTAssertTrue([0, 1].contains(run.exitCode), run.summary)
        let lines = try readResults(results)
        XCTAssertEqual(lines.count, total)
        XCTAssertEqual(Set(lines.map { $0.token ?? "" }).count, total, "exactly one line per token")
        for line in lines where line.outcome != "delivered" {
            XCTAssertEqual(line.outcome, "failed", "\(line)")
            XCTAssertEqual(line.reason, "Timeout", "\(line)")
        }
        let summary = try summary(run)
        XCTAssertEqual(summary["notifications"] as? Int, total)
        XCTAssertGreaterThanOrEqual(summary["retries"] as? Int ?? 0, total / 50 - 1, "the hung streams were retried")
        try setup.mock.stop()
        let stats = try MockAPNsProcess.readStats(setup.stats)
        XCTAssertGreaterThanOrEqual(stats["streams_blackholed"] as? Int ?? 0, total / 50)
        XCTAssertEqual(stats["accepted"] as? Int, lines.filter { $0.outcome == "delivered" }.count)
        XCTAssertEqual(stats["duplicate_apns_ids"] as? Int, 0)
    }

    func testBadLinesAreReportedWithLineNumberAndReasonWhileTheRestIsSent() throws {
        let setup = try start()
        let jobs = "\(setup.directory)/jobs.jsonl"
        let good =
            #"{"id": "good", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": ["\#(token(1))"]}"#
        let big = String(repeating: "x", count: 5000)
        let lines = [
            good,
            #"{"id": "broken", "topic": "#,
            #"{"id": "odd-type", "topic": "com.example.app", "push_type": "carrier-pigeon", "payload": {"aps": {}}, "tokens": ["\#(token(2))"]}"#,
            #"{"id": "nobody", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}}"#,
            #"{"id": "both", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", "payload": {"aps": {}}, "live_activity": {"event": "update", "content_state": {}}, "tokens": ["\#(token(3))"]}"#,
            #"{"id": "huge", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "\#(big)"}}, "tokens": ["\#(token(4))"]}"#,
            #"{"id": "not-hex", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": ["zz-not-a-token"]}"#,
            #"{"id": "no-file", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens_file": "missing.txt"}"#,
            // Refused by the engine, not the parser: no --registry to find the activity in.
            #"{"id": "no-registry", "app": "com.example.app", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "update", "content_state": {}}, "activity_id": "match-7"}"#,
            good.replacingOccurrences(of: "\"good\"", with: "\"good-too\"").replacingOccurrences(
                of: token(1), with: token(9)),
        ]
        try writeLines(lines, to: jobs)
        let results = "\(setup.directory)/results.jsonl"
        let run = try ProcessSupport.run(setup.fanout, setup.sendArguments(jobs: jobs, results: results), timeout: 60)
        XCTAssertEqual(run.exitCode, 1, "some notifications did not end delivered: \(run.summary)")
        let recorded = try readResults(results)
        let invalid = recorded.filter { $0.outcome == "invalid" }
        XCTAssertEqual(invalid.count, 8, "\(invalid)")
        let expectations: [(line: Int, mention: String)] = [
            (2, "JSON"), (3, "push_type"), (4, "recipients"), (5, "payload"), (6, "4096"), (7, "tokens[0]"),
            (8, "missing.txt"), (9, "needs a registry"),
        ]
        for expectation in expectations {
            XCTAssertTrue(
                invalid.contains {
                    ($0.reason ?? "").hasPrefix("line \(expectation.line): ")
                        && ($0.reason ?? "").contains(expectation.mention)
                },
                "line \(expectation.line) should be reported mentioning \(expectation.mention): \(invalid.map { $0.reason ?? "" })"
            )
        }
        XCTAssertEqual(recorded.filter { $0.outcome == "delivered" }.map(\.job).sorted(), ["good", "good-too"])
        let summary = try summary(run)
        XCTAssertEqual(summary["invalid"] as? Int, 8)
        XCTAssertEqual(summary["delivered"] as? Int, 2)
    }

    /// `fanout validate` reports a line that repeats an earlier line's id, as `fanout send` refuses it.
    func testValidateReportsARepeatedJobID() throws {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "validate")
        let jobs = "\(directory)/jobs.jsonl"
        let line =
            #"{"id": "same", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": ["\#(token(1))"]}"#
        try writeLines([line, line.replacingOccurrences(of: "\"same\"", with: "\"other\""), line], to: jobs)
        let run = try ProcessSupport.run(
            try ProcessSupport.builtExecutable("fanout"), ["validate", "--jobs", jobs], timeout: 30)
        XCTAssertEqual(run.exitCode, 1, run.summary)
        XCTAssertEqual(
            run.stdoutLines,
            [
                #"line 3: id "same" is already the id of line 1 (job ids must be unique in a job file)"#,
                "2 valid, 1 invalid",
            ])
    }

    func testUnreadableKeyExitsTwoAndSendsNothing() throws {
        let setup = try start()
        let jobs = "\(setup.directory)/jobs.jsonl"
        try writeLines(
            [
                #"{"id": "a", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": ["\#(token(1))"]}"#
            ],
            to: jobs)
        var arguments = setup.sendArguments(jobs: jobs, results: "\(setup.directory)/results.jsonl")
        arguments[arguments.firstIndex(of: "--key")! + 1] = "\(setup.directory)/no-such-key.p8"
        let run = try ProcessSupport.run(setup.fanout, arguments, timeout: 30)
        XCTAssertEqual(run.exitCode, 2, run.summary)
        XCTAssertEqual(run.stderrLines.count, 1, run.summary)
        XCTAssertTrue(run.stderr.contains("no-such-key.p8"), run.summary)
        XCTAssertTrue(run.stdout.isEmpty, run.summary)
        try setup.mock.stop()
        XCTAssertEqual(try MockAPNsProcess.readStats(setup.stats)["requests"] as? Int, 0, "nothing was sent")
    }

    func testKilledRunResumesWithCompleteUniqueResultsAndBoundedResends() throws {
        let setup = try start(["--latency-ms", "1"])
        let total = 200_000
        let tokensFile = "\(setup.directory)/tokens.txt"
        try writeLines((0..<total).map { token($0) }, to: tokensFile)
        let jobs = "\(setup.directory)/jobs.jsonl"
        try writeLines(
            [
                #"{"id": "a", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "a"}}, "tokens_file": "tokens.txt"}"#,
                #"{"id": "b", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "b"}}, "tokens": ["\#(token(total + 1))"]}"#,
            ], to: jobs)
        let results = "\(setup.directory)/results.jsonl"
        let arguments = setup.sendArguments(
            jobs: jobs, results: results, extra: ["--loops", "1", "--connections", "2"])

        let first = try RunningProcess(setup.fanout, arguments, environment: ProcessSupport.cleanEnvironment())
        // Kill it once it has made real progress, well before the end.
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            let size = (try? FileManager.default.attributesOfItem(atPath: results)[.size] as? Int) ?? 0
            if size > 2_000_000 { break }
            usleep(20_000)
        }
        first.kill(SIGKILL)
        XCTAssertTrue(first.waitForExit(timeout: 10))
        // The kill may cut the last line mid-write: count complete lines only (resume cuts the rest).
        let beforeResume = try String(contentsOfFile: results, encoding: .utf8).filter { $0 == "\n" }.count
        XCTAssertGreaterThan(beforeResume, 0)
        XCTAssertLessThan(beforeResume, total, "killed before the end")

        let second = try ProcessSupport.run(setup.fanout, arguments + ["--resume"], timeout: 180)
        XCTAssertEqual(second.exitCode, 0, second.summary)
        let lines = try readResults(results)
        let keys = Set(lines.map { "\($0.job)/\($0.token ?? "")" })
        XCTAssertEqual(lines.count, total + 1, "one line per (job, token) across both runs")
        XCTAssertEqual(keys.count, total + 1, "no (job, token) twice")
        XCTAssertTrue(lines.allSatisfy { $0.outcome == "delivered" })
        let summary = try summary(second)
        XCTAssertEqual(summary["notifications"] as? Int, total + 1, "the summary covers both runs")

        try setup.mock.stop()
        let record = try String(contentsOfFile: setup.record, encoding: .utf8).split(separator: "\n")
        var perToken: [Substring: Int] = [:]
        for line in record { perToken[line.split(separator: " ")[0], default: 0] += 1 }
        let resent = perToken.values.reduce(0) { $0 + ($1 - 1) }
        // In flight at the kill: at most the engine's in-flight limit (2 x 1 loop x 2 connections x 1000); and the
        // results the killed process had answered but not written yet: less than the writer's threshold of lines.
        let shortestLine =
            try String(contentsOfFile: results, encoding: .utf8).split(separator: "\n")
            .map(\.utf8.count).min() ?? 1
        let unwritten = ResultsWriter.writeThreshold / (shortestLine + 1) + 1
        XCTAssertLessThanOrEqual(
            resent, 4000 + unwritten, "only notifications in flight or unwritten at the kill may be sent twice")
        XCTAssertEqual(perToken.count, total + 1)
    }

    /// `--resume` appends to the `--invalid-tokens` file: the tokens the first run found dead are still to be
    /// dropped (it emptied the file, so a crashed run's cleanup missed what it had found before the crash).
    func testResumeKeepsTheInvalidTokensTheFirstRunFound() throws {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "send-invalid")
        let unregistered = "\(directory)/unregistered.txt"
        try writeLines([token(1), token(3)], to: unregistered)
        let setup = try start(["--unregistered", unregistered])
        let jobs = "\(setup.directory)/jobs.jsonl"
        let tokens = (0..<5).map { "\"\(token($0))\"" }.joined(separator: ", ")
        try writeLines(
            [
                #"{"id": "a", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "a"}}, "tokens": [\#(tokens)]}"#
            ], to: jobs)
        let results = "\(setup.directory)/results.jsonl"
        let invalid = "\(setup.directory)/invalid.jsonl"
        let arguments = setup.sendArguments(jobs: jobs, results: results, extra: ["--invalid-tokens", invalid])
        func invalidTokens() throws -> [String] {
            try String(contentsOfFile: invalid, encoding: .utf8).split(separator: "\n").map { line in
                let object = try XCTUnwrap(
                    try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], String(line))
                return try XCTUnwrap(object["token"] as? String)
            }
        }
        let first = try ProcessSupport.run(setup.fanout, arguments, timeout: 60)
        XCTAssertEqual(first.exitCode, 1, "two tokens unregistered: \(first.summary)")
        XCTAssertEqual(try invalidTokens().sorted(), [token(1), token(3)])

        let resumed = try ProcessSupport.run(setup.fanout, arguments + ["--resume"], timeout: 60)
        XCTAssertTrue([0, 1].contains(resumed.exitCode), resumed.summary)
        XCTAssertEqual(try invalidTokens().sorted(), [token(1), token(3)], "kept, not emptied or repeated")

        // A file that cannot be written ends the run before anything is sent.
        let unwritable = setup.sendArguments(
            jobs: jobs, results: "\(setup.directory)/other.jsonl",
            extra: ["--invalid-tokens", "\(setup.directory)/no-such-directory/invalid.jsonl"])
        let refused = try ProcessSupport.run(setup.fanout, unwritable, timeout: 60)
        XCTAssertEqual(refused.exitCode, 2, refused.summary)
        XCTAssertTrue(refused.stderr.contains("--invalid-tokens"), refused.summary)
    }

    /// `--summary` and `--invalid-tokens` are written through what their paths name: a symbolic link stays a link and
    /// its target gets the lines (Foundation's createFile wrote a new file and renamed it over the path, so
    /// `--summary /dev/null` replaced the device node with a regular file), and a full device is an error.
    func testTheSummaryAndInvalidTokensFilesAreWrittenThroughLinks() throws {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "send-links")
        let unregistered = "\(directory)/unregistered.txt"
        try writeLines([token(2)], to: unregistered)
        let setup = try start(["--unregistered", unregistered])
        let jobs = "\(setup.directory)/jobs.jsonl"
        let tokens = (0..<3).map { "\"\(token($0))\"" }.joined(separator: ", ")
        try writeLines(
            [
                #"{"id": "a", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "a"}}, "tokens": [\#(tokens)]}"#
            ], to: jobs)
        let files = FileManager.default
        for name in ["summary", "invalid"] {
            try files.createSymbolicLink(atPath: "\(directory)/\(name)-link", withDestinationPath: "\(name)-target")
        }
        let run = try ProcessSupport.run(
            setup.fanout,
            setup.sendArguments(
                jobs: jobs, results: "\(setup.directory)/results.jsonl",
                extra: ["--summary", "\(directory)/summary-link", "--invalid-tokens", "\(directory)/invalid-link"]),
            timeout: 60)
        XCTAssertEqual(run.exitCode, 1, "one token unregistered: \(run.summary)")
        for name in ["summary", "invalid"] {
            XCTAssertEqual(
                try files.destinationOfSymbolicLink(atPath: "\(directory)/\(name)-link"), "\(name)-target",
                "\(name): still a link")
        }
        let summary = try String(contentsOfFile: "\(directory)/summary-target", encoding: .utf8)
        XCTAssertEqual(summary.trimmingCharacters(in: .newlines), run.stdoutLines.last)
        let invalid = try String(contentsOfFile: "\(directory)/invalid-target", encoding: .utf8)
        XCTAssertTrue(invalid.contains(token(2)), invalid)

        // A summary that cannot be written (a link to /dev/full: the device itself is never at stake) says so.
        try files.createSymbolicLink(atPath: "\(directory)/full", withDestinationPath: "/dev/full")
        let full = try ProcessSupport.run(
            setup.fanout,
            setup.sendArguments(
                jobs: jobs, results: "\(setup.directory)/results-2.jsonl", extra: ["--summary", "\(directory)/full"]),
            timeout: 60)
        XCTAssertEqual(full.exitCode, 2, full.summary)
        XCTAssertTrue(full.stderr.contains("No space left on device"), full.summary)
        XCTAssertEqual(try files.destinationOfSymbolicLink(atPath: "\(directory)/full"), "/dev/full")
    }

    /// A misspelt or mistyped rate limit in `--config` is refused naming it, not run at the default budget.
    func testAMisspeltRateLimitInTheConfigIsRefused() throws {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "send-config")
        let fanout = try ProcessSupport.builtExecutable("fanout")
        let jobs = "\(directory)/jobs.jsonl"
        try writeLines(
            [
                #"{"id": "a", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "a"}}, "tokens": ["\#(token(1))"]}"#
            ], to: jobs)
        let cases = [
            (#"{"rate_limits": {"default": {"requests_per_hr": 1000}}}"#, "requests_per_hr"),
            (#"{"rate_limits": {"default": {"requests_per_hour": "1000"}}}"#, "requests_per_hour"),
            (#"{"rate_limits": {"workspace": {"acme": {"requests_per_hour": 10}}}}"#, "workspace"),
            (#"{"rate_limits": {"workspaces": [1]}}"#, "workspaces"),
            (#"{"rate_limits": {"default": {"policy": 1}}}"#, "policy"),
        ]
        for (index, (config, named)) in cases.enumerated() {
            let path = "\(directory)/config-\(index).json"
            try writeLines([config], to: path)
            let run = try ProcessSupport.run(
                fanout,
                [
                    "send", "--jobs", jobs, "--config", path, "--endpoint", "localhost:9", "--key",
                    "\(directory)/none.p8", "--key-id", "KEYID12345", "--team-id", "TEAMID1234", "--progress", "never",
                ], timeout: 30)
            XCTAssertEqual(run.exitCode, 2, "\(config): \(run.summary)")
            XCTAssertEqual(run.stderrLines.count, 1, run.summary)
            XCTAssertTrue(run.stderr.contains(named), "\(config) names \(named): \(run.summary)")
        }
    }

    func testMetricsListenServesAPrometheusExpositionDuringTheRun() throws {
        let setup = try start(["--latency-ms", "20"])
        let tokensFile = "\(setup.directory)/tokens.txt"
        try writeLines((0..<40_000).map { token($0) }, to: tokensFile)
        let jobs = "\(setup.directory)/jobs.jsonl"
        try writeLines(
            [
                #"{"id": "m", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "m"}}, "tokens_file": "tokens.txt"}"#
            ],
            to: jobs)
        let port = try ProcessSupport.freeLoopbackPort()
        let arguments =
            setup.sendArguments(jobs: jobs, results: "\(setup.directory)/results.jsonl")
            + ["--metrics-listen", "127.0.0.1:\(port)", "--loops", "1", "--connections", "1", "--log-format", "json"]
        let run = try RunningProcess(setup.fanout, arguments, environment: ProcessSupport.cleanEnvironment())
        // Scrape once some notifications are done (bounded wait), while the run goes on.
        var exposition: ParsedExposition?
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if let response = try? HTTPTestClient.exchange(port: port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
                let parsed = response.parsed, parsed.status == 200
            {
                let scraped = try ParsedExposition(String(decoding: parsed.body, as: UTF8.self))
                if (scraped.value("fanout_notifications_total", ["outcome": "delivered", "reason": ""]) ?? 0) > 0 {
                    exposition = scraped
                    break
                }
            }
            usleep(50_000)
        }
        XCTAssertTrue(run.waitForExit(timeout: 120))
        let result = run.result()
        XCTAssertEqual(result.exitCode, 0, result.summary)
        let scraped = try XCTUnwrap(exposition, "no scrape showed delivered notifications")
        XCTAssertEqual(scraped.types["fanout_notifications_total"], "counter")
        XCTAssertEqual(scraped.types["fanout_apns_round_trip_seconds"], "histogram")
        XCTAssertEqual(scraped.value("fanout_open_connections"), 1)
        XCTAssertNotNil(scraped.value("fanout_notifications_in_flight"))
        XCTAssertGreaterThan(scraped.value("fanout_apns_round_trip_seconds_count") ?? 0, 0)
        // Structured logs: JSON lines on stderr, with no secret in them.
        let logs = result.stderrLines.filter { $0.hasPrefix("{") }
        XCTAssertTrue(logs.contains { $0.contains("\"msg\":\"send started\"") }, result.stderr)
        XCTAssertFalse(result.stderr.contains("eyJ"), "no provider token in the logs")
    }
}
