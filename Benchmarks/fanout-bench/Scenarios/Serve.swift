import FanoutRedis
import FanoutTestSupport
import FanoutTransport
import Foundation
import Synchronization

/// The bench workspace's API keys; the config holds only their SHA-256 digests.
private let serveServerKey = "sk_bench_0123456789abcdef"
private let serveDeviceKey = "dk_bench_fedcba9876543210"
private let serveWorkspace = "bench"

/// What the serve scenario sends: its sizes, and the engine settings serve and `fanout send` share.
private struct ServeSizes {
    var registrations: Int
    var registrationConnections = 64
    var updateTokens: Int
    var bigTokens: Int
    var tinyTokens = 10
    /// Small updates per second while the big dispatch sends, and at least this many of them (--quick's big
    /// dispatch is over before a handful would be sent).
    var probeRate = 50.0
    var minProbes: Int
    /// Updates of one activity POSTed back to back (`activityBurst`).
    var burst: Int
    var loops = 1
    var connections = 2
    /// How long one dispatch or one `fanout send` may take before the run fails.
    var timeout: Double

    init(quick: Bool) {
        registrations = quick ? 640 : 100_000
        updateTokens = quick ? 2_000 : 100_000
        bigTokens = quick ? 2_000 : 1_000_000
        minProbes = quick ? 10 : 100
        burst = quick ? 50 : 200
        timeout = quick ? 60 : 900
    }
}

