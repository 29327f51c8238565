import FanoutCore
import FanoutRedis
import FanoutTestSupport
import Foundation

/// fleet: the fleet on Redis against `fanout send` of the same jobs, in the same run.
///
/// A redis-server of its own (free port, temporary directory, no persistence) and, for every measurement, a fresh
/// mock-apns with `--record` (so duplicates are counted per measurement). The jobs: `jobs` job lines, each a 1 KiB
/// Live Activity update to a tokens file of its own (`tokens` in all), so that the fleet has many shards. Each run:
///
/// 1. **send**: `fanout send` of the job file, spawn to exit (its results go to a file, as the fleet's go to Redis).
/// 2. **1, 2 and 3 workers**: FLUSHALL; `fanout enqueue` (timed from its spawn), then the workers started and the
///    time until the last job's last shard is done (its `finished_at`); the rate counts from the enqueue's spawn to
///    that. Then every job's `fanout results` is read and checked.
///
/// Redis commands are counted with `INFO commandstats` (every call, commands run inside the fleet's Lua scripts
/// included), reset before each phase: the enqueue, the workers (from their start to the last result) and the
/// results fetch, each per 1,000 notifications. The bench's own commands (INFO, CONFIG RESETSTAT, FLUSHALL, and the
/// HSTRLEN it polls with, which the fleet never sends) are left out. Redis's CPU seconds (`INFO cpu`) over the
/// workers' phase give its CPU per notification, and from that the ceiling one Redis core puts on a fleet.
///
/// Correctness is checked on every measurement, and a broken one fails the scenario: `fanout send` and each job's
/// `fanout results` have exactly one `delivered` line per token, in job order, and the mock accepted every token once
/// (no duplicates). --quick: 20,000 tokens in 4 jobs, shards of 1,000.
func runFleet(_ bench: BenchContext) throws {
    guard let redisServer = findTool("redis-server") else {
        throw BenchError("fleet needs redis-server on PATH (make deps-test installs it: apt-get install redis-server)")
    }
    let fanout = "\(bench.bin)/fanout"
    guard FileManager.default.isExecutableFile(atPath: fanout) else {
        throw BenchError("fleet needs the fanout binary beside fanout-bench (swift build --product fanout)")
    }
    let setup = FleetBenchSetup(
        tokens: bench.quick ? 20_000 : 200_000, jobs: bench.quick ? 4 : 8, shardSize: bench.quick ? 1_000 : 5_000)
    let workerCounts = [1, 2, 3]
    let timeout: Double = bench.quick ? 120 : 900
    let work = "\(bench.work)/fleet"
    try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let jobsPath = try setup.writeJobs(in: work)
    let loadBefore = loadAverage()

    let redis: RedisServerProcess
    do {
        redis = try RedisServerProcess()
    } catch {
        throw BenchError("fleet: cannot start \(redisServer): \(error)")
    }
    defer { redis.discard() }
    let client = try BenchRedis(url: redis.url)
    defer { client.close() }
    let fleet = FleetBenchRun(
        bench: bench, setup: setup, fanout: fanout, work: work, jobsPath: jobsPath, url: redis.url, client: client,
        nodes: [client], timeout: timeout)

    var sends: [[String: Any]] = []
    var fleets: [Int: [[String: Any]]] = [:]
    for run in 0..<bench.runs {
        sends.append(try fleet.send(run: run))
        for workers in workerCounts {
            fleets[workers, default: []].append(try fleet.fleet(workers: workers, run: run))
        }
    }
    let loadAfter = loadAverage()

    let cores = ProcessInfo.processInfo.activeProcessorCount
    let sendRate = spread(sends, "rate")
    let one = fleets[1] ?? []
    let ratios = Spread(zip(one, sends).map { number($0["rate"]) / max(number($1["rate"]), 1e-9) })
    let commands = spread(one, "worker_commands_per_1000")
    let enqueueCommands = spread(one, "enqueue_commands_per_1000")
    let resultsCommands = spread(one, "results_commands_per_1000")
    let endToEnd = Spread(
        one.map { number($0["worker_commands_per_1000"]) + number($0["enqueue_commands_per_1000"]) })
    let redisCPU = spread(one, "redis_cpu_us_per_notification")
    // One Redis core's ceiling for the fleet: what its CPU per notification allows.
    let ceiling = 1e6 / max(redisCPU.median, 1e-9)
    print(
        String(
            format: "fleet: %d cores, load average %.2f %.2f %.2f before, %.2f %.2f %.2f after (shared machine); "
                + "%d notifications in %d jobs, shards of %d; fanout send and each worker: 1 loop x 2 connections",
            cores, loadBefore[0], loadBefore[1], loadBefore[2], loadAfter[0], loadAfter[1], loadAfter[2],
            setup.tokens, setup.jobs, setup.shardSize))
    print(
        String(
            format: "fleet: fanout send: %.0f notifications/s [%.0f-%.0f] spawn to exit, %.2f CPU s", sendRate.median,
            sendRate.min, sendRate.max, spread(sends, "cpu_seconds").median))
    var entry: [String: Any] = [
        "scenario": "fleet", "notifications": setup.tokens, "jobs": setup.jobs, "shard_size": setup.shardSize,
        "cores": cores, "load_average_before": loadBefore, "load_average_after": loadAfter,
        "send_rate": sendRate.median, "send_rate_min": sendRate.min, "send_rate_max": sendRate.max,
        "send_peak_rss_mb": spread(sends, "peak_rss_mb").median,
        "send_cpu_seconds": spread(sends, "cpu_seconds").median,
        "ratio_1_worker_vs_send": ratios.median, "ratio_1_worker_vs_send_min": ratios.min,
        "ratio_1_worker_vs_send_max": ratios.max, "commands_per_1000": commands.median,
        "commands_per_1000_min": commands.min, "commands_per_1000_max": commands.max,
        "enqueue_commands_per_1000": enqueueCommands.median, "results_commands_per_1000": resultsCommands.median,
        "enqueue_and_worker_commands_per_1000": endToEnd.median,
        "redis_cpu_us_per_notification": redisCPU.median, "redis_one_core_ceiling_rate": ceiling,
        "top_worker_commands": topRedisCommands(one, key: "worker_commands"),
    ]
    for workers in workerCounts {
        let runs = fleets[workers] ?? []
        let rate = spread(runs, "rate")
        let workerRate = spread(runs, "worker_rate")
        let perThousand = spread(runs, "worker_commands_per_1000")
        let enqueueSeconds = spread(runs, "enqueue_seconds")
        let cpu = spread(runs, "worker_cpu_seconds")
        var line = String(
            format: "fleet: %d worker%@: %.0f notifications/s [%.0f-%.0f] from enqueue to the last result "
                + "(enqueue %.2f s; workers alone %.0f/s [%.0f-%.0f]); %.1f Redis commands per 1,000 [%.1f-%.1f]; "
                + "workers %.2f CPU s; Redis %.2f CPU us/notification",
            workers, workers == 1 ? "" : "s", rate.median, rate.min, rate.max, enqueueSeconds.median,
            workerRate.median, workerRate.min, workerRate.max, perThousand.median, perThousand.min, perThousand.max,
            cpu.median, spread(runs, "redis_cpu_us_per_notification").median)
        if workers == 1 {
            line += String(
                format: "; ratio vs fanout send %.2f [%.2f-%.2f] (goal >= 0.9)", ratios.median, ratios.min, ratios.max)
        }
        print(line)
        let prefix = "workers_\(workers)_"
        entry[prefix + "rate"] = rate.median
        entry[prefix + "rate_min"] = rate.min
        entry[prefix + "rate_max"] = rate.max
        entry[prefix + "worker_rate"] = workerRate.median
        entry[prefix + "enqueue_seconds"] = enqueueSeconds.median
        entry[prefix + "commands_per_1000"] = perThousand.median
        entry[prefix + "cpu_seconds"] = cpu.median
        entry[prefix + "peak_rss_mb"] = spread(runs, "worker_peak_rss_mb").median
        if workers == 1 {
            // The largest worker's, as a send's is its one process's.
            entry["peak_rss_mb"] = spread(runs, "worker_peak_rss_mb").median
            entry["rate"] = rate.median
            entry["rate_min"] = rate.min
            entry["rate_max"] = rate.max
            entry["seconds"] = spread(runs, "seconds").median
            entry["cpu_seconds"] = cpu.median
        }
    }
    print(
        String(
            format:
                "fleet: Redis commands per 1,000 notifications, 1 worker: %.1f [%.1f-%.1f] by the worker (goal <= 10), "
                + "%.1f by the enqueue, %.1f by fanout results (%.1f enqueue + worker); top: %@",
            commands.median, commands.min, commands.max, enqueueCommands.median, resultsCommands.median,
            endToEnd.median, entry["top_worker_commands"] as? String ?? ""))
    print(
        String(
            format: "fleet: Redis used %.2f CPU us per notification with 1 worker: one Redis core would serve about "
                + "%.0f notifications/s to a fleet", redisCPU.median, ceiling))
    entry["key_figure"] = String(
        format: "1 worker %.2fx fanout send (goal >= 0.9), %.1f Redis commands/1,000 (goal <= 10); 2 workers %.0f/s, "
            + "3 workers %.0f/s", ratios.median, commands.median, number(entry["workers_2_rate"]),
        number(entry["workers_3_rate"]))
    bench.record(entry)
}

