/// Three values, one per APNs priority, indexed 0 (priority 10), 1 (priority 5), 2 (priority 1).
///
/// A struct rather than an array so that the limiter's state is one inline value with no allocation and no
/// copy-on-write check on the hot path.
struct PriorityTriple: Hashable, Sendable {
    var p10: Int
    var p5: Int
    var p1: Int

    init(_ p10: Int, _ p5: Int, _ p1: Int) {
        self.p10 = p10
        self.p5 = p5
        self.p1 = p1
    }

    subscript(index: Int) -> Int {
        get {
            switch index {
            case 0: return p10
            case 1: return p5
            default: return p1
            }
        }
        set {
            switch index {
            case 0: p10 = newValue
            case 1: p5 = newValue
            default: p1 = newValue
            }
        }
    }

    var sum: Int { p10 + p5 + p1 }
}

/// The token levels of one workspace and the arithmetic on them (the model is described on `WorkspaceRateLimiter`).
///
/// Fixed point, exact: time is counted in whole microseconds and one request is `unitsPerRequest` units, the number of
/// microseconds in an hour, so a rate of r requests per hour adds exactly r units per microsecond. Refills are
/// `rate × elapsed` with no division and no rounding, so nothing drifts however the decisions are spaced.
struct RateBuckets: Sendable {
    static let microsPerSecond = 1_000_000
    static let unitsPerRequest = 3_600 * microsPerSecond

    /// The index of an APNs priority in a `PriorityTriple`.
    @inline(__always)
    static func index(ofPriority priority: Int) -> Int {
        switch priority {
        case 10: return 0
        case 5: return 1
        case 1: return 2
        default: preconditionFailure("APNs priorities are 10, 5 and 1, not \(priority)")
        }
    }

    /// A budget turned into rates (units per microsecond) and capacities (units).
    struct Config: Sendable {
        let workspaceRate: Int
        let workspaceCapacity: Int
        let guaranteedRate: PriorityTriple
        let guaranteedCapacity: PriorityTriple
        let ceilingRate: PriorityTriple
        let ceilingCapacity: PriorityTriple
        let burstMicros: Int
        /// The largest cost each priority can ever be admitted with, in requests.
        let maximumCost: PriorityTriple
        let policies: (RateLimitPolicy, RateLimitPolicy, RateLimitPolicy)

        /// Expects a budget whose products fit (`RateBudget.validate` checks them before calling this).
        init(_ budget: RateBudget) {
            let burstMicros = budget.burstSeconds * RateBuckets.microsPerSecond
            self.burstMicros = burstMicros
            workspaceRate = budget.requestsPerHour
            workspaceCapacity = budget.requestsPerHour * burstMicros
            guaranteedRate = PriorityTriple(
                budget.priority10.guaranteedPerHour, budget.priority5.guaranteedPerHour,
                budget.priority1.guaranteedPerHour)
            ceilingRate = PriorityTriple(
                budget.priority10.ceilingPerHour, budget.priority5.ceilingPerHour, budget.priority1.ceilingPerHour)
            guaranteedCapacity = PriorityTriple(
                guaranteedRate.p10 * burstMicros, guaranteedRate.p5 * burstMicros, guaranteedRate.p1 * burstMicros)
            ceilingCapacity = PriorityTriple(
                ceilingRate.p10 * burstMicros, ceilingRate.p5 * burstMicros, ceilingRate.p1 * burstMicros)
            // A request fits when its ceiling bucket and the workspace bucket minus the other priorities' full
            // reservations can both hold it.
            var maximumCost = PriorityTriple(0, 0, 0)
            for index in 0..<3 {
                let othersReserved = guaranteedCapacity.sum - guaranteedCapacity[index]
                let units = min(ceilingCapacity[index], workspaceCapacity - othersReserved)
                maximumCost[index] = max(0, units / RateBuckets.unitsPerRequest)
            }
            self.maximumCost = maximumCost
            policies = (budget.priority10.policy, budget.priority5.policy, budget.priority1.policy)
        }

        func maximumCost(priority: Int) -> Int { maximumCost[RateBuckets.index(ofPriority: priority)] }

        @inline(__always)
        func policy(atIndex index: Int) -> RateLimitPolicy {
            switch index {
            case 0: return policies.0
            case 1: return policies.1
            default: return policies.2
            }
        }
    }

    /// The workspace bucket W.
    var workspace: Int
    /// The guarantee buckets G_p (tokens reserved inside W for each priority).
    var guaranteed: PriorityTriple
    /// The ceiling buckets C_p.
    var ceiling: PriorityTriple
    /// The time the levels were computed for. Starts at 0, so the first decision finds every bucket full.
    var lastMicros = 0

    /// Every bucket full.
    init(_ config: Config) {
        workspace = config.workspaceCapacity
        guaranteed = config.guaranteedCapacity
        ceiling = config.ceilingCapacity
    }

    /// Brings the levels forward to `nowMicros`. A time earlier than the last one changes nothing (callers on several
    /// threads may read the clock in one order and take the lock in another).
    @inline(__always)
    mutating func refill(to nowMicros: Int, _ config: Config) {
        guard nowMicros > lastMicros else { return }
        // After `burstMicros` every bucket is full (capacity = rate × burstMicros), so longer gaps need not be
        // multiplied out, which also keeps every product below the capacity.
        let elapsed = min(nowMicros - lastMicros, config.burstMicros)
        lastMicros = nowMicros
        workspace = min(workspace + config.workspaceRate * elapsed, config.workspaceCapacity)
        guaranteed.p10 = min(guaranteed.p10 + config.guaranteedRate.p10 * elapsed, config.guaranteedCapacity.p10)
        guaranteed.p5 = min(guaranteed.p5 + config.guaranteedRate.p5 * elapsed, config.guaranteedCapacity.p5)
        guaranteed.p1 = min(guaranteed.p1 + config.guaranteedRate.p1 * elapsed, config.guaranteedCapacity.p1)
        ceiling.p10 = min(ceiling.p10 + config.ceilingRate.p10 * elapsed, config.ceilingCapacity.p10)
        ceiling.p5 = min(ceiling.p5 + config.ceilingRate.p5 * elapsed, config.ceilingCapacity.p5)
        ceiling.p1 = min(ceiling.p1 + config.ceilingRate.p1 * elapsed, config.ceilingCapacity.p1)
    }

