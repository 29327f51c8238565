import FanoutRedis
import FanoutTestSupport
import Foundation

/// fleet-cluster: the fleet on one redis-server and on a Redis Cluster of three primaries (no replicas), in the same
/// run, against `fanout send` of the same jobs.
///
/// The jobs are the fleet scenario's (`FleetBenchSetup`); each run measures `fanout send`, then 3 workers on one
/// Redis, then 3 workers on the cluster, whose enqueue spreads the shards over `partitions` streams
/// (`fanout enqueue --partitions`), as the measurement on one Redis does not (one stream, the default). A cluster
/// node's counters are its own, so each primary is measured apart: its commands per 1,000 notifications and its CPU
/// per notification (`INFO commandstats`, `INFO cpu`, reset before each phase, as in the fleet scenario), over the
/// workers' phase. Every run is checked as the fleet scenario checks it: one `delivered` line per token in each
/// job's `fanout results`, every token accepted once by the mock. --quick: 20,000 tokens in 4 jobs, shards of 1,000.
func runFleetCluster(_ bench: BenchContext) throws {
    guard findTool("redis-server") != nil, findTool("redis-cli") != nil else {
        throw BenchError(
            "fleet-cluster needs redis-server and redis-cli on PATH (make deps-test installs them: apt-get install "
                + "redis-server redis-tools)")
    }
    let fanout = "\(bench.bin)/fanout"
    guard FileManager.default.isExecutableFile(atPath: fanout) else {
        throw BenchError("fleet-cluster needs the fanout binary beside fanout-bench (swift build --product fanout)")
    }
    let setup = FleetBenchSetup(
        tokens: bench.quick ? 20_000 : 200_000, jobs: bench.quick ? 4 : 8, shardSize: bench.quick ? 1_000 : 5_000)
    let workers = 3
    let partitions = 6
    let timeout: Double = bench.quick ? 120 : 900
    let work = "\(bench.work)/fleet-cluster"
    try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let jobsPath = try setup.writeJobs(in: work)
    let loadBefore = loadAverage()

    let redis: RedisServerProcess
    let cluster: RedisClusterProcess
    do {
        redis = try RedisServerProcess()
    } catch {
        throw BenchError("fleet-cluster: cannot start redis-server: \(error)")
    }
    defer { redis.discard() }
    do {
        cluster = try RedisClusterProcess(primaries: 3)
    } catch {
        throw BenchError("fleet-cluster: cannot start the cluster: \(error)")
    }
    defer { cluster.discard() }
    let single = try BenchRedis(url: redis.url)
    defer { single.close() }
    let clusterClient = try BenchRedis(url: cluster.url)
    defer { clusterClient.close() }
    let primaryPorts = cluster.servers.map(\.port)
    let primaries = try primaryPorts.map { try BenchRedis(url: "redis://127.0.0.1:\($0)") }
    defer { for primary in primaries { primary.close() } }
    // Where the jobs' keys and the partitions' streams are: what each primary's share follows.
    func primaryPort(_ key: String) throws -> Int {
        try cluster.primary(servingSlot: RedisClusterSlot.slot(of: Array(key.utf8))).port
    }
    let jobPorts = try (0..<setup.jobs).map { try primaryPort("fanout:job:{\(setup.jobID($0))}") }
    let streamPorts = try (0..<partitions).map { try primaryPort($0 == 0 ? "fanout:shards" : "fanout:shards:\($0)") }
    let jobsPerPrimary = primaryPorts.map { port in jobPorts.count { $0 == port } }
    let streamsPerPrimary = primaryPorts.map { port in streamPorts.count { $0 == port } }

    let one = FleetBenchRun(
        bench: bench, setup: setup, fanout: fanout, work: work, jobsPath: jobsPath, url: redis.url, client: single,
        nodes: [single], timeout: timeout, labelPrefix: "one-redis")
    let three = FleetBenchRun(
        bench: bench, setup: setup, fanout: fanout, work: work, jobsPath: jobsPath, url: cluster.url,
        client: clusterClient, nodes: primaries, timeout: timeout, partitions: partitions, labelPrefix: "cluster")
    var sends: [[String: Any]] = []
    var onOne: [[String: Any]] = []
    var onCluster: [[String: Any]] = []
    for run in 0..<bench.runs {
        sends.append(try one.send(run: run))
        onOne.append(try one.fleet(workers: workers, run: run))
        onCluster.append(try three.fleet(workers: workers, run: run))
    }
    let loadAfter = loadAverage()
    let cores = ProcessInfo.processInfo.activeProcessorCount

    let sendRate = spread(sends, "rate")
    print(
        String(
            format: "fleet-cluster: %d cores, load average %.2f %.2f %.2f before, %.2f %.2f %.2f after (shared "
                + "machine); %d notifications in %d jobs, shards of %d; %d workers of 1 loop x 2 connections; "
                + "the cluster: 3 primaries, no replicas, --partitions %d", cores, loadBefore[0], loadBefore[1],
            loadBefore[2], loadAfter[0], loadAfter[1], loadAfter[2], setup.tokens, setup.jobs, setup.shardSize,
            workers, partitions))
    print(
        "fleet-cluster: jobs per primary \(jobsPerPrimary.map(String.init).joined(separator: ", ")); partition "
            + "streams per primary \(streamsPerPrimary.map(String.init).joined(separator: ", "))")
    print(
        String(
            format: "fleet-cluster: fanout send: %.0f notifications/s [%.0f-%.0f] spawn to exit", sendRate.median,
            sendRate.min, sendRate.max))
    var entry: [String: Any] = [
        "scenario": "fleet-cluster", "notifications": setup.tokens, "jobs": setup.jobs, "shard_size": setup.shardSize,
        "workers": workers, "partitions": partitions, "cores": cores, "load_average_before": loadBefore,
        "load_average_after": loadAfter, "send_rate": sendRate.median, "send_rate_min": sendRate.min,
        "send_rate_max": sendRate.max, "jobs_per_primary": jobsPerPrimary, "streams_per_primary": streamsPerPrimary,
    ]
    for (name, runs) in [("one_redis", onOne), ("cluster", onCluster)] {
        let rate = spread(runs, "rate")
        let ratio = Spread(zip(runs, sends).map { number($0["rate"]) / max(number($1["rate"]), 1e-9) })
        let commands = spread(runs, "worker_commands_per_1000")
        let enqueue = spread(runs, "enqueue_commands_per_1000")
        let cpu = spread(runs, "redis_cpu_us_per_notification")
        // Per node: the median over the runs of each node's figure.
        let nodeCount = (runs.first?["node_worker_commands_per_1000"] as? [Double])?.count ?? 0
        let nodeCommands = (0..<nodeCount).map { node in
            Spread(runs.map { ($0["node_worker_commands_per_1000"] as? [Double])?[node] ?? 0 }).median
        }
        let nodeCPU = (0..<nodeCount).map { node in
            Spread(runs.map { ($0["node_redis_cpu_us_per_notification"] as? [Double])?[node] ?? 0 }).median
        }
        let perNode = zip(nodeCommands, nodeCPU).enumerated().map { index, figures in
            String(
                format: "%@ %.1f commands/1,000, %.2f CPU us/notification",
                name == "cluster" ? "primary \(index + 1):" : "Redis:", figures.0, figures.1)
        }.joined(separator: "; ")
        print(
            String(
                format: "fleet-cluster: %@, %d workers: %.0f notifications/s [%.0f-%.0f] from enqueue to the last "
                    + "result, %.2fx fanout send [%.2f-%.2f]; %.1f Redis commands per 1,000 by the workers, %.1f by "
                    + "the enqueue; Redis %.2f CPU us/notification in all; %@",
                name == "cluster" ? "cluster of 3 primaries" : "one Redis", workers, rate.median, rate.min, rate.max,
                ratio.median, ratio.min, ratio.max, commands.median, enqueue.median, cpu.median, perNode))
        entry[name + "_rate"] = rate.median
        entry[name + "_rate_min"] = rate.min
        entry[name + "_rate_max"] = rate.max
        entry[name + "_ratio_vs_send"] = ratio.median
        entry[name + "_commands_per_1000"] = commands.median
        entry[name + "_enqueue_commands_per_1000"] = enqueue.median
        entry[name + "_redis_cpu_us_per_notification"] = cpu.median
        entry[name + "_node_commands_per_1000"] = nodeCommands
        entry[name + "_node_redis_cpu_us_per_notification"] = nodeCPU
        entry[name + "_top_worker_commands"] = topRedisCommands(runs, key: "worker_commands")
        entry[name + "_cpu_seconds"] = spread(runs, "worker_cpu_seconds").median
        entry[name + "_peak_rss_mb"] = spread(runs, "worker_peak_rss_mb").median
    }
    entry["rate"] = entry["cluster_rate"]
    entry["rate_min"] = entry["cluster_rate_min"]
    entry["rate_max"] = entry["cluster_rate_max"]
    // The workers' CPU seconds together and the largest worker's peak RSS, on the cluster.
    entry["cpu_seconds"] = entry["cluster_cpu_seconds"]
    entry["peak_rss_mb"] = entry["cluster_peak_rss_mb"]
    let clusterCommands = entry["cluster_node_commands_per_1000"] as? [Double] ?? []
    entry["key_figure"] = String(
        format: "3 workers: one Redis %.0f/s, cluster %.0f/s (send %.0f/s); commands/1,000 per primary %@",
        number(entry["one_redis_rate"]), number(entry["cluster_rate"]), sendRate.median,
        clusterCommands.map { String(format: "%.1f", $0) }.joined(separator: ", "))
    bench.record(entry)
}
