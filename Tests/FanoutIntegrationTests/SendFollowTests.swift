import Foundation
import XCTest

@testable import FanoutJobFile

/// `fanout send --follow` and `fanout append`: a job file used as a live queue, with the real binaries against a
/// mock-apns subprocess.
final class SendFollowTests: XCTestCase {
    private var directory = ""
    private var mock: MockAPNsProcess!
    private var fanout = ""
    private var record: String { "\(directory)/record.txt" }
    private var queue: String { "\(directory)/queue.jsonl" }
    private var results: String { "\(directory)/results.jsonl" }

    override func setUpWithError() throws {
        directory = try ProcessSupport.temporaryDirectory(for: self, "follow")
        mock = try MockAPNsProcess(arguments: [
            "--listen", "127.0.0.1:0", "--tls-dir", "\(directory)/tls", "--threads", "2", "--record", record,
            "--latency-ms", "1",
        ])
        let mock = self.mock!
        addTeardownBlock { _ = try? mock.stop() }
        fanout = try ProcessSupport.builtExecutable("fanout")
    }

    private func sendArguments(_ extra: [String] = []) -> [String] {
        [
            "send", "--jobs", queue, "--follow", "--results", results, "--endpoint", "localhost:\(mock.port)",
            "--ca-file", "\(directory)/tls/ca.pem", "--key", "\(directory)/tls/auth-key.p8", "--key-id",
            "KEYID12345", "--team-id", "TEAMID1234", "--progress", "never", "--loops", "1", "--connections", "2",
        ] + extra
    }

    private func startSender(resume: Bool = false, _ extra: [String] = []) throws -> RunningProcess {
        try RunningProcess(
            fanout, sendArguments((resume ? ["--resume"] : []) + extra), environment: ProcessSupport.cleanEnvironment())
    }

    private static func token(_ index: Int) -> String {
        let hex = String(index, radix: 16)
        return "f" + String(repeating: "0", count: 63 - hex.count) + hex
    }

    /// A job line: `tokens` alert tokens starting at `firstToken`.
    private static func job(_ id: String, firstToken: Int, tokens: Int) -> String {
        let list = (firstToken..<firstToken + tokens).map { "\"\(token($0))\"" }.joined(separator: ", ")
        return
            #"{"id": "\#(id)", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "\#(id)"}}, "tokens": [\#(list)]}"#
    }

    /// The complete lines of the results file.
    private func resultLineCount() -> Int {
        guard let data = FileManager.default.contents(atPath: results) else { return 0 }
        return data.reduce(0) { $0 + ($1 == UInt8(ascii: "\n") ? 1 : 0) }
    }

    /// Waits until the results file has at least `count` complete lines; fails the test after `timeout` seconds.
    private func waitForResults(
        _ count: Int, timeout: TimeInterval = 120, file: StaticString = #filePath,
        line: UInt = #line
    ) {
        let deadline = Date().addingTimeInterval(timeout)
        while resultLineCount() < count {
            guard Date() < deadline else {
                return XCTFail(
                    "\(resultLineCount()) results lines after \(timeout) s, not \(count)", file: file, line: line)
            }
            usleep(20_000)
        }
    }

