import Fanout
import Foundation
import Synchronization
import XCTest

/// A gateway's calls against mock-apns: the engine's defaults refuse nothing on their own, and a call's deadline
/// bounds everything it waits for, ending what it stopped with its own reason.
final class CallDeadlineTests: XCTestCase {
    private static func alert(_ index: Int) -> PushNotification {
        PushNotification(
            deviceToken: testDeviceToken(index),
            headers: NotificationHeaders(pushType: .alert, topic: "com.example.app"),
            payload: Array(#"{"aps":{"alert":"hi"}}"#.utf8))
    }

    /// 6,000 concurrent sends with the engine's defaults: every one delivered, none refused by a budget (the library's
    /// workspace budgets are opt-in).
    func testTheDefaultsSendSixThousandConcurrentSendsWithoutRefusingAny() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        var configuration = FanoutEngineConfiguration(
            endpoint: APNsEndpoint(host: "localhost", port: mock.port),
            credentials: ProviderCredentials(
                keyPath: mock.material.authKeyP8Path, keyID: "KEYID12345", teamID: "TEAMID1234"),
            caFile: mock.material.caPEMPath)
        XCTAssertNil(configuration.rateLimits, "workspace budgets are opt-in in the library")
        configuration.loops = 2
        let engine = try FanoutEngine(configuration: configuration)
        let outcomes = try await withThrowingTaskGroup(of: String.self) { group in
            for index in 0..<6_000 {
                group.addTask { try await engine.send(Self.alert(index)).outcome.name }
            }
            var counts: [String: Int] = [:]
            for try await outcome in group { counts[outcome, default: 0] += 1 }
            return counts
        }
        await engine.shutdown()
        XCTAssertEqual(outcomes, ["delivered": 6_000])
    }

    /// A send with a 200 ms deadline to a server that never answers ends `failed`, reason `DeadlineExceeded`,
    /// within 400 ms, and its stream is not left open (the engine drains at once).
    func testASendPastItsDeadlineEndsWithItsOwnReasonInTime() async throws {
        let mock = try MockHarness { $0.blackholeEvery = 1 }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        // A first send opens the connection, so the deadline below measures the send alone.
        _ = try await engine.send(Self.alert(0), timeout: .milliseconds(500))
        let started = ContinuousClock.now
        let result = try await engine.send(Self.alert(1), timeout: .milliseconds(200))
        let took = ContinuousClock.now - started
        XCTAssertEqual(result.outcome, .failed)
        XCTAssertEqual(result.reason, "DeadlineExceeded")
        XCTAssertLessThan(took, .milliseconds(400), "took \(took)")
        XCTAssertGreaterThanOrEqual(took, .milliseconds(200), "took \(took)")
        XCTAssertEqual(engine.inFlight, 0, "nothing of it is left running")
        await engine.shutdown(gracePeriod: .zero)
    }

    /// A job's deadline ends every notification not answered by then, each once, with the deadline's reason; the
    /// call returns with the summary.
    func testAJobPastItsDeadlineEndsEveryUnansweredNotificationOnce() async throws {
        let mock = try MockHarness { $0.blackholeAfter = 50 }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let log = ResultLog()
        let tokens = (0..<200).map { testDeviceToken($0) }
        let summary = try await engine.run(
            scoreUpdateJob(id: "deadline", tokens: tokens), timeout: .milliseconds(500)
        ) { log.add($0) }
        XCTAssertEqual(summary.notifications, 200)
        XCTAssertEqual(log.tokensWithResults, 200)
        XCTAssertEqual(log.tokensWithMoreThanOneResult, 0)
        XCTAssertEqual(log.count(.delivered), 50)
        XCTAssertEqual(log.count(.failed), 150)
        XCTAssertEqual(engine.inFlight, 0)
        await engine.shutdown(gracePeriod: .zero)
    }

    /// A timeout out of range is refused before anything is sent.
    func testATimeoutOutOfRangeIsRefused() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock)
        do {
            _ = try await engine.send(Self.alert(0), timeout: .zero)
            XCTFail("a zero timeout was taken")
        } catch {
            XCTAssertEqual(error.kind, .configuration)
        }
        XCTAssertEqual(mock.stats.accepted, 0)
        await engine.shutdown()
    }
}
