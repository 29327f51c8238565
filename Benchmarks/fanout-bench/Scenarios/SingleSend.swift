import Foundation

/// single-send: `engine.send` of one notification each, as a gateway calls it per request: 2,000 a
/// second for 5 seconds (0.5 s with --quick), each from a task of its own, due on a fixed schedule
/// whatever the earlier sends are doing. 1 loop, 1 connection, 1000 streams and the 1 KiB payload of
/// throughput-1c. Reports the achieved rate, each send's latency from its due time, and the child's
/// CPU microseconds per notification beside throughput-1c's in this run (issue 15's goal: at most 2×).
func runSingleSend(_ bench: BenchContext) throws {
    let rate = 2_000.0
    let duration = bench.quick ? 0.5 : 5
    var runs: [[String: Any]] = []
    for _ in 0..<bench.runs {
        runs.append(
            try bench.measureChild(
                ChildOptions(
                    mode: "single-send", loops: 1, connections: 1, streams: 1000, rate: rate, duration: duration),
                timeout: duration + 600))
    }
    let achieved = spread(runs, "rate")
    let names = ["p50", "p90", "p99", "p999", "max"]
    let percentiles = names.map { spread(runs, "latency_ms_" + $0) }
    let cpuPer = spread(runs, "cpu_us_per_notification")
    let schedulerPer = spread(runs, "scheduler_cpu_us_per_notification")
    let notifications = Int(spread(runs, "notifications").median)
    let ratio = bench.throughput1cCPUPerNotification.map { cpuPer.median / $0 }
    let ratioText =
        ratio.map {
            String(
                format: "%.1fx throughput-1c's %.2f us (goal <= 2x)", $0, bench.throughput1cCPUPerNotification ?? 0)
        } ?? "throughput-1c not run (run it too for the ratio)"
    print(
        String(
            format:
                "single-send: %.0f sends/s for %.1f s from a task each: achieved %.0f/s [%.0f-%.0f], latency from "
                + "intended send time (ms) p50 %.2f, p99 %.2f, p99.9 %.2f, max %.2f; %.1f CPU us/notification "
                + "[%.1f-%.1f] (scheduler thread %.1f), %@",
            rate, duration, achieved.median, achieved.min, achieved.max, percentiles[0].median,
            percentiles[2].median, percentiles[3].median, percentiles[4].median, cpuPer.median, cpuPer.min,
            cpuPer.max, schedulerPer.median, ratioText))
    var entry: [String: Any] = [
        "scenario": "single-send", "target_rate": rate, "duration": duration, "notifications": notifications,
        "delivered": Int(spread(runs, "delivered").median), "rate": achieved.median, "rate_min": achieved.min,
        "rate_max": achieved.max, "shortfall_percent": spread(runs, "shortfall_percent").median,
        "seconds": spread(runs, "seconds").median, "cpu_seconds": spread(runs, "cpu_seconds").median,
        "cpu_us_per_notification": cpuPer.median, "cpu_us_per_notification_min": cpuPer.min,
        "cpu_us_per_notification_max": cpuPer.max, "scheduler_cpu_us_per_notification": schedulerPer.median,
        "peak_rss_mb": spread(runs, "peak_rss_mb").median,
        "generator_max_lag_ms": spread(runs, "generator_max_lag_ms").median,
        "key_figure": String(
            format: "ms p50 %.2f p99 %.2f; %.1f CPU us/notification, %@", percentiles[0].median,
            percentiles[2].median, cpuPer.median, ratio.map { String(format: "%.1fx throughput-1c", $0) } ?? "no ratio"),
    ]
    if let ratio {
        entry["throughput_1c_cpu_us_per_notification"] = bench.throughput1cCPUPerNotification
        entry["cpu_ratio_vs_throughput_1c"] = ratio
    }
    for (name, value) in zip(names, percentiles) {
        entry["latency_ms_" + name] = value.median
        entry["latency_ms_\(name)_min"] = value.min
        entry["latency_ms_\(name)_max"] = value.max
    }
    bench.record(entry)
}
