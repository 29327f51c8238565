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

extension RedisClusterProcess {
    /// A cluster for `testCase`, its nodes stopped and their directories removed at the test's teardown.
    convenience init(
        for testCase: XCTestCase, primaries: Int = 3, replicasPerPrimary: Int = 0, nodeTimeoutMilliseconds: Int = 1000
    ) throws {
        try self.init(
            primaries: primaries, replicasPerPrimary: replicasPerPrimary,
            nodeTimeoutMilliseconds: nodeTimeoutMilliseconds)
        testCase.addTeardownBlock { [self] in discard() }
    }
}
