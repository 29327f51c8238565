import Foundation

/// load: open-loop load at a fixed rate (--rate, default half of this run's throughput-1c rate,
/// else 20,000/s) for --duration seconds (default 10, 2 with --quick), 1 loop and 1 connection as
/// in throughput-1c. Latency runs from each notification's intended send time to its answer.
func runLoad(_ bench: BenchContext) throws {
    let rate = bench.options.loadRate ?? bench.throughput1cRate.map { ($0 / 2).rounded() } ?? 20_000
    let rateSource =
        bench.options.loadRate != nil ? "--rate" : bench.throughput1cRate != nil ? "half of throughput-1c" : "default"
    let duration = bench.options.loadDuration ?? (bench.quick ? 2 : 10)
    var runs: [[String: Any]] = []
    for _ in 0..<bench.runs {
        runs.append(
            try bench.measureChild(
                ChildOptions(
                    mode: "load", loops: 1, connections: 1, streams: 1000, rate: rate, duration: duration,
                    allowFailures: true),
                timeout: duration + 600))
    }
    let achieved = spread(runs, "rate")
    let percentiles = ["p50", "p90", "p99", "p999", "max"].map { spread(runs, "latency_ms_" + $0) }
    let shortfall = spread(runs, "shortfall_percent")
    let delivered = Int(spread(runs, "delivered").median)
    let notifications = Int(spread(runs, "notifications").median)
    let latencyText = zip(["p50", "p90", "p99", "p99.9", "max"], percentiles).map { name, value in
        String(format: "%@ %.2f", name, value.median)
    }.joined(separator: ", ")
    print(
        String(
            format:
                "load: target %.0f/s (%@) for %.0f s, 1 connection: achieved %.0f/s [%.0f-%.0f] (shortfall %.1f%%), "
                + "latency from intended send time (ms) %@; %d of %d delivered; generator lag max %.2f ms",
            rate, rateSource, duration, achieved.median, achieved.min, achieved.max, shortfall.median, latencyText,
            delivered, notifications, spread(runs, "generator_max_lag_ms").median))
    var entry: [String: Any] = [
        "scenario": "load", "target_rate": rate, "target_rate_source": rateSource, "duration": duration,
        "notifications": notifications, "delivered": delivered, "rate": achieved.median, "rate_min": achieved.min,
        "rate_max": achieved.max, "shortfall_percent": shortfall.median, "seconds": spread(runs, "seconds").median,
        "cpu_seconds": spread(runs, "cpu_seconds").median, "peak_rss_mb": spread(runs, "peak_rss_mb").median,
        "generator_max_lag_ms": spread(runs, "generator_max_lag_ms").median,
        "key_figure": String(
            format: "target %.0f/s, shortfall %.1f%%, ms p50 %.2f p99 %.2f p99.9 %.2f max %.2f", rate,
            shortfall.median, percentiles[0].median, percentiles[2].median, percentiles[3].median,
            percentiles[4].median),
    ]
    for (name, value) in zip(["p50", "p90", "p99", "p999", "max"], percentiles) {
        entry["latency_ms_" + name] = value.median
        entry["latency_ms_\(name)_min"] = value.min
        entry["latency_ms_\(name)_max"] = value.max
    }
    bench.record(entry)
}
