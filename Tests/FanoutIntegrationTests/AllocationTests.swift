import Foundation
import XCTest

/// Heap allocations per notification in steady state, checked against the threshold files in
/// Tests/AllocationThresholds, as swift-nio's allocation-counter tests check theirs: a change that adds an
/// allocation on the hot path fails here. `alloc-probe` does the counting in a process of its own (it links the
/// counting allocator, which must not be in the test runner), against mock-apns in another; see
/// docs/ARCHITECTURE.md, "Counting allocations", for how to update a threshold.
final class AllocationTests: XCTestCase {
    /// The measured figure may exceed the threshold by this much per notification and still pass. The counts are
    /// exact, but a few allocations depend on timing rather than on the notification count: how many responses one
    /// socket read carries, whether the feeding task waits for in-flight permits, a loop turn more or less before
    /// a job's last result. alloc-probe reports the lowest of five runs, since timing only adds; that figure moved
    /// by at most 0.015 over probes on a loaded 2-core machine (debug 9.275 to 9.289, release 3.260 to 3.275),
    /// the runs themselves by 0.035. One allocation more per notification moves it by 1.0, so 0.1 cannot hide one.
    static let tolerance = 0.1

    func testThroughput1cAllocationsPerNotificationStayAtThreshold() throws {
        try checkAllocationsStayAtThreshold("throughput-1c")
    }

    /// `engine.send` of one notification, each call awaited before the next: what one call of a gateway's costs
    /// (its run, prepared payload and headers, hand-off to the loop, continuation, task frames, and a share of two loop
    /// turns).
    func testSingleSendAllocationsPerCallStayAtThreshold() throws {
        try checkAllocationsStayAtThreshold("single-send")
    }

    /// Runs `alloc-probe SCENARIO` of this build and compares its figure with the scenario's threshold file.
    private func checkAllocationsStayAtThreshold(_ scenario: String) throws {
        let probe = try ProcessSupport.builtExecutable("alloc-probe")
        let result = try ProcessSupport.run(probe, [scenario], timeout: 120)
        XCTAssertEqual(result.exitCode, 0, result.summary)
        guard let line = result.stdoutLines.last,
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
            let measured = object["allocations_per_notification"] as? Double, let build = object["build"] as? String
        else {
            return XCTFail("alloc-probe printed no figure: \(result.summary)")
        }
        // A debug build allocates more (unspecialized generics, iterators), so each build has its own figure.
        let threshold = try Self.threshold(for: scenario, build: build)
        XCTAssertLessThanOrEqual(
            measured, threshold + Self.tolerance,
            "\(scenario) (\(build)): \(measured) allocations per notification, over the threshold of \(threshold) in "
                + "Tests/AllocationThresholds/\(scenario).json; find the new allocation, or raise the threshold "
                + "there and say why in the commit (\(line))")
        if measured < threshold - Self.tolerance {
            print(
                "\(scenario) (\(build)): \(measured) allocations per notification, under the threshold of \(threshold):"
                    + " lower Tests/AllocationThresholds/\(scenario).json to keep the gain")
        }
    }

    /// The `allocations_per_notification` of Tests/AllocationThresholds/<scenario>.json for `build` (debug or
    /// release).
    static func threshold(for scenario: String, build: String) throws -> Double {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("AllocationThresholds/\(scenario).json")
        let object = try JSONSerialization.jsonObject(with: Data(contentsOf: path)) as? [String: Any]
        guard let figures = object?["allocations_per_notification"] as? [String: Any],
            let value = figures[build] as? Double
        else {
            throw ProcessSupportError("\(path.path) has no allocations_per_notification for a \(build) build")
        }
        return value
    }
}
