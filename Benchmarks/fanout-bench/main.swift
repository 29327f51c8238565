import CommandLineSupport
import Foundation

let usage = """
    fanout-bench: measures Fanout against mock-apns, beside h2load and aioapns against the same mock.

    usage: fanout-bench [--scenario NAME]... [--json FILE] [--report DIR] [--quick] [--runs N] [--rate R]
                        [--duration S] [--send-rate R] [--redis-fsync always|everysec]

      --scenario NAME   run this scenario (repeatable; default: all, but peer-aioapns only when
                        named with --quick). Scenarios:
                          throughput-1c    one job, 1 KiB Live Activity payload, 1 loop, 1 connection, vs h2load -c 1;
                                           the ratio of the medians and the median of run-by-run ratios;
                                           also each client's CPU per request and the mock's under each.
                                           Every run measures the engine twice, in alternating order, then
                                           h2load: with the default apnsIDs .apns (no apns-id sent) and with
                                           .fanout (an id per notification, sent; its figures end in
                                           _fanout_ids: ratio_vs_h2load_fanout_ids, its CPU per notification,
                                           the mock's CPU per request under it)
                          throughput-4c    the same with 2 loops and 4 connections, vs h2load -c 4
                          fanout-scaling   one job from a tokens file of 10,000, 100,000 and 1,000,000 tokens:
                                           rate, CPU microseconds per notification, peak RSS, growth ratios
                          many-jobs        100,000 jobs of 10 tokens with distinct payloads, 64 jobs in flight:
                                           rate, payload encodings (one per job), CPU per notification
                                           and its ratio to throughput-1c's (when that ran too)
                          single-send      engine.send of one notification each from a task of its own, 2,000/s
                                           (--send-rate) for 5 s (0.5 s with --quick): achieved rate, latency
                                           p50/p99 from each send's intended time, CPU microseconds per
                                           notification and its ratio to throughput-1c's in the same run
                                           (when that ran too); each run alternated with one whose tasks
                                           prefer engine.sendExecutor() (on the loop thread)
                          encode           in process: a 1 KiB Live Activity payload and its header block built
                                           once per job (reused by 10,000 notifications) versus once per token;
                                           ns per notification and the ratio
                          ratelimit        workspace rate-limiter decisions per second on one core
                          faults           200,000 notifications against a mock failing 5% 503, 1% 429, 1% 500,
                                           with GOAWAY every 20,000 and a dropped connection every 50,000
                                           requests: rate, outcomes, retries, duplicates seen by the mock
                          load             open loop at --rate R for --duration S (10 s, 2 with --quick). Without
                                           --rate, first measures this machine's maximum (short full-speed runs,
                                           1 connection, 1000 streams) and runs at 40% of it. Latency
                                           percentiles from each notification's intended send time, the
                                           achieved rate's shortfall, and beside them the mock's own service
                                           time: h2load -c 1 -m 1 --rps 1000 against the same mock (--log-file);
                                           and where it went: the bench's scheduler lag and task start, the
                                           engine and mock, and of that the wire (sent to answered)
                          peer-aioapns     aioapns (Python, installed from PyPI into a temporary virtual
                                           environment) sends 50,000 notifications to the same mock;
                                           ratio_vs_aioapns (Fanout's rate for the same count / aioapns's).
                                           Skipped with a note when python3, venv or PyPI is missing.
                                           With --quick: --quick --scenario peer-aioapns (2,000).
                          registry         the token registry: 1,000,000 update-token JSON lines imported into a
                                           fresh registry (import_rate, registrations/s); the activity's tokens
                                           paged out 4,096 at a time (resolve_rate, tokens/s); one update job by
                                           activity_id to them, beside a tokens_file job to the same tokens
                                           (ratio_vs_tokens_file) and an activity_id job to 10,000 tokens
                                           (rss_growth_mb: peak RSS over the small one's). --quick: 20,000 and 1,000
                          serve            fanout serve (the real binary) against the mock: update-token
                                           registrations through HTTP (h2load --h1, 64 keep-alive connections;
                                           rate, share of 2xx, ratio_vs_healthz); an update by the API to a
                                           100,000-token activity, POST to done, against fanout send of the same
                                           tokens (ratio_vs_send); the 202's p50/p99 of small updates at 50/s
                                           while a 1,000,000-token update sends; the update and the 202 again
                                           with --redis (a redis-server with AOF on: ratio_vs_send_redis,
                                           accept_p99_ms_during_big_redis, Redis commands per 1,000); 200
                                           updates of one activity back to back (dispatches/s).
                                           --quick: 640 and 2,000
                          broadcast        one Live Activity update to 1,000,000 followers by fanout send (the real
                                           binary) against a mock-apns with --manage-listen: a tokens_file job
                                           (one request per follower) against a job with the channel_id of a
                                           channel made by fanout channels create (1 request, asserted):
                                           requests at the mock and spawn-to-exit seconds of each, and the
                                           ratios without / with. --quick: 20,000
                          fleet            the fleet on Redis (a redis-server of its own, no persistence) against
                                           fanout send of the same 200,000 tokens in 8 jobs, in the same run: 1, 2
                                           and 3 fanout workers, timed from fanout enqueue to the last result
                                           (shards of 5,000); the 1-worker ratio vs fanout send (goal >= 0.9);
                                           Redis commands per 1,000 notifications from INFO commandstats (goal
                                           <= 10; the enqueue, the workers and fanout results apart, commands run
                                           by the fleet's Lua scripts included) and Redis's CPU per notification.
                                           Every run checked: one delivered result per token, no duplicate at the
                                           mock. --quick: 20,000 tokens in 4 jobs, shards of 1,000
                          fleet-cluster    the fleet's jobs with 3 workers on one redis-server and on a Redis
                                           Cluster of 3 primaries (redis-cli --cluster create, no replicas;
                                           fanout enqueue --partitions 6) in the same run, against fanout send:
                                           rates, ratio vs send, and per primary Redis commands per 1,000
                                           notifications and Redis CPU per notification. Checked as fleet is.
                                           --quick: 20,000 tokens in 4 jobs, shards of 1,000
                          follow           fanout send --follow (the real binary) against the shared mock, its job
                                           file a queue: the bench appends one-token alert jobs at 1,000/s for 10 s
                                           (each line one write(2) on an O_APPEND descriptor, on a fixed schedule)
                                           and reads the results lines from its stdout: latency from each job's
                                           scheduled append to its results line, p50/p99/p99.9/max (goal p99 <=
                                           10 ms), with the producer's lag and the engine's wire time beside it;
                                           then SIGTERM (exit 0, the summary last). The sender's CPU per job
                                           against fanout send --jobs of the same jobs as a finished file in the
                                           same run (cpu_vs_file, goal <= 2). --quick: 1 s
      --json FILE       also write the results as JSON (one object per scenario)
      --report DIR      also write DIR/index.html (DIR made when missing): one self-contained page, inline CSS
                        and hand-written SVG, no script, nothing fetched. The machine (cores, load average
                        before and after), date and command line; per throughput scenario a bar chart of
                        Fanout beside its reference (h2load, aioapns, fanout send...) with min-max whiskers;
                        load's latency percentiles beside the mock's own (log scale); fanout-scaling's CPU
                        per notification and peak RSS against tokens; the summary table. Made from the same
                        results as --json and the table; scenarios not run are absent
      --quick           small sizes (seconds, not minutes), for CI
      --runs N          runs per measurement; the median is reported (default 5, 1 with --quick)
      --rate R          load: target notifications per second (default: 40% of the measured maximum)
      --duration S      load: seconds of load (default 10, 2 with --quick)
      --send-rate R     single-send: engine.send calls per second (default 2,000; past what the engine
                        takes, the calls queue up and the achieved rate and memory show what that costs)
      --redis-fsync F   serve: the Redis's appendfsync, always (default: what docs/FLEET.md asks of a
                        fleet's Redis, nothing acknowledged is lost) or everysec (what that fsync costs)

    Each run of Fanout happens in a fresh child process, so CPU seconds and peak RSS are its own.
    """