/// The jobs: `jobs` Live Activity updates of about 1 KiB, each to a tokens file of its own, `tokens` in all.
struct FleetBenchSetup {
    let tokens: Int
    let jobs: Int
    let shardSize: Int

    /// Job `j`'s tokens: bench tokens [j × per, (j + 1) × per), the last job taking the remainder.
    func range(job: Int) -> Range<Int> {
        let per = tokens / jobs
        return job * per..<(job == jobs - 1 ? tokens : (job + 1) * per)
    }

    func jobID(_ job: Int) -> String { "fleet-\(job)" }

    func writeJobs(in work: String) throws -> String {
        var lines = ""
        let note = String(repeating: "x", count: 900)
        for job in 0..<jobs {
            let file = "tokens-\(job).txt"
            _ = FileManager.default.createFile(atPath: "\(work)/\(file)", contents: nil)
            guard let handle = FileHandle(forWritingAtPath: "\(work)/\(file)") else {
                throw BenchError("cannot write \(work)/\(file)")
            }
            var chunk = ""
            for index in range(job: job) { chunk += benchToken(index) + "\n" }
            handle.write(Data(chunk.utf8))
            try handle.close()
            lines +=
                #"{"id": "\#(jobID(job))", "topic": "\#(benchTopic)", "push_type": "liveactivity", "priority": 10, "#
                + #""live_activity": {"event": "update", "timestamp": 1764460800, "#
                + #""content_state": {"score": "\#(job)-1", "note": "\#(note)"}}, "tokens_file": "\#(file)"}"# + "\n"
        }
        let path = "\(work)/jobs.jsonl"
        _ = FileManager.default.createFile(atPath: path, contents: Data(lines.utf8))
        return path
    }

