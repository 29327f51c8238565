extension WorkspaceRateLimiter {
    /// Decisions per second on the calling thread: one workspace with the default budget (`reject` policy), no
    /// contention, priorities 10, 5 and 1 in turn, and a simulated clock advancing 1 µs per decision. That offers
    /// thousands of times the budget, so nearly every decision is a refusal with its retry time computed, the more
    /// expensive path. For `fanout-bench`; the goal is at least 10 million. No decision (`count` 0 or less) is a
    /// rate of 0.
    ///
    /// `package`: a measurement of this package's own, not API for a gateway (it was public to every `import Fanout`).
    package static func benchmarkDecisions(count: Int) -> Double {
        guard count > 0 else { return 0 }
        let limiter = WorkspaceRateLimiter(budget: .default)
        var now: UInt64 = 1_000_000_000
        var admitted = 0
        let clock = ContinuousClock()
        let start = clock.now
        for step in 0..<count {
            let priority = RateBuckets.priority(atIndex: step % 3)
            if limiter.decide(priority: priority, now: now).isAdmitted { admitted += 1 }
            now += 1_000
        }
        let elapsed = (clock.now - start).components
        let seconds = Double(elapsed.seconds) + Double(elapsed.attoseconds) * 1e-18
        // `admitted` keeps the loop's results observable; it is always at most `count`.
        precondition(admitted <= count)
        return Double(count) / max(seconds, 1e-9)
    }
}
