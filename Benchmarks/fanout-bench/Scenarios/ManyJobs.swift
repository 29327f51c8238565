import Foundation

/// many-jobs: 100,000 jobs of 10 tokens, each with its own Live Activity payload (about 1 KiB),
/// 64 jobs in flight at a time. Each payload is encoded once: payload_encodings equals the jobs.
func runManyJobs(_ bench: BenchContext) throws {
    let jobs = bench.quick ? 2_000 : 100_000
    let perJob = 10
    var runs: [[String: Any]] = []
    for _ in 0..<bench.runs {
        runs.append(
            try bench.measureChild(
                ChildOptions(
                    mode: "many-jobs", tokens: perJob, loops: 1, connections: 1, streams: 1000, jobs: jobs,
                    inFlightJobs: 64)))
    }
    let rates = spread(runs, "rate")
    let cpuPer = spread(runs, "cpu_us_per_notification")
    let encodings = Int(spread(runs, "payload_encodings").median)
    let jobRate = spread(runs, "jobs_per_second").median
    let encodingsOK = runs.allSatisfy { Int(number($0["payload_encodings"])) == jobs }
    let ratio = bench.throughput1cCPUPerNotification.map { cpuPer.median / $0 }
    print(
        String(
            format:
                "many-jobs: %d jobs x %d tokens, 64 in flight: %.0f notifications/s [%.0f-%.0f] (%.0f jobs/s), "
                + "%.2f CPU us/notification%@, %.0f MB peak, payload encodings %d%@",
            jobs, perJob, rates.median, rates.min, rates.max, jobRate, cpuPer.median,
            ratio.map { String(format: " (%.1fx throughput-1c's, goal <= 2x)", $0) } ?? "",
            spread(runs, "peak_rss_mb").median, encodings, encodingsOK ? " (= jobs)" : " (NOT one per job)"))
    var entry: [String: Any] = [
        "scenario": "many-jobs", "jobs": jobs, "tokens_per_job": perJob, "jobs_in_flight": 64,
        "notifications": jobs * perJob, "rate": rates.median, "rate_min": rates.min, "rate_max": rates.max,
        "jobs_per_second": jobRate, "seconds": spread(runs, "seconds").median,
        "cpu_seconds": spread(runs, "cpu_seconds").median, "cpu_us_per_notification": cpuPer.median,
        "peak_rss_mb": spread(runs, "peak_rss_mb").median, "payload_encodings": encodings,
        "payload_encodings_equal_jobs": encodingsOK,
        "key_figure": String(
            format: "%.0f jobs/s, %.2f CPU us/notification%@, %d encodings", jobRate, cpuPer.median,
            ratio.map { String(format: " (%.1fx throughput-1c)", $0) } ?? "", encodings),
    ]
    if let ratio {
        entry["throughput_1c_cpu_us_per_notification"] = bench.throughput1cCPUPerNotification
        entry["cpu_ratio_vs_throughput_1c"] = ratio
    }
    bench.record(entry)
}
