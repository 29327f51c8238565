// `fanout send --resume` after a kill, in process: the job-file driver against an in-process mock-apns and a SQLite
// registry, with the killed run's results file and journal cut back to what a kill leaves. Each resumed run must
// give every (job, token) exactly one line, send nothing finished again, and sum in its summary what the results
// file holds; a second --resume must add nothing.
import Fanout
import FanoutCore
import FanoutJobLines
import FanoutRegistry
import Foundation
import MockAPNsKit
import XCTest

@testable import FanoutJobFile

final class SendResumeTests: XCTestCase {
    private static let app = "com.example.app"
    private var directory = ""
    private var jobs = ""
    private var results = ""

    override func setUpWithError() throws {
        directory = try ProcessSupport.temporaryDirectory(for: self, "send-resume")
        jobs = "\(directory)/jobs.jsonl"
        results = "\(directory)/results.jsonl"
    }

    // MARK: Helpers

    private func write(_ lines: [String], to path: String) throws {
        try (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: true, encoding: .utf8)
    }

    /// A registry file holding the app, with `tokens` as `activity`'s update tokens.
    private func makeRegistry(activity: String, tokens: [String]) async throws -> SQLiteRegistryStore {
        let registry = try SQLiteRegistryStore(path: "\(directory)/registry.db")
        addTeardownBlock { registry.close() }
        try await registry.defineApps([RegistryApp(bundleID: Self.app)])
        // Registered two minutes ago: a 410 (which mock-apns dates now) removes only a token registered at least a
        // minute before it.
        let registeredAt = registry.clock.now() - 120_000
        try await registry.apply(
            tokens.enumerated().map { index, token in
                .updateToken(
                    UpdateTokenRegistration(
                        app: Self.app, activityID: activity, deviceID: "d\(index)", token: token,
                        registeredAt: registeredAt))
            })
        return registry
    }

    /// One `fanout send` of `jobs` into `results` (a fresh engine each time: a run shuts its engine down).
    private func send(
        mock: MockHarness, registry: (any RegistryStore)?, resume: Bool,
        configure: (inout SendOptions) -> Void = { _ in }
    ) async throws -> SendSummary {
        let engine = try makeEngine(for: mock) { $0.registry = registry }
        var options = SendOptions(jobsPath: jobs)
        options.resultsPath = results
        options.resume = resume
        options.progress = .never
        configure(&options)
        return try await JobFileRunner(engine: engine, options: options).run()
    }

    /// Why a run was cut short (`SendSummary.cutShort`); fails the test (and returns nil) when it ran whole.
    private func cutShortReason(
        mock: MockHarness, registry: (any RegistryStore)?, resume: Bool,
        configure: (inout SendOptions) -> Void = { _ in }, line: UInt = #line
    ) async throws -> String? {
        let summary = try await send(mock: mock, registry: registry, resume: resume, configure: configure)
        XCTAssertFalse(summary.allDelivered, "a run cut short is not all delivered", line: line)
        guard let cutShort = summary.cutShort else {
            XCTFail("the run was not cut short: \(summary.jsonLine)", line: line)
            return nil
        }
        return cutShort
    }

    /// The results file's journal.
    private func journal() throws -> SendJournal {
        try XCTUnwrap(try SendJournal.load(from: SendJournal.path(forResults: results)))
    }

    /// The results file's lines, as text.
    private func resultLines() throws -> [String] {
        try String(contentsOfFile: results, encoding: .utf8).split(separator: "\n").map(String.init)
    }

