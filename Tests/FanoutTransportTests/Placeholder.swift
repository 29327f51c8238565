import XCTest

final class FanoutTransportTestsPlaceholder: XCTestCase {
    func testNothingYet() {}
}
