import XCTest

final class FanoutCoreTestsPlaceholder: XCTestCase {
    func testNothingYet() {}
}