    /// Checks a results file (`fanout send --results` or `fanout results --out`): exactly one `delivered` line per
    /// token of the job(s), in job order. Returns nil when right, else what is wrong.
    func checkResults(_ path: String, jobs: Range<Int>) -> String? {
        guard let data = FileManager.default.contents(atPath: path) else { return "no results file \(path)" }
        var expected: [String] = []
        for job in jobs {
            for index in range(job: job) {
                expected.append(#"{"job":"\#(jobID(job))","token":"\#(benchToken(index))","outcome":"delivered","#)
            }
        }
        // fanout send writes results as they finish: compare as sets of (job, token) there, by order otherwise.
        var seen: [Substring: Int] = [:]
        var lines = 0
        let text = String(decoding: data, as: UTF8.self)
        for line in text.split(separator: "\n") {
            lines += 1
            guard let end = line.range(of: #""outcome":"delivered","#)?.upperBound else {
                return "a result is not delivered: \(line.prefix(200))"
            }
            seen[line[..<end], default: 0] += 1
        }
        guard lines == expected.count else { return "\(lines) result lines for \(expected.count) tokens" }
        for prefix in expected where seen[Substring(prefix)] != 1 {
            return "\(seen[Substring(prefix)] ?? 0) results for \(prefix)"
        }
        return nil
    }
}

/// The measurements of one fleet scenario: its Redis (one server, or a cluster), jobs and binaries.
struct FleetBenchRun {
    let bench: BenchContext
    let setup: FleetBenchSetup
    let fanout: String
    let work: String
    let jobsPath: String
    /// The URL the fleet is given (`redis://`, or `redis+cluster://`).
    let url: String
    /// A client of `url`: the jobs' keys, wherever they are.
    let client: BenchRedis
    /// One client per primary (the server itself when there is one): its counters, its FLUSHALL.
    let nodes: [BenchRedis]
    let timeout: Double
    /// `fanout enqueue --partitions`: the shards spread over this many streams.
    var partitions = 1
    /// Prefixed to the measurement's label (its directory, the worker names, the messages).
    var labelPrefix = "fleet"

    /// The commands the bench sends itself, left out of the counts.
    static let ownCommands: Set = ["info", "config|resetstat", "config", "flushall", "hstrlen"]

    private func startMock(_ label: String) throws -> (MockProcess, record: String) {
        let directory = "\(work)/\(label)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let record = "\(directory)/record.txt"
        let mock = try MockProcess.start(
            binDirectory: bench.bin, workDirectory: directory, threads: 2, extra: ["--record", record])
        return (mock, record)
    }

