import FanoutPolicy

/// One stream of offered requests: `perHour` requests of `priority`, evenly spaced.
struct OfferedLoad {
    var workspace = "default"
    var priority: Int
    var perHour: Int
    var cost = 1

    var intervalNanoseconds: UInt64 { hour / UInt64(perHour) }
}

let second: UInt64 = 1_000_000_000
let hour: UInt64 = 3_600 * second

/// Admissions of a simulation, by the priority a request was admitted at (differs from the offered one when demoted).
struct Admissions {
    var byPriority: [Int: Int] = [:]
    var total: Int { byPriority.values.reduce(0, +) }
    subscript(priority: Int) -> Int { byPriority[priority, default: 0] }
}

/// Offers `loads` to a limiter from `start` for `duration` nanoseconds of simulated time, in time order (loads due at
/// the same instant go in the order given), and calls `decide` for each request.
func simulate(
    _ loads: [OfferedLoad], from start: UInt64 = second, for duration: UInt64 = hour,
    decide: (OfferedLoad, UInt64) -> RateDecision
) -> Admissions {
    var next = loads.map { _ in start }
    var admissions = Admissions()
    let end = start + duration
    while true {
        var earliest = -1
        for index in loads.indices where next[index] < end && (earliest < 0 || next[index] < next[earliest]) {
            earliest = index
        }
        if earliest < 0 { break }
        let load = loads[earliest]
        if case .admit(let priority) = decide(load, next[earliest]) {
            admissions.byPriority[priority, default: 0] += load.cost
        }
        next[earliest] += load.intervalNanoseconds
    }
    return admissions
}

/// `simulate` against one limiter.
func simulate(
    _ limiter: WorkspaceRateLimiter, _ loads: [OfferedLoad], from start: UInt64 = second, for duration: UInt64 = hour
) -> Admissions {
    simulate(loads, from: start, for: duration) { load, now in
        limiter.decide(priority: load.priority, cost: load.cost, now: now)
    }
}

/// What the model says an hour of saturation admits: `perHour` plus the burst (`burstSeconds` of `perHour`).
func hourWithBurst(_ perHour: Int, burstSeconds: Int = 60) -> Double {
    Double(perHour) * (1 + Double(burstSeconds) / 3_600)
}