    private static func object(_ line: String) throws -> [String: Any] {
        try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], line)
    }

    /// "job/token" (or "job/channel", "job/-") of each line.
    private func resultKeys() throws -> [String] {
        try resultLines().map { line in
            let object = try Self.object(line)
            let recipient = object["token"] as? String ?? object["channel"] as? String ?? "-"
            return "\(object["job"] as? String ?? "?")/\(recipient)"
        }
    }

    /// What a kill leaves: the results file holding `lines` only, and a journal that covers the first
    /// `coveredLines` of them, with `partial` and `counts` as it would record them.
    private func leaveKilledRun(
        lines: [String], coveredLines: Int = 0, finishedLines: [[Int]] = [],
        partial: [String: SendJournal.PartialJob] = [:], counts: SendCounts = SendCounts()
    ) throws {
        let text = lines.map { $0 + "\n" }.joined()
        try text.write(toFile: results, atomically: true, encoding: .utf8)
        let offset = lines.prefix(coveredLines).reduce(0) { $0 + $1.utf8.count + 1 }
        let size = try XCTUnwrap(try FileManager.default.attributesOfItem(atPath: jobs)[.size] as? Int)
        try SendJournal(
            jobsFile: jobs, jobsFileSize: size, resultsOffset: offset, finishedLines: finishedLines, partial: partial,
            counts: counts
        ).write(to: SendJournal.path(forResults: results))
    }

    /// A results line as the writer makes it.
    private static func line(_ result: NotificationResult) -> String {
        var bytes: [UInt8] = []
        ResultLine.append(result, to: &bytes)
        return String(decoding: bytes.dropLast(), as: UTF8.self)
    }

    private static let updateContent = #""live_activity": {"event": "update", "content_state": {"home": 1, "away": 0}}"#

    // MARK: Tests

    /// The reviewer's case: T1, T2 and T3 under match-8, T1 answered 410 (so the first run removed it from the
    /// registry), killed with T1's and T2's lines written and a journal at position 2. The resumed run reads T2 and
    /// T3 from the registry, at positions 0 and 1: by position both were "done", and T3 was never sent nor given a
    /// line. By token, T3 is sent and T2 is not.
    func testARegistryJobResumesByTokenNotByPosition() async throws {
        let tokens = (1...3).map { testDeviceToken($0) }
        let registry = try await makeRegistry(activity: "match-8", tokens: tokens)
        try write([tokens[0]], to: "\(directory)/unregistered.txt")
        let mock = try MockHarness {
            $0.unregisteredPath = "\(self.directory)/unregistered.txt"
            $0.capturePayloads = true
        }
        addTeardownBlock { mock.stop() }
        try write(
            [
                #"{"id": "v", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", \#(Self.updateContent), "activity_id": "match-8"}"#
            ], to: jobs)
        let first = try await send(mock: mock, registry: registry, resume: false)
        XCTAssertEqual(first.counts.notifications, 3)
        let live = try await registry.liveUpdateTokenCount(
            app: Self.app, activityID: "match-8", now: registry.clock.now())
        XCTAssertEqual(live, 2, "the first run removed T1, answered 410, from the registry")

        // Killed after T1's and T2's lines, with the journal covering them (as an older journal would: no
        // tokensFrom).
        let kept = try resultLines().filter { line in tokens.prefix(2).contains { line.contains($0) } }
        XCTAssertEqual(kept.count, 2)
        var counts = SendCounts()
        counts.outcomes.unregistered = 1
        counts.outcomes.delivered = 1
        try leaveKilledRun(
            lines: kept, coveredLines: 2, partial: ["1": .init(job: "v", prefix: 2, beyond: [])], counts: counts)

        let resumed = try await send(mock: mock, registry: registry, resume: true)
        XCTAssertEqual(try resultKeys().sorted(), tokens.map { "v/\($0)" }, "one line per token, T3's included")
        XCTAssertEqual(resumed.counts.notifications, 3)
        XCTAssertEqual(resumed.counts.outcomes.delivered, 2)
        XCTAssertEqual(resumed.counts.jobs, 1)
        XCTAssertEqual(mock.stats.payloadsByToken[tokens[2]]?.count, 2, "T3 sent again: its line was lost")
        XCTAssertEqual(mock.stats.payloadsByToken[tokens[1]]?.count, 1, "T2 had a line: not sent again")

        let again = try await send(mock: mock, registry: registry, resume: true)
        XCTAssertEqual(try resultKeys().count, 3, "a second --resume adds no line")
        XCTAssertEqual(again.counts.notifications, 3)
        XCTAssertEqual(again.counts.jobs, 1)
        XCTAssertEqual(mock.stats.payloadsByToken.values.map(\.count).reduce(0, +), 3, "and sends nothing")
    }

    /// The journal the writer keeps for a registry job records where its lines start, past an earlier job's; a
    /// resumed run reads from there and skips the tokens that have lines, though the registry lost one meanwhile.
    func testARegistryJobsJournalEntrySaysWhereItsLinesStart() async throws {
        let tokens = (1...3).map { testDeviceToken($0) }
        let other = testDeviceToken(99)
        let registry = try await makeRegistry(activity: "match-8", tokens: tokens)
        let mock = try MockHarness { $0.capturePayloads = true }
        addTeardownBlock { mock.stop() }
        try write(
            [
                #"{"id": "first", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": ["\#(other)"]}"#,
                #"{"id": "v", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", \#(Self.updateContent), "activity_id": "match-8"}"#,
            ], to: jobs)
        let size = try XCTUnwrap(try FileManager.default.attributesOfItem(atPath: jobs)[.size] as? Int)

        // The killed run, as its writer left it: line 1 finished, line 2 begun and two of its tokens answered.
        let writer = try ResultsWriter(
            path: results, journal: true, jobsFile: jobs, jobsFileSize: size, resumeFrom: nil, fileLength: 0)
        func result(_ job: String, _ token: String, _ outcome: NotificationOutcome, _ position: Int)
            -> NotificationResult
        {
            var result = NotificationResult(jobID: job, token: token, outcome: outcome, reason: nil)
            result.position = position
            return result
        }
        writer.record(result("first", other, .delivered, 0), line: 1)
        writer.finishJob(line: 1, payloadEncodings: 1, demoted: 0)
        writer.beginRegistryJob(line: 2, job: "v", linesFrom: nil, broadcastDone: false)
        writer.record(result("v", tokens[0], .unregistered, 0), line: 2)
        writer.record(result("v", tokens[1], .delivered, 1), line: 2)
        try writer.flush()
        let journal = try XCTUnwrap(try SendJournal.load(from: SendJournal.path(forResults: results)))
        XCTAssertEqual(journal.partial["2"]?.tokensFrom, Self.line(result("first", other, .delivered, 0)).count + 1)
        _ = try await registry.apply([.invalidToken(token: tokens[0])])

        let resumed = try await send(mock: mock, registry: registry, resume: true)
        XCTAssertEqual(try resultKeys().sorted(), (["first/\(other)"] + tokens.map { "v/\($0)" }).sorted())
        XCTAssertEqual(Set(mock.stats.payloadsByToken.keys), [tokens[2]], "only T3 had no line")
        XCTAssertEqual(resumed.counts.notifications, 4)
        XCTAssertEqual(resumed.counts.jobs, 2)
    }

    /// An activity bound to a channel sends its broadcast first, so a kill early in the job leaves the broadcast's
    /// line (token null, with `channel`) alone in the tail. That line is one recipient's, not the job's: the
    /// broadcast is not sent again, every token push is, and the summary counts the broadcast. A channel job's
    /// broadcast line is its one recipient's too.
    func testABroadcastLineInTheTailDoesNotEndItsJob() async throws {
        let tokens = (1...3).map { testDeviceToken($0) }
        let registry = try await makeRegistry(activity: "match-7", tokens: tokens)
        let mock = try MockHarness()
        addTeardownBlock { mock.stop() }
        let channel = try XCTUnwrap(mock.server.channels.create(app: Self.app))
        _ = try await registry.apply([.channel(app: Self.app, activityID: "match-7", channelID: channel)])
        try write(
            [
                #"{"id": "m7", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", \#(Self.updateContent), "activity_id": "match-7"}"#,
                #"{"id": "direct", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", \#(Self.updateContent), "channel_id": "\#(channel)"}"#,
            ], to: jobs)
        func broadcast(_ job: String, position: Int) -> String {
            var result = NotificationResult(jobID: job, token: nil, outcome: .delivered, reason: nil)
            result.channel = channel
            result.status = 200
            result.attempts = 1
            result.position = position
            return Self.line(result)
        }
        try leaveKilledRun(
            lines: [
                broadcast("m7", position: FanoutEngine.activityBroadcastPosition), broadcast("direct", position: 0),
            ]
        )

        let resumed = try await send(mock: mock, registry: registry, resume: true)
        XCTAssertEqual(mock.stats.broadcasts, 0, "neither broadcast is sent again")
        XCTAssertEqual(mock.stats.accepted, 3, "every token push of m7 is sent")
        XCTAssertEqual(
            try resultKeys().sorted(), (["direct/\(channel)", "m7/\(channel)"] + tokens.map { "m7/\($0)" }).sorted())
        XCTAssertEqual(resumed.counts.broadcasts, 2)
        XCTAssertEqual(resumed.counts.notifications, 5)
        XCTAssertEqual(resumed.counts.outcomes.delivered, 5)
        XCTAssertEqual(resumed.counts.jobs, 2)
    }

    /// A journal of another version (an older fanout's, whose inline tokens kept their repeats and so their
    /// positions) is refused, naming both versions, and nothing is sent.
    func testAJournalOfAnotherVersionIsRefused() async throws {
        let mock = try MockHarness()
        addTeardownBlock { mock.stop() }
        try write(
            [
                #"{"id": "a", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "a"}}, "tokens": ["\#(testDeviceToken(1))"]}"#
            ], to: jobs)
        _ = try await send(mock: mock, registry: nil, resume: false)
        let path = SendJournal.path(forResults: results)
        let text = try String(contentsOfFile: path, encoding: .utf8)
        XCTAssertTrue(text.hasPrefix(#"{"version":2,"#), text)
        try text.replacingOccurrences(of: #"{"version":2,"#, with: #"{"version":1,"#).write(
            toFile: path, atomically: true, encoding: .utf8)
        let sentBefore = mock.stats.requests
        do {
            let summary = try await send(mock: mock, registry: nil, resume: true)
            XCTFail("resumed from a version 1 journal: \(summary.jsonLine)")
        } catch let error as SendError {
            XCTAssertTrue(error.description.contains("version 1"), error.description)
            XCTAssertTrue(error.description.contains("version 2"), error.description)
        }
        XCTAssertEqual(mock.stats.requests, sentBefore, "nothing sent")
    }

    /// The reviewer's case: two valid jobs, a bad push_type and a line that is not JSON, killed with only the two
    /// `invalid` lines written (and one delivered line that took three attempts) and the journal at offset 0. The
    /// resumed run's summary counts all four jobs and the tail's retries, and a second --resume writes nothing.
    func testJobsEndedInTheTailAreCountedAndNotWrittenAgain() async throws {
        let mock = try MockHarness { $0.capturePayloads = true }
        addTeardownBlock { mock.stop() }
        let tokens = (1...3).map { testDeviceToken($0) }
        try write(
            [
                #"{"id": "a", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "a"}}, "tokens": ["\#(tokens[0])", "\#(tokens[1])"]}"#,
                #"{"id": "b", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "b"}}, "tokens": ["\#(tokens[2])"]}"#,
                #"{"id": "bad", "topic": "com.example.app", "push_type": "foo", "payload": {"aps": {"alert": "c"}}, "tokens": ["\#(tokens[0])"]}"#,
                "not json",
            ], to: jobs)
        _ = try await send(mock: mock, registry: nil, resume: false)
        let invalid = try resultLines().filter { try Self.object($0)["outcome"] as? String == "invalid" }
        XCTAssertEqual(invalid.count, 2)
        var retried = NotificationResult(jobID: "a", token: tokens[0], outcome: .delivered, reason: nil)
        retried.status = 200
        retried.attempts = 3
        try leaveKilledRun(lines: invalid + [Self.line(retried)])
        let sentBefore = mock.stats.accepted

        let resumed = try await send(mock: mock, registry: nil, resume: true)
        XCTAssertEqual(resumed.counts.jobs, 4)
        XCTAssertEqual(resumed.counts.notifications, 5)
        XCTAssertEqual(resumed.counts.outcomes.invalid, 2)
        XCTAssertEqual(resumed.counts.outcomes.retries, 2, "the tail's line that took three attempts")
        XCTAssertEqual(mock.stats.accepted - sentBefore, 2, "the tokens without a line, not the one with")
        let afterResume = try resultLines()
        XCTAssertEqual(afterResume.count, 5)

        let again = try await send(mock: mock, registry: nil, resume: true)
        XCTAssertEqual(try resultLines(), afterResume, "a second --resume writes nothing")
        XCTAssertEqual(again.counts.jobs, 4)
        XCTAssertEqual(again.counts.notifications, 5)
        XCTAssertEqual(again.counts.outcomes.retries, 2)
        XCTAssertEqual(mock.stats.accepted - sentBefore, 2, "and sends nothing")
    }

    // MARK: Job ids

    /// Two lines with one id would share their results lines (keyed by job and token) and `--resume`'s view of them.
    /// The second is refused: one `invalid` line, keyed `line-N` as for a line without an id, whose reason names the
    /// line, the id and the line that has it; the first is sent whole, and the second's tokens are not sent.
    func testALineThatRepeatsAnEarlierJobsIDIsInvalidAndTheFirstIsSent() async throws {
        let mock = try MockHarness { $0.capturePayloads = true }
        addTeardownBlock { mock.stop() }
        let tokens = (1...3).map { testDeviceToken($0) }
        try write(Self.duplicateIDJobs(tokens), to: jobs)

        let summary = try await send(mock: mock, registry: nil, resume: false)
        XCTAssertEqual(
            try resultKeys().sorted(), ["dup/\(tokens[0])", "dup/\(tokens[1])", "line-2/-", "z/\(tokens[2])"])
        let invalid = try resultLines().map { try Self.object($0) }.filter { $0["outcome"] as? String == "invalid" }
        XCTAssertEqual(
            invalid.first?["reason"] as? String,
            #"line 2: id "dup" is already the id of line 1 (job ids must be unique in a job file)"#)
        XCTAssertEqual(summary.counts.jobs, 3)
        XCTAssertEqual(summary.counts.notifications, 4)
        XCTAssertEqual(summary.counts.outcomes.invalid, 1)
        XCTAssertEqual(mock.stats.accepted, 3, "the refused line's token is not sent")
        XCTAssertEqual(mock.stats.payloadsByToken[tokens[2]]?.count, 1, "sent by z only")
        XCTAssertEqual(
            mock.stats.payloadsByToken[tokens[0]].map { $0.map { String(decoding: $0, as: UTF8.self) } },
            [#"{"aps": {"alert": "first"}}"#], "the first line's payload, once")
    }

    /// A resumed run refuses the same line: whether the first line with the id is finished in the journal (so the
    /// resumed run skips it without parsing it for sending) or still running with the duplicate's `invalid` line in
    /// the tail. That line does not end the first job (it is keyed `line-2`), and the duplicate's tokens are never
    /// sent under the first job's id.
    func testAResumedRunRefusesTheSameDuplicateID() async throws {
        let mock = try MockHarness { $0.capturePayloads = true }
        addTeardownBlock { mock.stop() }
        let tokens = (1...3).map { testDeviceToken($0) }
        try write(Self.duplicateIDJobs(tokens), to: jobs)
        func delivered(_ job: String, _ token: String, _ position: Int) -> String {
            var result = NotificationResult(jobID: job, token: token, outcome: .delivered, reason: nil, attempts: 1)
            result.position = position
            return Self.line(result)
        }
        var counts = SendCounts()
        counts.jobs = 1
        counts.payloadEncodings = 1
        counts.outcomes.delivered = 2

        // Line 1 finished and journaled; killed before line 2 was recorded.
        try leaveKilledRun(
            lines: [delivered("dup", tokens[0], 0), delivered("dup", tokens[1], 1)], coveredLines: 2,
            finishedLines: [[1, 1]], counts: counts)
        let afterFinished = try await send(mock: mock, registry: nil, resume: true)
        XCTAssertEqual(
            try resultKeys().sorted(), ["dup/\(tokens[0])", "dup/\(tokens[1])", "line-2/-", "z/\(tokens[2])"])
        XCTAssertEqual(afterFinished.counts.outcomes.invalid, 1)
        XCTAssertEqual(afterFinished.counts.jobs, 3)
        XCTAssertEqual(Set(mock.stats.payloadsByToken.keys), [tokens[2]], "only z's token; the duplicate's is not sent")

        // Line 1 still running (one token answered), line 2's invalid line in the tail, the journal at the start.
        let sentBefore = mock.stats.accepted
        let refused = try resultLines().filter { try Self.object($0)["outcome"] as? String == "invalid" }
        try leaveKilledRun(lines: [delivered("dup", tokens[0], 0)] + refused)
        let afterRunning = try await send(mock: mock, registry: nil, resume: true)
        XCTAssertEqual(
            try resultKeys().sorted(), ["dup/\(tokens[0])", "dup/\(tokens[1])", "line-2/-", "z/\(tokens[2])"])
        XCTAssertEqual(afterRunning.counts.notifications, 4)
        XCTAssertEqual(afterRunning.counts.outcomes.invalid, 1, "the duplicate's line is not written again")
        XCTAssertEqual(
            mock.stats.accepted - sentBefore, 2, "dup's second token and z's: the refused line did not end dup")
        XCTAssertEqual(mock.stats.payloadsByToken[tokens[0]]?.count, nil, "dup's first token had a line")
    }

    /// `dup` to tokens 0 and 1, `dup` again to token 2 (refused), then `z` to token 2.
    private static func duplicateIDJobs(_ tokens: [String]) -> [String] {
        [
            #"{"id": "dup", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "first"}}, "tokens": ["\#(tokens[0])", "\#(tokens[1])"]}"#,
            #"{"id": "dup", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "second"}}, "tokens": ["\#(tokens[2])"]}"#,
            #"{"id": "z", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "z"}}, "tokens": ["\#(tokens[2])"]}"#,
        ]
    }

    // MARK: Recipients or the job file failing mid-read

    /// The registry failing partway through a job (here its second page of tokens; a SQLite or Redis error takes the
    /// same path) while the first page's 4,096 notifications are in flight. Every one of those gets its line, the
    /// job is not recorded as finished (no `invalid` line that would end it for `--resume`), and the run ends with an
    /// error naming the job and `--resume`. Resumed once the registry answers again, it sends only the tokens without
    /// a line, so each token is sent and recorded once; a second `--resume` adds nothing.
    func testARegistryThatFailsPartwayLeavesTheJobToResume() async throws {
        let tokens = (0..<(RegistryPaging.defaultPageSize + 500)).map { testDeviceToken($0) }
        let registry = PageFailingRegistry(try await makeRegistry(activity: "match-9", tokens: tokens))
        let mock = try MockHarness {
            $0.capturePayloads = true
            $0.latencyMilliseconds = 20
        }
        addTeardownBlock { mock.stop() }
        try write(
            [
                #"{"id": "v", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", \#(Self.updateContent), "activity_id": "match-9"}"#
            ], to: jobs)

        registry.failsAfterFirstPage = true
        let message = try await cutShortReason(mock: mock, registry: registry, resume: false)
        XCTAssertTrue(message?.contains(#"job "v" (line 1)"#) == true, message ?? "")
        XCTAssertTrue(message?.contains("registry") == true, message ?? "")
        XCTAssertTrue(message?.contains("--resume") == true, message ?? "")
        let firstKeys = try resultKeys()
        XCTAssertEqual(
            firstKeys.count, RegistryPaging.defaultPageSize, "a line for each notification of the first page")
        XCTAssertEqual(Set(firstKeys).count, firstKeys.count, "each once")
        XCTAssertFalse(firstKeys.contains("v/-"), "no job-level line: it would end the job for --resume")
        XCTAssertEqual(mock.stats.accepted, RegistryPaging.defaultPageSize)
        let stopped = try journal()
        XCTAssertFalse(stopped.isFinished(line: 1), "the job is not finished")
        XCTAssertEqual(stopped.counts.jobs, 0)
        XCTAssertEqual(stopped.counts.outcomes.delivered, RegistryPaging.defaultPageSize)
        XCTAssertEqual(stopped.resultsOffset, try FileManager.default.attributesOfItem(atPath: results)[.size] as? Int)

        registry.failsAfterFirstPage = false
        let resumed = try await send(mock: mock, registry: registry, resume: true)
        let keys = try resultKeys()
        XCTAssertEqual(keys.count, tokens.count, "one line per token")
        XCTAssertEqual(Set(tokens.map { "v/\($0)" }).subtracting(keys).count, 0, "every token has its line")
        XCTAssertEqual(resumed.counts.notifications, tokens.count)
        XCTAssertEqual(resumed.counts.outcomes.delivered, tokens.count)
        XCTAssertEqual(resumed.counts.outcomes.invalid, 0)
        XCTAssertEqual(resumed.counts.jobs, 1)
        XCTAssertEqual(mock.stats.accepted, tokens.count, "nothing sent twice")
        XCTAssertEqual(mock.stats.payloadsByToken.count, tokens.count, "nothing left out")

        let again = try await send(mock: mock, registry: registry, resume: true)
        XCTAssertEqual(try resultKeys().count, tokens.count, "a second --resume adds no line")
        XCTAssertEqual(again.counts.notifications, tokens.count)
        XCTAssertEqual(mock.stats.accepted, tokens.count, "and sends nothing")
    }

    /// A tokens file that opens but fails at read (an I/O error: here a symlink to /proc/self/mem, whose first read
    /// is EIO) ends its job with no line and unfinished, and the run with an error naming the job; the job after it
    /// runs to the end. Once the file reads, `--resume` sends its tokens (a malformed line in it is one recipient's
    /// `unregistered` result, not a failed read), and the job that finished is not sent again.
    func testATokensFileThatFailsMidReadLeavesItsJobToResume() async throws {
        let mock = try MockHarness { $0.capturePayloads = true }
        addTeardownBlock { mock.stop() }
        let tokens = (1...3).map { testDeviceToken($0) }
        let other = testDeviceToken(9)
        let tokensFile = "\(directory)/tokens.txt"
        try FileManager.default.createSymbolicLink(atPath: tokensFile, withDestinationPath: "/proc/self/mem")
        try write(
            [
                #"{"id": "f", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "f"}}, "tokens_file": "tokens.txt"}"#,
                #"{"id": "after", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "a"}}, "tokens": ["\#(other)"]}"#,
            ], to: jobs)

        let message = try await cutShortReason(mock: mock, registry: nil, resume: false)
        XCTAssertTrue(message?.contains(#"job "f" (line 1)"#) == true, message ?? "")
        XCTAssertTrue(message?.contains("Input/output error") == true, message ?? "")
        XCTAssertTrue(message?.contains("--resume") == true, message ?? "")
        XCTAssertEqual(try resultKeys(), ["after/\(other)"], "the other job ran; no line for the failed read")
        let stopped = try journal()
        XCTAssertFalse(stopped.isFinished(line: 1))
        XCTAssertTrue(stopped.isFinished(line: 2))

        try FileManager.default.removeItem(atPath: tokensFile)
        try write([tokens[0], "not-a-token", tokens[1], tokens[2]], to: tokensFile)
        let resumed = try await send(mock: mock, registry: nil, resume: true)
        XCTAssertEqual(
            try resultKeys().sorted(),
            (["after/\(other)", "f/line 2 (not hex, not shown)"] + tokens.map { "f/\($0)" }).sorted())
        XCTAssertEqual(resumed.counts.jobs, 2)
        XCTAssertEqual(resumed.counts.notifications, 5)
        XCTAssertEqual(resumed.counts.outcomes.delivered, 4)
        XCTAssertEqual(resumed.counts.outcomes.unregistered, 1)
        XCTAssertEqual(resumed.counts.outcomes.invalid, 0)
        XCTAssertEqual(
            mock.stats.payloadsByToken.mapValues(\.count),
            Dictionary(uniqueKeysWithValues: (tokens + [other]).map { ($0, 1) }))

        _ = try await send(mock: mock, registry: nil, resume: true)
        XCTAssertEqual(try resultKeys().count, 5, "a second --resume adds no line")
        XCTAssertEqual(mock.stats.accepted, 4, "and sends nothing")
    }

    /// The job file itself failing mid-read (a line over the reader's limit, lowered here, and longer than one
    /// 256 KiB chunk, so the reader sees it; an I/O error takes the same path) stops the run, but only once the job already started has run to the end: its notifications, in
    /// flight at the failure, are neither cancelled nor left without a line, and it is finished in the journal, so a
    /// `--resume` (which stops at the same line) does not send it again.
    func testAJobFileThatFailsMidReadFinishesTheJobsAlreadyStarted() async throws {
        let mock = try MockHarness { $0.latencyMilliseconds = 100 }
        addTeardownBlock { mock.stop() }
        let tokens = (0..<50).map { testDeviceToken($0) }
        let list = tokens.map { "\"\($0)\"" }.joined(separator: ", ")
        try write(
            [
                #"{"id": "a", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "a"}}, "tokens": [\#(list)]}"#,
                #"{"id": "long", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "\#(String(repeating: "x", count: 300_000))"}}, "tokens": ["\#(tokens[0])"]}"#,
            ], to: jobs)
        let limit: (inout SendOptions) -> Void = { $0.maximumJobLineLength = 64 << 10 }

        let message = try await cutShortReason(mock: mock, registry: nil, resume: false, configure: limit)
        XCTAssertTrue(message?.contains("line 2 is longer than 65536 bytes") == true, message ?? "")
        let lines = try resultLines().map { try Self.object($0) }
        XCTAssertEqual(lines.compactMap { $0["token"] as? String }.sorted(), tokens.sorted(), "one line per token")
        XCTAssertEqual(Set(lines.compactMap { $0["outcome"] as? String }), ["delivered"], "none cancelled")
        let stopped = try journal()
        XCTAssertTrue(stopped.isFinished(line: 1), "the started job is finished in the journal")
        XCTAssertEqual(stopped.counts.outcomes.delivered, tokens.count)
        XCTAssertEqual(mock.stats.accepted, tokens.count)

        let again = try await cutShortReason(mock: mock, registry: nil, resume: true, configure: limit)
        XCTAssertTrue(again?.contains("line 2 is longer than 65536 bytes") == true, again ?? "")
        XCTAssertEqual(try resultLines().count, tokens.count, "the resumed run adds no line")
        XCTAssertEqual(mock.stats.accepted, tokens.count, "and sends nothing again")
    }
}

/// A registry whose paged reads of an activity's tokens fail after the first page while `failsAfterFirstPage` is
/// set, as a registry that breaks partway through a job does; everything else goes to `store`.
private final class PageFailingRegistry: RegistryStore {
    private let store: SQLiteRegistryStore
    private let failing = FanoutMutex(false)

    init(_ store: SQLiteRegistryStore) { self.store = store }

    var failsAfterFirstPage: Bool {
        get { failing.withLock { $0 } }
        set { failing.withLock { $0 = newValue } }
    }

    var clock: RegistryClock { store.clock }
    func defineApps(_ apps: [RegistryApp]) async throws(RegistryError) { try await store.defineApps(apps) }
    func apps() async throws(RegistryError) -> [RegistryApp] { try await store.apps() }
    func apply(_ changes: [RegistryChange]) async throws(RegistryError) -> RegistryApplyResult {
        try await store.apply(changes)
    }
    func sweep(now: Int64, batchSize: Int) async throws(RegistryError) -> RegistrySweepResult {
        try await store.sweep(now: now, batchSize: batchSize)
    }
    func liveUpdateTokens(app: String, activityID: String, after: RegistryCursor?, limit: Int, now: Int64)
        async throws(RegistryError) -> RegistryPage<UpdateTokenRecord>
    {
        if after != nil && failsAfterFirstPage { throw RegistryError(.storage, "disk I/O error (injected)") }
        return try await store.liveUpdateTokens(app: app, activityID: activityID, after: after, limit: limit, now: now)
    }
    func endedChannels(now: Int64, limit: Int, skipping: Int) async throws(RegistryError) -> [EndedChannel] {
        try await store.endedChannels(now: now, limit: limit, skipping: skipping)
    }
    func liveUpdateTokenCount(app: String, activityID: String, now: Int64) async throws(RegistryError) -> Int {
        try await store.liveUpdateTokenCount(app: app, activityID: activityID, now: now)
    }
    func updateTokens(app: String, deviceID: String, after: RegistryCursor?, limit: Int, now: Int64)
        async throws(RegistryError) -> RegistryPage<UpdateTokenRecord>
    {
        try await store.updateTokens(app: app, deviceID: deviceID, after: after, limit: limit, now: now)
    }
    func pushToStartTokens(
        app: String, attributesType: String?, selection: RecipientSelection, after: RegistryCursor?, limit: Int
    ) async throws(RegistryError) -> RegistryPage<PushToStartRecord> {
        try await store.pushToStartTokens(
            app: app, attributesType: attributesType, selection: selection, after: after, limit: limit)
    }
    func devices(app: String, selection: RecipientSelection, after: RegistryCursor?, limit: Int)
        async throws(RegistryError) -> RegistryPage<DeviceRecord>
    {
        try await store.devices(app: app, selection: selection, after: after, limit: limit)
    }
    func activity(app: String, activityID: String) async throws(RegistryError) -> ActivityRecord? {
        try await store.activity(app: app, activityID: activityID)
    }
    func events(after: RegistryCursor?, limit: Int) async throws(RegistryError) -> RegistryPage<RegistryEvent> {
        try await store.events(after: after, limit: limit)
    }
    func stats(now: Int64) async throws(RegistryError) -> RegistryStats { try await store.stats(now: now) }
    func subscribe() -> AsyncStream<RegistryEvent> { store.subscribe() }
}