let allScenarios = [
    "throughput-1c", "throughput-4c", "fanout-scaling", "many-jobs", "single-send", "encode", "ratelimit", "faults",
    "load", "peer-aioapns", "registry", "serve", "broadcast", "fleet", "fleet-cluster", "follow",
]
/// Left out of `--quick` unless named: installing aioapns alone takes longer than the rest.
let slowScenarios: Set = ["peer-aioapns"]

// MARK: Parent mode

struct Options {
    var scenarios: [String] = []
    var jsonPath: String?
    var reportDirectory: String?
    var quick = false
    var runs: Int?
    var loadRate: Double?
    var loadDuration: Double?
    var sendRate: Double?
    /// serve's Redis: `appendfsync` always (true) or everysec.
    var redisFsyncAlways = true
}

func parse(_ arguments: [String]) throws(UsageError) -> Options? {
    var options = Options()
    var cursor = ArgumentCursor(arguments)
    while let flag = try cursor.nextFlag() {
        switch flag {
        case "--help", "-h": return nil
        case "--scenario":
            let name = try cursor.string()
            guard allScenarios.contains(name) else {
                throw UsageError("unknown scenario '\(name)' (have: \(allScenarios.joined(separator: ", ")))")
            }
            if !options.scenarios.contains(name) { options.scenarios.append(name) }
        case "--json": options.jsonPath = try cursor.string()
        case "--report": options.reportDirectory = try cursor.string()
        case "--quick": options.quick = true
        case "--runs": options.runs = try cursor.int(in: 1...50)
        case "--rate": options.loadRate = try cursor.double(in: 1...10_000_000)
        case "--duration": options.loadDuration = try cursor.double(in: 0.1...3600)
        case "--send-rate": options.sendRate = try cursor.double(in: 1...1_000_000)
        case "--redis-fsync":
            let value = try cursor.string()
            guard ["always", "everysec"].contains(value) else {
                throw UsageError("--redis-fsync takes always or everysec, not '\(value)'")
            }
            options.redisFsyncAlways = value == "always"
        default: throw UsageError("unknown option \(flag) (see fanout-bench --help)")
        }
    }
    if options.scenarios.isEmpty {
        options.scenarios = allScenarios.filter { !options.quick || !slowScenarios.contains($0) }
    } else {
        // Always in the listed order, so many-jobs and single-send can use throughput-1c's CPU per notification.
        options.scenarios = allScenarios.filter(options.scenarios.contains)
    }
    return options
}