    private func credentials(_ mock: MockProcess) -> [String] {
        [
            "--ca-file", "\(mock.tlsDirectory)/ca.pem", "--key", "\(mock.tlsDirectory)/auth-key.p8", "--key-id",
            MockProcess.keyID, "--team-id", MockProcess.teamID,
        ]
    }

    /// Stops the mock (SIGTERM flushes its record) and checks that it accepted every token exactly once.
    private func checkMock(_ mock: MockProcess, record: String, label: String) throws -> Int {
        mock.child.stop()
        let accepted = try recordedTokenCounts(record)
        guard accepted.duplicateTokens == 0, accepted.distinct == setup.tokens else {
            throw BenchError(
                "fleet \(label): BROKEN RUN: mock-apns accepted \(accepted.lines) notifications for \(accepted.distinct) "
                    + "distinct tokens of \(setup.tokens), \(accepted.duplicateTokens) token(s) more than once")
        }
        return accepted.duplicateTokens
    }

    /// `fanout send` of the job file: spawn to exit.
    func send(run: Int) throws -> [String: Any] {
        let label = "send-\(run)"
        let (mock, record) = try startMock(label)
        let results = "\(work)/\(label)/results.jsonl"
        let summary = "\(work)/\(label)/summary.json"
        let cpuBefore = childrenCPUSeconds()
        let start = DispatchTime.now()
        let peakRSS: Double
        do {
            peakRSS = try runToolSamplingPeakRSS(
                fanout,
                [
                    "send", "--jobs", jobsPath, "--results", results, "--summary", summary, "--endpoint",
                    "localhost:\(mock.port)", "--loops", "1", "--connections", "2", "--progress", "never",
                ] + credentials(mock), in: work, timeout: timeout
            ).peakRSSMegabytes
        } catch {
            mock.child.stop()
            throw error
        }
        let wall = seconds(since: start)
        let cpu = childrenCPUSeconds() - cpuBefore
        let duplicates = try checkMock(mock, record: record, label: label)
        if let problem = setup.checkResults(results, jobs: 0..<setup.jobs) {
            throw BenchError("fleet \(label): BROKEN RUN: fanout send's results: \(problem)")
        }
        try? FileManager.default.removeItem(atPath: "\(work)/\(label)")
        return [
            "seconds": wall, "rate": Double(setup.tokens) / wall, "cpu_seconds": cpu, "duplicates": duplicates,
            "peak_rss_mb": peakRSS,
        ]
    }