/// serve: `fanout serve` (the real binary, started once for the scenario) against the shared mock-apns, three
/// figures, each beside a reference measured in the same run:
///
/// 1. Registrations through HTTP: h2load `--h1` on 64 keep-alive connections POSTs one update-token registration
///    with the device key (HTTP, auth, quota, the registry's SQLite write): requests/s and the share of 2xx,
///    beside h2load `--h1` against `/healthz` of the same server (the ceiling), interleaved.
/// 2. An update to a 100,000-token activity through the API: from the POST to the dispatch's `done` (polled every
///    20 ms), beside `fanout send` of a `tokens_file` job naming the same tokens, the same content state and the
///    same loops and connections, interleaved: `ratio_vs_send` (goal >= 0.9).
/// 3. The `202` of small updates (to a 10-token activity, 50 a second on one keep-alive connection) while an update
///    to a 1,000,000-token activity sends: p50 and p99 from each request's scheduled time, so a stall counts for
///    every request it delays (goal p99 <= 10 ms); beside the same small updates on the idle server just before
///    (100 of them, `p99_vs_idle`).
///
/// 4. 200 updates of the 10-token activity POSTed back to back, to the last one's `done`: the dispatches of one
///    activity the server runs a second (`activityBurst`).
///
/// Then 2. to 4. again with the registry and the dispatch queue on Redis (`fanout serve --redis`, a redis-server the
/// bench starts with AOF on): `ratio_vs_send_redis`, `accept_p99_ms_during_big_redis`, and Redis commands per 1,000
/// notifications (`measureServeOnRedis`); skipped, and said so, without redis-server.
///
/// The activities' tokens are imported with `fanout registry import` before serve starts. Budgets are 10^9 an hour,
/// so the quotas decide every request but refuse none. --quick: 640 registrations, 2,000-token activities.
func runServe(_ bench: BenchContext) throws {
    let sizes = ServeSizes(quick: bench.quick)
    let fanout = "\(bench.bin)/fanout"
    guard FileManager.default.isExecutableFile(atPath: fanout) else {
        throw BenchError("serve needs the fanout binary beside fanout-bench (swift build --product fanout)")
    }
    let work = "\(bench.work)/serve"
    try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let loadBefore = loadAverage()

    // The registry: three activities, bulk-imported before serve opens it.
    let database = "\(work)/serve.db"
    let updateTokensFile = "\(work)/serve-update.tokens"
    try importServeActivities(
        fanout: fanout, work: work, into: ["--db", database], sizes: sizes, tokensFile: updateTokensFile)

    let server = try ServeProcess.start(
        fanout: fanout, work: work, database: database, redis: nil, mock: bench.mock, sizes: sizes)
    defer { server.stop() }
    let control = BenchHTTPConnection(port: server.port)
    defer { control.close() }

    // 1. Registrations through HTTP, beside /healthz.
    var registrationRuns: [H2loadH1Result] = []
    var healthRuns: [H2loadH1Result] = []
    if let h2load = bench.h2load {
        let body = "\(work)/registration.json"
        _ = FileManager.default.createFile(
            atPath: body, contents: Data(#"{"token": "\#(benchToken(7))", "device_id": "bench-device"}"#.utf8))
        let base = "http://127.0.0.1:\(server.port)"
        for _ in 0..<bench.runs {
            healthRuns.append(
                try measureH2loadH1(
                    h2load: h2load, work: work, url: "\(base)/healthz", requests: sizes.registrations,
                    connections: sizes.registrationConnections))
            registrationRuns.append(
                try measureH2loadH1(
                    h2load: h2load, work: work, url: "\(base)/v1/activities/serve-registrations/tokens",
                    requests: sizes.registrations, connections: sizes.registrationConnections, body: body,
                    headers: ["authorization: Bearer \(serveDeviceKey)", "content-type: application/json"]))
        }
    }

    // 2. and 3.: the update beside fanout send, and the 202 while the big update sends.
    let (serveRuns, sendRuns, probeRuns) = try measureUpdates(
        bench, server: server, control: control, fanout: fanout, work: work, tokensFile: updateTokensFile,
        sizes: sizes)
    let burstRate = try activityBurst(control, sizes: sizes)
    let peakRSS = processPeakRSSMegabytes(server.child.process.processIdentifier)
    server.stop()
    control.close()

    // The same with the registry and the dispatch queue on Redis.
    let onRedis = try measureServeOnRedis(
        bench, fanout: fanout, work: work, tokensFile: updateTokensFile, sizes: sizes)
    let loadAfter = loadAverage()

    let rate = spread(serveRuns, "rate")
    let sendRate = spread(sendRuns, "rate")
    let ratio = rate.median / max(sendRate.median, 1)
    let pairRatios = Spread(zip(serveRuns, sendRuns).map { number($0["rate"]) / max(number($1["rate"]), 1) })
    let dispatchRate = spread(serveRuns, "dispatch_rate")
    let cpu = spread(serveRuns, "cpu_seconds")
    let p50 = spread(probeRuns, "latency_ms_p50")
    let p99 = spread(probeRuns, "latency_ms_p99")
    let maxLatency = spread(probeRuns, "latency_ms_max")
    let serviceP99 = spread(probeRuns, "service_ms_p99")
    let bigRate = spread(probeRuns, "big_rate")
    let probes = spread(probeRuns, "probes")
    let idleP50 = spread(probeRuns, "idle_latency_ms_p50")
    let idleP99 = spread(probeRuns, "idle_latency_ms_p99")
    let load = String(
        format: "load average %.2f %.2f %.2f before, %.2f %.2f %.2f after", loadBefore[0], loadBefore[1],
        loadBefore[2], loadAfter[0], loadAfter[1], loadAfter[2])
    var entry: [String: Any] = [
        "scenario": "serve", "notifications": sizes.updateTokens, "seconds": spread(serveRuns, "seconds").median,
        "rate": rate.median, "rate_min": rate.min, "rate_max": rate.max, "cpu_seconds": cpu.median,
        "peak_rss_mb": peakRSS, "cores": ProcessInfo.processInfo.activeProcessorCount,
        "load_average_before": loadBefore, "load_average_after": loadAfter, "loops": sizes.loops,
        "connections": sizes.connections, "dispatch_rate": dispatchRate.median,
        "accept_ms": spread(serveRuns, "accept_ms").median, "send_rate": sendRate.median,
        "send_rate_min": sendRate.min, "send_rate_max": sendRate.max, "ratio_vs_send": ratio,
        "ratio_vs_send_min": pairRatios.min, "ratio_vs_send_max": pairRatios.max, "big_tokens": sizes.bigTokens,
        "big_rate": bigRate.median, "probe_rate": sizes.probeRate, "probes": probes.median,
        "latency_ms_p50": p50.median, "latency_ms_p50_min": p50.min, "latency_ms_p50_max": p50.max,
        "latency_ms_p99": p99.median, "latency_ms_p99_min": p99.min, "latency_ms_p99_max": p99.max,
        "latency_ms_max": maxLatency.median, "service_ms_p99": serviceP99.median,
        "idle_probes": spread(probeRuns, "idle_probes").median, "idle_latency_ms_p50": idleP50.median,
        "idle_latency_ms_p99": idleP99.median, "p99_vs_idle": p99.median / max(idleP99.median, 1e-3),
        "activity_burst": sizes.burst, "activity_dispatches_per_second": burstRate,
    ]
    print(
        String(
            format: "serve: %d cores, %@", ProcessInfo.processInfo.activeProcessorCount, load))
    var keyFigure = ""
    if !registrationRuns.isEmpty {
        let registrations = Spread(registrationRuns.map(\.rate))
        let health = Spread(healthRuns.map(\.rate))
        let share = Spread(registrationRuns.map(\.share2xx))
        let ceiling = registrations.median / max(health.median, 1)
        print(
            String(
                format: "serve registrations: %d POSTs on %d keep-alive connections (h2load --h1): %.0f/s [%.0f-%.0f], "
                    + "%.1f%% 2xx; /healthz %.0f/s [%.0f-%.0f]; ratio_vs_healthz %.2f",
                sizes.registrations, sizes.registrationConnections, registrations.median, registrations.min,
                registrations.max, share.min * 100, health.median, health.min, health.max, ceiling))
        entry["registrations"] = sizes.registrations
        entry["registration_connections"] = sizes.registrationConnections
        entry["registration_rate"] = registrations.median
        entry["registration_rate_min"] = registrations.min
        entry["registration_rate_max"] = registrations.max
        entry["registration_2xx_share"] = share.min
        entry["healthz_rate"] = health.median
        entry["healthz_rate_min"] = health.min
        entry["healthz_rate_max"] = health.max
        entry["ratio_vs_healthz"] = ceiling
        keyFigure = String(format: "registrations %.0f/s (%.2f of /healthz), ", registrations.median, ceiling)
    } else {
        print("serve registrations: skipped, h2load not installed (apt-get install nghttp2-client)")
        keyFigure = "registrations skipped (no h2load), "
    }
    print(
        String(
            format: "serve update by API: %d tokens, %d loop(s) x %d connection(s): %.0f notifications/s [%.0f-%.0f] "
                + "POST to done (%.0f/s by the dispatch's own seconds), %.2f CPU s; fanout send %.0f/s [%.0f-%.0f]; "
                + "ratio_vs_send %.2f [%.2f-%.2f] (goal >= 0.9)",
            sizes.updateTokens, sizes.loops, sizes.connections, rate.median, rate.min, rate.max, dispatchRate.median,
            cpu.median, sendRate.median, sendRate.min, sendRate.max, ratio, pairRatios.min, pairRatios.max))
    print(
        String(
            format: "serve 202 while a %d-token update sends at %.0f/s (small updates at %.0f/s, %.0f of them): "
                + "p50 %.2f ms [%.2f-%.2f], p99 %.2f ms [%.2f-%.2f], max %.2f ms; p99 from the send %.2f ms "
                + "(goal p99 <= 10 ms); idle server: p50 %.2f ms, p99 %.2f ms [%.2f-%.2f]; p99_vs_idle %.1f; "
                + "serve peak RSS %.0f MB",
            sizes.bigTokens, bigRate.median, sizes.probeRate, probes.median, p50.median, p50.min, p50.max,
            p99.median, p99.min, p99.max, maxLatency.median, serviceP99.median, idleP50.median, idleP99.median,
            idleP99.min, idleP99.max, p99.median / max(idleP99.median, 1e-3), peakRSS))
    print(
        String(
            format: "serve: %d updates of one activity back to back: %.1f dispatches/s (POST of the first to the "
                + "last done)", sizes.burst, burstRate))
    keyFigure += String(
        format: "ratio_vs_send %.2f, 202 p99 %.1f ms during %d (idle %.1f ms)", ratio, p99.median, sizes.bigTokens,
        idleP99.median)
    if let onRedis {
        for line in onRedis.lines { print(line) }
        entry.merge(onRedis.entry) { _, new in new }
        keyFigure += onRedis.keyFigure
    } else {
        entry["redis_skipped"] = "redis-server not installed"
        keyFigure += "; on Redis skipped (no redis-server)"
    }
    entry["key_figure"] = keyFigure
    bench.record(entry)
}

// MARK: The registry, the measurements

/// Writes the three activities' registrations and imports them with `fanout registry IMPORT_TARGET import`
/// (`["--db", FILE]` or `["--redis", URL]`); the update activity's tokens also go to `tokensFile` (fanout send's).
/// Returns the seconds the imports took.
@discardableResult
private func importServeActivities(
    fanout: String, work: String, into target: [String], sizes: ServeSizes, tokensFile: String
) throws -> Double {
    let imports: [(activity: String, first: Int, count: Int, tokens: String?)] = [
        ("serve-update", 20_000_000, sizes.updateTokens, tokensFile),
        ("serve-big", 30_000_000, sizes.bigTokens, nil), ("serve-tiny", 40_000_000, sizes.tinyTokens, nil),
    ]
    var importing = 0.0
    for entry in imports {
        let file = "\(work)/\(entry.activity).jsonl"
        try writeRegistrations(
            file, activity: entry.activity, indices: entry.first..<(entry.first + entry.count), tokensPath: entry.tokens
        )
        let start = DispatchTime.now()
        try runTool(
            fanout, ["registry"] + target + ["import", file, "--workspace", serveWorkspace], in: work,
            timeout: sizes.timeout)
        importing += seconds(since: start)
        try? FileManager.default.removeItem(atPath: file)
    }
    return importing
}

/// Hooks around the measurements of one server, for the Redis variant's counters: `before` at the start of each
/// update and of each big update's phase, `after` at its end, with the run's figures to add to.
private struct MeasureHooks {
    var before: () throws -> Void = {}
    var after: (_ figures: inout [String: Any]) throws -> Void = { _ in }
}

/// Measurements 2 and 3 on one running server: each run's update through the API, then `fanout send` of the same
/// tokens (interleaved); then each run's small updates on the idle server and during the big update.
private func measureUpdates(
    _ bench: BenchContext, server: ServeProcess, control: BenchHTTPConnection, fanout: String, work: String,
    tokensFile: String, sizes: ServeSizes, updateHooks: MeasureHooks = MeasureHooks(),
    bigHooks: MeasureHooks = MeasureHooks()
) throws -> (serve: [[String: Any]], send: [[String: Any]], probes: [[String: Any]]) {
    // A first small update opens serve's APNs connections, so every measured run finds them open (fanout send opens
    // its own each time).
    _ = try waitForDispatch(
        control, try postUpdate(control, activity: "serve-tiny", content: serveContentState(-1)), pollInterval: 0.02,
        timeout: 60)
    var serveRuns: [[String: Any]] = []
    var sendRuns: [[String: Any]] = []
    for run in 0..<bench.runs {
        let cpuBefore = processCPUSeconds(server.child.process.processIdentifier)
        try updateHooks.before()
        var result = try serveUpdate(
            control, activity: "serve-update", content: serveContentState(run), tokens: sizes.updateTokens,
            pollInterval: 0.02, timeout: sizes.timeout)
        result["cpu_seconds"] = processCPUSeconds(server.child.process.processIdentifier) - cpuBefore
        try updateHooks.after(&result)
        serveRuns.append(result)
        sendRuns.append(
            try sendTokensFile(
                fanout: fanout, work: work, mock: bench.mock, tokensFile: tokensFile, run: run, sizes: sizes))
    }
    var probeRuns: [[String: Any]] = []
    for run in 0..<bench.runs {
        probeRuns.append(try probeDuringBigUpdate(control, port: server.port, run: run, sizes: sizes, hooks: bigHooks))
    }
    return (serveRuns, sendRuns, probeRuns)
}

/// `sizes.burst` updates of the 10-token activity POSTed back to back on one connection, then polled until the last
/// is done: how many dispatches of one activity the server runs a second (they run one after another, so that
/// each device's last update is the newest content).
private func activityBurst(_ control: BenchHTTPConnection, sizes: ServeSizes) throws -> Double {
    let start = DispatchTime.now()
    var last = ""
    for index in 0..<sizes.burst {
        last = try postUpdate(control, activity: "serve-tiny", content: #"{"score": "burst-\#(index)"}"#)
    }
    _ = try waitForDispatch(control, last, pollInterval: 0.005, timeout: sizes.timeout)
    return Double(sizes.burst) / seconds(since: start)
}

// MARK: On Redis

/// The Redis variant's figures, under their own keys, the lines to print, and its part of the key figure.
private struct ServeOnRedis {
    var entry: [String: Any]
    var lines: [String]
    var keyFigure: String
}

/// Measurements 2 and 3 again with `fanout serve --redis`: a redis-server of the bench's own (free port, AOF on with
/// `appendfsync always`, as docs/FLEET.md asks of a fleet's Redis; everysec with `--redis-fsync everysec`), the same three activities imported into it with
/// `fanout registry --redis URL import`, and one serve instance (`fleet_worker` on: it accepts onto the shared
/// queue and takes from it). Each update's `ratio_vs_send_redis` is against a `fanout send` of its own in the same
/// run. Redis commands (`INFO commandstats`, every call, the scripts' included; the bench's INFO and CONFIG left
/// out) and Redis's CPU (`INFO cpu`) are counted over each update from its POST to `done`, and over each big
/// update's phase (its small updates' commands included). Nil when redis-server is not installed.
private func measureServeOnRedis(
    _ bench: BenchContext, fanout: String, work: String, tokensFile: String, sizes: ServeSizes
) throws -> ServeOnRedis? {
    guard findTool("redis-server") != nil else {
        print("serve on Redis: skipped, redis-server not installed (make deps-test installs it)")
        return nil
    }
    let fsync = bench.options.redisFsyncAlways ? "always" : "everysec"
    let redis = try RedisServerProcess(appendOnly: true, extra: ["--appendfsync", fsync])
    defer { redis.discard() }
    let client = try BenchRedis(url: redis.url)
    defer { client.close() }
    let importSeconds = try importServeActivities(
        fanout: fanout, work: work, into: ["--redis", redis.url], sizes: sizes, tokensFile: tokensFile)
    let server = try ServeProcess.start(
        fanout: fanout, work: work, database: "\(work)/serve-redis.db", redis: redis.url, mock: bench.mock,
        sizes: sizes)
    defer { server.stop() }
    let control = BenchHTTPConnection(port: server.port)
    defer { control.close() }

    let ownCommands: Set = [
        "info", "config|resetstat", "config|set", "config", "xlen", "slowlog|get", "slowlog|reset", "slowlog",
        "latency|latest", "latency|history", "latency|reset", "latency", "ping",
    ]
    // Every command that holds Redis for 2 ms or more is logged: what a 202's commands can wait behind.
    _ = try client.run(["CONFIG", "SET", "slowlog-log-slower-than", "2000"])
    _ = try client.run(["CONFIG", "SET", "slowlog-max-len", "4096"])
    // And every pause of 2 ms or more in its event loop, by cause (a command, the AOF's write or fsync, a fork).
    _ = try client.run(["CONFIG", "SET", "latency-monitor-threshold", "2"])
    var redisCPUBefore = 0.0
    var phaseStart = DispatchTime.now()
    // During each big update, PING on a connection of its own: how long Redis itself keeps any client waiting.
    var pinger: RedisPinger?
    let before = {
        _ = try client.run(["CONFIG", "RESETSTAT"])
        _ = try client.run(["SLOWLOG", "RESET"])
        _ = try client.run(["LATENCY", "RESET"])
        redisCPUBefore = try client.cpuSeconds()
        phaseStart = DispatchTime.now()
    }
    let after = { (figures: inout [String: Any]) in
        // Done on the instance comes before its last publication and the entry's acknowledgement (the queue's next
        // round, within its 1 s read): those count too, so wait for the queue to be empty.
        let deadline = Date().addingTimeInterval(30)
        while try client.run(["XLEN", "fanout:dispatch-queue"]).integer != 0 {
            guard Date() < deadline else { throw BenchError("serve on Redis: the queue did not empty in 30 s") }
            usleep(5_000)
        }
        let stats = try client.commandStats(excluding: ownCommands)
        let calls = stats.mapValues(\.calls)
        let notifications = max(number(figures["notifications"]), 1)
        figures["redis_commands"] = calls
        figures["redis_command_microseconds"] = stats.mapValues(\.microseconds)
        figures["redis_commands_per_1000"] = Double(calls.values.reduce(0, +)) / notifications * 1000
        figures["redis_cpu_us_per_notification"] = (try client.cpuSeconds() - redisCPUBefore) / notifications * 1e6
        let pauses = try client.latencyEvents()
        figures["redis_pause_ms_max"] = pauses.mapValues(\.maxMilliseconds)
        figures["redis_pause_seconds"] = pauses.mapValues(\.seconds)
        // CONFIG RESETSTAT zeroes total_forks too: these are the phase's (AOF rewrites).
        figures["redis_forks"] = try client.infoNumber("stats", "total_forks")
        let slow = try client.slowCommands(limit: 4096, excluding: ownCommands)
        let longest = slow.max { $0.microseconds < $1.microseconds }
        // The registry's page reads (the engine's next 4,096 tokens: one script each) among them.
        let pages = slow.filter { command in
            guard command.arguments.count > 3, let keys = Int(command.arguments[2]) else { return false }
            return command.arguments.dropFirst(3 + keys).first == "page"
        }
        figures["slow_pages"] = pages.count
        figures["slow_page_ms_mean"] =
            pages.isEmpty ? 0 : Double(pages.reduce(0) { $0 + $1.microseconds }) / Double(pages.count) / 1000
        figures["slow_commands"] = slow.count
        figures["slow_ms_max"] = Double(longest?.microseconds ?? 0) / 1000
        figures["slow_ms_total"] = Double(slow.reduce(0) { $0 + $1.microseconds }) / 1000
        figures["slow_share"] = number(figures["slow_ms_total"]) / 1000 / max(seconds(since: phaseStart), 1e-3)
        // Its command and, for a script, its arguments after the keys (the registry's scripts name their
        // operation first).
        figures["slow_longest"] =
            longest.map { command in
                var words = [command.arguments.first ?? "?"]
                if command.arguments.count > 2, let keys = Int(command.arguments[2]) {
                    words += command.arguments.dropFirst(3 + keys).prefix(4)
                } else {
                    words += command.arguments.dropFirst().prefix(2)
                }
                return words.map { String($0.prefix(40)) }.joined(separator: " ")
            } ?? ""
    }
    let (serveRuns, sendRuns, probeRuns) = try measureUpdates(
        bench, server: server, control: control, fanout: fanout, work: work, tokensFile: tokensFile, sizes: sizes,
        updateHooks: MeasureHooks(before: before, after: after),
        bigHooks: MeasureHooks(
            before: {
                try before()
                pinger = try RedisPinger(url: redis.url)
            },
            after: { figures in
                if let pings = pinger?.finish() {
                    figures["redis_ping_ms_p50"] = percentile(pings, 50)
                    figures["redis_ping_ms_p99"] = percentile(pings, 99)
                }
                pinger = nil
                try after(&figures)
            }))
    let burstRate = try activityBurst(control, sizes: sizes)
    let peakRSS = processPeakRSSMegabytes(server.child.process.processIdentifier)
    // The same small updates sent to a second, API-only instance (`fleet_worker` false) while the first sends the
    // big update: the 202 apart from the sending process (its Redis connection, its CPU), Redis shared.
    let apiOnly = try ServeProcess.start(
        fanout: fanout, work: work, database: "\(work)/serve-redis-api.db", redis: redis.url, takesWork: false,
        mock: bench.mock, sizes: sizes)
    defer { apiOnly.stop() }
    var apiOnlyRuns: [[String: Any]] = []
    for run in 0..<bench.runs {
        apiOnlyRuns.append(
            try probeDuringBigUpdate(
                control, port: apiOnly.port, run: bench.runs + run, sizes: sizes, hooks: MeasureHooks()))
    }
    apiOnly.stop()
    let forks = (serveRuns + probeRuns).reduce(0) { $0 + number($1["redis_forks"]) }
    let redisPeakMB = try client.infoNumber("memory", "used_memory_peak") / 1_048_576
    server.stop()

    let rate = spread(serveRuns, "rate")
    let sendRate = spread(sendRuns, "rate")
    let pairRatios = Spread(zip(serveRuns, sendRuns).map { number($0["rate"]) / max(number($1["rate"]), 1) })
    let ratio = rate.median / max(sendRate.median, 1)
    let commands = spread(serveRuns, "redis_commands_per_1000")
    let redisCPU = spread(serveRuns, "redis_cpu_us_per_notification")
    let p50 = spread(probeRuns, "latency_ms_p50")
    let p99 = spread(probeRuns, "latency_ms_p99")
    let idleP50 = spread(probeRuns, "idle_latency_ms_p50")
    let idleP99 = spread(probeRuns, "idle_latency_ms_p99")
    let bigRate = spread(probeRuns, "big_rate")
    let bigCommands = spread(probeRuns, "redis_commands_per_1000")
    let slowUpdate = spread(serveRuns, "slow_ms_max")
    let pageUpdate = spread(serveRuns, "slow_page_ms_mean")
    let pagesUpdate = spread(serveRuns, "slow_pages")
    let pageBig = spread(probeRuns, "slow_page_ms_mean")
    let pagesBig = spread(probeRuns, "slow_pages")
    let slowBig = spread(probeRuns, "slow_ms_max")
    let slowBigShare = spread(probeRuns, "slow_share")
    let slowBigCount = spread(probeRuns, "slow_commands")
    let slowLongest = probeRuns.max { number($0["slow_ms_max"]) < number($1["slow_ms_max"]) }?["slow_longest"] ?? ""
    // Redis's pauses during the big updates, by cause: the median run's largest, and the seconds with one.
    var pauses: [String] = []
    var pauseEntry: [String: Double] = [:]
    let causes = Set(probeRuns.flatMap { ($0["redis_pause_ms_max"] as? [String: Int] ?? [:]).keys }).sorted()
    for cause in causes {
        let largest = Spread(probeRuns.map { number(($0["redis_pause_ms_max"] as? [String: Int])?[cause]) })
        let seconds = Spread(probeRuns.map { number(($0["redis_pause_seconds"] as? [String: Int])?[cause]) })
        pauseEntry[cause] = largest.median
        pauses.append(
            String(
                format: "%@ up to %.0f ms [%.0f-%.0f] in %.0f s of it", cause, largest.median, largest.min,
                largest.max, seconds.median))
    }
    let apiOnlyP50 = spread(apiOnlyRuns, "latency_ms_p50")
    let apiOnlyP99 = spread(apiOnlyRuns, "latency_ms_p99")
    let apiOnlyService = spread(apiOnlyRuns, "service_ms_p99")
    let pingP50 = spread(probeRuns, "redis_ping_ms_p50")
    let pingP99 = spread(probeRuns, "redis_ping_ms_p99")
    let top = topRedisCommands(serveRuns, key: "redis_commands")
    let topTime = topRedisCommands(serveRuns, key: "redis_command_microseconds")
    var lines: [String] = []
    let entry: [String: Any] = [
        "redis_appendonly": "yes, appendfsync \(fsync)", "redis_import_seconds": importSeconds,
        "rate_redis": rate.median, "rate_redis_min": rate.min, "rate_redis_max": rate.max,
        "seconds_redis": spread(serveRuns, "seconds").median,
        "dispatch_rate_redis": spread(serveRuns, "dispatch_rate").median,
        "accept_ms_redis": spread(serveRuns, "accept_ms").median,
        "cpu_seconds_redis": spread(serveRuns, "cpu_seconds").median,
        "peak_rss_mb_redis": peakRSS, "send_rate_redis": sendRate.median, "send_rate_redis_min": sendRate.min,
        "send_rate_redis_max": sendRate.max, "ratio_vs_send_redis": ratio, "ratio_vs_send_redis_min": pairRatios.min,
        "ratio_vs_send_redis_max": pairRatios.max, "redis_commands_per_1000": commands.median,
        "redis_commands_per_1000_min": commands.min, "redis_commands_per_1000_max": commands.max,
        "redis_top_commands": top, "redis_top_commands_us": topTime, "redis_cpu_us_per_notification": redisCPU.median,
        "big_rate_redis": bigRate.median, "big_redis_commands_per_1000": bigCommands.median,
        "big_redis_cpu_us_per_notification": spread(probeRuns, "redis_cpu_us_per_notification").median,
        "probes_redis": spread(probeRuns, "probes").median, "accept_p50_ms_during_big_redis": p50.median,
        "accept_p99_ms_during_big_redis": p99.median, "accept_p99_ms_during_big_redis_min": p99.min,
        "accept_p99_ms_during_big_redis_max": p99.max,
        "accept_max_ms_during_big_redis": spread(probeRuns, "latency_ms_max").median,
        "service_ms_p99_redis": spread(probeRuns, "service_ms_p99").median,
        "service_ms_p50_redis": spread(probeRuns, "service_ms_p50").median,
        "idle_latency_ms_p50_redis": idleP50.median, "idle_latency_ms_p99_redis": idleP99.median,
        "p99_vs_idle_redis": p99.median / max(idleP99.median, 1e-3), "redis_forks": forks,
        "redis_used_memory_peak_mb": redisPeakMB, "redis_slow_ms_max_update": slowUpdate.median,
        "redis_slow_ms_max_during_big": slowBig.median, "redis_slow_commands_during_big": slowBigCount.median,
        "redis_slow_share_during_big": slowBigShare.median, "redis_slow_longest_during_big": slowLongest,
        "redis_pause_ms_max_during_big": pauseEntry, "redis_page_ms_update": pageUpdate.median,
        "redis_pages_over_2ms_update": pagesUpdate.median, "redis_page_ms_during_big": pageBig.median,
        "redis_pages_over_2ms_during_big": pagesBig.median, "redis_ping_ms_p50_during_big": pingP50.median,
        "redis_ping_ms_p99_during_big": pingP99.median, "accept_p50_ms_during_big_redis_api_only": apiOnlyP50.median,
        "accept_p99_ms_during_big_redis_api_only": apiOnlyP99.median,
        "accept_p99_ms_during_big_redis_api_only_min": apiOnlyP99.min,
        "accept_p99_ms_during_big_redis_api_only_max": apiOnlyP99.max,
        "service_ms_p99_redis_api_only": apiOnlyService.median,
        "idle_latency_ms_p99_redis_api_only": spread(apiOnlyRuns, "idle_latency_ms_p99").median,
        "activity_dispatches_per_second_redis": burstRate,
    ]
    lines.append(
        String(
            format: "serve on Redis (AOF, appendfsync \(fsync)): registry import %.1f s; update by API: %.0f "
                + "notifications/s [%.0f-%.0f] POST to done (%.0f/s by the dispatch's own seconds; 202 in %.1f ms), "
                + "%.2f CPU s; fanout send %.0f/s [%.0f-%.0f]; ratio_vs_send_redis %.2f [%.2f-%.2f] (goal >= 0.9)",
            importSeconds, rate.median, rate.min, rate.max, number(entry["dispatch_rate_redis"]),
            number(entry["accept_ms_redis"]), number(entry["cpu_seconds_redis"]), sendRate.median, sendRate.min,
            sendRate.max, ratio, pairRatios.min, pairRatios.max))
    lines.append(
        String(
            format: "serve on Redis: %.1f Redis commands per 1,000 notifications [%.1f-%.1f] (top: %@; Redis "
                + "microseconds per 1,000 by command: %@), Redis %.2f CPU us/notification; during the big update %.1f per 1,000 (its small updates' included); "
                + "%.0f fork(s) (AOF rewrites) in the measured phases, Redis peak memory %.0f MB",
            commands.median, commands.min, commands.max, top, topTime, redisCPU.median, bigCommands.median, forks,
            redisPeakMB))
    lines.append(
        String(
            format: "serve on Redis 202 while a %d-token update sends at %.0f/s: p50 %.2f ms, p99 %.2f ms [%.2f-%.2f], "
                + "max %.2f ms; p99 from the send %.2f ms (goal p99 <= 10 ms); idle server: p50 %.2f ms, "
                + "p99 %.2f ms; p99_vs_idle %.1f; serve peak RSS %.0f MB",
            sizes.bigTokens, bigRate.median, p50.median, p99.median, p99.min, p99.max,
            number(entry["accept_max_ms_during_big_redis"]), number(entry["service_ms_p99_redis"]), idleP50.median,
            idleP99.median, number(entry["p99_vs_idle_redis"]), peakRSS))
    lines.append(
        String(
            format: "serve on Redis: commands that held Redis >= 2 ms during the big update: %.0f, longest %.1f ms "
                + "[%.1f-%.1f] (%@), %.0f%% of its time; during the %d-token update the longest %.1f ms",
            slowBigCount.median, slowBig.median, slowBig.min, slowBig.max, "\(slowLongest)", slowBigShare.median * 100,
            sizes.updateTokens, slowUpdate.median))
    lines.append(
        String(
            format: "serve on Redis: the registry's page reads (one script a page) that held Redis >= 2 ms: "
                + "%.0f in the %d-token update, %.1f ms each; %.0f in the big update, %.1f ms each",
            pagesUpdate.median, sizes.updateTokens, pageUpdate.median, pagesBig.median, pageBig.median))
    lines.append(
        String(
            format: "serve on Redis: %d updates of one activity back to back: %.1f dispatches/s", sizes.burst,
            burstRate))
    lines.append(
        String(
            format: "serve on Redis 202 of an API-only instance (fleet_worker false) while the other sends the big "
                + "update: p50 %.2f ms, p99 %.2f ms [%.2f-%.2f]; p99 from the send %.2f ms; idle p99 %.2f ms",
            apiOnlyP50.median, apiOnlyP99.median, apiOnlyP99.min, apiOnlyP99.max, apiOnlyService.median,
            number(entry["idle_latency_ms_p99_redis_api_only"])))
    lines.append(
        String(
            format: "serve on Redis: PING on a connection of its own every 20 ms during the big update: p50 %.2f ms, "
                + "p99 %.2f ms [%.2f-%.2f] (what Redis alone adds to each of the 202's round trips)",
            pingP50.median, pingP99.median, pingP99.min, pingP99.max))
    lines.append(
        "serve on Redis: pauses of Redis's event loop >= 2 ms during the big update (LATENCY, by cause): "
            + (pauses.isEmpty ? "none" : pauses.joined(separator: "; ")))
    return ServeOnRedis(
        entry: entry, lines: lines,
        keyFigure: String(
            format: "; on Redis: ratio_vs_send %.2f, 202 p99 %.1f ms during %d, %.1f commands/1,000", ratio,
            p99.median, sizes.bigTokens, commands.median))
}

/// PINGs Redis every 20 ms from a thread and a connection of its own until `finish()`: each reply's time.
private final class RedisPinger: @unchecked Sendable {
    private let client: BenchRedis
    private let stop = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)
    /// Milliseconds per PING; written only by the thread until `finished` is signalled.
    private var latencies: [Double] = []

    init(url: String) throws {
        client = try BenchRedis(url: url)
        _ = try client.run(["PING"])
        Thread.detachNewThread { [self] in
            defer { finished.signal() }
            while !stop.load(ordering: .acquiring) {
                let start = DispatchTime.now()
                guard (try? client.run(["PING"])) != nil else { return }
                latencies.append(seconds(since: start) * 1000)
                usleep(20_000)
            }
        }
    }

    /// Stops the thread and closes the connection: the latencies, sorted.
    func finish() -> [Double] {
        stop.store(true, ordering: .releasing)
        finished.wait()
        client.close()
        return latencies.sorted()
    }
}

// MARK: The server

/// A `fanout serve` child with a config for the bench workspace: one app sending to the shared mock.
private struct ServeProcess {
    let child: ChildProcess
    let port: Int

    /// `redis`: the registry and the dispatch queue on that Redis (`--redis`); `database` then keeps only this
    /// instance's own records. `takesWork` false: an API-only instance (`"fleet_worker": false`), which only accepts.
    static func start(
        fanout: String, work: String, database: String, redis: String?, takesWork: Bool = true, mock: MockProcess,
        sizes: ServeSizes
    ) throws -> ServeProcess {
        let unlimited = ["requests_per_hour": 1_000_000_000, "burst": 1_000_000_000]
        let config: [String: Any] = [
            "loops": sizes.loops, "connections": sizes.connections, "grace_seconds": 1, "fleet_worker": takesWork,
            "workspaces": [
                serveWorkspace: [
                    "server_keys_sha256": [SHA256Digest.hexHash(serveServerKey)],
                    "device_keys_sha256": [SHA256Digest.hexHash(serveDeviceKey)],
                    "rate_limit": unlimited, "device_rate_limit": unlimited,
                    "apps": [
                        registryBenchApp: [
                            "team_id": MockProcess.teamID, "key_id": MockProcess.keyID,
                            "key_path": "\(mock.tlsDirectory)/auth-key.p8", "endpoint": "localhost:\(mock.port)",
                            "ca_file": "\(mock.tlsDirectory)/ca.pem",
                        ]
                    ],
                ]
            ],
        ]
        let configPath = "\(work)/serve-\(UUID().uuidString).json"
        _ = FileManager.default.createFile(
            atPath: configPath, contents: try JSONSerialization.data(withJSONObject: config, options: [.sortedKeys]))
        let child = try ChildProcess.start(
            fanout,
            ["serve", "--config", configPath, "--db", database, "--listen", "127.0.0.1:0", "--log-format", "json"]
                + (redis.map { ["--redis", $0] } ?? []), in: work)
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if let line = child.output.split(separator: "\n").first, line.hasPrefix("listening on "),
                let port = Int(line.split(separator: ":").last ?? "")
            {
                return ServeProcess(child: child, port: port)
            }
            if !child.process.isRunning { break }
            usleep(20_000)
        }
        child.stop()
        throw BenchError("fanout serve did not start: \(child.errorOutput.suffix(2000))")
    }

    /// SIGTERM, then SIGKILL past 10 seconds (`ChildProcess.stop`).
    func stop() { child.stop() }
}

/// Runs a tool to the end; throws with its stderr unless it exits 0 within `timeout`. Returns its standard output.
@discardableResult
func runTool(_ tool: String, _ arguments: [String], in work: String, timeout: Double) throws -> String {
    try runToolSamplingPeakRSS(tool, arguments, in: work, timeout: timeout, sample: false).output
}

/// `runTool`, with the tool's peak RSS in MB (`ChildProcess.waitSamplingPeakRSS`).
func runToolSamplingPeakRSS(
    _ tool: String, _ arguments: [String], in work: String, timeout: Double, sample: Bool = true
) throws -> (output: String, peakRSSMegabytes: Double) {
    let child = try ChildProcess.start(tool, arguments, in: work)
    let (status, peak) = child.waitSamplingPeakRSS(seconds: timeout, sample: sample)
    guard status == 0 else {
        throw BenchError(
            "\((tool as NSString).lastPathComponent) \(arguments.prefix(4).joined(separator: " ")) failed "
                + "(exit \(status)): \(child.errorOutput.suffix(1000))")
    }
    return (child.output, peak)
}

/// The update's content state: distinct per run, about 1 KiB of payload like the other scenarios.
private func serveContentState(_ run: Int) -> String {
    #"{"score": "\#(run)-1", "note": "\#(String(repeating: "x", count: 900))"}"#
}

// MARK: 1. Registrations

struct H2loadH1Result {
    var rate: Double
    var total: Int
    var status2xx: Int
    var share2xx: Double { Double(status2xx) / Double(max(total, 1)) }
}

/// h2load `--h1` (HTTP/1.1, keep-alive, one request at a time per connection): its rate and status counts.
func measureH2loadH1(
    h2load: String, work: String, url: String, requests: Int, connections: Int, body: String? = nil,
    headers: [String] = []
) throws -> H2loadH1Result {
    var arguments = ["--h1", "-n", String(requests), "-c", String(connections)]
    if let body { arguments += ["-d", body] }
    for header in headers { arguments += ["-H", header] }
    arguments.append(url)
    let child = try ChildProcess.start(h2load, arguments, in: work)
    let status = child.wait(seconds: 600)
    let output = child.output
    guard status == 0, let rate = firstCapture(#"finished in [^,]*, ([0-9.]+) req/s"#, in: output),
        let total = firstCapture(#"requests: ([0-9]+) total"#, in: output),
        let ok = firstCapture(#"status codes: ([0-9]+) 2xx"#, in: output)
    else {
        throw BenchError("h2load --h1 \(url) failed (exit \(status)): \(output.suffix(600))")
    }
    return H2loadH1Result(rate: rate, total: Int(total), status2xx: Int(ok))
}

/// The first capture group of `pattern` in `text`, as a number.
private func firstCapture(_ pattern: String, in text: String) -> Double? {
    guard let expression = try? NSRegularExpression(pattern: pattern),
        let match = expression.firstMatch(in: text, range: NSRange(text.startIndex..., in: text)),
        let range = Range(match.range(at: 1), in: text)
    else { return nil }
    return Double(text[range])
}

// MARK: 2. The update through the API and through fanout send

/// POSTs an update to `activity` and polls its dispatch every `pollInterval` seconds until `done`: the time from the
/// POST to seeing `done`, and the dispatch's own timing.
private func serveUpdate(
    _ connection: BenchHTTPConnection, activity: String, content: String, tokens: Int, pollInterval: Double,
    timeout: Double
) throws -> [String: Any] {
    let start = DispatchTime.now()
    let id = try postUpdate(connection, activity: activity, content: content)
    let accepted = seconds(since: start)
    let dispatch = try waitForDispatch(connection, id, pollInterval: pollInterval, timeout: timeout)
    let elapsed = seconds(since: start)
    let delivered = Int(number(dispatch["delivered"]))
    guard delivered == tokens else {
        throw BenchError("serve dispatch \(id) to \(activity) delivered \(delivered) of \(tokens): \(dispatch)")
    }
    let dispatchSeconds = number(dispatch["seconds"])
    return [
        "notifications": tokens, "delivered": delivered, "seconds": elapsed, "rate": Double(delivered) / elapsed,
        "dispatch_seconds": dispatchSeconds, "dispatch_rate": Double(delivered) / max(dispatchSeconds, 1e-3),
        "accept_ms": accepted * 1000,
    ]
}

/// POSTs an update to `activity` with the server key; the dispatch id of its 202.
private func postUpdate(_ connection: BenchHTTPConnection, activity: String, content: String) throws -> String {
    let (status, object) = try connection.requestObject(
        "POST", "/v1/activities/\(activity)/update", bearer: serveServerKey, json: #"{"content_state": \#(content)}"#)
    guard status == 202, let id = object["dispatch_id"] as? String else {
        throw BenchError("POST /v1/activities/\(activity)/update: \(status) \(object)")
    }
    return id
}

/// Polls `GET /v1/dispatches/{id}` until its state is `done`; its JSON.
private func waitForDispatch(_ connection: BenchHTTPConnection, _ id: String, pollInterval: Double, timeout: Double)
    throws -> [String: Any]
{
    let deadline = Date().addingTimeInterval(timeout)
    while true {
        let (status, dispatch) = try connection.requestObject("GET", "/v1/dispatches/\(id)", bearer: serveServerKey)
        guard status == 200 else { throw BenchError("GET /v1/dispatches/\(id): \(status) \(dispatch)") }
        if dispatch["state"] as? String == "done" { return dispatch }
        guard Date() < deadline else { throw BenchError("dispatch \(id) not done after \(timeout) s: \(dispatch)") }
        usleep(UInt32(pollInterval * 1e6))
    }
}

/// `fanout send` of one job naming `tokensFile`, with the same content state, loops and connections as serve's
/// engine: the rate from its summary (the job's own seconds, as serve's figure is the dispatch's).
private func sendTokensFile(
    fanout: String, work: String, mock: MockProcess, tokensFile: String, run: Int, sizes: ServeSizes
) throws -> [String: Any] {
    let jobs = "\(work)/send-\(run).jsonl"
    let summary = "\(work)/send-\(run).summary"
    let results = "\(work)/send-\(run).results"
    defer {
        for path in [jobs, summary, results] { try? FileManager.default.removeItem(atPath: path) }
    }
    let line =
        #"{"id": "serve-send-\#(run)", "workspace": "\#(serveWorkspace)", "#
        + #""topic": "\#(registryBenchApp).push-type.liveactivity", "push_type": "liveactivity", "priority": 10, "#
        + #""live_activity": {"event": "update", "timestamp": \#(Int(Date().timeIntervalSince1970)), "#
        + #""content_state": \#(serveContentState(run))}, "tokens_file": "\#(tokensFile)"}"#
    _ = FileManager.default.createFile(atPath: jobs, contents: Data((line + "\n").utf8))
    let start = DispatchTime.now()
    try runTool(
        fanout,
        [
            "send", "--jobs", jobs, "--results", results, "--summary", summary, "--endpoint", "localhost:\(mock.port)",
            "--ca-file", "\(mock.tlsDirectory)/ca.pem", "--key", "\(mock.tlsDirectory)/auth-key.p8", "--key-id",
            MockProcess.keyID, "--team-id", MockProcess.teamID, "--loops", String(sizes.loops), "--connections",
            String(sizes.connections), "--progress", "never",
        ], in: work, timeout: sizes.timeout)
    let wall = seconds(since: start)
    guard let data = FileManager.default.contents(atPath: summary),
        let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
    else { throw BenchError("fanout send wrote no summary") }
    guard Int(number(object["delivered"])) == sizes.updateTokens else {
        throw BenchError("fanout send delivered \(object["delivered"] ?? "?") of \(sizes.updateTokens)")
    }
    return ["rate": number(object["rate"]), "seconds": number(object["seconds"]), "process_seconds": wall]
}

// MARK: 3. The 202 while a big update sends

/// What the probe thread measured; written only by that thread until `finished` is signalled, read after.
private final class ProbeLog: @unchecked Sendable {
    let stop = Atomic<Bool>(false)
    let finished = DispatchSemaphore(value: 0)
    /// Milliseconds from each request's scheduled time, and from its send, to its whole response.
    var latencies: [Double] = []
    var serviceTimes: [Double] = []
    var failure: String?
    var lastDispatch: String?
}

/// Sends small updates to the tiny activity at `rate` from one keep-alive connection, on a thread of its own, until
/// `stop` is set and at least `minProbes` were sent (or `maxProbes` were); `finished` is signalled when it ends.
private func startProbes(port: Int, label: String, rate: Double, minProbes: Int, maxProbes: Int) -> ProbeLog {
    let log = ProbeLog()
    Thread.detachNewThread {
        defer { log.finished.signal() }
        let probes = BenchHTTPConnection(port: port, timeoutSeconds: 10)
        defer { probes.close() }
        let begin = DispatchTime.now().uptimeNanoseconds
        var index = 0
        while index < maxProbes && (index < minProbes || !log.stop.load(ordering: .acquiring)) {
            let due = begin + UInt64(Double(index) * 1e9 / rate)
            let now = DispatchTime.now().uptimeNanoseconds
            if due > now { usleep(UInt32((due - now) / 1000)) }
            let sent = DispatchTime.now().uptimeNanoseconds
            do {
                let (status, object) = try probes.requestObject(
                    "POST", "/v1/activities/serve-tiny/update", bearer: serveServerKey,
                    json: #"{"content_state": {"score": "\#(label)-\#(index)"}}"#)
                let done = DispatchTime.now().uptimeNanoseconds
                guard status == 202, let id = object["dispatch_id"] as? String else {
                    log.failure = "small update \(index): \(status) \(object)"
                    return
                }
                log.lastDispatch = id
                log.latencies.append(Double(done - min(due, sent)) / 1e6)
                log.serviceTimes.append(Double(done - sent) / 1e6)
            } catch {
                log.failure = "small update \(index): \(error)"
                return
            }
            index += 1
        }
    }
    return log
}

/// Stops the probe thread and waits for it (its socket times out in 10 s), then for its last dispatch, so what
/// comes next finds an idle server: the latencies and service times, sorted.
private func finishProbes(_ log: ProbeLog, control: BenchHTTPConnection, timeout: Double) throws -> (
    latencies: [Double], service: [Double]
) {
    log.stop.store(true, ordering: .releasing)
    guard log.finished.wait(timeout: .now() + timeout) == .success else {
        throw BenchError("the small-update thread did not finish")
    }
    if let failure = log.failure { throw BenchError("serve \(failure)") }
    if let last = log.lastDispatch { _ = try waitForDispatch(control, last, pollInterval: 0.02, timeout: 60) }
    return (log.latencies.sorted(), log.serviceTimes.sorted())
}

/// Small updates on an idle server (`minProbes` of them, the reference), then the same while an update to the big
/// activity sends, until its dispatch is done (and at least `minProbes` were sent): each 202's latency.
private func probeDuringBigUpdate(
    _ control: BenchHTTPConnection, port: Int, run: Int, sizes: ServeSizes, hooks: MeasureHooks
) throws -> [String: Any] {
    let rate = sizes.probeRate
    let maxProbes = Int(sizes.timeout * rate)
    let idleLog = startProbes(
        port: port, label: "idle-\(run)", rate: rate, minProbes: sizes.minProbes, maxProbes: maxProbes)
    let idle = try finishProbes(idleLog, control: control, timeout: Double(sizes.minProbes) / rate + 30)

    try hooks.before()
    let start = DispatchTime.now()
    let bigID = try postUpdate(control, activity: "serve-big", content: serveContentState(run))
    let log = startProbes(
        port: port, label: "busy-\(run)", rate: rate, minProbes: sizes.minProbes, maxProbes: maxProbes)
    // However the poll ends, the probe thread is stopped and waited for.
    var big: [String: Any] = [:]
    var pollError: Error?
    do {
        big = try waitForDispatch(control, bigID, pollInterval: 0.05, timeout: sizes.timeout)
    } catch {
        pollError = error
    }
    let elapsed = seconds(since: start)
    let busy = Result { try finishProbes(log, control: control, timeout: 30) }
    if let pollError { throw pollError }
    let (latencies, service) = try busy.get()
    let delivered = Int(number(big["delivered"]))
    guard delivered == sizes.bigTokens else {
        throw BenchError("serve dispatch \(bigID) delivered \(delivered) of \(sizes.bigTokens): \(big)")
    }
    var figures: [String: Any] = [
        "notifications": delivered,
        "big_rate": Double(delivered) / elapsed, "big_seconds": elapsed, "probes": latencies.count,
        "latency_ms_p50": percentile(latencies, 50), "latency_ms_p99": percentile(latencies, 99),
        "latency_ms_max": latencies.last ?? 0, "service_ms_p50": percentile(service, 50),
        "service_ms_p99": percentile(service, 99), "idle_probes": idle.latencies.count,
        "idle_latency_ms_p50": percentile(idle.latencies, 50), "idle_latency_ms_p99": percentile(idle.latencies, 99),
    ]
    try hooks.after(&figures)
    return figures
}

/// The nearest-rank percentile of sorted values.
private func percentile(_ sorted: [Double], _ p: Double) -> Double {
    sorted.isEmpty ? 0 : sorted[max(0, min(sorted.count - 1, Int((p / 100 * Double(sorted.count)).rounded(.up)) - 1))]
}

// MARK: Another process's figures

/// Peak RSS (`VmHWM`) of a running process in MB, 0 when it cannot be read.
private func processPeakRSSMegabytes(_ pid: Int32) -> Double {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
        let kilobytes = line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first.flatMap({
            Double($0)
        })
    else { return 0 }
    return kilobytes / 1024
}

/// The 1, 5 and 15 minute load averages (/proc/loadavg).
func loadAverage() -> [Double] {
    let text = (try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8)) ?? ""
    let values = text.split(separator: " ").prefix(3).compactMap { Double($0) }
    return values.count == 3 ? values : [0, 0, 0]
}