    private func resultKeys() throws -> [String] {
        let text = try String(contentsOfFile: results, encoding: .utf8)
        return try text.split(separator: "\n").map { line in
            let object = try XCTUnwrap(
                try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], String(line))
            XCTAssertEqual(object["outcome"] as? String, "delivered", String(line))
            return "\(object["job"] as? String ?? "?")/\(object["token"] as? String ?? "")"
        }
    }

    /// Three producers append 3,000 jobs of 10 tokens through `fanout append`, concurrently and in paced batches,
    /// while `fanout send --follow` sends them; the sender is killed with SIGKILL twice and started again with
    /// `--resume`. Every (job, token) ends with exactly one results line, every line of the job file is one whole
    /// job, and mock-apns saw a notification twice only for what was in flight (or answered but not yet written)
    /// at a kill.
    func testConcurrentProducersAndAKilledSenderGiveOneResultPerJobAndToken() throws {
        let producers = 3
        let batches = 10
        let jobsPerBatch = 100
        let tokensPerJob = 10
        let total = producers * batches * jobsPerBatch * tokensPerJob
        var scripts: [String] = []
        for producer in 0..<producers {
            var script = ""
            for batch in 0..<batches {
                let lines = (0..<jobsPerBatch).map { index -> String in
                    let number = (producer * batches + batch) * jobsPerBatch + index
                    return Self.job("p\(producer)-\(number)", firstToken: number * tokensPerJob, tokens: tokensPerJob)
                }
                let path = "\(directory)/p\(producer)-b\(batch).jsonl"
                try (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: true, encoding: .utf8)
                // A producer's pace: a batch every 0.3 s, so the sender is killed while jobs are still arriving.
                script += "\"$1\" append --jobs \"$2\" - < \(path) > /dev/null || exit 1; sleep 0.3; "
            }
            scripts.append(script)
        }
        XCTAssertTrue(FileManager.default.createFile(atPath: queue, contents: nil))
        var sender = try startSender()
        let running = try scripts.map { script in
            try RunningProcess("/bin/sh", ["-c", script, "sh", fanout, queue])
        }
        for fraction in [3, 2] {
            waitForResults(total / fraction)
            sender.kill(SIGKILL)
            XCTAssertTrue(sender.waitForExit(timeout: 10))
            sender = try startSender(resume: true)
        }
        for producer in running {
            XCTAssertTrue(producer.waitForExit(timeout: 60), "a producer did not finish")
            XCTAssertEqual(producer.result().exitCode, 0, producer.result().summary)
        }
        waitForResults(total)
        XCTAssertEqual(try sender.stop(timeout: 30), 0, sender.stderrText())
        let summary = try XCTUnwrap(sender.stdoutText().split(separator: "\n").last)
        let counts = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(summary.utf8)) as? [String: Any])
        XCTAssertEqual(counts["notifications"] as? Int, total, String(summary))

        let keys = try resultKeys()
        XCTAssertEqual(keys.count, total, "one results line per (job, token)")
        XCTAssertEqual(Set(keys).count, total, "no (job, token) twice")
        let jobLines = try String(contentsOfFile: queue, encoding: .utf8).split(separator: "\n")
        XCTAssertEqual(jobLines.count, producers * batches * jobsPerBatch, "no job line lost or split")
        for line in jobLines {
            XCTAssertNotNil(try? JSONSerialization.jsonObject(with: Data(line.utf8)), "an interleaved line: \(line)")
        }

        try mock.stop()
        let recorded = try String(contentsOfFile: record, encoding: .utf8).split(separator: "\n")
        var perToken: [Substring: Int] = [:]
        for line in recorded { perToken[line.split(separator: " ")[0], default: 0] += 1 }
        XCTAssertEqual(perToken.count, total)
        // Per kill: in flight (the engine's limit, 2 x 1 loop x 2 connections x 1000) and answered but unwritten
        // (less than the writer's threshold of lines).
        let resent = perToken.values.reduce(0) { $0 + ($1 - 1) }
        let unwritten = ResultsWriter.writeThreshold / 100 + 1
        XCTAssertLessThanOrEqual(resent, 2 * (4000 + unwritten), "only what was in flight at a kill is sent twice")
    }

    /// A rotation mid-run (the file renamed away and a new one created, as logrotate does): the jobs of both files
    /// are sent, once each, and the log says the file was replaced.
    func testARotationMidRunSendsTheJobsOfBothFilesOnce() throws {
        try ((0..<5).map { Self.job("old-\($0)", firstToken: $0, tokens: 1) }.joined(separator: "\n") + "\n")
            .write(toFile: queue, atomically: true, encoding: .utf8)
        let sender = try startSender()
        waitForResults(5)
        try FileManager.default.moveItem(atPath: queue, toPath: queue + ".1")
        try ((0..<5).map { Self.job("new-\($0)", firstToken: 100 + $0, tokens: 1) }.joined(separator: "\n") + "\n")
            .write(toFile: queue, atomically: false, encoding: .utf8)
        waitForResults(10)
        XCTAssertEqual(try sender.stop(timeout: 30), 0, sender.stderrText())
        let jobs = try resultKeys().map { String($0.split(separator: "/")[0]) }
        XCTAssertEqual(jobs.sorted(), ((0..<5).map { "new-\($0)" } + (0..<5).map { "old-\($0)" }).sorted())
        XCTAssertTrue(sender.stderrText().contains("was replaced (rotated)"), sender.stderrText())
    }

    /// While the sender is held back (one job at a time, each answered after 4 s), producers run ahead: the progress
    /// line says how many complete job lines are unread and how long the oldest has waited.
    func testTheProgressLineShowsTheJobsProducersAreAheadAndTheOldestAge() throws {
        let slow = try MockAPNsProcess(arguments: [
            "--listen", "127.0.0.1:0", "--tls-dir", "\(directory)/tls", "--latency-ms", "4000",
        ])
        defer { _ = try? slow.stop() }
        try ((0..<30).map { Self.job("queued-\($0)", firstToken: $0, tokens: 1) }.joined(separator: "\n") + "\n")
            .write(toFile: queue, atomically: true, encoding: .utf8)
        var arguments = sendArguments(["--concurrent-jobs", "1"])
        arguments[arguments.firstIndex(of: "localhost:\(mock.port)")!] = "localhost:\(slow.port)"
        arguments[arguments.firstIndex(of: "never")!] = "always"
        let sender = try RunningProcess(fanout, arguments, environment: ProcessSupport.cleanEnvironment())
        let deadline = Date().addingTimeInterval(30)
        var queueLine: Substring?
        while queueLine == nil && Date() < deadline {
            queueLine = sender.stderrText().split(separator: "\n").first { $0.contains("queue: ") }
            if queueLine == nil { usleep(100_000) }
        }
        _ = try sender.stop(timeout: 30)
        let line = try XCTUnwrap(queueLine, "no progress line with the queue: \(sender.stderrText())")
        // "queue: N jobs (B bytes) unread, oldest S s": the first line comes 5 s in, when at most two jobs are done.
        let numbers = line.split(separator: "queue: ")[1].split(whereSeparator: { !"0123456789.".contains($0) })
        guard numbers.count >= 3 else { return XCTFail("no count, bytes and age: \(line)") }
        let jobs = try XCTUnwrap(Int(numbers[0]), String(line))
        let oldest = try XCTUnwrap(Double(numbers[2]), String(line))
        XCTAssertGreaterThanOrEqual(jobs, 25, String(line))
        XCTAssertLessThan(jobs, 30, String(line))
        XCTAssertGreaterThanOrEqual(oldest, 3, String(line))
    }

    /// A line counts once its newline is written: a producer that has written half a line has written no job, and
    /// the job goes out when the rest of its line arrives. Had the sender taken the half line for a line, it would
    /// have recorded it (and the rest) as `invalid` jobs. Each line is read the moment it is complete
    /// (`--follow-linger 0`).
    func testAHalfWrittenLineIsSentOnlyOnceItsNewlineIsWritten() throws {
        let line = Self.job("whole", firstToken: 1, tokens: 1)
        let half = line.utf8.count / 2
        try (Self.job("first", firstToken: 2, tokens: 1) + "\n" + String(line.prefix(half))).write(
            toFile: queue, atomically: false, encoding: .utf8)
        let sender = try startSender(["--follow-linger", "0"])
        // Once "first" is sent, the sender has read the file as it is, half line included.
        waitForResults(1)
        let handle = try XCTUnwrap(FileHandle(forWritingAtPath: queue))
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(String(line.dropFirst(half)).utf8))
        try handle.write(contentsOf: Data(("\n" + Self.job("third", firstToken: 3, tokens: 1) + "\n").utf8))
        waitForResults(3)
        XCTAssertEqual(try sender.stop(timeout: 30), 0, sender.stderrText())
        XCTAssertEqual(
            try resultKeys().map { String($0.split(separator: "/")[0]) }.sorted(), ["first", "third", "whole"])
    }

    /// docs/SEND.md's Python producer (one locked write per line), run as the guide shows it, feeds a followed file.
    func testTheGuidesPythonProducerFeedsAFollowedFile() throws {
        let guide = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("docs/SEND.md")
        let text = try String(contentsOf: guide, encoding: .utf8)
        let start = try XCTUnwrap(text.range(of: "```python\n"), "docs/SEND.md has no Python example")
        let end = try XCTUnwrap(text.range(of: "```", range: start.upperBound..<text.endIndex))
        // The block sits in a list item: its lines lose the item's indentation, as Markdown reads them.
        let lines = text[start.upperBound..<end.lowerBound].split(separator: "\n", omittingEmptySubsequences: false)
        let indent = lines.filter { !$0.isEmpty }.map { $0.prefix { $0 == " " }.count }.min() ?? 0
        let example = lines.map { $0.dropFirst(min(indent, $0.count)) }.joined(separator: "\n")
        let job = Self.job("from-python", firstToken: 7, tokens: 1)
        let script = "job = json.loads('\(job)')\n" + example
        XCTAssertTrue(FileManager.default.createFile(atPath: queue, contents: nil))
        let sender = try startSender()
        let run = try ProcessSupport.run(
            "/usr/bin/env", ["python3", "-c", "import json\n" + script], currentDirectory: directory)
        guard run.exitCode == 0 else { return XCTFail(run.summary) }
        waitForResults(1)
        XCTAssertEqual(try sender.stop(timeout: 30), 0, sender.stderrText())
        XCTAssertEqual(try resultKeys().map { String($0.split(separator: "/")[0]) }, ["from-python"])
    }

    /// `fanout append` refuses an invalid line (naming why) and appends the valid ones.
    func testAppendRefusesAnInvalidLineAndAppendsTheOthers() throws {
        let input = "\(directory)/input.jsonl"
        try
            ([
                Self.job("good-1", firstToken: 1, tokens: 1), #"{"id": "bad"}"#,
                Self.job("good-2", firstToken: 2, tokens: 1),
            ]
            .joined(separator: "\n") + "\n").write(toFile: input, atomically: true, encoding: .utf8)
        let run = try ProcessSupport.run(
            "/bin/sh", ["-c", #""$1" append --jobs "$2" - < "$3""#, "sh", fanout, queue, input])
        XCTAssertEqual(run.exitCode, 1, run.summary)
        XCTAssertEqual(run.stdoutLines.last, #"{"appended": 2, "invalid": 1}"#, run.summary)
        XCTAssertTrue(run.stderr.contains("line 2"), run.summary)
        let appended = try String(contentsOfFile: queue, encoding: .utf8).split(separator: "\n")
        XCTAssertEqual(appended.count, 2)
    }
}
