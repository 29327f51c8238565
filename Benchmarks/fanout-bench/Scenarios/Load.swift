import Foundation

/// load: open-loop load at a fixed rate for --duration seconds (default 10, 2 with --quick), 1 loop,
/// 1 connection and 1000 streams as in throughput-1c. Latency runs from each notification's intended
/// send time to its answer, once one notification has opened the connection (its time is reported apart).
///
/// The rate is --rate when given. Otherwise this machine's maximum is measured first (full-speed
/// one-job runs against the same mock with the same connection and streams, the median of --runs),
/// and the load runs at 40% of it: a fixed guess overloads a slow machine and reports a queue, not a
/// latency.
///
/// Beside each run, h2load sends to the same mock over one connection, with the same body and headers,
/// one request at a time at 1,000/s: its per-request latency is the mock's service time with
/// `--latency-ms 0` (plus loopback TLS and the leanest client there is), so Fanout's share of the
/// latency can be told apart from the mock's. One stream at a time because h2load's own figure with
/// `-m 1000` under `--rps` was 1 to 3 ms higher at the same rate (against a debug mock: 0.98 ms mean
/// against 0.14 ms at 1,000/s, and above Fanout's end-to-end figure at 4,000/s): that is h2load's
/// client, not the mock.
func runLoad(_ bench: BenchContext) throws {
    let duration = bench.options.loadDuration ?? (bench.quick ? 2 : 10)
    let rate: Double
    let rateSource: String
    var maximum: Spread?
    if let forced = bench.options.loadRate {
        rate = forced
        rateSource = "--rate"
    } else {
        let measured = try measureMaximumRate(bench)
        maximum = measured
        rate = max(1, (measured.median * loadShareOfMaximum).rounded())
        rateSource = "40% of the measured maximum"
        print(
            String(
                format: "load: maximum %.0f/s [%.0f-%.0f] (one job, 1 connection, 1000 streams, full speed)",
                measured.median, measured.min, measured.max))
    }
    var runs: [[String: Any]] = []
    var mockRuns: [[String: Any]] = []
    for _ in 0..<bench.runs {
        runs.append(
            try bench.measureChild(
                ChildOptions(
                    mode: "load", loops: 1, connections: 1, streams: 1000, rate: rate, duration: duration,
                    allowFailures: true),
                timeout: duration + 600))
        if let h2load = bench.h2load {
            mockRuns.append(
                try measureMockLatency(h2load: h2load, bench: bench, rate: mockProbeRate, duration: duration))
        }
    }
    let achieved = spread(runs, "rate")
    let names = ["p50", "p90", "p99", "p999", "max"]
    let percentiles = names.map { spread(runs, "latency_ms_" + $0) }
    let mockPercentiles = names.map { spread(mockRuns, "latency_ms_" + $0) }
    let shortfall = spread(runs, "shortfall_percent")
    let delivered = Int(spread(runs, "delivered").median)
    let notifications = Int(spread(runs, "notifications").median)
    func latencyText(_ values: [Spread]) -> String {
        zip(["p50", "p90", "p99", "p99.9", "max"], values).map { name, value in
            String(format: "%@ %.2f", name, value.median)
        }.joined(separator: ", ")
    }
    let mockText =
        mockRuns.isEmpty
        ? "mock alone: h2load not installed"
        : "mock alone (h2load -c 1 -m 1 --rps \(Int(mockProbeRate)), ms) \(latencyText(mockPercentiles))"
    print(
        String(
            format:
                "load: target %.0f/s (%@) for %.0f s, 1 connection: achieved %.0f/s [%.0f-%.0f] (shortfall %.1f%%), "
                + "latency from intended send time (ms) %@; %@; %d of %d delivered; generator lag max %.2f ms; "
                + "before the schedule, one notification opened the connection in %.2f ms",
            rate, rateSource, duration, achieved.median, achieved.min, achieved.max, shortfall.median,
            latencyText(percentiles), mockText, delivered, notifications, spread(runs, "generator_max_lag_ms").median,
            spread(runs, "warmup_ms").median
        ))
    let partNames = [
        ("scheduler", "scheduler lag"), ("task_start", "task start"), ("engine", "engine and mock"),
        ("wire", "of that first sent to answered (the loop's clock, whole ms)"),
    ]
    // The tail moves with the host: a run in which the hypervisor took more of the CPU has the longer p99.
    let p99AndSteal = runs.map { [number($0["latency_ms_p99"]), number($0["steal_percent"])] }
    print(
        "load: p99 and CPU stolen by the hypervisor, run by run: "
            + p99AndSteal.map { String(format: "%.2f ms at %.1f%%", $0[0], $0[1]) }.joined(separator: ", "))
    print(
        "load: where it went (ms, each part's own percentiles): "
            + partNames.map { key, label in
                String(
                    format: "%@ p50 %.2f p99 %.2f p99.9 %.2f", label, spread(runs, "part_\(key)_ms_p50").median,
                    spread(runs, "part_\(key)_ms_p99").median, spread(runs, "part_\(key)_ms_p999").median)
            }.joined(separator: "; "))
    var keyFigure = String(
        format: "target %.0f/s, shortfall %.1f%%, ms p50 %.2f p99 %.2f p99.9 %.2f max %.2f", rate, shortfall.median,
        percentiles[0].median, percentiles[2].median, percentiles[3].median, percentiles[4].median)
    if let maximum { keyFigure = String(format: "max %.0f/s, ", maximum.median) + keyFigure }
    if !mockRuns.isEmpty {
        keyFigure += String(
            format: "; mock alone p50 %.2f p99 %.2f p99.9 %.2f", mockPercentiles[0].median, mockPercentiles[2].median,
            mockPercentiles[3].median)
    }
    var entry: [String: Any] = [
        "scenario": "load", "target_rate": rate, "target_rate_source": rateSource, "duration": duration,
        "notifications": notifications, "delivered": delivered, "rate": achieved.median, "rate_min": achieved.min,
        "rate_max": achieved.max, "shortfall_percent": shortfall.median, "seconds": spread(runs, "seconds").median,
        "cpu_seconds": spread(runs, "cpu_seconds").median, "peak_rss_mb": spread(runs, "peak_rss_mb").median,
        "generator_max_lag_ms": spread(runs, "generator_max_lag_ms").median, "key_figure": keyFigure,
        "steal_percent": spread(runs, "steal_percent").median, "runs_p99_steal": p99AndSteal,
        "warmup_ms": spread(runs, "warmup_ms").median,
    ]
    for (key, _) in partNames {
        for percentile in ["p50", "p99", "p999"] {
            entry["part_\(key)_ms_\(percentile)"] = spread(runs, "part_\(key)_ms_\(percentile)").median
        }
    }
    if let maximum {
        entry["max_rate"] = maximum.median
        entry["max_rate_min"] = maximum.min
        entry["max_rate_max"] = maximum.max
    }
    for (name, value) in zip(names, percentiles) {
        entry["latency_ms_" + name] = value.median
        entry["latency_ms_\(name)_min"] = value.min
        entry["latency_ms_\(name)_max"] = value.max
    }
    if !mockRuns.isEmpty {
        entry["mock_latency_method"] =
            "h2load -c 1 -m 1 --rps \(Int(mockProbeRate)), same body and headers; per-request time from its --log-file"
        entry["mock_rate"] = spread(mockRuns, "rate").median
        for (name, value) in zip(names, mockPercentiles) {
            entry["mock_latency_ms_" + name] = value.median
            entry["mock_latency_ms_\(name)_min"] = value.min
            entry["mock_latency_ms_\(name)_max"] = value.max
        }
    }
    bench.record(entry)
}