    /// Whether `units` can be admitted at the priority with `index` now: its ceiling bucket holds them, and so does the
    /// workspace bucket once the other priorities' reservations are set aside. (The priority's own reservation counts
    /// as available to it: the guaranteed path is the case where the reservation alone covers the request.)
    @inline(__always)
    func canAdmit(_ index: Int, _ units: Int) -> Bool {
        ceiling[index] >= units && workspace - (guaranteed.sum - guaranteed[index]) >= units
    }

    /// Takes `units` at the priority with `index`: from its reservation first, the rest from the shared part of W.
    @inline(__always)
    mutating func consume(_ index: Int, _ units: Int) {
        ceiling[index] -= units
        workspace -= units
        guaranteed[index] -= min(guaranteed[index], units)
    }

    /// Whether a demoted priority-10 request of `units` fits in what priority 5 could borrow: its ceiling's headroom
    /// above its reservation, and the shared part of W. Neither may dip into priority 5's reservation, which keeps
    /// priority 5's guarantee (and the invariant C_5 ≥ G_5) intact however many updates are demoted.
    @inline(__always)
    func canAdmitDemoted(_ units: Int) -> Bool {
        ceiling.p5 - guaranteed.p5 >= units && workspace - guaranteed.sum >= units
    }

    /// Takes a demoted request's `units` from priority 5's ceiling and from W, leaving priority 5's reservation alone.
    @inline(__always)
    mutating func consumeDemoted(_ units: Int) {
        ceiling.p5 -= units
        workspace -= units
    }

    /// The model's invariants: every level within [0, capacity], W ≥ ΣG_p (every reservation is backed by real
    /// workspace tokens, which is what makes guarantees unconditional) and C_p ≥ G_p. Checked by `assert` after every
    /// admission in debug builds.
    func invariantsHold(_ config: Config) -> Bool {
        guard workspace >= guaranteed.sum, workspace <= config.workspaceCapacity else { return false }
        for index in 0..<3 {
            guard guaranteed[index] >= 0, ceiling[index] >= guaranteed[index],
                ceiling[index] <= config.ceilingCapacity[index],
                guaranteed[index] <= config.guaranteedCapacity[index]
            else { return false }
        }
        return true
    }

    /// The smallest number of microseconds after `lastMicros` at which `canAdmit(index, units)` holds if nothing is
    /// consumed meanwhile. `units` must be at most the priority's maximum cost; the answer is then at most
    /// `burstMicros`.
    ///
    /// Both conditions only ever turn from false to true as time passes, so the answer is the later of the two times.
    /// The ceiling bucket is linear until full. The workspace side, A(t) = W(t) − Σ_{q≠p} G_q(t), grows at
    /// R − Σ(rates of the other reservations that are not yet full) ≥ 0, a slope that steps up as each of the (at most
    /// two) other reservations fills; the walk below goes through those segments on integer microseconds, exactly.
    /// W's own cap is left out: once W is full, A ≥ W − Σ_{q≠p} cap(G_q) ≥ the maximum cost, so the crossing always
    /// comes before W caps.
    func microsUntilAdmissible(_ index: Int, _ units: Int, _ config: Config) -> Int {
        var wait = 0
        let ceilingLevel = ceiling[index]
        if ceilingLevel < units {
            wait = Self.divideRoundingUp(units - ceilingLevel, config.ceilingRate[index])
        }

        let first = index == 0 ? 1 : 0
        let second = index == 2 ? 1 : 2
        let level1 = guaranteed[first]
        let level2 = guaranteed[second]
        let rate1 = config.guaranteedRate[first]
        let rate2 = config.guaranteedRate[second]
        let cap1 = config.guaranteedCapacity[first]
        let cap2 = config.guaranteedCapacity[second]
        func available(at t: Int) -> Int {
            workspace + config.workspaceRate * t - min(level1 + rate1 * t, cap1) - min(level2 + rate2 * t, cap2)
        }
        guard available(at: 0) < units else { return wait }

        // The last microsecond at which each other reservation is still below its cap (−1: full already). Up to it
        // the reservation grows linearly; from the next one on it is constant.
        let last1 = level1 < cap1 ? (cap1 - level1) / rate1 : -1
        let last2 = level2 < cap2 ? (cap2 - level2) / rate2 : -1
        var start = 0
        for step in 0..<2 {
            let end = step == 0 ? min(last1, last2) : max(last1, last2)
            if end < start { continue }
            let slope = config.workspaceRate - (last1 >= end ? rate1 : 0) - (last2 >= end ? rate2 : 0)
            let atStart = available(at: start)
            if atStart >= units { return max(wait, start) }
            if slope > 0 && atStart + slope * (end - start) >= units {
                return max(wait, start + Self.divideRoundingUp(units - atStart, slope))
            }
            start = end + 1
        }
        let atStart = available(at: start)
        if atStart >= units { return max(wait, start) }
        return max(wait, start + Self.divideRoundingUp(units - atStart, config.workspaceRate))
    }

    @inline(__always)
    static func divideRoundingUp(_ numerator: Int, _ denominator: Int) -> Int {
        (numerator + denominator - 1) / denominator
    }
}