    /// Enqueue, `workers` workers until the last result, results read back and checked.
    func fleet(workers: Int, run: Int) throws -> [String: Any] {
        let label = "\(labelPrefix)-\(workers)w-\(run)"
        let (mock, record) = try startMock(label)
        var running: [ChildProcess] = []
        defer {
            for worker in running { worker.stop() }
            mock.child.stop()
        }
        let config = "\(work)/\(label)/config.json"
        let text = """
            {"endpoint": "localhost:\(mock.port)", "ca_file": "\(mock.tlsDirectory)/ca.pem",
             "key_path": "\(mock.tlsDirectory)/auth-key.p8", "key_id": "\(MockProcess.keyID)",
             "team_id": "\(MockProcess.teamID)", "loops": 1, "connections": 2}
            """
        _ = FileManager.default.createFile(atPath: config, contents: Data(text.utf8))
        for node in nodes {
            _ = try node.run(["FLUSHALL"])
            _ = try node.run(["CONFIG", "RESETSTAT"])
        }

        // 1. Enqueue.
        let start = Date()
        let startUptime = DispatchTime.now()
        let enqueued = try runTool(
            fanout,
            [
                "enqueue", "--redis", url, "--jobs", jobsPath, "--shard-size", String(setup.shardSize), "--partitions",
                String(partitions),
            ], in: work, timeout: timeout)
        let enqueueSeconds = seconds(since: startUptime)
        guard enqueued.split(separator: "\n").count == setup.jobs else {
            throw BenchError("fleet \(label): fanout enqueue printed \(enqueued)")
        }
        let enqueueCommands = try commandCalls()
        for node in nodes { _ = try node.run(["CONFIG", "RESETSTAT"]) }
        let redisCPUBefore = try nodes.map { try $0.cpuSeconds() }

        // 2. The workers, until every job's last shard is done.
        let cpuBefore = childrenCPUSeconds()
        let workersStart = DispatchTime.now()
        let workersStartDate = Date()
        for index in 0..<workers {
            running.append(
                try ChildProcess.start(
                    fanout,
                    ["worker", "--redis", url, "--config", config, "--name", "\(label)-w\(index)"], in: work))
        }
        let ids = (0..<setup.jobs).map(setup.jobID)
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let replies = try client.pipeline(
                ids.map { ["HSTRLEN", RedisArgument("fanout:job:{\($0)}"), "finished_at"] })
            if replies.allSatisfy({ ($0.integer ?? 0) > 0 }) { break }
            if let dead = running.first(where: { !$0.process.isRunning }) {
                throw BenchError(
                    "fleet \(label): a worker exited (\(dead.process.terminationStatus)): \(dead.errorOutput.suffix(1000))"
                )
            }
            guard Date() < deadline else { throw BenchError("fleet \(label): the jobs did not finish in \(timeout) s") }
            // The time comes from finished_at, not from this poll: it can be slow, and light on Redis's CPU.
            usleep(20_000)
        }
        let detected = seconds(since: workersStart)
        let nodeCommands = try nodes.map { try $0.commandCalls(excluding: Self.ownCommands) }
        let workerCommands = nodeCommands.reduce(into: [String: Int]()) { total, calls in
            total.merge(calls, uniquingKeysWith: +)
        }
        let nodeCPU = try zip(nodes, redisCPUBefore).map { try $0.cpuSeconds() - $1 }
        let redisCPU = nodeCPU.reduce(0, +)
        // The last shard's finished_at (Redis's clock, Unix ms; the same machine's clock as `start`).
        let finished =
            try client.pipeline(ids.map { ["HGET", RedisArgument("fanout:job:{\($0)}"), "finished_at"] })
            .compactMap(\.integer).max() ?? 0
        let endToEnd = max(Double(finished) / 1000 - start.timeIntervalSince1970, 1e-6)
        let workersSeconds = max(Double(finished) / 1000 - workersStartDate.timeIntervalSince1970, 1e-6)
        // Read while they run: a worker's high-water mark is gone once it has exited.
        let workerPeakRSS = running.map { peakRSSMegabytes(ofProcess: $0.process.processIdentifier) ?? 0 }.max() ?? 0
        for worker in running {
            worker.stop()
            guard worker.process.terminationStatus == 0 else {
                throw BenchError(
                    "fleet \(label): a worker did not exit cleanly on SIGTERM (\(worker.process.terminationStatus)): "
                        + worker.errorOutput.suffix(1000))
            }
        }
        running = []
        let workerCPU = childrenCPUSeconds() - cpuBefore

        // 3. The results, read back and checked.
        for node in nodes { _ = try node.run(["CONFIG", "RESETSTAT"]) }
        for (job, id) in ids.enumerated() {
            let out = "\(work)/\(label)/results-\(job).jsonl"
            try runTool(
                fanout, ["results", "--redis", url, "--job", id, "--out", out], in: work, timeout: timeout)
            if let problem = setup.checkResults(out, jobs: job..<job + 1) {
                throw BenchError("fleet \(label): BROKEN RUN: fanout results --job \(id): \(problem)")
            }
            try? FileManager.default.removeItem(atPath: out)
        }
        let resultsCommands = try commandCalls()
        let duplicates = try checkMock(mock, record: record, label: label)
        try? FileManager.default.removeItem(atPath: "\(work)/\(label)")

        let perThousand = { (calls: [String: Int]) in Double(calls.values.reduce(0, +)) / Double(setup.tokens) * 1000 }
        return [
            "notifications": setup.tokens, "seconds": endToEnd, "rate": Double(setup.tokens) / endToEnd,
            "enqueue_seconds": enqueueSeconds, "worker_seconds": workersSeconds,
            "worker_rate": Double(setup.tokens) / workersSeconds, "detected_seconds": detected,
            "worker_cpu_seconds": workerCPU, "worker_peak_rss_mb": workerPeakRSS, "worker_commands": workerCommands,
            "worker_commands_per_1000": perThousand(workerCommands),
            "enqueue_commands_per_1000": perThousand(enqueueCommands),
            "results_commands_per_1000": perThousand(resultsCommands),
            "redis_cpu_us_per_notification": redisCPU / Double(setup.tokens) * 1e6, "duplicates": duplicates,
            "node_worker_commands_per_1000": nodeCommands.map(perThousand),
            "node_redis_cpu_us_per_notification": nodeCPU.map { $0 / Double(setup.tokens) * 1e6 },
        ]
    }

    /// Every node's commands since its last `CONFIG RESETSTAT`, the bench's own left out, added up by name.
    private func commandCalls() throws -> [String: Int] {
        try nodes.reduce(into: [String: Int]()) { total, node in
            total.merge(try node.commandCalls(excluding: Self.ownCommands), uniquingKeysWith: +)
        }
    }
}
