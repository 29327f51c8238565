import Dispatch
import FanoutCore
import FanoutPolicy
import XCTest

final class RateLimiterRegistryTests: XCTestCase {
    func testOverridesAndTheDefault() throws {
        let special = RateBudget(requestsPerHour: 36_000, burstSeconds: 10)
        let registry = try RateLimiterRegistry(defaultBudget: .jobFileDefault, overrides: ["acme": special])
        XCTAssertEqual(registry.limiter(for: "acme").budget, special)
        XCTAssertEqual(registry.limiter(for: "other").budget, .jobFileDefault)
        XCTAssertEqual(registry.budget(for: "default"), .jobFileDefault)
        XCTAssertTrue(registry.limiter(for: "acme") === registry.limiter(for: "acme"))
        XCTAssertFalse(registry.limiter(for: "acme") === registry.limiter(for: "other"))
        XCTAssertEqual(registry.decide(workspace: "acme", priority: 5, now: second), .admit(priority: 5))
    }

    func testConcurrentLookupsAgreeOnOneLimiterPerWorkspace() throws {
        let registry = try RateLimiterRegistry()
        let names = (0..<2_000).map { "workspace-\($0)" }
        let seen = FanoutMutex([String: Set<ObjectIdentifier>]())
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
            var mine: [String: Set<ObjectIdentifier>] = [:]
            for index in names.indices {
                let name = names[(index * (thread + 1) + thread) % names.count]
                mine[name, default: []].insert(ObjectIdentifier(registry.limiter(for: name)))
            }
            seen.withLock { all in all.merge(mine) { $0.union($1) } }
        }
        let result = seen.withLock { $0 }
        XCTAssertEqual(result.count, names.count)
        XCTAssertEqual(result.values.filter { $0.count != 1 }.count, 0)
        for name in names.prefix(50) {
            XCTAssertEqual(result[name], [ObjectIdentifier(registry.limiter(for: name))])
        }
    }
}

final class RateLimiterRegistryValidationTests: XCTestCase {
    func testABudgetThatCannotBeEnforcedIsAnErrorNamingTheWorkspace() {
        let impossible = RateBudget(requestsPerHour: 3600, burstSeconds: 5, policy: .reject)
        XCTAssertThrowsError(try RateLimiterRegistry(overrides: ["tight": impossible])) { error in
            XCTAssertTrue("\(error)".contains("workspace tight"), "\(error)")
        }
    }
}
