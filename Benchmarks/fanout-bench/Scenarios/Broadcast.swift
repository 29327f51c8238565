import Foundation

/// broadcast: what an iOS 18 broadcast channel saves one Live Activity update.
///
/// A mock-apns of its own, with `--manage-listen` (the channel management API) and `--stats`; one channel created
/// with `fanout channels create`. Then, each run, interleaved:
///
/// 1. Without a channel: `fanout send` of one update job naming a tokens file of `tokens` tokens (1,000,000) —
///    one request per follower.
/// 2. With a channel: `fanout send` of the same update as a job with `channel_id` — one broadcast request, whatever
///    the number of followers. The scenario fails unless the mock saw exactly 1 request and 1 broadcast on the
///    channel.
///
/// Each send is the real binary's process, timed from spawn to exit (TLS handshake and provider token included);
/// the requests are the mock's `requests` before and after, from its stats file. The ratios are without / with.
/// --quick: 20,000 tokens.
func runBroadcast(_ bench: BenchContext) throws {
    let tokens = bench.quick ? 20_000 : 1_000_000
    let timeout: Double = bench.quick ? 60 : 900
    let loops = 1
    let connections = 2
    let fanout = "\(bench.bin)/fanout"
    guard FileManager.default.isExecutableFile(atPath: fanout) else {
        throw BenchError("broadcast needs the fanout binary beside fanout-bench (swift build --product fanout)")
    }
    let work = "\(bench.work)/broadcast"
    try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let loadBefore = loadAverage()

    let statsPath = "\(work)/mock-stats.json"
    let mock = try MockProcess.start(
        binDirectory: bench.bin, workDirectory: work, threads: 2,
        extra: ["--manage-listen", "127.0.0.1:0", "--stats", statsPath])
    defer { mock.child.stop() }
    let managePort = try waitForManagePort(mock)
    let credentials = [
        "--ca-file", "\(mock.tlsDirectory)/ca.pem", "--key", "\(mock.tlsDirectory)/auth-key.p8", "--key-id",
        MockProcess.keyID, "--team-id", MockProcess.teamID,
    ]

    // The channel: created once, at the mock's management listener.
    let created = try runTool(
        fanout,
        ["channels", "create", "--app", registryBenchApp, "--manage-endpoint", "127.0.0.1:\(managePort)"]
            + credentials, in: work, timeout: 60)
    guard let data = created.split(separator: "\n").last.map({ Data($0.utf8) }),
        let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
        let channel = object["channel"] as? String
    else { throw BenchError("fanout channels create printed no channel: \(created)") }

    let tokensFile = try bench.tokensFile(count: tokens)
    let send = BroadcastSend(
        fanout: fanout, work: work, endpoint: "localhost:\(mock.port)", credentials: credentials, loops: loops,
        connections: connections, statsPath: statsPath, timeout: timeout)
    // Nothing has reached the push listener yet (the channel was made on the management one), so the stats the mock
    // wrote on start are exact.
    var stats = try send.stats(after: .distantPast)
    var without: [[String: Any]] = []
    var with: [[String: Any]] = []
    for run in 0..<bench.runs {
        let plain = try send.run(
            recipients: #""tokens_file": "\#(tokensFile)""#, label: "without-\(run)", run: run, stats: &stats)
        guard Int(number(plain["delivered"])) == tokens, Int(number(plain["requests"])) >= tokens else {
            throw BenchError(
                "broadcast without a channel: \(plain["delivered"] ?? "?") delivered, \(plain["requests"] ?? "?") "
                    + "requests at the mock, for \(tokens) tokens")
        }
        without.append(plain)
        let broadcast = try send.run(
            recipients: #""channel_id": "\#(channel)""#, label: "with-\(run)", run: run, stats: &stats,
            channel: channel)
        guard Int(number(broadcast["requests"])) == 1, Int(number(broadcast["channel_broadcasts"])) == 1,
            Int(number(broadcast["accepted"])) == 0
        else {
            throw BenchError(
                "broadcast with a channel: the mock saw \(broadcast["requests"] ?? "?") request(s), "
                    + "\(broadcast["channel_broadcasts"] ?? "?") broadcast(s) on the channel and "
                    + "\(broadcast["accepted"] ?? "?") device push(es); want 1, 1 and 0")
        }
        with.append(broadcast)
    }
    try? FileManager.default.removeItem(atPath: tokensFile)
    let loadAfter = loadAverage()

    let wall = spread(without, "wall_seconds")
    let wallWith = spread(with, "wall_seconds")
    let jobSeconds = spread(without, "job_seconds")
    let jobSecondsWith = spread(with, "job_seconds")
    let requests = spread(without, "requests")
    let requestsWith = spread(with, "requests")
    let cpu = spread(without, "cpu_seconds")
    let cpuWith = spread(with, "cpu_seconds")
    let timeRatio = wall.median / max(wallWith.median, 1e-6)
    let pairRatios = Spread(
        zip(without, with).map { number($0["wall_seconds"]) / max(number($1["wall_seconds"]), 1e-6) })
    let requestRatio = requests.median / max(requestsWith.median, 1)
    let cores = ProcessInfo.processInfo.activeProcessorCount
    let load = String(
        format: "load average %.2f %.2f %.2f before, %.2f %.2f %.2f after", loadBefore[0], loadBefore[1],
        loadBefore[2], loadAfter[0], loadAfter[1], loadAfter[2])
    print(
        String(
            format: "broadcast: %d cores, %@; fanout send, %d loop(s) x %d connection(s)", cores, load, loops,
            connections))
    print(
        String(
            format: "broadcast without a channel: one update to %d tokens (tokens_file): %.0f requests at the mock, "
                + "%.2f s [%.2f-%.2f] spawn to exit (job %.2f s), %.2f CPU s", tokens, requests.median, wall.median,
            wall.min, wall.max, jobSeconds.median, cpu.median))
    print(
        String(
            format: "broadcast with a channel: one update by channel_id: %.0f request(s) at the mock, 1 broadcast on "
                + "the channel, %.3f s [%.3f-%.3f] spawn to exit (job %.3f s), %.2f CPU s", requestsWith.median,
            wallWith.median, wallWith.min, wallWith.max, jobSecondsWith.median, cpuWith.median))
    print(
        String(
            format: "broadcast ratio without / with: requests x%.0f, time x%.1f [%.1f-%.1f pair by pair]",
            requestRatio, timeRatio, pairRatios.min, pairRatios.max))
    bench.record([
        "scenario": "broadcast", "notifications": tokens, "seconds": wall.median,
        "rate": Double(tokens) / max(wall.median, 1e-6), "rate_min": Double(tokens) / max(wall.max, 1e-6),
        "rate_max": Double(tokens) / max(wall.min, 1e-6), "cpu_seconds": cpu.median, "cores": cores,
        "load_average_before": loadBefore, "load_average_after": loadAfter, "loops": loops,
        "connections": connections, "followers": tokens, "requests_without_channel": requests.median,
        "requests_with_channel": requestsWith.median, "seconds_without_channel": wall.median,
        "seconds_without_channel_min": wall.min, "seconds_without_channel_max": wall.max,
        "seconds_with_channel": wallWith.median, "seconds_with_channel_min": wallWith.min,
        "seconds_with_channel_max": wallWith.max, "job_seconds_without_channel": jobSeconds.median,
        "job_seconds_with_channel": jobSecondsWith.median, "cpu_seconds_with_channel": cpuWith.median,
        // The fan-out's `fanout send` (without the channel), as `rate` and `seconds` are.
        "peak_rss_mb": spread(without, "peak_rss_mb").median,
        "peak_rss_mb_with_channel": spread(with, "peak_rss_mb").median,
        "channel_broadcasts": spread(with, "channel_broadcasts").median, "requests_ratio": requestRatio,
        "time_ratio": timeRatio, "time_ratio_min": pairRatios.min, "time_ratio_max": pairRatios.max,
        "key_figure": String(
            format: "%d followers: %.0f requests in %.2f s without a channel, %.0f in %.3f s with one: x%.0f "
                + "requests, x%.1f time", tokens, requests.median, wall.median, requestsWith.median, wallWith.median,
            requestRatio, timeRatio),
    ])
}

/// The second line mock-apns prints with `--manage-listen`: `manage listening on HOST:PORT`.
private func waitForManagePort(_ mock: MockProcess) throws -> Int {
    let deadline = Date().addingTimeInterval(20)
    while Date() < deadline {
        if let line = mock.child.output.split(separator: "\n").first(where: { $0.hasPrefix("manage listening on ") }),
            let port = Int(line.split(separator: ":").last ?? "")
        {
            return port
        }
        if !mock.child.process.isRunning { break }
        usleep(20_000)
    }
    throw BenchError("mock-apns printed no manage port: \(mock.child.errorOutput.suffix(1000))")
}

/// One `fanout send` of one Live Activity update job against the scenario's mock, with the mock's counters before
/// and after it.
private struct BroadcastSend {
    let fanout: String
    let work: String
    let endpoint: String
    let credentials: [String]
    let loops: Int
    let connections: Int
    let statsPath: String
    let timeout: Double

    /// Sends the job addressed by `recipients` (a JSON member): the process's wall and CPU seconds, the summary's,
    /// and what the mock counted meanwhile (`requests`, `accepted`, and broadcasts on `channel`), from `stats` (the
    /// mock's stats before the send, replaced by those after it).
    func run(recipients: String, label: String, run: Int, stats: inout [String: Any], channel: String? = nil) throws
        -> [String: Any]
    {
        let jobs = "\(work)/\(label).jsonl"
        let summary = "\(work)/\(label).summary"
        let results = "\(work)/\(label).results"
        defer {
            for path in [jobs, summary, results] { try? FileManager.default.removeItem(atPath: path) }
        }
        let note = String(repeating: "x", count: 900)
        let line =
            #"{"id": "broadcast-\#(label)", "topic": "\#(registryBenchApp).push-type.liveactivity", "#
            + #""push_type": "liveactivity", "priority": 10, "live_activity": {"event": "update", "#
            + #""timestamp": \#(Int(Date().timeIntervalSince1970)), "#
            + #""content_state": {"score": "\#(run)-1", "note": "\#(note)"}}, \#(recipients)}"#
        _ = FileManager.default.createFile(atPath: jobs, contents: Data((line + "\n").utf8))

        let before = stats
        let cpuBefore = childrenCPUSeconds()
        let start = DispatchTime.now()
        let peakRSS = try runToolSamplingPeakRSS(
            fanout,
            [
                "send", "--jobs", jobs, "--results", results, "--summary", summary, "--endpoint", endpoint,
                "--loops", String(loops), "--connections", String(connections), "--progress", "never",
            ] + credentials, in: work, timeout: timeout
        ).peakRSSMegabytes
        let wall = seconds(since: start)
        let cpu = childrenCPUSeconds() - cpuBefore
        let after = try self.stats(after: Date())
        stats = after
        guard let data = FileManager.default.contents(atPath: summary),
            let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
        else { throw BenchError("fanout send \(label) wrote no summary") }
        func delta(_ key: String) -> Int { Int(number(after[key])) - Int(number(before[key])) }
        var channelBroadcasts = 0
        if let channel {
            channelBroadcasts =
                Int(number((after["broadcasts_by_channel"] as? [String: Any])?[channel]))
                - Int(number((before["broadcasts_by_channel"] as? [String: Any])?[channel]))
        }
        return [
            "wall_seconds": wall, "job_seconds": number(object["seconds"]), "cpu_seconds": cpu, "peak_rss_mb": peakRSS,
            "delivered": number(object["delivered"]), "notifications": number(object["notifications"]),
            "summary_broadcasts": number(object["broadcasts"]), "requests": delta("requests"),
            "accepted": delta("accepted"), "broadcasts": delta("broadcasts"), "channel_broadcasts": channelBroadcasts,
        ]
    }

    /// The mock's stats as written after `moment` (it rewrites them every second, atomically): every request
    /// answered before `moment` is counted in them. The file must be 0.2 s younger than `moment`, so that a snapshot
    /// taken just before `moment` and written just after it is not taken for a later one.
    func stats(after moment: Date) throws -> [String: Any] {
        let settled = moment.addingTimeInterval(0.2)
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            if let attributes = try? FileManager.default.attributesOfItem(atPath: statsPath),
                let modified = attributes[.modificationDate] as? Date, modified > settled,
                let data = FileManager.default.contents(atPath: statsPath),
                let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
            {
                return object
            }
            usleep(20_000)
        }
        throw BenchError("mock-apns did not rewrite its stats file \(statsPath)")
    }
}

/// CPU seconds (user + system) of this process's ended and waited-for children so far.
func childrenCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_CHILDREN.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6 + Double(usage.ru_stime.tv_sec)
        + Double(usage.ru_stime.tv_usec) / 1e6
}