func runParent(_ options: Options) throws -> Int32 {
    let started = Date()
    let loadBefore = loadAverage()
    let cpuBefore = MachineCPUTime.now()
    let bench = try BenchContext(options: options)
    defer { bench.close() }
    print(
        "cores: \(ProcessInfo.processInfo.activeProcessorCount), runs per measurement: \(bench.runs) (median [min-max])"
    )
    for scenario in options.scenarios {
        switch scenario {
        case "throughput-1c": try runThroughput(bench, loops: 1, connections: 1)
        case "throughput-4c": try runThroughput(bench, loops: 2, connections: 4)
        case "fanout-scaling": try runFanoutScaling(bench)
        case "many-jobs": try runManyJobs(bench)
        case "single-send": try runSingleSend(bench)
        case "encode": try runEncode(bench)
        case "ratelimit": runRateLimit(bench)
        case "faults": try runFaults(bench)
        case "load": try runLoad(bench)
        case "peer-aioapns": try runPeerAioapns(bench)
        case "registry": try runRegistry(bench)
        case "serve": try runServe(bench)
        case "broadcast": try runBroadcast(bench)
        case "fleet": try runFleet(bench)
        case "fleet-cluster": try runFleetCluster(bench)
        case "follow": try runFollow(bench)
        default: break
        }
    }
    printSummaryTable(bench.results)
    print(
        String(
            format: "CPU time stolen by the hypervisor over the whole run: %.1f%%",
            MachineCPUTime.now().stealPercent(since: cpuBefore)))
    if let path = options.jsonPath {
        let data = try JSONSerialization.data(withJSONObject: bench.results, options: [.prettyPrinted, .sortedKeys])
        _ = FileManager.default.createFile(atPath: path, contents: data)
    }
    if let directory = options.reportDirectory {
        let run = ReportRun(
            date: started, seconds: Date().timeIntervalSince(started),
            arguments: ["fanout-bench"] + CommandLine.arguments.dropFirst(),
            cores: ProcessInfo.processInfo.activeProcessorCount, kernel: kernelDescription(),
            loadAverageBefore: loadBefore, loadAverageAfter: loadAverage(),
            stealPercent: MachineCPUTime.now().stealPercent(since: cpuBefore), runs: bench.runs)
        print("report: \(try writeReport(directory: directory, results: bench.results, run: run))")
    }
    return 0
}

signal(SIGPIPE, SIG_IGN)
let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "--child" {
    exit(await runChild(Array(arguments.dropFirst())))
}
do {
    guard let options = try parse(arguments) else {
        print(usage)
        exit(0)
    }
    exit(try runParent(options))
} catch let error as UsageError {
    FileHandle.standardError.write(Data("fanout-bench: \(error.message)\n".utf8))
    exit(2)
} catch {
    FileHandle.standardError.write(Data("fanout-bench: \(error)\n".utf8))
    exit(1)
}
