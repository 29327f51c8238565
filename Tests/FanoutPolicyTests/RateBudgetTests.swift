import FanoutPolicy
import XCTest

final class RateBudgetTests: XCTestCase {
    func testDefaults() {
        let budget = RateBudget.default
        XCTAssertEqual(budget.requestsPerHour, 250_000)
        XCTAssertEqual(budget.burstSeconds, 60)
        XCTAssertEqual(budget.countingUnit, .job)
        XCTAssertEqual(
            budget.priority10, PriorityBudget(guaranteedPerHour: 125_000, ceilingPerHour: 200_000, policy: .reject))
        XCTAssertEqual(
            budget.priority5, PriorityBudget(guaranteedPerHour: 100_000, ceilingPerHour: 250_000, policy: .reject))
        XCTAssertEqual(
            budget.priority1, PriorityBudget(guaranteedPerHour: 25_000, ceilingPerHour: 250_000, policy: .reject))
        XCTAssertEqual(RateBudget.jobFileDefault, budget.with(policy: .wait))
        XCTAssertEqual(RateBudget.jobFileDefault[priority: 5].policy, .wait)
        XCTAssertNoThrow(try budget.validate())
        XCTAssertNoThrow(try RateBudget.jobFileDefault.validate())
    }

    func testDemoteAppliesToPriority10Only() {
        let budget = RateBudget.default.with(policy: .demote)
        XCTAssertEqual(budget.priority10.policy, .demote)
        XCTAssertEqual(budget.priority5.policy, .reject)
        XCTAssertEqual(budget.priority1.policy, .reject)
        var wrong = budget
        wrong.priority5.policy = .demote
        XCTAssertThrowsError(try wrong.validate())
    }

    func testTheSplitScalesWithTheTotal() {
        let budget = RateBudget(requestsPerHour: 36_001, burstSeconds: 10, countingUnit: .notification, policy: .wait)
        XCTAssertEqual(budget.priority10.guaranteedPerHour, 18_000)
        XCTAssertEqual(budget.priority10.ceilingPerHour, 28_800)
        XCTAssertEqual(budget.priority5.guaranteedPerHour, 14_400)
        XCTAssertEqual(budget.priority1.ceilingPerHour, 36_001)
        XCTAssertNoThrow(try budget.validate())
    }

    func testValidationRejectsBudgetsThatCannotBeEnforced() {
        func invalid(_ change: (inout RateBudget) -> Void, file: StaticString = #filePath, line: UInt = #line) {
            var budget = RateBudget.default
            change(&budget)
            XCTAssertThrowsError(try budget.validate(), file: file, line: line)
        }
        invalid { $0.requestsPerHour = 0 }
        invalid { $0.burstSeconds = 0 }
        invalid { $0.requestsPerHour = Int.max / 1_000 }
        invalid { $0.priority5.guaranteedPerHour += 1 }  // guarantees above the total
        invalid { $0.priority10.ceilingPerHour = 100_000 }  // below its guarantee
        invalid { $0.priority5.ceilingPerHour = 250_001 }  // above the total
        invalid { $0.priority1.guaranteedPerHour = -1 }
        invalid { $0 = RateBudget(requestsPerHour: 60, burstSeconds: 1) }  // a burst below one request
    }
}
