import FanoutPolicy
import Foundation

/// ratelimit: workspace rate-limiter decisions per second on one core (a saturated workspace).
func runRateLimit(_ bench: BenchContext) {
    let count = bench.quick ? 1_000_000 : 30_000_000
    let rates = Spread((0..<bench.runs).map { _ in rateLimitDecisionsPerSecond(count: count) })
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

/// Decisions per second on the calling thread: one workspace with the default budget (`reject` policy), no
/// contention, priorities 10, 5 and 1 in turn, and a simulated clock advancing 1 µs per decision. That offers
/// thousands of times the budget, so nearly every decision is a refusal with its retry time computed, the more
/// expensive path. The goal is at least 10 million.
func rateLimitDecisionsPerSecond(count: Int) -> Double {
    guard count > 0 else { return 0 }
    let limiter = WorkspaceRateLimiter(budget: .default)
    let priorities = [10, 5, 1]
    var now: UInt64 = 1_000_000_000
    var admitted = 0
    let clock = ContinuousClock()
    let start = clock.now
    for step in 0..<count {
        if limiter.decide(priority: priorities[step % 3], now: now).isAdmitted { admitted += 1 }
        now += 1_000
    }
    let elapsed = (clock.now - start).components
    let seconds = Double(elapsed.seconds) + Double(elapsed.attoseconds) * 1e-18
    // `admitted` keeps the loop's results observable; it is always at most `count`.
    precondition(admitted <= count)
    return Double(count) / max(seconds, 1e-9)
}