/// The share of the measured maximum that load runs at when no --rate is given.
let loadShareOfMaximum = 0.4
/// The rate of h2load's requests, one at a time, that measure the mock's own service time.
let mockProbeRate = 1_000.0

/// This machine's maximum for load's shape: one job to a tokens file at full speed, 1 loop, 1
/// connection, 1000 streams, against the same mock; --runs runs. Short (100,000 tokens, 10,000 with
/// --quick): it sets a rate, it is not the throughput figure (that is throughput-1c's).
func measureMaximumRate(_ bench: BenchContext) throws -> Spread {
    let tokens = bench.quick ? 10_000 : 100_000
    let tokensFile = try bench.tokensFile(count: tokens)
    var rates: [Double] = []
    for _ in 0..<bench.runs {
        let run = try bench.measureChild(
            ChildOptions(tokens: tokens, tokensFile: tokensFile, loops: 1, connections: 1, streams: 1000))
        rates.append(number(run["rate"]))
    }
    return Spread(rates)
}

/// The mock's own service time: h2load (C on nghttp2, and it does nothing but send) sends
/// `rate × duration` requests at `--rps rate`, one at a time over 1 connection, with the same body and
/// headers as Fanout. Each request's time is read from h2load's `--log-file` (from when h2load
/// started the request to the end of its response; 200s only), so it is the mock plus loopback TLS
/// plus the leanest client there is. Returns the percentiles in milliseconds and the achieved rate.
func measureMockLatency(h2load: String, bench: BenchContext, rate: Double, duration: Double) throws
    -> [String: Any]
{
    let requests = max(1, Int(rate * duration))
    let logFile = "\(bench.work)/h2load-latency-\(UUID().uuidString.prefix(8)).tsv"
    let child = try ChildProcess.start(
        h2load,
        [
            "-n", String(requests), "-c", "1", "-m", "1", "--rps", String(max(1, Int(rate.rounded()))),
            "--log-file", logFile,
        ] + h2loadRequestArguments(work: bench.work, mock: bench.mock, payloadBytes: 1024), in: bench.work)
    child.wait(seconds: duration + 600)
    defer { try? FileManager.default.removeItem(atPath: logFile) }
    guard let text = try? String(contentsOfFile: logFile, encoding: .utf8) else {
        throw BenchError("h2load wrote no log: \(child.output.suffix(500)) \(child.errorOutput.suffix(500))")
    }
    var latencies: [Double] = []
    var first = UInt64.max
    var last: UInt64 = 0
    for row in text.split(separator: "\n") {
        let columns = row.split(separator: "\t")
        guard columns.count >= 3, columns[1] == "200", let started = UInt64(columns[0]),
            let micros = UInt64(columns[2])
        else { continue }
        latencies.append(Double(micros) / 1000)
        first = min(first, started)
        last = max(last, started + micros)
    }
    // As in measureH2load: the streams h2load opens before the mock's first SETTINGS may be refused.
    guard latencies.count >= requests - 100 else {
        throw BenchError("h2load: \(latencies.count) of \(requests) requests succeeded: \(child.output.suffix(500))")
    }
    latencies.sort()
    return [
        "rate": Double(latencies.count) / max(Double(last &- first) / 1e6, 1e-9),
        "latency_ms_p50": nearestRank(latencies, 50), "latency_ms_p90": nearestRank(latencies, 90),
        "latency_ms_p99": nearestRank(latencies, 99), "latency_ms_p999": nearestRank(latencies, 99.9),
        "latency_ms_max": latencies.last ?? 0,
    ]
}
