import FanoutPolicy
import XCTest

final class RetryBudgetTests: XCTestCase {
    private let second: UInt64 = 1_000_000_000

    func testRetriesAreCappedAtTheRatioOfFirstAttemptsPlusTheFloor() {
        var budget = RetryBudget(ratio: 0.2, floor: 10, windowSeconds: 10)
        for _ in 0..<1000 { budget.recordFirstAttempt(now: 5 * second) }
        var allowed = 0
        for _ in 0..<1000 where budget.tryRetry(now: 5 * second) { allowed += 1 }
        XCTAssertEqual(allowed, 210, "20% of 1000 first attempts, plus the floor of 10")
    }

    func testQuietSenderStillGetsTheFloor() {
        var budget = RetryBudget(ratio: 0.2, floor: 3)
        var allowed = 0
        for _ in 0..<10 where budget.tryRetry(now: second) { allowed += 1 }
        XCTAssertEqual(allowed, 3)
    }

    func testOldTrafficLeavesTheWindow() {
        var budget = RetryBudget(ratio: 0.5, floor: 0, windowSeconds: 2)
        for _ in 0..<100 { budget.recordFirstAttempt(now: 1 * second) }
        for _ in 0..<50 { XCTAssertTrue(budget.tryRetry(now: 1 * second)) }
        XCTAssertFalse(budget.tryRetry(now: 1 * second), "the budget of the window is spent")
        // Two seconds later the first second has left the window: nothing to retry against.
        XCTAssertFalse(budget.tryRetry(now: 3 * second))
        for _ in 0..<10 { budget.recordFirstAttempt(now: 3 * second) }
        var allowed = 0
        for _ in 0..<10 where budget.tryRetry(now: 3 * second) { allowed += 1 }
        XCTAssertEqual(allowed, 5)
    }
}
