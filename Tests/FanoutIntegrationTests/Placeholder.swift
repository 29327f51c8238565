import XCTest

final class FanoutIntegrationTestsPlaceholder: XCTestCase {
    func testNothingYet() {}
}
