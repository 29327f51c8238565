import FanoutCore

/// One workspace's rate limiter: hierarchical token buckets with per-priority guarantees and ceilings.
///
/// ## The model
///
/// R is the workspace's `requestsPerHour`, b its `burstSeconds`; for each priority p (10, 5, 1), g_p is its
/// `guaranteedPerHour` and c_p its `ceilingPerHour`, with Σ g_p ≤ R and g_p ≤ c_p ≤ R. Seven token buckets, each
/// refilled continuously at its rate and holding at most b seconds of it:
///
/// - W, the workspace bucket: rate R. Every admitted request takes its cost from W.
/// - G_p, priority p's reservation: rate g_p. Its tokens are a reserved part of W's (W ≥ Σ G_p always holds), so
///   they are not extra capacity, only a claim on W that other priorities cannot touch.
/// - C_p, priority p's ceiling: rate c_p. Every request admitted at p takes its cost from C_p.
///
/// A request of cost k at priority p is admitted when C_p ≥ k and W − Σ_{q≠p} G_q ≥ k: it fits under p's ceiling and
/// in the workspace tokens that are not reserved for another priority. It then takes k from C_p and from W, and as
/// much as it can (up to k) from G_p: its own reservation first, the rest borrowed from the shared part of W,
/// W − Σ G. The shared part grows at R − Σ g plus whatever a full (idle) reservation cannot hold, which is how unused
/// guaranteed capacity becomes borrowable.
///
/// What follows, for any window of T seconds:
/// - The workspace admits at most R·T + R·b (W), whatever the priorities do.
/// - Priority p admits at most c_p·T + c_p·b (C_p): priority 10 cannot pass its ceiling.
/// - A priority that keeps asking gets at least g_p·T, however hard the others push: G_p's tokens are backed by W and
///   no other priority may take them, so bulk priority-5 traffic cannot starve priority 10.
/// - A priority can borrow idle capacity up to its ceiling: with the others idle, it gets min(R, c_p)·T.
/// - Workspaces share nothing: each has its own limiter and lock.
///
/// `demote` (priority 10 only): when a request does not fit at priority 10, it is admitted at priority 5 if it fits in
/// what priority 5 could borrow: C_5 − G_5 ≥ k and W − Σ G ≥ k. It takes k from C_5 and W but nothing from G_5, so
/// demoted updates use idle capacity under priority 5's ceiling and never priority 5's own reservation: a flood of
/// demoted updates cannot starve priority 5's traffic either.
///
/// A single priority's burst is smaller than the workspace's: at most its ceiling's burst, and at most W's burst less
/// the other priorities' reservations (`maximumCost(priority:)`), because those reservations are always kept.
///
/// ## Cost and time
///
/// Levels are exact integers (see `RateBuckets`): one request is 3.6 × 10⁹ units, time counts in microseconds, and a
/// refill is a multiplication, so an hour of decisions admits exactly what the rates say. Time is passed in as `now`
/// (nanoseconds from any fixed origin, such as `MonotonicRateClock`), which is how tests run a simulated hour in
/// milliseconds.
///
/// ## Concurrency
///
/// Thread-safe. Each limiter has its own lock (`FanoutMutex`), held for one refill and one comparison (tens of
/// nanoseconds), so workspaces never contend with each other; there is no global lock. `RateLimiterRegistry` finds a
/// workspace's limiter without taking any lock.
public final class WorkspaceRateLimiter: Sendable {
    /// The budget this limiter enforces.
    public let budget: RateBudget
    private let config: RateBuckets.Config
    private let buckets: FanoutMutex<RateBuckets>

    /// A limiter whose buckets start full. `budget` must be valid (`RateBudget.validate()`).
    public init(budget: RateBudget = .default) {
        do {
            try budget.validate()
        } catch {
            preconditionFailure("invalid rate budget: \(error)")
        }
        self.budget = budget
        let config = RateBuckets.Config(budget)
        self.config = config
        buckets = FanoutMutex(RateBuckets(config))
    }

    /// The largest cost a request at `priority` can ever be admitted with: the burst of its ceiling bucket, or of the
    /// workspace bucket less the other priorities' reservations, whichever is smaller. Split larger jobs (counted in
    /// notifications) into chunks of at most this cost.
    public func maximumCost(priority: Int) -> Int {
        config.maximumCost(priority: priority)
    }

    /// Decides one request and, when it is admitted, takes its tokens.
    ///
    /// - Parameters:
    ///   - priority: the APNs priority, 10, 5 or 1.
    ///   - cost: what the request counts for (`RateCountingUnit.cost(ofJobWith:)`): 0 is always admitted, and more
    ///     than `maximumCost(priority:)` is a programming error, because it could never be admitted.
    ///   - now: the time in nanoseconds, on the same clock for every call to this limiter.
    /// - returns: `.admit` with the priority to send at, or the policy's answer with a time in `now`'s clock.
    public func decide(priority: Int, cost: Int = 1, now: UInt64) -> RateDecision {
        let index = RateBuckets.index(ofPriority: priority)
        let config = self.config
        precondition(
            cost >= 0 && cost <= config.maximumCost[index],
            "cost \(cost) is outside 0...\(config.maximumCost[index]) for priority \(priority)")
        let units = cost * RateBuckets.unitsPerRequest
        let nowMicros = Int(truncatingIfNeeded: now / 1000)
        return buckets.withLock { buckets -> RateDecision in
            buckets.refill(to: nowMicros, config)
            if buckets.canAdmit(index, units) {
                buckets.consume(index, units)
                assert(buckets.invariantsHold(config))
                return .admit(priority: priority)
            }
            var policy = config.policy(atIndex: index)
            if policy == .demote {
                if buckets.canAdmitDemoted(units) {
                    buckets.consumeDemoted(units)
                    assert(buckets.invariantsHold(config))
                    return .admit(priority: 5)
                }
                policy = config.policy(atIndex: RateBuckets.index(ofPriority: 5))
            }
            // For a demoting request too this is priority 10's own time: demotion room may come sooner, but only
            // priority 10's is sure to be there (see `RateBuckets.canAdmitDemoted`).
            let waitMicros = buckets.microsUntilAdmissible(index, units, config)
            // `lastMicros` ≥ now / 1000 and `waitMicros` ≥ 1, so `until` is later than `now`.
            let until = UInt64(buckets.lastMicros + waitMicros) * 1000
            if policy == .wait { return .wait(untilNanoseconds: until) }
            return .reject(retryAfterNanoseconds: until - now)
        }
    }

    /// `decide(priority:cost:now:)` at the clock's current time.
    public func decide(priority: Int, cost: Int = 1, clock: some RateClock = MonotonicRateClock()) -> RateDecision {
        decide(priority: priority, cost: cost, now: clock.nanoseconds())
    }
}
