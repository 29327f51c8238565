import XCTest

@testable import MockAPNsKit

/// `--blackhole-after N` answers the first N streams and holds every later one; N = 0 holds them all (before, 0 meant
/// off, which `--help` does not say), and without the flag nothing is held.
final class FaultPlanTests: XCTestCase {
    private func held(after: Int?, requests: Int) -> [Bool] {
        var options = MockOptions()
        options.blackholeAfter = after
        let plan = FaultPlan(options: options)
        return (0..<requests).map { _ in plan.next().blackhole }
    }

    func testBlackholeAfterHoldsEveryStreamPastTheNth() {
        XCTAssertEqual(held(after: 0, requests: 3), [true, true, true])
        XCTAssertEqual(held(after: 2, requests: 4), [false, false, true, true])
        XCTAssertEqual(held(after: nil, requests: 3), [false, false, false])
    }
}
