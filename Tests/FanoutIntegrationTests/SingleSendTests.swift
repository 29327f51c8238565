import Fanout
import FanoutCore
import FanoutTestSupport
import Foundation
import XCTest

/// `send`'s direct path (the calling task hands the notification straight to a loop) and where it gives way to the
/// general one: a send that finds no room in flight waits for it as a job does, a send whose task is cancelled before
/// it reaches its loop sends nothing, and a send whose budget demotes it goes out at priority 5.
final class SingleSendTests: XCTestCase {
    private static func alert(_ index: Int, priority: Int? = nil) -> PushNotification {
        PushNotification(
            deviceToken: testDeviceToken(index),
            headers: NotificationHeaders(pushType: .alert, topic: "com.example.app", priority: priority),
            payload: Array(#"{"aps":{"alert":"hi"}}"#.utf8))
    }

    /// With one notification allowed in flight and one held by the mock, a second send parks for room (the general
    /// path), and is sent and answered once the first ends.
    func testASendThatFindsNoRoomInFlightWaitsForItAndIsThenSent() async throws {
        let mock = try MockHarness { $0.latencyMilliseconds = 300 }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.maxInFlight = 1 }
        let (one, two) = (Self.alert(1), Self.alert(2))
        let first = Task { try await engine.send(one) }
        let holding = await eventually { engine.inFlight == 1 }
        XCTAssertTrue(holding, "the first send never went in flight")
        let second = Task { try await engine.send(two) }
        let parked = await eventually { engine.waitingForRoom == 1 }
        XCTAssertTrue(parked, "the second send never parked for room: \(engine.waitingForRoom) waiting")
        let results = [try await first.value, try await second.value]
        XCTAssertEqual(results.map(\.outcome), [.delivered, .delivered])
        XCTAssertEqual(results.map(\.token), [testDeviceToken(1), testDeviceToken(2)])
        XCTAssertEqual(mock.stats.accepted, 2)
        XCTAssertEqual(engine.inFlight, 0)
        await engine.shutdown(gracePeriod: .zero)
    }

    /// A send whose task is already cancelled when it calls `send` ends `cancelled` and sends nothing, though the
    /// cancellation reaches its loop before the notification does.
    func testASendFromACancelledTaskSendsNothing() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let opened = try await engine.send(Self.alert(0))
        XCTAssertEqual(opened.outcome, .delivered)
        let gate = AsyncGate()
        let notification = Self.alert(1)
        let send = Task {
            await gate.wait()
            return try await engine.send(notification)
        }
        send.cancel()
        gate.open()
        let result = try await send.value
        XCTAssertEqual(result.outcome, .cancelled)
        XCTAssertEqual(result.reason, "Cancelled")
        XCTAssertEqual(result.token, testDeviceToken(1))
        XCTAssertEqual(mock.stats.accepted, 1, "only the first send reached the mock")
        XCTAssertEqual(engine.inFlight, 0)
        await engine.shutdown(gracePeriod: .zero)
    }

    /// A priority-10 send past its budget's priority-10 share, with the demote policy, is admitted at priority 5 on
    /// the direct path and delivered at priority 5.
    func testASendItsBudgetDemotesGoesOutAtPriorityFive() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        // A 10-second burst of 3,600 an hour: priority 10 may take 1 (its ceiling, 360 an hour), priority 5 lends
        // the rest of the workspace's 10 above its own reservation of 1.
        let demoting = RateBudget(
            requestsPerHour: 3600, burstSeconds: 10, countingUnit: .job,
            priority10: PriorityBudget(guaranteedPerHour: 360, ceilingPerHour: 360, policy: .demote),
            priority5: PriorityBudget(guaranteedPerHour: 360, ceilingPerHour: 3600, policy: .reject),
            priority1: PriorityBudget(guaranteedPerHour: 360, ceilingPerHour: 3600, policy: .reject))
        let registry = try RateLimiterRegistry(overrides: ["demoting": demoting])
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.rateLimits = registry }
        var results: [NotificationResult] = []
        for index in 0..<3 {
            var notification = Self.alert(index, priority: 10)
            notification.workspace = "demoting"
            results.append(try await engine.send(notification))
        }
        await engine.shutdown(gracePeriod: .zero)
        XCTAssertEqual(results.map(\.outcome), [.delivered, .delivered, .delivered])
        XCTAssertEqual(mock.stats.snapshot()["accepted_by_priority"] as? [String: Int], ["10": 1, "5": 2])
    }
}

/// A one-shot gate a task waits at until another opens it.
private final class AsyncGate: Sendable {
    private let state = FanoutMutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let open = state.withLock { state -> Bool in
                if state.open { return true }
                state.waiters.append(continuation)
                return false
            }
            if open { continuation.resume() }
        }
    }

    func open() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}
