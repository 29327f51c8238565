import Fanout
import FanoutTransport
import Foundation
import Synchronization
import XCTest

/// Results are delivered by each loop's results thread, not on the loop threads (issue 15): the loop only decides
/// the outcome. A slow handler holds sending back through the in-flight permits, which come back only as results
/// are delivered, and every result is still delivered once, before the summary.
final class ResultsThreadTests: XCTestCase {
    func testResultsAreDeliveredOffTheLoopThreadsAndASlowHandlerHoldsSendingBack() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let limit = 64
        let engine = try makeEngine(for: mock, loops: 2, connections: 1) { $0.maxInFlight = limit }
        let total = 2_000
        let log = ResultLog()
        let onLoop = Atomic<Int>(0)
        let highest = Atomic<Int>(0)
        let summary = try await engine.run(scoreUpdateJob(id: "slow-handler", tokens: (0..<total).map(testDeviceToken)))
        { result in
            if engine.loopThreads.contains(where: { $0.inLoop }) { onLoop.add(1, ordering: .relaxed) }
            highest.max(engine.inFlight, ordering: .relaxed)
            usleep(100)  // a handler slower than the mock's answers
            log.add(result)
        }
        XCTAssertEqual(onLoop.load(ordering: .relaxed), 0, "onResult ran on a loop thread")
        XCTAssertLessThanOrEqual(highest.load(ordering: .relaxed), limit, "in flight beyond maxInFlight")
        XCTAssertEqual(summary.counts.delivered, total)
        XCTAssertEqual(log.total, total, "every result delivered before the summary")
        XCTAssertEqual(log.tokensWithMoreThanOneResult, 0)
        XCTAssertEqual(engine.inFlight, 0, "every permit came back before the summary")
        await engine.shutdown()
    }
}
