import FanoutPolicy
import XCTest

/// An hour of simulated time (an injected clock) under saturating load, against the default budget: 250,000 per hour,
/// burst 60 s; priority 10 guaranteed 50% / ceiling 80%, priority 5 40% / 100%, priority 1 10% / 100%.
final class SimulatedHourTests: XCTestCase {
    let budget = RateBudget.default
    /// Ten times the budget, the saturating offered load.
    let flood = 2_500_000

    func assertWithinPermille(
        _ actual: Int, _ expected: Double, _ message: String, file: StaticString = #filePath, line: UInt = #line
    ) {
        XCTAssertLessThanOrEqual(
            abs(Double(actual) - expected), expected * 0.001, "\(message): \(actual), expected \(expected)",
            file: file, line: line)
    }

    func testSaturatedWorkspaceAdmitsItsBudgetPlusBurstSplitByGuarantees() {
        let limiter = WorkspaceRateLimiter(budget: budget)
        let admitted = simulate(
            limiter,
            [
                OfferedLoad(priority: 10, perHour: flood / 3), OfferedLoad(priority: 5, perHour: flood / 3),
                OfferedLoad(priority: 1, perHour: flood / 3),
            ])
        assertWithinPermille(admitted.total, hourWithBurst(250_000), "workspace total")
        XCTAssertLessThanOrEqual(Double(admitted.total), hourWithBurst(250_000))
        // The guarantees add up to the whole budget, so under full contention each priority gets exactly its own.
        assertWithinPermille(admitted[10], hourWithBurst(125_000), "priority 10")
        assertWithinPermille(admitted[5], hourWithBurst(100_000), "priority 5")
        assertWithinPermille(admitted[1], hourWithBurst(25_000), "priority 1")
        XCTAssertGreaterThanOrEqual(admitted[10], 125_000)
        XCTAssertGreaterThanOrEqual(admitted[5], 100_000)
        XCTAssertGreaterThanOrEqual(admitted[1], 25_000)
    }

    func testBulkPriority5CannotStarvePriority10BelowItsGuarantee() {
        let limiter = WorkspaceRateLimiter(budget: budget)
        // Priority 10 asks for less than its guarantee: every request gets through while priority 5 floods.
        let admitted = simulate(
            limiter, [OfferedLoad(priority: 5, perHour: flood), OfferedLoad(priority: 10, perHour: 75_000)])
        XCTAssertEqual(admitted[10], 75_000)
        XCTAssertLessThanOrEqual(Double(admitted.total), hourWithBurst(250_000))
        XCTAssertGreaterThan(admitted[5], 170_000, "priority 5 borrows what priority 10 leaves")

        // Both flood: each gets at least its guarantee; priority 1's idle share is borrowed by the two.
        let contended = WorkspaceRateLimiter(budget: budget)
        let both = simulate(
            contended, [OfferedLoad(priority: 5, perHour: flood / 2), OfferedLoad(priority: 10, perHour: flood / 2)])
        XCTAssertGreaterThanOrEqual(both[10], 125_000)
        XCTAssertGreaterThanOrEqual(both[5], 100_000)
        XCTAssertLessThanOrEqual(Double(both[10]), hourWithBurst(200_000))
        // Priority 1's reservation (its 60 s of burst) stays set aside, unused.
        assertWithinPermille(both.total, hourWithBurst(250_000) - 25_000.0 / 60, "workspace total")
    }

    func testPriority10AloneStopsAtItsCeiling() {
        let limiter = WorkspaceRateLimiter(budget: budget)
        let admitted = simulate(limiter, [OfferedLoad(priority: 10, perHour: flood)])
        XCTAssertLessThanOrEqual(Double(admitted[10]), hourWithBurst(200_000))
        assertWithinPermille(admitted[10], hourWithBurst(200_000), "priority 10 at its 80% ceiling")
    }

    func testPriority5BorrowsIdleCapacityUpToItsCeiling() {
        let limiter = WorkspaceRateLimiter(budget: budget)
        let admitted = simulate(limiter, [OfferedLoad(priority: 5, perHour: flood)])
        // Ceiling 100%: all of R. Of the burst, W's 4,167 less the idle priorities' reservations (2,083 + 417).
        assertWithinPermille(admitted[5], 250_000 + 100_000.0 / 60, "priority 5 alone")
        XCTAssertGreaterThan(admitted[5], 2 * 100_000, "far above its own 40% guarantee")
    }

