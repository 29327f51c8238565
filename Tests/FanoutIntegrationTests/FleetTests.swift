// The fleet on Redis Streams, end to end: a real redis-server started by the test, mock-apns in
// process with its record file, and the real `fanout` binary for enqueue, worker, status and results.
//
// The issue's two "Must show" runs (3 workers; one killed) send its 300,000 notifications in 10 jobs, in shards of
// 5,000 (the default). The fault tests (Redis restart, SIGTERM) send 30,000 in 5 jobs of shards of 1,000: the same
// shape, so the suite stays well inside its time on two cores.
import FanoutRedis
import FanoutTestSupport
import Foundation
import XCTest

final class FleetTests: XCTestCase {
    private struct Scale {
        var jobs: Int
        var tokensPerJob: Int
        var shardSize: Int
        var total: Int { jobs * tokensPerJob }
        var shardsPerJob: Int { (tokensPerJob + shardSize - 1) / shardSize }

        /// At full scale: 300,000 notifications in 10 jobs.
        static let full = Scale(jobs: 10, tokensPerJob: 30_000, shardSize: 5_000)
        static let small = Scale(jobs: 5, tokensPerJob: 6_000, shardSize: 1_000)
    }

    private var scale = Scale.small

    private struct Fleet {
        /// The Redis server (with Sentinel: the primary at the start).
        let redis: RedisServerProcess
        /// The URL the commands are given: the server's, `redis+sentinel://` with Sentinel, `redis+cluster://` on a
        /// cluster.
        let url: String
        /// On a cluster: its nodes (`redis` is then its first primary).
        var cluster: RedisClusterProcess? = nil
        let mock: RestartableMock
        let directory: String
        let config: String
        let fanout: String

        func workerArguments(name: String, claimIdle: Int = 1) -> [String] {
            ["worker", "--redis", url, "--config", config, "--name", name, "--claim-idle", String(claimIdle)]
        }

        func run(_ arguments: [String], timeout: TimeInterval = 60) throws -> ProcessResult {
            try ProcessSupport.run(
                fanout, arguments, environment: ProcessSupport.cleanEnvironment(), timeout: timeout)
        }
    }

    /// - Parameters:
    ///   - appendOnly: Redis with AOF (`appendfsync always`), for a test that kills and restarts it.
    ///   - mockLatency: mock-apns's latency per request, in milliseconds.
    ///   - rateLimits: the config file's `rate_limits` object, if any.
    ///   - sentinel: one primary, one replica and three sentinels, the fleet given a `redis+sentinel://` URL.
    ///   - cluster: a Redis Cluster of three primaries, each with one replica, the fleet given a `redis+cluster://` URL.
    private func startFleet(
        appendOnly: Bool = false, mockLatency: UInt64 = 0, rateLimits: String? = nil, sentinel: Bool = false,
        cluster: Bool = false
    ) throws -> Fleet {
        let redis: RedisServerProcess
        var url: String
        var clusterProcess: RedisClusterProcess?
        if cluster {
            let nodes = try RedisClusterProcess(primaries: 3, replicasPerPrimary: 1)
            addTeardownBlock { nodes.discard() }
            (redis, url, clusterProcess) = (nodes.servers[0], nodes.url, nodes)
        } else if sentinel {
            let setup = try RedisSentinelSetup()
            addTeardownBlock { setup.discard() }
            (redis, url) = (setup.primary, setup.url)
        } else {
            redis = try RedisServerProcess(for: self, appendOnly: appendOnly)
            url = redis.url
        }
        let mock = try RestartableMock { $0.latencyMilliseconds = mockLatency }
        addTeardownBlock { _ = mock.stop() }
        let directory = try ProcessSupport.temporaryDirectory(for: self, "fleet")
        let config = "\(directory)/config.json"
        // One loop and two connections per worker: each worker's engine holds at most 4,000 notifications in flight.
        let text = """
            {"endpoint": "localhost:\(mock.port)", "ca_file": "\(mock.material.caPEMPath)",
             "key_path": "\(mock.material.authKeyP8Path)", "key_id": "KEYID12345", "team_id": "TEAMID1234",
             "loops": 1, "connections": 2\(rateLimits.map { ", \"rate_limits\": \($0)" } ?? "")}
            """
        try text.write(toFile: config, atomically: true, encoding: .utf8)
        return Fleet(
            redis: redis, url: url, cluster: clusterProcess, mock: mock, directory: directory, config: config,
            fanout: try ProcessSupport.builtExecutable("fanout"))
    }

