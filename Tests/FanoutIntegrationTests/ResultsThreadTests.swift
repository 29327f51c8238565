import Fanout
import FanoutCore
import FanoutTransport
import Foundation
import Synchronization
import XCTest

/// Results are delivered by each loop's results thread, not on the loop threads: the loop only decides
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

    /// `send`'s result is delivered by the loop itself, not queued behind other jobs' results on the results thread:
    /// a send returns while another job's handler holds that thread, and many concurrent sends each get one result
    /// and give their permits back.
    func testSendsAreNotHeldUpByAnotherJobsSlowHandler() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.maxInFlight = 16 }
        let headers = NotificationHeaders(pushType: .alert, topic: "com.example.app")
        let payload = Array(#"{"aps":{"alert":"hi"}}"#.utf8)
        let handlerEntered = DispatchSemaphore(value: 0)
        let sendsDone = DispatchSemaphore(value: 0)
        let handlerWait = FanoutMutex<DispatchTimeoutResult?>(nil)
        let held = Task {
            try await engine.run(scoreUpdateJob(id: "held", tokens: [testDeviceToken(1)])) { _ in
                handlerEntered.signal()
                // The results thread stays here until the sends below have returned (or 20 s have passed).
                let waited = sendsDone.wait(timeout: .now() + 20)
                handlerWait.withLock { $0 = waited }
            }
        }
        let entered = await Task.detached { handlerEntered.wait(timeout: .now() + 20) }.value
        XCTAssertEqual(entered, .success, "the held job's handler never ran")
        let sends = 200
        let results = try await withThrowingTaskGroup(of: NotificationResult.self) { group in
            for index in 0..<sends {
                let token = testDeviceToken(1_000 + index)
                group.addTask {
                    try await engine.send(PushNotification(deviceToken: token, headers: headers, payload: payload))
                }
            }
            var results: [NotificationResult] = []
            for try await result in group { results.append(result) }
            return results
        }
        sendsDone.signal()
        let summary = try await held.value
        XCTAssertEqual(handlerWait.withLock { $0 }, .success, "the sends waited for the held job's handler")
        XCTAssertEqual(results.count, sends)
        XCTAssertEqual(results.filter { $0.outcome == .delivered }.count, sends)
        XCTAssertEqual(Set(results.compactMap(\.token)).count, sends, "a send got another's result")
        XCTAssertEqual(summary.counts.delivered, 1)
        XCTAssertEqual(engine.inFlight, 0, "every permit came back")
        await engine.shutdown()
    }
}
