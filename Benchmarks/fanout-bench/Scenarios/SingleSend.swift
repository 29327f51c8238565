import Foundation

/// single-send: `engine.send` of one notification each, as a gateway calls it per request: 2,000 a
/// second (`--send-rate`) for 5 seconds (0.5 s with --quick), each from a task of its own, due on a fixed schedule
/// whatever the earlier sends are doing. 1 loop, 1 connection, 1000 streams and the 1 KiB payload of
/// throughput-1c. Reports the achieved rate, each send's latency from its due time, and the child's
/// CPU microseconds per notification beside throughput-1c's in this run (the goal: at most 2×).
///
/// The child's CPU is the whole process's, so it includes the scheduler thread, which stands for the
/// gateway: it sleeps until each send is due and starts a `Task` for it (the wake-up of a cooperative
/// thread that this costs is paid there too). A gateway pays that for its own requests whatever it
/// calls, so the scheduler thread's share is reported apart, and the ratio is given both with it and
/// without it (Fanout's own share: `engine.send` from the task's start to its return, the loop thread,
/// and the wake-ups between them).
///
/// Each run is alternated with one whose tasks start with `engine.sendExecutor()` as their preference, so they run on
/// the loop thread and their sends cross no thread; both are reported.
func runSingleSend(_ bench: BenchContext) throws {
    let rate = bench.options.sendRate ?? 2_000
    let duration = bench.quick ? 0.5 : 5
    var runs: [[String: Any]] = []
    var onLoopRuns: [[String: Any]] = []
    for _ in 0..<bench.runs {
        var options = ChildOptions(
            mode: "single-send", loops: 1, connections: 1, streams: 1000, rate: rate, duration: duration)
        runs.append(try bench.measureChild(options, timeout: duration + 600))
        options.onLoop = true
        onLoopRuns.append(try bench.measureChild(options, timeout: duration + 600))
    }
    // The floor for a request sent alone: h2load, one request at a time on one connection at the same rate.
    var h2loadRuns: [Double] = []
    if let h2load = bench.h2load {
        for _ in 0..<bench.runs {
            h2loadRuns.append(
                try measureIsolatedRequestCPU(h2load: h2load, bench: bench, rate: rate, requests: Int(rate * duration)))
        }
    }
    let achieved = spread(runs, "rate")
    let names = ["p50", "p90", "p99", "p999", "max"]
    let percentiles = names.map { spread(runs, "latency_ms_" + $0) }
    let cpuPer = spread(runs, "cpu_us_per_notification")
    let schedulerPer = spread(runs, "scheduler_cpu_us_per_notification")
    let notifications = Int(spread(runs, "notifications").median)
    let enginePer = spread(runs, "engine_cpu_us_per_notification")
    let ratio = bench.throughput1cCPUPerNotification.map { cpuPer.median / $0 }
    let engineRatio = bench.throughput1cCPUPerNotification.map { enginePer.median / $0 }
    let ratioText =
        ratio.map {
            String(
                format: "%.1fx throughput-1c's %.2f us (goal <= 2x); without the scheduler thread %.1f us, %.1fx",
                $0, bench.throughput1cCPUPerNotification ?? 0, enginePer.median, engineRatio ?? 0)
        }
        ?? String(
            format: "without the scheduler thread %.1f us; throughput-1c not run (run it too for the ratio)",
            enginePer.median)
    let h2loadPer = h2loadRuns.isEmpty ? nil : Spread(h2loadRuns)
    // Calls past `maxPendingSends` (16,384 under way by default) are refused at once: only at rates the engine
    // cannot take.
    let refused = spread(runs, "refused")
    let refusedText =
        refused.max > 0
        ? String(
            format: "; refused as overloaded (maxPendingSends) %.0f [%.0f-%.0f] of %d", refused.median, refused.min,
            refused.max, Int(spread(runs, "notifications").median)) : ""
    // What a request sent alone costs the machine whoever sends it: h2load's lone request as a multiple of
    // throughput-1c's CPU per notification, the floor under the 2x goal (its wake-ups and system calls are the
    // kernel's and hypervisor's, not the client's).
    let floorRatio = h2loadPer.flatMap { per in bench.throughput1cCPUPerNotification.map { per.median / $0 } }
    let h2loadText =
        h2loadPer.map {
            String(
                format:
                    "; h2load one request at a time at the same rate: %.1f CPU us/request [%.1f-%.1f]%@, Fanout %.1fx",
                $0.median, $0.min, $0.max, floorRatio.map { String(format: " (%.1fx throughput-1c's)", $0) } ?? "",
                cpuPer.median / $0.median)
        } ?? ""
    print(
        String(
            format:
                "single-send: %.0f sends/s for %.1f s from a task each: achieved %.0f/s [%.0f-%.0f], latency from "
                + "intended send time (ms) p50 %.2f, p99 %.2f, p99.9 %.2f, max %.2f; %.1f CPU us/notification "
                + "[%.1f-%.1f] (scheduler thread %.1f), %@",
            rate, duration, achieved.median, achieved.min, achieved.max, percentiles[0].median,
            percentiles[2].median, percentiles[3].median, percentiles[4].median, cpuPer.median, cpuPer.min,
            cpuPer.max, schedulerPer.median, ratioText) + h2loadText + refusedText)
    let onLoopPer = spread(onLoopRuns, "cpu_us_per_notification")
    let onLoopEnginePer = spread(onLoopRuns, "engine_cpu_us_per_notification")
    let onLoopPercentiles = names.map { spread(onLoopRuns, "latency_ms_" + $0) }
    let onLoopRatio = bench.throughput1cCPUPerNotification.map { onLoopEnginePer.median / $0 }
    print(
        String(
            format:
                "single-send on the loop (tasks with engine.sendExecutor() as their preference): achieved %.0f/s, "
                + "latency (ms) p50 %.2f, p99 %.2f, p99.9 %.2f; %.1f CPU us/notification [%.1f-%.1f], without the "
                + "scheduler thread %.1f us [%.1f-%.1f]%@%@",
            spread(onLoopRuns, "rate").median, onLoopPercentiles[0].median, onLoopPercentiles[2].median,
            onLoopPercentiles[3].median, onLoopPer.median, onLoopPer.min, onLoopPer.max, onLoopEnginePer.median,
            onLoopEnginePer.min, onLoopEnginePer.max,
            onLoopRatio.map { String(format: ", %.1fx throughput-1c's", $0) } ?? "",
            h2loadPer.map { String(format: ", %.1fx h2load's lone request", onLoopPer.median / $0.median) } ?? ""))
    var entry: [String: Any] = [
        "scenario": "single-send", "target_rate": rate, "duration": duration, "notifications": notifications,
        "delivered": Int(spread(runs, "delivered").median), "refused": Int(refused.median), "rate": achieved.median,
        "rate_min": achieved.min,
        "rate_max": achieved.max, "shortfall_percent": spread(runs, "shortfall_percent").median,
        "seconds": spread(runs, "seconds").median, "cpu_seconds": spread(runs, "cpu_seconds").median,
        "cpu_us_per_notification": cpuPer.median, "cpu_us_per_notification_min": cpuPer.min,
        "cpu_us_per_notification_max": cpuPer.max, "scheduler_cpu_us_per_notification": schedulerPer.median,
        "engine_cpu_us_per_notification": enginePer.median, "engine_cpu_us_per_notification_min": enginePer.min,
        "engine_cpu_us_per_notification_max": enginePer.max,
        "peak_rss_mb": spread(runs, "peak_rss_mb").median,
        "generator_max_lag_ms": spread(runs, "generator_max_lag_ms").median,
        "key_figure": String(
            format: "ms p50 %.2f p99 %.2f; %.1f CPU us/notification, %@", percentiles[0].median,
            percentiles[2].median, cpuPer.median, ratio.map { String(format: "%.1fx throughput-1c", $0) } ?? "no ratio"),
    ]
    // The on-loop runs' figures under the plain runs' names, prefixed.
    for key in [
        "rate", "cpu_us_per_notification", "engine_cpu_us_per_notification", "latency_ms_p50", "latency_ms_p99",
        "latency_ms_p999",
    ] {
        let figure = spread(onLoopRuns, key)
        entry["on_loop_" + key] = figure.median
        entry["on_loop_\(key)_min"] = figure.min
        entry["on_loop_\(key)_max"] = figure.max
    }
    if let onLoopRatio { entry["on_loop_engine_cpu_ratio_vs_throughput_1c"] = onLoopRatio }
    if let h2loadPer {
        // The goal's figure: a plain send's CPU (the whole process's, as h2load's is) over h2load's lone request.
        entry["ratio_vs_h2load_single"] = cpuPer.median / h2loadPer.median
        entry["on_loop_ratio_vs_h2load_single"] = onLoopPer.median / h2loadPer.median
        entry["on_loop_cpu_ratio_vs_h2load_isolated"] = onLoopPer.median / h2loadPer.median
        entry["h2load_isolated_cpu_us_per_request"] = h2loadPer.median
        entry["h2load_isolated_cpu_us_per_request_min"] = h2loadPer.min
        entry["h2load_isolated_cpu_us_per_request_max"] = h2loadPer.max
        if let floorRatio { entry["h2load_isolated_ratio_vs_throughput_1c"] = floorRatio }
    }
    if let ratio {
        entry["throughput_1c_cpu_us_per_notification"] = bench.throughput1cCPUPerNotification
        entry["cpu_ratio_vs_throughput_1c"] = ratio
        entry["engine_cpu_ratio_vs_throughput_1c"] = engineRatio
    }
    for (name, value) in zip(names, percentiles) {
        entry["latency_ms_" + name] = value.median
        entry["latency_ms_\(name)_min"] = value.min
        entry["latency_ms_\(name)_max"] = value.max
    }
    bench.record(entry)
}

