import FanoutPolicy
import Foundation

/// ratelimit: workspace rate-limiter decisions per second on one core (a saturated workspace).
func runRateLimit(_ bench: BenchContext) {
    let count = bench.quick ? 1_000_000 : 30_000_000
    let rates = Spread((0..<bench.runs).map { _ in WorkspaceRateLimiter.benchmarkDecisions(count: count) })
    print(
        String(
            format: "ratelimit: %.1f million decisions/s [%.1f-%.1f] on one core (saturated workspace)",
            rates.median / 1e6, rates.min / 1e6, rates.max / 1e6))
    bench.record([
        "scenario": "ratelimit", "notifications": count, "rate": rates.median, "rate_min": rates.min,
        "rate_max": rates.max, "seconds": Double(count) / rates.median, "cpu_seconds": Double(count) / rates.median,
        "peak_rss_mb": processUsage().peakRSSMegabytes,
        "key_figure": String(format: "%.1f M decisions/s", rates.median / 1e6),
    ])
}