    func testBorrowedCapacityReturnsAtOnceWhenTheOwnerComesBack() {
        let limiter = WorkspaceRateLimiter(budget: budget)
        let firstHalf = simulate(limiter, [OfferedLoad(priority: 5, perHour: flood)], from: second, for: hour / 2)
        assertWithinPermille(firstHalf[5], 125_000 + 100_000.0 / 60, "priority 5 alone for half an hour")
        // Priority 10's reservation was never lent out: its first request is admitted immediately.
        XCTAssertEqual(limiter.decide(priority: 10, now: second + hour / 2), .admit(priority: 10))
        let secondHalf = simulate(
            limiter, [OfferedLoad(priority: 5, perHour: flood / 2), OfferedLoad(priority: 10, perHour: flood / 2)],
            from: second + hour / 2 + 1, for: hour / 2)
        XCTAssertGreaterThanOrEqual(secondHalf[10], 62_500)
        XCTAssertGreaterThanOrEqual(secondHalf[5], 50_000)
        XCTAssertLessThanOrEqual(Double(secondHalf[10]), Double(100_000) + 200_000.0 / 60)
    }

    /// Checks every decision against `ReferenceModel`, the model's rules written out plainly: an update is demoted
    /// exactly when priority 10 has no room and priority 5 has room to spare, and never otherwise.
    func testDemoteMovesUpdatesToPriority5ExactlyWhenPriority10IsOut() {
        let demotingBudget = budget.with(policy: .demote)
        let limiter = WorkspaceRateLimiter(budget: demotingBudget)
        var reference = ReferenceModel(demotingBudget)
        var mismatches: [String] = []
        var demoted = 0
        var demotedWhilePriority10HadRoom = 0
        var priority5Own = 0
        let loads = [OfferedLoad(priority: 10, perHour: flood), OfferedLoad(priority: 5, perHour: 25_000)]
        let admitted = simulate(loads) { load, now in
            reference.advance(to: now)
            let priority10HadRoom = reference.hasRoom(priority: 10, cost: 1)
            let expected = reference.decide(priority: load.priority, now: now)
            let decision = limiter.decide(priority: load.priority, now: now)
            var actual: Int?
            if case .admit(let priority) = decision { actual = priority }
            if actual != expected, mismatches.count < 5 {
                mismatches.append("at \(now): \(decision) != \(expected as Any)")
            }
            if load.priority == 10 && actual == 5 {
                demoted += 1
                if priority10HadRoom { demotedWhilePriority10HadRoom += 1 }
            }
            if load.priority == 5 && actual == 5 { priority5Own += 1 }
            return decision
        }
        XCTAssertEqual(mismatches, [])
        XCTAssertEqual(demotedWhilePriority10HadRoom, 0)
        // Priority 10 floods up to its ceiling (80% plus its burst); priority 5 uses 10%; the rest of the budget goes
        // to demoted updates, except the reservations of priorities 5 and 1, which stay set aside (their owners leave
        // them nearly full), so the total falls short of R + B by those.
        let rest = hourWithBurst(250_000) - (100_000.0 + 25_000.0) / 60 - hourWithBurst(200_000) - 25_000
        assertWithinPermille(demoted, rest, "demoted updates")
        XCTAssertLessThanOrEqual(Double(admitted[10]), hourWithBurst(200_000))
        XCTAssertEqual(priority5Own, 25_000, "demoted updates never take priority 5's own reservation")
        XCTAssertLessThanOrEqual(Double(admitted.total), hourWithBurst(250_000))
    }