/// CPU microseconds per request of h2load sending `requests` one at a time over one connection at `--rps rate`, with
/// Fanout's body and headers: what a request sent alone costs the leanest client (C on nghttp2, one thread, no
/// hand-off between threads): a TLS record, a write, a read and an epoll wait each, which a fan-out shares among
/// many streams and a lone send cannot. Measured as this process's children's CPU (h2load is the only child that
/// ends meanwhile; the mock keeps running).
func measureIsolatedRequestCPU(h2load: String, bench: BenchContext, rate: Double, requests: Int) throws -> Double {
    func childrenCPU() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_CHILDREN.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6 + Double(usage.ru_stime.tv_sec)
            + Double(usage.ru_stime.tv_usec) / 1e6
    }
    let before = childrenCPU()
    let child = try ChildProcess.start(
        h2load,
        ["-n", String(requests), "-c", "1", "-m", "1", "--rps", String(Int(rate.rounded()))]
            + h2loadRequestArguments(work: bench.work, mock: bench.mock, payloadBytes: 1024), in: bench.work)
    let status = child.wait(seconds: Double(requests) / rate + 600)
    guard status == 0, child.output.contains("\(requests) succeeded") else {
        throw BenchError("h2load (one at a time) failed (exit \(status)): \(child.output.suffix(500))")
    }
    return (childrenCPU() - before) / Double(requests) * 1e6
}
