import Fanout
import FanoutCore
import FanoutPolicy
import FanoutTestSupport
import FanoutTransport
import Foundation
import MockAPNsKit
import XCTest

/// Retry, token invalidation, provider-token self-healing and rate limits, end to end against mock-apns.
final class PolicyTests: XCTestCase {
    private func makeEngine(
        _ mock: MockHarness, loops: Int = 2, configure: (inout FanoutEngineConfiguration) -> Void = { _ in }
    ) throws -> FanoutEngine {
        var configuration = FanoutEngineConfiguration(
            endpoint: APNsEndpoint(host: "localhost", port: mock.port),
            credentials: ProviderCredentials(
                keyPath: mock.material.authKeyP8Path, keyID: "KEYID12345", teamID: "TEAMID1234"),
            caFile: mock.material.caPEMPath)
        configuration.loops = loops
        configuration.connectionsPerLoop = 2
        configuration.retryBase = .milliseconds(5)
        configuration.retryCap = .milliseconds(50)
        configure(&configuration)
        return try FanoutEngine(configuration: configuration)
    }

    private func alertJob(_ id: String, tokens: [String], workspace: String = "default", priority: Int = 10)
        -> FanoutJob
    {
        FanoutJob(
            id: id, workspace: workspace,
            headers: NotificationHeaders(pushType: .alert, topic: "com.example.app", priority: priority),
            payload: .raw(Array(#"{"aps":{"alert":"hi"}}"#.utf8)), recipients: .tokens(tokens))
    }

    func testTransientFaultsAreRetriedUntilEveryNotificationIsDeliveredOnce() async throws {
        let mock = try MockHarness {
            $0.failures = [
                InjectedFailure(rate: 0.05, status: 503, reason: "ServiceUnavailable"),
                InjectedFailure(rate: 0.01, status: 429, reason: "TooManyRequests"),
                InjectedFailure(rate: 0.01, status: 500, reason: "InternalServerError"),
            ]
            $0.seed = 7
        }
        defer { mock.stop() }
        let engine = try makeEngine(mock)
        let total = 100_000
        let summary = try await engine.run(alertJob("faulty", tokens: (0..<total).map { testDeviceToken($0) })) { _ in }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.delivered, total, "\(summary.counts)")
        XCTAssertGreaterThan(summary.counts.retries, total * 5 / 100, "about 7% of first attempts are retried")
        XCTAssertEqual(mock.stats.accepted, total)
        XCTAssertEqual(mock.stats.duplicateApnsIDs, 0, "a retry keeps its apns-id and none was accepted twice")
        XCTAssertEqual(
            mock.stats.requests, total + summary.counts.retries, "every retry is a request, every request counted once")
    }

    func testExpiredProviderTokenIsReplacedAndNothingFails() async throws {
        let mock = try MockHarness {
            $0.tokenMaxAge = 2
            $0.latencyMilliseconds = 2
        }
        defer { mock.stop() }
        // The engine would keep its token for 100 s; the mock calls it expired after 2 s.
        let engine = try makeEngine(mock, loops: 1) {
            $0.tokenRefresh = .seconds(100)
            $0.tokenMinimumInterval = .seconds(1)
            $0.maxInFlight = 200
        }
        let total = 4000
        let start = ContinuousClock.now
        var delivered = 0
        var batch = 0
        // Keep sending for over 3 seconds so that the first token expires mid-run.
        while ContinuousClock.now - start < .milliseconds(3500) {
            let tokens = (0..<total).map { testDeviceToken(batch * total + $0) }
            let summary = try await engine.run(alertJob("job-\(batch)", tokens: tokens)) { _ in }
            XCTAssertEqual(summary.counts.delivered, total, "\(summary.counts)")
            delivered += summary.counts.delivered
            batch += 1
        }
        await engine.shutdown()
        XCTAssertGreaterThan(mock.stats.count(reason: "ExpiredProviderToken"), 0, "the mock did expire the token")
        XCTAssertEqual(mock.stats.accepted, delivered)
    }

    func testPermanentReasonsAreNeverRetried() async throws {
        let cases: [(status: Int, reason: String, outcome: NotificationOutcome)] = [
            (400, "BadDeviceToken", .unregistered), (400, "DeviceTokenNotForTopic", .unregistered),
            (410, "Unregistered", .unregistered), (410, "ExpiredToken", .unregistered),
            (400, "BadCollapseId", .rejected), (400, "BadTopic", .rejected), (400, "TopicDisallowed", .rejected),
            (413, "PayloadTooLarge", .rejected), (403, "Forbidden", .rejected),
            (403, "InvalidProviderToken", .rejected),
            (403, "BadCertificate", .rejected), (404, "BadPath", .rejected),
        ]
        for entry in cases {
            let mock = try MockHarness {
                $0.failures = [InjectedFailure(rate: 1, status: entry.status, reason: entry.reason)]
            }
            let engine = try makeEngine(mock, loops: 1)
            let results = FanoutMutex<[NotificationResult]>([])
            let summary = try await engine.run(alertJob(entry.reason, tokens: (0..<20).map { testDeviceToken($0) })) {
                result in results.withLock { $0.append(result) }
            }
            await engine.shutdown()
            mock.stop()
            XCTAssertEqual(summary.notifications, 20, entry.reason)
            XCTAssertEqual(summary.counts.retries, 0, "\(entry.reason) must not be retried")
            XCTAssertEqual(mock.stats.requests, 20, entry.reason)
            for result in results.withLock({ $0 }) {
                XCTAssertEqual(result.outcome, entry.outcome, entry.reason)
                XCTAssertEqual(result.status, entry.status, entry.reason)
                XCTAssertEqual(result.reason, entry.reason)
                XCTAssertEqual(result.attempts, 1, entry.reason)
            }
        }
    }

    func testInvalidatedTokensAreStreamed() async throws {
        let gone = (0..<30).map { testDeviceToken(5000 + $0) }
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("gone-\(UUID().uuidString)").path
        try gone.joined(separator: "\n").write(toFile: file, atomically: true, encoding: .utf8)
        let mock = try MockHarness { $0.unregisteredPath = file }
        defer { mock.stop() }
        let engine = try makeEngine(mock)
        _ = try await engine.run(alertJob("mixed", tokens: (0..<300).map { testDeviceToken($0) } + gone)) { _ in }
        await engine.shutdown()
        var streamed: [InvalidatedToken] = []
        for await token in engine.invalidTokens { streamed.append(token) }
        XCTAssertEqual(Set(streamed.map(\.token)), Set(gone))
        XCTAssertTrue(streamed.allSatisfy { $0.reason == "Unregistered" && $0.timestamp != nil && $0.jobID == "mixed" })
    }

    func testWorkspaceBudgetRejectsWithRetryAfterAndLeavesOtherWorkspacesAlone() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        // 3,600 jobs an hour (one a second) with a 10-second burst: priority 10 may take 5 at once
        // (the workspace's 10 less the reservations of priorities 5 and 1), then one a second.
        let tight = RateBudget(requestsPerHour: 3600, burstSeconds: 10, policy: .reject)
        let registry = try RateLimiterRegistry(overrides: ["tight": tight])
        let engine = try makeEngine(mock) { $0.rateLimits = registry }
        var limited: [JobSummary] = []
        var retryAfter: [Double] = []
        for index in 0..<8 {
            let results = FanoutMutex<[NotificationResult]>([])
            let summary = try await engine.run(
                alertJob("tight-\(index)", tokens: [testDeviceToken(index)], workspace: "tight")
            ) {
                result in results.withLock { $0.append(result) }
            }
            if summary.counts.rateLimited > 0 {
                limited.append(summary)
                retryAfter += results.withLock { $0 }.compactMap(\.retryAfterSeconds)
            }
        }
        let other = try await engine.run(alertJob("roomy", tokens: (0..<10).map { testDeviceToken(100 + $0) })) { _ in }
        await engine.shutdown()
        XCTAssertGreaterThanOrEqual(limited.count, 2, "jobs past the burst are refused")
        XCTAssertLessThanOrEqual(limited.count, 3)
        XCTAssertTrue(retryAfter.allSatisfy { $0 > 0 && $0 <= 1.5 }, "\(retryAfter)")
        XCTAssertEqual(other.counts.delivered, 10, "another workspace is not affected")
        XCTAssertEqual(mock.stats.accepted, 10 + 8 - limited.count)
    }

    /// A caller chooses per call what an exhausted budget does: waiting where the budget rejects, rejecting where it
    /// waits, and a wait ended by the call's deadline.
    func testACallChoosesBetweenWaitingForTheBudgetAndRejectingAtOnce() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        // Both: one a second with a 10-second burst, so priority 10 may take 5 at once (see the test above).
        let rejecting = RateBudget(requestsPerHour: 3600, burstSeconds: 10, policy: .reject)
        let waiting = RateBudget(requestsPerHour: 3600, burstSeconds: 10, policy: .wait)
        // One every 10 seconds: past its first 5, the next is 10 s away.
        let slow = RateBudget(requestsPerHour: 360, burstSeconds: 100, policy: .wait)
        let registry = try RateLimiterRegistry(overrides: ["rejecting": rejecting, "waiting": waiting, "slow": slow])
        let engine = try makeEngine(mock) { $0.rateLimits = registry }
        func notification(_ index: Int, workspace: String) throws -> PushNotification {
            var notification = try PushNotification.alert(
                AlertPayload(title: "t", body: "b"), to: testDeviceToken(index), app: "com.example.app")
            notification.workspace = workspace
            return notification
        }
        var waited: [NotificationResult] = []
        for index in 0..<7 {
            waited.append(try await engine.send(notification(index, workspace: "rejecting"), overBudget: .wait))
        }
        XCTAssertEqual(waited.map(\.outcome), Array(repeating: .delivered, count: 7), "waited past the burst")
        var rejected: [NotificationResult] = []
        for index in 0..<6 {
            rejected.append(try await engine.send(notification(10 + index, workspace: "waiting"), overBudget: .reject))
        }
        XCTAssertEqual(rejected.prefix(5).map(\.outcome), Array(repeating: .delivered, count: 5))
        XCTAssertEqual(rejected.last?.outcome, .rateLimited, "rejected at once, though the budget waits")
        XCTAssertTrue((rejected.last?.retryAfterSeconds).map { $0 > 0 && $0 <= 1.5 } ?? false, "\(rejected.last!)")
        for index in 0..<5 { _ = try await engine.send(notification(20 + index, workspace: "slow")) }
        let started = ContinuousClock.now
        let late = try await engine.send(
            notification(30, workspace: "slow"), timeout: .milliseconds(200), overBudget: .wait)
        let elapsed = ContinuousClock.now - started
        await engine.shutdown()
        XCTAssertEqual(late.outcome, .failed)
        XCTAssertEqual(late.reason, "DeadlineExceeded")
        XCTAssertLessThan(elapsed, .seconds(2), "the deadline ends a wait for a budget 10 s away")
        XCTAssertEqual(mock.stats.accepted, 7 + 5 + 5)
    }
}
