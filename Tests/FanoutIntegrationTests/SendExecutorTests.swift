import Fanout
import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation
import Synchronization
import XCTest

/// `FanoutEngine.sendExecutor()`: tasks started with it as their preference run on a loop thread, their sends are
/// answered as from any task, and they still finish once the engine has shut down.
final class SendExecutorTests: XCTestCase {
    private let headers = NotificationHeaders(pushType: .alert, topic: "com.example.app")
    private let payload = Array(#"{"aps":{"alert":"hi"}}"#.utf8)

    func testSendsFromTasksOnTheLoopAreAnsweredAndRunOnTheLoopThread() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 2, connections: 1) { $0.maxInFlight = 64 }
        let loops = engine.loopThreads
        let headers = self.headers
        let payload = self.payload
        let sends = 300
        // More sends than permits: some wait for room in flight, and are resumed on their loop.
        let outcomes = try await withThrowingTaskGroup(of: (NotificationResult, Bool, Bool).self) { group in
            for index in 0..<sends {
                let notification = PushNotification(
                    deviceToken: testDeviceToken(index), headers: headers, payload: payload)
                group.addTask(executorPreference: engine.sendExecutor()) {
                    let before = loops.contains { $0.inLoop }
                    let result = try await engine.send(notification)
                    let after = loops.contains { $0.inLoop }
                    return (result, before, after)
                }
            }
            var outcomes: [(NotificationResult, Bool, Bool)] = []
            for try await outcome in group { outcomes.append(outcome) }
            return outcomes
        }
        await engine.shutdown()
        XCTAssertEqual(outcomes.count, sends)
        XCTAssertEqual(outcomes.filter { $0.0.outcome == .delivered }.count, sends)
        XCTAssertEqual(Set(outcomes.compactMap(\.0.token)).count, sends, "a send got another's result")
        XCTAssertTrue(outcomes.allSatisfy { $0.1 && $0.2 }, "a task ran off the loop threads")
        XCTAssertEqual(mock.stats.accepted, sends)
        XCTAssertEqual(engine.inFlight, 0, "every permit came back")
    }

    func testATaskOnTheLoopStillFinishesAfterShutdown() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let executor = engine.sendExecutor()
        let headers = self.headers
        let payload = self.payload
        let first = try await Task(executorPreference: executor) {
            try await engine.send(PushNotification(deviceToken: testDeviceToken(1), headers: headers, payload: payload))
        }.value
        XCTAssertEqual(first.outcome, .delivered)
        await engine.shutdown()
        // The loop has stopped: the task's jobs go to the cooperative pool instead of being lost.
        let late = Task(executorPreference: executor) { () -> FanoutError.Kind? in
            do {
                _ = try await engine.send(
                    PushNotification(deviceToken: testDeviceToken(2), headers: headers, payload: payload))
                return nil
            } catch let error as FanoutError {
                return error.kind
            } catch {
                return nil
            }
        }
        guard let kind = try await withDeadline(.seconds(20), { await late.value }) else {
            return XCTFail("a task started on a stopped loop never ran")
        }
        XCTAssertEqual(kind, .shutdown)
    }
}
