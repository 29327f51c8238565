import FanoutTestSupport
import XCTest

extension RedisServerProcess {
    /// A server for `testCase`, stopped and its directory removed at the test's teardown.
    convenience init(for testCase: XCTestCase, port: Int? = nil, appendOnly: Bool = false, extra: [String] = []) throws
    {
        try self.init(port: port, appendOnly: appendOnly, extra: extra)
        testCase.addTeardownBlock { [self] in discard() }
    }
}
