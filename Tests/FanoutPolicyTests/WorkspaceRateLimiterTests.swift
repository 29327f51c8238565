import Dispatch
import FanoutCore
import FanoutPolicy
import XCTest

/// Small budgets whose numbers can be followed by hand. With 3,600 per hour and a 60 s burst (the default split), the
/// buckets hold (in requests) W 60; reservations G10 30, G5 24, G1 6; ceilings C10 48, C5 60, C1 60.
final class WorkspaceRateLimiterTests: XCTestCase {
    let start: UInt64 = 5 * second + 123

    func hourly(_ policy: RateLimitPolicy, counting unit: RateCountingUnit = .job) -> RateBudget {
        RateBudget(requestsPerHour: 3_600, burstSeconds: 60, countingUnit: unit, policy: policy)
    }

    func testBucketsStartFullAndBoundEachPrioritysLargestCost() {
        let limiter = WorkspaceRateLimiter(budget: hourly(.reject))
        // A priority's burst is its ceiling's, less the other priorities' reservations (which are always kept).
        XCTAssertEqual(limiter.maximumCost(priority: 10), 30)
        XCTAssertEqual(limiter.maximumCost(priority: 5), 24)
        XCTAssertEqual(limiter.maximumCost(priority: 1), 6)
        XCTAssertEqual(limiter.decide(priority: 10, cost: 30, now: start), .admit(priority: 10))
        XCTAssertFalse(limiter.decide(priority: 10, now: start).isAdmitted)
        XCTAssertEqual(limiter.decide(priority: 5, cost: 24, now: start), .admit(priority: 5))
        XCTAssertEqual(limiter.decide(priority: 1, cost: 6, now: start), .admit(priority: 1))
        XCTAssertFalse(limiter.decide(priority: 1, now: start).isAdmitted)
        XCTAssertEqual(limiter.decide(priority: 5, cost: 0, now: start), .admit(priority: 5), "cost 0 always fits")
    }

    func testWaitNamesTheFirstTimeARetryIsAdmitted() {
        let limiter = WorkspaceRateLimiter(budget: hourly(.wait))
        XCTAssertEqual(limiter.decide(priority: 10, cost: 30, now: start), .admit(priority: 10))
        // W has 30 left, all reserved for priorities 5 and 1; the shared part refills at 1 per second.
        let until = 6 * second
        XCTAssertEqual(limiter.decide(priority: 10, now: start), .wait(untilNanoseconds: until))
        XCTAssertEqual(limiter.decide(priority: 10, now: until - 1_000), .wait(untilNanoseconds: until))
        XCTAssertEqual(limiter.decide(priority: 10, now: until), .admit(priority: 10))
    }

    func testRejectGivesAPositiveRetryAfterThatIsAdmitted() {
        let limiter = WorkspaceRateLimiter(budget: hourly(.reject))
        XCTAssertEqual(limiter.decide(priority: 10, cost: 30, now: start), .admit(priority: 10))
        let decision = limiter.decide(priority: 10, now: start)
        XCTAssertEqual(decision, .reject(retryAfterNanoseconds: 6 * second - start))
        guard case .reject(let retryAfter) = decision else { return }
        XCTAssertGreaterThan(retryAfter, 0)
        XCTAssertFalse(limiter.decide(priority: 10, now: start + retryAfter - 1_000).isAdmitted)
        XCTAssertEqual(limiter.decide(priority: 10, now: start + retryAfter), .admit(priority: 10))
    }

    func testCountingNotificationsChargesAJobForEachOfItsTokens() {
        let budget = hourly(.wait, counting: .notification)
        let limiter = WorkspaceRateLimiter(budget: budget)
        XCTAssertEqual(RateCountingUnit.job.cost(ofJobWith: 1_000), 1)
        let cost = budget.countingUnit.cost(ofJobWith: 20)
        XCTAssertEqual(cost, 20)
        XCTAssertEqual(limiter.decide(priority: 5, cost: cost, now: start), .admit(priority: 5))
        // Priority 5 may use W less the other reservations (30 + 6): 40 − 36 = 4 now, 16 more at 1 per second.
        XCTAssertEqual(limiter.decide(priority: 5, cost: cost, now: start), .wait(untilNanoseconds: 21 * second))
        XCTAssertEqual(limiter.decide(priority: 5, cost: cost, now: 21 * second), .admit(priority: 5))
    }