    /// The limiter against `ReferenceModel` for an hour of changing, uneven loads with costs above 1: every decision
    /// the same, and every refusal's time the first microsecond at which the priority has room.
    func testEveryDecisionMatchesTheReferenceModel() {
        var mixed = budget.with(policy: .demote)
        mixed.requestsPerHour = 36_000
        mixed.priority10 = PriorityBudget(guaranteedPerHour: 10_000, ceilingPerHour: 20_000, policy: .demote)
        mixed.priority5 = PriorityBudget(guaranteedPerHour: 8_000, ceilingPerHour: 30_000, policy: .reject)
        mixed.priority1 = PriorityBudget(guaranteedPerHour: 2_000, ceilingPerHour: 12_000, policy: .wait)
        let limiter = WorkspaceRateLimiter(budget: mixed)
        var reference = ReferenceModel(mixed)
        var mismatches = 0
        var wrongTimes = 0
        var refusals = 0
        var demoted = 0
        var admitted = 0
        let phases: [[OfferedLoad]] = [
            [
                OfferedLoad(priority: 10, perHour: 30_011, cost: 3), OfferedLoad(priority: 5, perHour: 20_021, cost: 2),
                OfferedLoad(priority: 1, perHour: 90_007), OfferedLoad(priority: 10, perHour: 7_001, cost: 7),
            ],
            [OfferedLoad(priority: 10, perHour: 200_003), OfferedLoad(priority: 5, perHour: 3_001, cost: 5)],
            [OfferedLoad(priority: 1, perHour: 50_000, cost: 2), OfferedLoad(priority: 5, perHour: 9_000, cost: 3)],
            [],
            [
                OfferedLoad(priority: 5, perHour: 100_019, cost: 4), OfferedLoad(priority: 10, perHour: 1_999, cost: 9),
                OfferedLoad(priority: 1, perHour: 4_001),
            ],
        ]
        for (index, loads) in phases.enumerated() {
            let phaseStart = second + UInt64(index) * hour / 5
            let phase = simulate(loads, from: phaseStart, for: hour / 5) { load, now in
                let decision = limiter.decide(priority: load.priority, cost: load.cost, now: now)
                var actual: Int?
                if case .admit(let priority) = decision { actual = priority }
                if actual != reference.decide(priority: load.priority, cost: load.cost, now: now) {
                    mismatches += 1
                }
                if load.priority == 10 && actual == 5 { demoted += 1 }
                var until: UInt64?
                if case .wait(let time) = decision { until = time }
                if case .reject(let retryAfter) = decision { until = now + retryAfter }
                if let until {
                    var atTime = reference
                    atTime.advance(to: until)
                    var justBefore = reference
                    justBefore.advance(to: until - 1_000)
                    if !atTime.hasRoom(priority: load.priority, cost: load.cost) { wrongTimes += 1 }
                    if justBefore.hasRoom(priority: load.priority, cost: load.cost) { wrongTimes += 1 }
                    refusals += 1
                }
                return decision
            }
            admitted += phase.total
        }
        XCTAssertEqual(mismatches, 0)
        XCTAssertEqual(wrongTimes, 0)
        XCTAssertGreaterThan(refusals, 50_000)
        XCTAssertGreaterThan(demoted, 1_000)
        XCTAssertLessThanOrEqual(Double(admitted), hourWithBurst(36_000))
    }

    func testTwoWorkspacesNeverAffectEachOther() {
        let overrides = ["big": RateBudget(requestsPerHour: 500_000, burstSeconds: 30)]
        let quietLoads = [
            OfferedLoad(workspace: "small", priority: 10, perHour: 100_000),
            OfferedLoad(workspace: "small", priority: 5, perHour: 1_000_000),
        ]
        let bigLoads = [10, 5, 1].map { OfferedLoad(workspace: "big", priority: $0, perHour: 1_000_000) }

        func run(_ loads: [OfferedLoad]) -> (decisions: [String: [RateDecision]], admitted: [String: Int]) {
            let registry = try! RateLimiterRegistry(overrides: overrides)
            var decisions: [String: [RateDecision]] = [:]
            var admitted: [String: Int] = [:]
            _ = simulate(loads) { load, now in
                let decision = registry.decide(workspace: load.workspace, priority: load.priority, now: now)
                decisions[load.workspace, default: []].append(decision)
                if decision.isAdmitted { admitted[load.workspace, default: 0] += 1 }
                return decision
            }
            return (decisions, admitted)
        }

        let alone = run(quietLoads)
        let together = run(quietLoads + bigLoads)
        XCTAssertEqual(alone.decisions["small"]?.count, together.decisions["small"]?.count)
        XCTAssertTrue(alone.decisions["small"] == together.decisions["small"], "same decisions, one by one")
        XCTAssertEqual(alone.admitted["small"], together.admitted["small"])
        // Priority 10 asks for less than its guarantee, so its reservation, like priority 1's, stays nearly full.
        assertWithinPermille(together.admitted["small"] ?? 0, 250_000 + 100_000.0 / 60, "small")
        assertWithinPermille(together.admitted["big"] ?? 0, hourWithBurst(500_000, burstSeconds: 30), "big")
    }
}