    /// `scale.jobs` jobs of `scale.tokensPerJob` tokens (`testDeviceToken(job × tokensPerJob + i)`): all but the last
    /// from tokens files, the last inline.
    private func writeJobs(in directory: String) throws -> String {
        var lines: [String] = []
        for job in 0..<scale.jobs {
            let tokens = (job * scale.tokensPerJob..<(job + 1) * scale.tokensPerJob).map(testDeviceToken)
            let head =
                #"{"id": "fleet-\#(job)", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "update", "content_state": {"job": \#(job)}}"#
            if job == scale.jobs - 1 {
                lines.append(head + #", "tokens": ["# + tokens.map { "\"\($0)\"" }.joined(separator: ", ") + "]}")
            } else {
                try (tokens.joined(separator: "\n") + "\n").write(
                    toFile: "\(directory)/tokens-\(job).txt", atomically: true, encoding: .utf8)
                lines.append(head + #", "tokens_file": "tokens-\#(job).txt"}"#)
            }
        }
        let path = "\(directory)/jobs.jsonl"
        try (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// - Parameter partitions: `--partitions`: the shards spread over that many streams.
    private func enqueue(_ fleet: Fleet, partitions: Int = 1) throws {
        let jobs = try writeJobs(in: fleet.directory)
        let enqueued = try fleet.run(
            [
                "enqueue", "--redis", fleet.url, "--jobs", jobs, "--shard-size", String(scale.shardSize),
                "--partitions", String(partitions),
            ])
        XCTAssertEqual(enqueued.exitCode, 0, enqueued.summary)
        XCTAssertEqual(
            enqueued.stdoutLines,
            (0..<scale.jobs).map { #"{"job": "fleet-\#($0)", "shards": \#(scale.shardsPerJob)}"# }, enqueued.summary)
    }

    /// `fanout status`'s lines by job id.
    private func status(_ fleet: Fleet) throws -> [String: [String: Any]] {
        let result = try fleet.run(["status", "--redis", fleet.url])
        XCTAssertEqual(result.exitCode, 0, result.summary)
        var jobs: [String: [String: Any]] = [:]
        for line in result.stdoutLines {
            let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            jobs[try XCTUnwrap(object["job"] as? String)] = object
        }
        return jobs
    }

    private func waitUntilDone(_ fleet: Fleet, timeout: TimeInterval = 180) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let jobs = try status(fleet)
            let ours = (0..<scale.jobs).compactMap { jobs["fleet-\($0)"] }
            if ours.count == scale.jobs, ours.allSatisfy({ $0["state"] as? String == "done" }) { return }
            guard Date() < deadline else {
                throw ProcessSupportError("the fleet did not finish within \(timeout) s: \(jobs)")
            }
            usleep(200_000)
        }
    }

    /// Every job's `fanout results`: exactly one line per (job, token), all delivered, and the summary says so.
    private func checkResults(_ fleet: Fleet) throws {
        for job in 0..<scale.jobs {
            let out = "\(fleet.directory)/results-\(job).jsonl"
            let result = try fleet.run(["results", "--redis", fleet.url, "--job", "fleet-\(job)", "--out", out])
            XCTAssertEqual(result.exitCode, 0, result.summary)
            let lines = try String(contentsOfFile: out, encoding: .utf8).split(separator: "\n")
            var tokens: [String] = []
            for line in lines {
                let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
                XCTAssertEqual(object["job"] as? String, "fleet-\(job)")
                XCTAssertEqual(object["outcome"] as? String, "delivered", String(line))
                tokens.append(try XCTUnwrap(object["token"] as? String))
            }
            let expected = (job * scale.tokensPerJob..<(job + 1) * scale.tokensPerJob).map(testDeviceToken)
            XCTAssertEqual(tokens, expected, "fleet-\(job): one line per token, in job order")
            let summaryLine = try XCTUnwrap(result.stdoutLines.last, result.summary)
            let summary = try XCTUnwrap(
                try JSONSerialization.jsonObject(with: Data(summaryLine.utf8)) as? [String: Any], summaryLine)
            XCTAssertEqual(summary["notifications"] as? Int, scale.tokensPerJob, summaryLine)
            XCTAssertEqual(summary["delivered"] as? Int, scale.tokensPerJob, summaryLine)
            XCTAssertEqual(summary["jobs"] as? Int, 1, summaryLine)
            if job == 0 {
                // Without --out: the same lines on stdout, then the summary as its last line.
                let plain = try fleet.run(["results", "--redis", fleet.url, "--job", "fleet-0"])
                XCTAssertEqual(plain.exitCode, 0, plain.summary)
                XCTAssertEqual(plain.stdoutLines.dropLast(), lines.map(String.init)[...])
                XCTAssertEqual(plain.stdoutLines.last, summaryLine)
                try checkResultsAreWrittenThrough(fleet, lines: lines.count)
            }
        }
    }

    /// `--out` writes through what its path names (a symbolic link stays a link; Foundation's createFile renamed a
    /// new file over the path, so `--out /dev/full` replaced the device node), and results that cannot be written,
    /// to `--out` or to stdout, are an error (exit 2, one line), not a success with nothing written.
    private func checkResultsAreWrittenThrough(_ fleet: Fleet, lines: Int) throws {
        let files = FileManager.default
        let link = "\(fleet.directory)/results-link.jsonl"
        try files.createSymbolicLink(atPath: link, withDestinationPath: "results-target.jsonl")
        let linked = try fleet.run(["results", "--redis", fleet.url, "--job", "fleet-0", "--out", link])
        XCTAssertEqual(linked.exitCode, 0, linked.summary)
        XCTAssertEqual(try files.destinationOfSymbolicLink(atPath: link), "results-target.jsonl", "still a link")
        let target = try String(contentsOfFile: "\(fleet.directory)/results-target.jsonl", encoding: .utf8)
        XCTAssertEqual(target.split(separator: "\n").count, lines)
        // A link to /dev/full stands for a full disk (the device itself is never at stake).
        let full = "\(fleet.directory)/full"
        try files.createSymbolicLink(atPath: full, withDestinationPath: "/dev/full")
        let toFull = try fleet.run(["results", "--redis", fleet.url, "--job", "fleet-0", "--out", full])
        XCTAssertEqual(toFull.exitCode, 2, toFull.summary)
        XCTAssertEqual(toFull.stderrLines, ["fanout results: cannot write \(full): No space left on device"])
        XCTAssertEqual(try files.destinationOfSymbolicLink(atPath: full), "/dev/full")
        let stdoutFull = try ProcessSupport.run(
            "/bin/sh",
            ["-c", "exec \"$0\" results --redis \"$1\" --job fleet-0 > /dev/full", fleet.fanout, fleet.url],
            environment: ProcessSupport.cleanEnvironment())
        XCTAssertEqual(stdoutFull.exitCode, 2, stdoutFull.summary)
        XCTAssertEqual(
            stdoutFull.stderrLines,
            ["fanout results: cannot write the results to standard output: No space left on device"])
    }

    private func startWorkers(_ fleet: Fleet, count: Int, claimIdle: Int = 1) throws -> [RunningProcess] {
        try (0..<count).map { index in
            let worker = try RunningProcess(
                fleet.fanout, fleet.workerArguments(name: "w\(index)", claimIdle: claimIdle),
                environment: ProcessSupport.cleanEnvironment())
            addTeardownBlock { worker.kill(SIGKILL) }
            return worker
        }
    }

    func testThreeWorkersSendTenJobsWithExactlyOneResultPerTokenAndNoDuplicates() throws {
        scale = .full
        let fleet = try startFleet()
        try enqueue(fleet)
        // A job id is enqueued once: the same file again is refused line by line.
        let again = try fleet.run(["enqueue", "--redis", fleet.url, "--jobs", "\(fleet.directory)/jobs.jsonl"])
        XCTAssertEqual(again.exitCode, 1, again.summary)
        XCTAssertTrue(again.stdout.isEmpty, again.summary)
        XCTAssertTrue(again.stderr.contains("job fleet-0 is already enqueued in Redis"), again.summary)
        // A registry-addressed job whose app the registry on this Redis does not know is refused with the reason
        // (FleetRegistryTests sends them); the others go on.
        let mixed = "\(fleet.directory)/mixed.jsonl"
        try
            ([
                #"{"id": "by-activity", "app": "com.example.app", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", "live_activity": {"event": "update", "content_state": {}}, "activity_id": "match-7"}"#,
                #"{"id": "empty", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens_file": "empty.txt"}"#,
            ].joined(separator: "\n") + "\n").write(toFile: mixed, atomically: true, encoding: .utf8)
        XCTAssertTrue(FileManager.default.createFile(atPath: "\(fleet.directory)/empty.txt", contents: nil))
        let refused = try fleet.run(["enqueue", "--redis", fleet.url, "--jobs", mixed])
        XCTAssertEqual(refused.exitCode, 1, refused.summary)
        XCTAssertEqual(refused.stdoutLines, [#"{"job": "empty", "shards": 0}"#], refused.summary)
        XCTAssertTrue(
            refused.stderr.contains(#"line 1: app: "com.example.app" is not in the registry"#), refused.summary)

        let start = Date()
        let workers = try startWorkers(fleet, count: 3)
        try waitUntilDone(fleet)
        let seconds = Date().timeIntervalSince(start)
        for worker in workers {
            XCTAssertEqual(try worker.stop(timeout: 20), 0, "SIGTERM: a clean exit")
        }
        try checkResults(fleet)
        let status = try status(fleet)
        XCTAssertEqual(status["fleet-0"]?["shards_done"] as? Int, scale.shardsPerJob, "\(status)")
        XCTAssertEqual(status["fleet-0"]?["delivered"] as? Int, scale.tokensPerJob, "\(status)")
        // Every outcome's count (the outcomes of docs/SEND.md), `cancelled` and `superseded` too.
        for outcome in [
            "rejected", "unregistered", "failed", "expired", "rate_limited", "invalid", "cancelled", "superseded",
        ] {
            XCTAssertEqual(status["fleet-0"]?[outcome] as? Int, 0, "\(outcome): \(status)")
        }

        XCTAssertTrue(fleet.mock.stop())
        let counts = try fleet.mock.acceptedPerToken(count: scale.total)
        XCTAssertEqual(counts.distinct, scale.total, "every token reached the mock")
        XCTAssertEqual(counts.duplicates, 0, "no token was sent twice")
        XCTAssertEqual(counts.foreign, 0)
        print(
            "fleet: 3 workers, \(scale.total) notifications in \(scale.jobs) jobs, "
                + "\(String(format: "%.1f", seconds)) s from the workers' start to the last shard")
    }

    /// Three workers share workspace acme's 7,200 jobs per hour (2 per second) with a burst of 5 and
    /// `wait`. Each job is one shard of one token, so a job's `finished_at` follows its admission closely. Priority 5
    /// can take 4 of the burst (priority 10 and 1 keep their reservations), so any 10 s admit at most 4 + 20 = 24
    /// jobs; the workspace other, on the default budget, is not held back.
    func testThreeWorkersShareOneWorkspaceBudget() async throws {
        let fleet = try startFleet(
            rateLimits: #"{"default": {"requests_per_hour": 250000}, "workspaces": {"acme": "#
                + #"{"requests_per_hour": 7200, "burst_seconds": 5, "policy": "wait"}}}"#)
        var lines: [String] = []
        for (workspace, count) in [("acme", 40), ("other", 10)] {
            for job in 0..<count {
                lines.append(
                    #"{"id": "\#(workspace)-\#(job)", "workspace": "\#(workspace)", "topic": "com.example.app", "push_type": "alert", "priority": 5, "payload": {"aps": {"alert": "hi"}}, "tokens": ["\#(testDeviceToken(job))"]}"#
                )
            }
        }
        let jobs = "\(fleet.directory)/budget.jsonl"
        try (lines.joined(separator: "\n") + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let enqueued = try fleet.run(["enqueue", "--redis", fleet.url, "--jobs", jobs])
        XCTAssertEqual(enqueued.exitCode, 0, enqueued.summary)
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: fleet.url)))
        defer { Task { await client.shutdown() } }
        func finished(_ id: String) async throws -> Int64? {
            try await client.command(["HGET", RedisArgument("fanout:job:{\(id)}"), "finished_at"]).integer
        }
        func finishedCount(_ workspace: String, _ count: Int) async throws -> Int {
            var done = 0
            for job in 0..<count where try await finished("\(workspace)-\(job)") != nil { done += 1 }
            return done
        }
        let workers = try startWorkers(fleet, count: 3)
        // Until 25 of acme's jobs are done (the burst's 4 and 21 at the rate: what the checks of the rate below need)
        // and all of other's; then stop while acme's last ones are still to come (the workers finish the shards they
        // hold, at the budget's rate, before they exit).
        let deadline = Date().addingTimeInterval(60 * testTimeScale)
        var acmeDone = 0
        var otherDone = 0
        while acmeDone < 25 || otherDone < 10 {
            guard Date() < deadline else {
                return XCTFail("acme finished \(acmeDone) of 25 jobs, other \(otherDone) of 10, in time")
            }
            try await Task.sleep(for: .milliseconds(100))
            acmeDone = try await finishedCount("acme", 40)
            otherDone = try await finishedCount("other", 10)
        }
        for worker in workers { worker.kill(SIGTERM) }
        for worker in workers { _ = worker.waitForExit(timeout: 20) }

        var acme: [Int64] = []
        for job in 0..<40 { if let at = try await finished("acme-\(job)") { acme.append(at) } }
        acme.sort()
        XCTAssertGreaterThanOrEqual(acme.count, 24, "the budget was used: \(acme)")
        for (index, start) in acme.enumerated() {
            let window = acme[index...].prefix { $0 < start + 10_000 }.count
            XCTAssertLessThanOrEqual(window, 24, "jobs finished within 10 s of \(start): \(acme)")
        }
        // From the first to the 21st finished job (20 past the burst) at 2 per second: about 10 s, never much less.
        if acme.count > 24 { XCTAssertGreaterThanOrEqual(acme[24] - acme[4], 9_500, "\(acme)") }
        for job in 0..<10 {
            let at = try await finished("other-\(job)")
            XCTAssertNotNil(at, "workspace other is not held back by acme's budget")
        }
        // The workers returned their unspent leases on SIGTERM: no lease record is left.
        let records = try await client.command(["KEYS", "fanout:budget:*:lease:*"]).array ?? []
        XCTAssertEqual(records, [], "leases left after shutdown")
    }

    /// Three workers starting at once share one provider token, minted by one of them under the
    /// Redis lock, and mock-apns sees that token only.
    func testThreeWorkersStartingAtOnceMintOneProviderTokenAndTheMockSeesOnlyThatOne() throws {
        let fleet = try startFleet()
        let tokens = (0..<3_000).map(testDeviceToken)
        try (tokens.joined(separator: "\n") + "\n").write(
            toFile: "\(fleet.directory)/token-tokens.txt", atomically: true, encoding: .utf8)
        let jobs = "\(fleet.directory)/token-jobs.jsonl"
        try
            (#"{"id": "one-token", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens_file": "token-tokens.txt"}"#
            + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let enqueued = try fleet.run(["enqueue", "--redis", fleet.url, "--jobs", jobs, "--shard-size", "100"])
        XCTAssertEqual(enqueued.exitCode, 0, enqueued.summary)

        let workers = try startWorkers(fleet, count: 3)
        let deadline = Date().addingTimeInterval(120)
        while try status(fleet)["one-token"]?["state"] as? String != "done" {
            guard Date() < deadline else { return XCTFail("the job did not finish: \(try status(fleet))") }
            usleep(200_000)
        }
        for worker in workers {
            XCTAssertEqual(try worker.stop(timeout: 20), 0, "SIGTERM: a clean exit")
        }
        XCTAssertEqual(fleet.mock.distinctProviderTokens(), 1, "one provider token for the whole fleet")
        let totals = fleet.mock.totals()
        XCTAssertEqual(totals.accepted, tokens.count)
        XCTAssertGreaterThanOrEqual(totals.connections, 3, "every worker sent (each opens its own connections)")
    }

    func testAWorkerKilledMidRunLeavesItsShardsToTheOthersWithDuplicatesOnlyFromThem() async throws {
        scale = .full
        let fleet = try startFleet()
        try enqueue(fleet)
        let workers = try startWorkers(fleet, count: 3)
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: fleet.url)))

        // Kill w0 with SIGKILL once sending is under way and it holds shards.
        let deadline = Date().addingTimeInterval(120)
        var pending: [RedisValue] = []
        while true {
            XCTAssertTrue(Date() < deadline, "w0 never held a shard while the fleet was sending")
            if Date() >= deadline { return }
            if fleet.mock.totals().accepted >= scale.total / 10 {
                pending =
                    try await client.command([
                        "XPENDING", "fanout:shards", "fanout-workers", "-", "+", "100", "w0",
                    ]).array ?? []
                if !pending.isEmpty {
                    workers[0].kill(SIGKILL)
                    break
                }
            }
            try await Task.sleep(for: .milliseconds(5))
        }
        XCTAssertTrue(workers[0].waitForExit(timeout: 10))
        let acceptedAtKill = fleet.mock.totals().accepted
        XCTAssertLessThan(acceptedAtKill, scale.total, "the kill came before the end")
        // The token indices of the shards w0 held (still pending under its name right after the kill).
        let owned =
            try await client.command([
                "XPENDING", "fanout:shards", "fanout-workers", "-", "+", "100", "w0",
            ]).array ?? []
        var held = Set<Int>()
        for entry in owned {
            let id = try XCTUnwrap(entry.array?.first?.string)
            let range = try await client.command(["XRANGE", "fanout:shards", RedisArgument(id), RedisArgument(id)])
            let fields = try XCTUnwrap(range.array?.first?.array?[1].array).compactMap(\.string)
            let values = Dictionary(
                uniqueKeysWithValues: stride(from: 0, to: fields.count - 1, by: 2).map { (fields[$0], fields[$0 + 1]) })
            let job = try XCTUnwrap(values["job"].flatMap { Int($0.dropFirst("fleet-".count)) })
            let start = try XCTUnwrap(values["start"].flatMap(Int.init))
            let count = try XCTUnwrap(values["count"].flatMap(Int.init))
            for position in start..<start + count { held.insert(job * scale.tokensPerJob + position) }
        }
        XCTAssertFalse(held.isEmpty, "w0 held shards at its death")

        // The two others claim w0's shards after --claim-idle (1 s) and finish everything.
        try waitUntilDone(fleet)
        for worker in workers.dropFirst() {
            XCTAssertEqual(try worker.stop(timeout: 20), 0, "SIGTERM: a clean exit")
        }
        try checkResults(fleet)
        // Done shards leave nothing behind on the stream: acknowledged, deleted, their tokens keys gone.
        let length = try await client.command(["XLEN", "fanout:shards"])
        XCTAssertEqual(length, .integer(0))
        let tokenKeys = try await client.command(["KEYS", "fanout:job:*:tokens:*"])
        XCTAssertEqual(tokenKeys, .array([]))
        await client.shutdown()

        XCTAssertTrue(fleet.mock.stop())
        let counts = try fleet.mock.acceptedPerToken(count: scale.total)
        XCTAssertEqual(counts.distinct, scale.total, "every token reached the mock")
        // Sent twice: only tokens of the shards w0 held (at most 4 concurrent shards), and of those only what was in
        // flight (its engine holds at most 4,000) or not yet written to Redis when it died.
        let twice = counts.perToken.indices.filter { counts.perToken[$0] > 1 }
        XCTAssertTrue(
            Set(twice).isSubset(of: held), "duplicates outside w0's shards: \(Set(twice).subtracting(held).count)")
        XCTAssertLessThanOrEqual(counts.duplicates, 4 * scale.shardSize)
        print(
            "fleet kill test: accepted at the kill \(acceptedAtKill) of \(scale.total); w0 held \(held.count) tokens; "
                + "sent twice \(counts.duplicates)")
    }

    /// redis-server (AOF, `appendfsync always`) killed with SIGKILL mid-run and started again on the same port
    /// and directory about a second later. The workers pause (their Redis calls fail or wait for a connection),
    /// reconnect and go on: every (job, token) has one result, every token is delivered, and no worker exits.
    ///
    /// `--claim-idle 5`, longer than the outage: a live worker's shards are not claimed by the other while Redis is
    /// down (a shorter one would let the outage pass for a death, and the claimed shards be sent twice, which the
    /// kill test covers). What could be sent twice here is bounded by the shards held at the kill: 2 workers × 4
    /// concurrent shards × 1,000 tokens.
    func testRedisRestartMidRunLosesNothingAndDuplicatesOnlyWhatWasInFlight() async throws {
        let fleet = try startFleet(appendOnly: true, mockLatency: 5)
        try enqueue(fleet)
        let workers = try startWorkers(fleet, count: 2, claimIdle: 5)

        // Kill Redis once sending is well under way.
        let deadline = Date().addingTimeInterval(120)
        while fleet.mock.totals().accepted < scale.total / 5 {
            XCTAssertTrue(Date() < deadline, "sending did not start")
            if Date() >= deadline { return }
            try await Task.sleep(for: .milliseconds(5))
        }
        fleet.redis.kill()
        let killedAt = Date()
        let acceptedAtKill = fleet.mock.totals().accepted
        XCTAssertLessThan(acceptedAtKill, scale.total, "the kill came before the end")

        // Down for about a second: the outage is the stimulus. Meanwhile the workers must notice and stay up.
        while Date().timeIntervalSince(killedAt) < 1 {
            try await Task.sleep(for: .milliseconds(50))
        }
        for (index, worker) in workers.enumerated() {
            XCTAssertTrue(worker.isRunning, "w\(index) exited while Redis was down: \(worker.stderrText())")
        }
        let acceptedWhileDown = fleet.mock.totals().accepted - acceptedAtKill
        try fleet.redis.restart()
        let downSeconds = Date().timeIntervalSince(killedAt)

        // The AOF kept the consumer group and its pending shards.
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: fleet.url)))
        let groups = try await client.command(["XINFO", "GROUPS", "fanout:shards"]).array ?? []
        XCTAssertEqual(groups.count, 1, "the consumer group survived the restart: \(groups)")

        try waitUntilDone(fleet)
        let seconds = Date().timeIntervalSince(killedAt)
        for (index, worker) in workers.enumerated() {
            XCTAssertTrue(worker.isRunning, "w\(index) exited: \(worker.stderrText())")
            XCTAssertEqual(try worker.stop(timeout: 20), 0, "SIGTERM: a clean exit")
        }
        // What the workers logged about the outage (failed calls they retried), for the report.
        let retried = workers.map { worker in
            worker.stderrText().split(separator: "\n").filter { $0.contains("retrying") }.count
        }
        try checkResults(fleet)
        let length = try await client.command(["XLEN", "fanout:shards"])
        XCTAssertEqual(length, .integer(0), "every shard acknowledged and deleted")
        let pending = try await client.command(["XPENDING", "fanout:shards", "fanout-workers"]).array
        XCTAssertEqual(pending?.first, .integer(0), "\(String(describing: pending))")
        await client.shutdown()

        XCTAssertTrue(fleet.mock.stop())
        let counts = try fleet.mock.acceptedPerToken(count: scale.total)
        XCTAssertEqual(counts.distinct, scale.total, "every token reached the mock")
        XCTAssertEqual(counts.foreign, 0)
        XCTAssertLessThanOrEqual(counts.duplicates, 2 * 4 * scale.shardSize, "within the shards held at the kill")
        print(
            "fleet redis restart test: accepted at the kill \(acceptedAtKill) of \(scale.total), "
                + "\(acceptedWhileDown) more while Redis was down \(String(format: "%.2f", downSeconds)) s; "
                + "done \(String(format: "%.1f", seconds)) s after the kill; sent twice \(counts.duplicates); "
                + "retries logged per worker \(retried)")
    }

    /// The fleet on Redis Sentinel (one primary, one replica, three sentinels): the primary killed with SIGKILL
    /// mid-run, the sentinels promote the replica and the workers follow it (they ask the sentinels again when the
    /// connection is lost or a server answers READONLY). The run completes with one result per (job, token). A write
    /// acknowledged just before the kill may not have reached the replica (replication is asynchronous): its shard's
    /// progress goes back, and those notifications are sent again and recorded once.
    func testAFleetOnSentinelRidesOutThePrimaryKilledMidRun() async throws {
        let fleet = try startFleet(mockLatency: 5, sentinel: true)
        try enqueue(fleet)
        let workers = try startWorkers(fleet, count: 2, claimIdle: 5)
        let deadline = Date().addingTimeInterval(120)
        while fleet.mock.totals().accepted < scale.total / 5 {
            XCTAssertTrue(Date() < deadline, "sending did not start")
            if Date() >= deadline { return }
            try await Task.sleep(for: .milliseconds(5))
        }
        fleet.redis.kill()
        let killedAt = Date()
        let acceptedAtKill = fleet.mock.totals().accepted
        XCTAssertLessThan(acceptedAtKill, scale.total, "the kill came before the end")

        // Until the sentinels have promoted the replica they still name the dead primary, and a one-shot `fanout
        // status` fails: wait for one that answers, then for the run to end.
        let promoted = Date().addingTimeInterval(30 * testTimeScale)
        while try fleet.run(["status", "--redis", fleet.url]).exitCode != 0 {
            XCTAssertTrue(Date() < promoted, "no primary answered 30 s after the kill")
            if Date() >= promoted { return }
            try await Task.sleep(for: .milliseconds(200))
        }
        try waitUntilDone(fleet)
        let seconds = Date().timeIntervalSince(killedAt)
        for (index, worker) in workers.enumerated() {
            XCTAssertTrue(worker.isRunning, "w\(index) exited: \(worker.stderrText())")
            XCTAssertEqual(try worker.stop(timeout: 20), 0, "SIGTERM: a clean exit")
        }
        try checkResults(fleet)
        XCTAssertTrue(fleet.mock.stop())
        let counts = try fleet.mock.acceptedPerToken(count: scale.total)
        XCTAssertEqual(counts.distinct, scale.total, "every token reached the mock")
        XCTAssertEqual(counts.foreign, 0)
        XCTAssertLessThanOrEqual(counts.duplicates, 2 * 4 * scale.shardSize, "within the shards held at the kill")
        print(
            "fleet sentinel failover test: accepted at the kill \(acceptedAtKill) of \(scale.total); done "
                + "\(String(format: "%.1f", seconds)) s after the kill; sent twice \(counts.duplicates)")
    }

    /// Every command's `calls` in the node's `INFO commandstats`, by command name.
    private func commandCalls(_ cluster: RedisClusterProcess, port: Int) throws -> [String: Int] {
        var calls: [String: Int] = [:]
        for line in try cluster.cli(port, ["INFO", "commandstats"]).split(whereSeparator: \.isNewline) {
            guard line.hasPrefix("cmdstat_"), let colon = line.firstIndex(of: ":") else { continue }
            let name = String(line[line.index(line.startIndex, offsetBy: 8)..<colon])
            let field = line[line.index(after: colon)...].split(separator: ",").first { $0.hasPrefix("calls=") }
            calls[name] = field.flatMap { Int($0.dropFirst("calls=".count)) } ?? 0
        }
        return calls
    }

    /// The full-scale run on a Redis Cluster (three primaries, each with a replica): `fanout enqueue --partitions 6`
    /// spreads the shards over six streams, the jobs' hash tags spread their keys; 3 workers send 300,000
    /// notifications in 10 jobs with exactly one result per (job, token) and none sent twice, and every primary takes
    /// part of the work (its command counts grow), the streams being read on more than one.
    func testThreeWorkersSendTenJobsOnAClusterWithExactlyOneResultPerTokenAndNoDuplicates() throws {
        scale = .full
        let fleet = try startFleet(cluster: true)
        let cluster = try XCTUnwrap(fleet.cluster)
        let primaries = try cluster.nodes().filter(\.isPrimary).map(\.port)
        XCTAssertEqual(primaries.count, 3)
        let partitions = 6
        try enqueue(fleet, partitions: partitions)
        let streams = (0..<partitions).map { $0 == 0 ? "fanout:shards" : "fanout:shards:\($0)" }
        let streamPrimaries = try Set(
            streams.map { try cluster.primary(servingSlot: RedisClusterSlot.slot(of: Array($0.utf8))).port })
        XCTAssertGreaterThan(streamPrimaries.count, 1, "the partitions' streams are on several primaries")
        let before = try primaries.map { try commandCalls(cluster, port: $0) }

        let start = Date()
        let workers = try startWorkers(fleet, count: 3)
        try waitUntilDone(fleet)
        let seconds = Date().timeIntervalSince(start)
        for worker in workers {
            XCTAssertEqual(try worker.stop(timeout: 20), 0, "SIGTERM: a clean exit")
        }
        let after = try primaries.map { try commandCalls(cluster, port: $0) }
        // Each primary has a replica: every shard's completion waited for it before the shard left its stream.
        let waits = zip(before, after).reduce(0) { $0 + ($1.1["wait"] ?? 0) - ($1.0["wait"] ?? 0) }
        XCTAssertGreaterThanOrEqual(waits, scale.jobs * scale.shardsPerJob, "a WAIT per shard's completion")
        var spread: [String] = []
        for (index, port) in primaries.enumerated() {
            func delta(_ command: String) -> Int { (after[index][command] ?? 0) - (before[index][command] ?? 0) }
            let total = after[index].keys.reduce(0) { $0 + delta($1) }
            XCTAssertGreaterThan(delta("evalsha"), 0, "primary \(port) recorded results")
            XCTAssertGreaterThan(total, 0, "primary \(port) took commands")
            if streamPrimaries.contains(port) {
                XCTAssertGreaterThan(delta("xreadgroup"), 0, "primary \(port) holds a stream that was read")
                XCTAssertGreaterThan(delta("xack"), 0, "primary \(port) holds a stream whose shards were done")
            }
            spread.append(
                "\(port): \(total) commands (evalsha \(delta("evalsha")), xreadgroup \(delta("xreadgroup")), "
                    + "xack \(delta("xack")))")
        }
        try checkResults(fleet)
        XCTAssertTrue(fleet.mock.stop())
        let counts = try fleet.mock.acceptedPerToken(count: scale.total)
        XCTAssertEqual(counts.distinct, scale.total, "every token reached the mock")
        XCTAssertEqual(counts.duplicates, 0, "no token was sent twice")
        XCTAssertEqual(counts.foreign, 0)
        print(
            "fleet on a cluster: 3 workers, \(scale.total) notifications in \(scale.jobs) jobs, "
                + "\(String(format: "%.1f", seconds)) s from the workers' start to the last shard; \(waits) WAITs; per primary: "
                + spread.joined(separator: "; "))
    }

    /// A Redis Cluster (three primaries, each with a replica) loses, to SIGKILL, the primary holding a job's keys
    /// mid-run: the cluster promotes its replica (node timeout 1 s), the workers' commands to those slots wait for it,
    /// and the run completes with one result per (job, token), each counted once. Sent twice: at most what the
    /// workers held at the kill (3 workers × 4 shards): shards whose heartbeats failed while the slots had no
    /// primary, claimed by another worker, and positions whose results the old primary acknowledged but had not
    /// passed to its replica, sent again before their shard completes.
    func testAFleetOnAClusterRidesOutAPrimaryKilledMidRun() async throws {
        let fleet = try startFleet(cluster: true)
        let cluster = try XCTUnwrap(fleet.cluster)
        try enqueue(fleet, partitions: 6)
        let slot = RedisClusterSlot.slot(of: Array("fanout:job:{fleet-0}".utf8))
        let victim = try cluster.primary(servingSlot: slot)
        let heir = try XCTUnwrap(try cluster.nodes().first { $0.primaryID == victim.id }, "the victim's replica")
        let workers = try startWorkers(fleet, count: 3)
        let deadline = Date().addingTimeInterval(120)
        while fleet.mock.totals().accepted < scale.total / 5 {
            XCTAssertTrue(Date() < deadline, "sending did not start")
            if Date() >= deadline { return }
            try await Task.sleep(for: .milliseconds(5))
        }
        try XCTUnwrap(cluster.server(port: victim.port)).kill()
        let killedAt = Date()
        let acceptedAtKill = fleet.mock.totals().accepted
        XCTAssertLessThan(acceptedAtKill, scale.total, "the kill came before the end")

        // `fanout status` reads every job's keys: it answers once the replica serves the victim's slots.
        let promoted = Date().addingTimeInterval(30 * testTimeScale)
        while (try? cluster.primary(servingSlot: slot).port) != heir.port {
            XCTAssertTrue(Date() < promoted, "the replica was not promoted 30 s after the kill")
            if Date() >= promoted { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        let failover = Date().timeIntervalSince(killedAt)
        try waitUntilDone(fleet)
        let seconds = Date().timeIntervalSince(killedAt)
        for (index, worker) in workers.enumerated() {
            XCTAssertTrue(worker.isRunning, "w\(index) exited: \(worker.stderrText())")
            XCTAssertEqual(try worker.stop(timeout: 20), 0, "SIGTERM: a clean exit")
        }
        try checkResults(fleet)
        XCTAssertTrue(fleet.mock.stop())
        let counts = try fleet.mock.acceptedPerToken(count: scale.total)
        XCTAssertEqual(counts.distinct, scale.total, "every token reached the mock")
        XCTAssertEqual(counts.foreign, 0)
        XCTAssertLessThanOrEqual(counts.duplicates, 3 * 4 * scale.shardSize, "within the shards held at the kill")
        print(
            "fleet cluster failover test: accepted at the kill \(acceptedAtKill) of \(scale.total); replica promoted "
                + "\(String(format: "%.1f", failover)) s and the run done \(String(format: "%.1f", seconds)) s after "
                + "the kill; sent twice \(counts.duplicates)")
    }

    /// redis-server (AOF, `appendfsync always`) killed and started again while `fanout enqueue` is writing a job's
    /// shards: the enqueue rides it out (each step tried again, saying so) and ends with every shard on the stream
    /// exactly once, in one job listed once. Before, the first lost answer ended it (exit 2) with the job half
    /// enqueued and its id taken.
    func testRedisRestartDuringAnEnqueueIsRiddenOutWithEveryShardOnce() async throws {
        let fleet = try startFleet(appendOnly: true)
        let tokens = 300_000
        let shardSize = 100
        let tokensFile = "\(fleet.directory)/tokens.txt"
        try ((0..<tokens).map(testDeviceToken).joined(separator: "\n") + "\n").write(
            toFile: tokensFile, atomically: true, encoding: .utf8)
        let jobs = "\(fleet.directory)/jobs.jsonl"
        try
            (#"{"id": "big", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens_file": "tokens.txt"}"#
            + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let enqueue = try RunningProcess(
            fleet.fanout, ["enqueue", "--redis", fleet.url, "--jobs", jobs, "--shard-size", String(shardSize)],
            environment: ProcessSupport.cleanEnvironment())
        addTeardownBlock { enqueue.kill(SIGKILL) }
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: fleet.url)))
        defer { Task { await client.shutdown() } }
        func shardsWritten() async -> Int {
            guard case .bytes(let value)? = try? await client.command(["HGET", "fanout:job:{big}", "shards"]) else {
                return 0
            }
            return Int(String(decoding: value, as: UTF8.self)) ?? 0
        }
        // Kill Redis once the enqueue is well under way (each shard is one fsync'd transaction, so it takes seconds).
        let deadline = Date().addingTimeInterval(60)
        while await shardsWritten() < 100 {
            guard Date() < deadline, enqueue.isRunning else {
                XCTFail("the enqueue did not get going: \(enqueue.stderrText())")
                return
            }
            try await Task.sleep(for: .milliseconds(5))
        }
        // Writes held first, so that the kill finds a command in flight: the enqueue's next write waits in the server,
        // read and postponed (a client Redis holds is `blocked`). Killed between two commands, the client would
        // reconnect before the next and never see a loss.
        _ = try await client.command(["CLIENT", "PAUSE", "60000", "WRITE"])
        func blockedClients() async -> Int {
            guard case .bytes(let info)? = try? await client.command(["INFO", "clients"]) else { return 0 }
            let line = String(decoding: info, as: UTF8.self).split(whereSeparator: \.isNewline)
                .first { $0.hasPrefix("blocked_clients:") }
            return line.flatMap { Int($0.dropFirst("blocked_clients:".count)) } ?? 0
        }
        let held = Date().addingTimeInterval(10 * testTimeScale)
        while await blockedClients() == 0 {
            guard Date() < held, enqueue.isRunning else {
                return XCTFail("no command of the enqueue was held by the server: \(enqueue.stderrText())")
            }
            try await Task.sleep(for: .milliseconds(5))
        }
        fleet.redis.kill()
        // The enqueue sees the lost connection and says it tries again (the check that it rides the outage out,
        // rather than exiting, is that it is still running after saying so).
        let noticed = Date().addingTimeInterval(10 * testTimeScale)
        while !enqueue.stderrText().contains("trying again") && enqueue.isRunning && Date() < noticed {
            try await Task.sleep(for: .milliseconds(5))
        }
        XCTAssertTrue(enqueue.stderrText().contains("trying again"), "no retry logged: \(enqueue.stderrText())")
        XCTAssertTrue(enqueue.isRunning, "the enqueue waits for Redis: \(enqueue.stderrText())")
        try fleet.redis.restart()

        XCTAssertTrue(enqueue.waitForExit(timeout: 120), "the enqueue finished")
        let result = enqueue.result()
        XCTAssertEqual(result.exitCode, 0, result.summary)
        XCTAssertEqual(result.stdoutLines, [#"{"job": "big", "shards": 3000}"#], result.summary)
        XCTAssertTrue(result.stderr.contains("trying again"), "it said it was trying again: \(result.summary)")
        // Every shard on the stream once (no worker has read any), and the job's totals and listing.
        let entries = try await client.command(["XRANGE", "fanout:shards", "-", "+"]).array ?? []
        var shards: [Int] = []
        for entry in entries {
            let fields = entry.array?.last?.array ?? []
            var index = 0
            while index + 1 < fields.count {
                if case .bytes(let name) = fields[index], name == Array("shard".utf8),
                    case .bytes(let value) = fields[index + 1]
                {
                    shards.append(Int(String(decoding: value, as: UTF8.self)) ?? -1)
                }
                index += 2
            }
        }
        XCTAssertEqual(shards.count, tokens / shardSize, "one entry per shard, none twice")
        XCTAssertEqual(shards.sorted(), Array(0..<(tokens / shardSize)))
        let listed = try await client.command(["LRANGE", "fanout:jobs", "0", "-1"])
        XCTAssertEqual(listed, .array([.bytes(Array("big".utf8))]))
        let status = try status(fleet)
        XCTAssertEqual(status["big"]?["shards"] as? Int, tokens / shardSize, "\(status)")
        XCTAssertEqual(status["big"]?["notifications"] as? Int, tokens, "\(status)")
        XCTAssertEqual(status["big"]?["state"] as? String, "waiting", "\(status)")
    }

    func testSigtermFinishesTheShardsBeingSentAndLeavesTheRestToAnotherWorker() async throws {
        let fleet = try startFleet()
        try enqueue(fleet)
        let first = try startWorkers(fleet, count: 1)[0]
        let deadline = Date().addingTimeInterval(120)
        while fleet.mock.totals().accepted < scale.total / 10 {
            XCTAssertTrue(Date() < deadline, "sending did not start")
            if Date() >= deadline { return }
            try await Task.sleep(for: .milliseconds(5))
        }
        XCTAssertEqual(try first.stop(timeout: 20), 0, "SIGTERM: a clean exit")
        XCTAssertTrue(first.stderrText().contains("stopping: no new shards"), first.stderrText())
        // It finished what it held: nothing is pending, and part of the work is still on the stream.
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: fleet.url)))
        let pending = try await client.command(["XPENDING", "fanout:shards", "fanout-workers"]).array
        XCTAssertEqual(pending?.first, .integer(0), "\(String(describing: pending))")
        let left = try await client.command(["XLEN", "fanout:shards"]).integer ?? 0
        await client.shutdown()
        XCTAssertGreaterThan(left, 0, "the stop came before the end")

        let second = try startWorkers(fleet, count: 1)[0]
        try waitUntilDone(fleet)
        XCTAssertEqual(try second.stop(timeout: 20), 0)
        try checkResults(fleet)
        XCTAssertTrue(fleet.mock.stop())
        let counts = try fleet.mock.acceptedPerToken(count: scale.total)
        XCTAssertEqual(counts.distinct, scale.total, "every token reached the mock")
        XCTAssertEqual(counts.duplicates, 0, "a graceful stop sends nothing twice")
        print(
            "fleet stop test: \(left) of \(scale.jobs * scale.shardsPerJob) shards left on the stream by the stopped worker"
        )
    }

    /// The heartbeat runs at most every 100 ms: with `--claim-idle 0.05` other workers claimed live workers' shards
    /// (8,720 of 50,000 sent twice). A value below three heartbeats (0.3 s) is a usage error naming the flag and the
    /// minimum, before Redis is asked anything; 0.3 itself is taken (and then fails on the unreachable Redis).
    func testAClaimIdleShorterThanThreeHeartbeatsIsAUsageError() throws {
        let fanout = try ProcessSupport.builtExecutable("fanout")
        let url = "redis://127.0.0.1:\(try ProcessSupport.freeLoopbackPort())"
        let credentials = [
            "--endpoint", "localhost:1", "--key", "/nonexistent.p8", "--key-id", "KEYID12345", "--team-id",
            "TEAMID1234",
        ]
        for value in ["0.05", "0.299"] {
            let result = try ProcessSupport.run(
                fanout, ["worker", "--redis", url, "--claim-idle", value] + credentials,
                environment: ProcessSupport.cleanEnvironment())
            XCTAssertEqual(result.exitCode, 2, result.summary)
            XCTAssertEqual(
                result.stderrLines,
                [
                    "fanout worker: --claim-idle must be at least 0.3 s (3 heartbeats, which run at most every 0.1 s), "
                        + "not \(value)"
                ], result.summary)
        }
        let minimum = try ProcessSupport.run(
            fanout, ["worker", "--redis", url, "--claim-idle", "0.3"] + credentials,
            environment: ProcessSupport.cleanEnvironment())
        XCTAssertEqual(minimum.exitCode, 2, minimum.summary)
        XCTAssertTrue(minimum.stderr.hasPrefix("fanout worker: cannot reach Redis at \(url): "), minimum.summary)
        let help = try ProcessSupport.run(fanout, ["worker", "--help"], environment: ProcessSupport.cleanEnvironment())
        XCTAssertTrue(help.stdout.contains("default 30,\n") && help.stdout.contains("at least 0.3)"), help.stdout)
    }

    /// A signing key that cannot be read is one line naming the file, its message, not the error's debug form
    /// ("signing key: CryptoError(fileNotFound): ...").
    func testAnUnreadableSigningKeyIsOneLineWithTheKeysMessage() throws {
        let redis = try RedisServerProcess(for: self)
        let fanout = try ProcessSupport.builtExecutable("fanout")
        let result = try ProcessSupport.run(
            fanout,
            [
                "worker", "--redis", redis.url, "--endpoint", "localhost:1", "--key", "/nonexistent.p8", "--key-id",
                "KEYID12345", "--team-id", "TEAMID1234",
            ], environment: ProcessSupport.cleanEnvironment())
        XCTAssertEqual(result.exitCode, 2, result.summary)
        XCTAssertEqual(result.stderrLines.count, 1, result.summary)
        XCTAssertTrue(result.stderr.hasPrefix("fanout worker: signing key: "), result.summary)
        XCTAssertTrue(result.stderr.contains("/nonexistent.p8"), result.summary)
        XCTAssertFalse(result.stderr.contains("CryptoError"), result.summary)
    }

    func testUnreachableRedisAtStartIsAOneLineErrorAndExitStatusTwo() throws {
        let fanout = try ProcessSupport.builtExecutable("fanout")
        let directory = try ProcessSupport.temporaryDirectory(for: self, "fleet")
        let port = try ProcessSupport.freeLoopbackPort()
        let url = "redis://127.0.0.1:\(port)"
        let jobs = "\(directory)/jobs.jsonl"
        try
            (#"{"id": "a", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": ["\#(testDeviceToken(1))"]}"#
            + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let credentials = [
            "--endpoint", "localhost:1", "--key", "/nonexistent.p8", "--key-id", "KEYID12345", "--team-id",
            "TEAMID1234",
        ]
        let commands: [[String]] = [
            ["enqueue", "--redis", url, "--jobs", jobs],
            ["worker", "--redis", url] + credentials,
            ["results", "--redis", url, "--job", "a"],
            ["status", "--redis", url],
        ]
        // Each waits out its PING deadline (3 s): run them side by side.
        let children = try commands.map {
            try RunningProcess(fanout, $0, environment: ProcessSupport.cleanEnvironment())
        }
        for (arguments, child) in zip(commands, children) {
            XCTAssertTrue(child.waitForExit(timeout: 30), "\(arguments[0]) did not give up")
            let result = child.result()
            XCTAssertEqual(result.exitCode, 2, result.summary)
            XCTAssertEqual(result.stderrLines.count, 1, result.summary)
            XCTAssertTrue(
                result.stderr.hasPrefix("fanout \(arguments[0]): cannot reach Redis at \(url): "), result.summary)
            XCTAssertTrue(result.stdout.isEmpty, result.summary)
        }
        // rediss:// is refused with the reason (no TLS in Debian's hiredis 0.14).
        let tls = try ProcessSupport.run(
            fanout, ["status", "--redis", "rediss://127.0.0.1:\(port)"], environment: ProcessSupport.cleanEnvironment())
        XCTAssertEqual(tls.exitCode, 2, tls.summary)
        XCTAssertTrue(tls.stderr.contains("rediss:// (Redis over TLS) is not supported"), tls.summary)
    }
}