    func testATimeEarlierThanTheLastAddsNothing() {
        let limiter = WorkspaceRateLimiter(budget: hourly(.reject))
        XCTAssertEqual(limiter.decide(priority: 1, cost: 6, now: 100 * second), .admit(priority: 1))
        // Still as at 100 s: priority 1 may borrow all of W's refill (1 per second) from 101 s on.
        XCTAssertEqual(limiter.decide(priority: 1, now: 90 * second), .reject(retryAfterNanoseconds: 11 * second))
        XCTAssertEqual(limiter.decide(priority: 1, now: 101 * second), .admit(priority: 1))
    }

    /// R 3,600/h, burst 60 s. Priority 10: guaranteed 600, ceiling 1,200 (buckets 10 and 20); priority 5: 1,200 and
    /// 3,600 (20 and 60); priority 1: none guaranteed. W's shared part starts at 60 − 30 = 30.
    func testDemoteUsesPriority5sSpareRoomOnlyAfterPriority10IsOut() {
        var budget = RateBudget(requestsPerHour: 3_600, burstSeconds: 60)
        budget.priority10 = PriorityBudget(guaranteedPerHour: 600, ceilingPerHour: 1_200, policy: .demote)
        budget.priority5 = PriorityBudget(guaranteedPerHour: 1_200, ceilingPerHour: 3_600, policy: .reject)
        budget.priority1 = PriorityBudget(guaranteedPerHour: 0, ceilingPerHour: 3_600, policy: .reject)
        let limiter = WorkspaceRateLimiter(budget: budget)
        for _ in 0..<20 {
            XCTAssertEqual(limiter.decide(priority: 10, now: start), .admit(priority: 10))
        }
        // Priority 10's ceiling is out; W has 40 left, 20 of them reserved for priority 5: 20 can be demoted.
        for _ in 0..<20 {
            XCTAssertEqual(limiter.decide(priority: 10, now: start), .admit(priority: 5))
        }
        // No spare room left: refused with priority 10's own time (its ceiling refills 1 per 3 s).
        XCTAssertEqual(limiter.decide(priority: 10, now: start), .reject(retryAfterNanoseconds: 8 * second - start))
        // Priority 5's reservation is still whole.
        XCTAssertEqual(limiter.decide(priority: 5, cost: 20, now: start), .admit(priority: 5))
        XCTAssertEqual(limiter.decide(priority: 10, now: 8 * second), .admit(priority: 10))
    }

    func testConcurrentDecisionsAtOneInstantAdmitExactlyTheBurst() {
        let limiter = WorkspaceRateLimiter(budget: hourly(.reject))
        let admitted = FanoutMutex([10: 0, 5: 0, 1: 0])
        let start = start
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
            var mine = [10: 0, 5: 0, 1: 0]
            for step in 0..<600 {
                let priority = [10, 5, 1][(step + thread) % 3]
                if case .admit(let at) = limiter.decide(priority: priority, now: start) { mine[at]! += 1 }
            }
            admitted.withLock { total in total.merge(mine, uniquingKeysWith: +) }
        }
        XCTAssertEqual(admitted.withLock { $0 }, [10: 30, 5: 24, 1: 6])
    }

    func testTheMonotonicClockConvenience() {
        let clock = MonotonicRateClock()
        let first = clock.nanoseconds()
        let limiter = WorkspaceRateLimiter(budget: .default)
        XCTAssertEqual(limiter.decide(priority: 10, clock: clock), .admit(priority: 10))
        XCTAssertGreaterThanOrEqual(clock.nanoseconds(), first)
    }
}
