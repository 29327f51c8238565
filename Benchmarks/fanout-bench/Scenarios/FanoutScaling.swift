import Foundation

/// fanout-scaling: one job to 10,000, 100,000 and 1,000,000 tokens from a tokens file; rate, CPU
/// per notification and peak RSS at each size, and their growth from the smallest to the largest.
func runFanoutScaling(_ bench: BenchContext) throws {
    let sizes = bench.quick ? [1_000, 10_000] : [10_000, 100_000, 1_000_000]
    var rows: [[String: Any]] = []
    for size in sizes {
        let file = try bench.tokensFile(count: size)
        var runs: [[String: Any]] = []
        for _ in 0..<bench.runs {
            var run = try bench.measureChild(
                ChildOptions(tokens: size, tokensFile: file, loops: 1, connections: 2, streams: 1000))
            run["cpu_us_per_notification"] = number(run["cpu_seconds"]) / Double(size) * 1e6
            runs.append(run)
        }
        try? FileManager.default.removeItem(atPath: file)
        let rates = spread(runs, "rate")
        let cpuPer = spread(runs, "cpu_us_per_notification")
        let rss = spread(runs, "peak_rss_mb")
        print(
            String(
                format: "fanout-scaling %d tokens: %.0f notifications/s, %.2f CPU us/notification, %.1f MB peak RSS",
                size, rates.median, cpuPer.median, rss.median))
        rows.append([
            "tokens": size, "rate": rates.median, "cpu_us_per_notification": cpuPer.median,
            "peak_rss_mb": rss.median, "cpu_seconds": spread(runs, "cpu_seconds").median,
            "seconds": spread(runs, "seconds").median,
        ])
    }
    let first = rows.first!
    let last = rows.last!
    let rssGrowth = number(last["peak_rss_mb"]) / number(first["peak_rss_mb"])
    let cpuGrowth = number(last["cpu_us_per_notification"]) / number(first["cpu_us_per_notification"])
    print(
        String(
            format: "fanout-scaling growth %d -> %d tokens: peak RSS x%.2f, CPU per notification x%.2f",
            sizes.first!, sizes.last!, rssGrowth, cpuGrowth))
    bench.record([
        "scenario": "fanout-scaling", "sizes": rows, "rss_growth": rssGrowth, "cpu_per_notification_growth": cpuGrowth,
        "notifications": sizes.reduce(0, +), "rate": number(last["rate"]), "peak_rss_mb": number(last["peak_rss_mb"]),
        "seconds": number(last["seconds"]), "cpu_seconds": number(last["cpu_seconds"]),
        "key_figure": String(
            format: "%d->%d tokens: RSS x%.2f, CPU/notification x%.2f (%.2f us)", sizes.first!, sizes.last!, rssGrowth,
            cpuGrowth, number(last["cpu_us_per_notification"])),
    ])
}
