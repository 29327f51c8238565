import FanoutPolicy

/// The limiter's model written out plainly, as a test oracle: dictionaries instead of fixed fields, and every rule
/// stated once, exactly as in `WorkspaceRateLimiter`'s documentation. Levels in units of 1 / 3.6e9 request; time in
/// microseconds.
struct ReferenceModel {
    static let unit = 3_600_000_000
    let budget: RateBudget
    var workspace: Int
    var guaranteed: [Int: Int] = [:]
    var ceiling: [Int: Int] = [:]
    var lastMicros = 0

    var burstMicros: Int { budget.burstSeconds * 1_000_000 }

    init(_ budget: RateBudget) {
        self.budget = budget
        workspace = budget.requestsPerHour * budget.burstSeconds * 1_000_000
        for priority in RateBudget.priorities {
            guaranteed[priority] = budget[priority: priority].guaranteedPerHour * budget.burstSeconds * 1_000_000
            ceiling[priority] = budget[priority: priority].ceilingPerHour * budget.burstSeconds * 1_000_000
        }
    }

    mutating func advance(to now: UInt64) {
        let nowMicros = Int(now / 1000)
        guard nowMicros > lastMicros else { return }
        let elapsed = nowMicros - lastMicros
        lastMicros = nowMicros
        func filled(_ level: Int, _ perHour: Int) -> Int {
            min(level + perHour * min(elapsed, burstMicros), perHour * burstMicros)
        }
        workspace = filled(workspace, budget.requestsPerHour)
        for priority in RateBudget.priorities {
            guaranteed[priority] = filled(guaranteed[priority]!, budget[priority: priority].guaranteedPerHour)
            ceiling[priority] = filled(ceiling[priority]!, budget[priority: priority].ceilingPerHour)
        }
    }

    var reservedTotal: Int { guaranteed.values.reduce(0, +) }

    /// C_p ≥ k and W − Σ_{q≠p} G_q ≥ k.
    func hasRoom(priority: Int, cost: Int) -> Bool {
        let units = cost * Self.unit
        return ceiling[priority]! >= units && workspace - (reservedTotal - guaranteed[priority]!) >= units
    }

    /// C_5 − G_5 ≥ k and W − Σ G ≥ k.
    func hasRoomToDemote(cost: Int) -> Bool {
        let units = cost * Self.unit
        return ceiling[5]! - guaranteed[5]! >= units && workspace - reservedTotal >= units
    }

    /// The priority the request is admitted at, or nil.
    mutating func decide(priority: Int, cost: Int = 1, now: UInt64) -> Int? {
        advance(to: now)
        let units = cost * Self.unit
        if hasRoom(priority: priority, cost: cost) {
            ceiling[priority]! -= units
            workspace -= units
            guaranteed[priority]! -= min(guaranteed[priority]!, units)
            return priority
        }
        if budget[priority: priority].policy == .demote && hasRoomToDemote(cost: cost) {
            ceiling[5]! -= units
            workspace -= units
            return 5
        }
        return nil
    }
}
