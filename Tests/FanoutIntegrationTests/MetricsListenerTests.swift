// `FanoutEngineConfiguration.metricsListener`: a gateway's own listener, against mock-apns, is told of every request
// written, every outcome (exactly once per notification, whether it reached APNs or was refused before), retries,
// workspace budget refusals, in-flight work and connections.
import Fanout
import FanoutTestSupport
import Foundation
import MockAPNsKit
import Synchronization
import XCTest

/// Records every event, as a gateway's listener would count them.
final class RecordingMetricsListener: FanoutMetricsListener {
    struct Finished: Equatable {
        var outcome: NotificationOutcome
        var reason: String?
        var latency: Duration?
    }

    struct Events {
        var sentAttempts: [Int] = []
        var finished: [Finished] = []
        var retryReasons: [String?] = []
        var rateLimited: [(workspace: String, priority: Int, count: Int)] = []
        var inFlight: [Int] = []
        var connectionsAdded = 0
        var connectionsRemoved = 0
        var connectionFailures: [String] = []
    }

    private let state = FanoutMutex(Events())
    var events: Events { state.withLock { $0 } }

    func notificationSent(attempt: Int) { state.withLock { $0.sentAttempts.append(attempt) } }
    func notificationFinished(outcome: NotificationOutcome, reason: String?, latency: Duration?) {
        state.withLock { $0.finished.append(Finished(outcome: outcome, reason: reason, latency: latency)) }
    }
    func notificationRetried(reason: String?) { state.withLock { $0.retryReasons.append(reason) } }
    func notificationsRateLimited(workspace: String, priority: Int, count: Int) {
        state.withLock { $0.rateLimited.append((workspace, priority, count)) }
    }
    func notificationsInFlight(_ count: Int) { state.withLock { $0.inFlight.append(count) } }
    func connectionAdded() { state.withLock { $0.connectionsAdded += 1 } }
    func connectionRemoved() { state.withLock { $0.connectionsRemoved += 1 } }
    func connectionFailed(reason: String) { state.withLock { $0.connectionFailures.append(reason) } }
}

/// A listener that implements one event only: the others keep the protocol's empty defaults.
final class DeliveredCounter: FanoutMetricsListener {
    let delivered = Atomic<Int>(0)
    func notificationFinished(outcome: NotificationOutcome, reason: String?, latency: Duration?) {
        if outcome == .delivered { delivered.add(1, ordering: .relaxed) }
    }
}

// LIBRARY-EXAMPLE-BEGIN
/// Notifications delivered, tokens to drop and retries, for a StatsD or Prometheus client to read.
final class GatewayMetrics: FanoutMetricsListener {
    let delivered = Atomic<Int>(0)
    let dropTokens = Atomic<Int>(0)
    let retries = Atomic<Int>(0)

    func notificationFinished(outcome: NotificationOutcome, reason: String?, latency: Duration?) {
        switch outcome.kind {
        case .delivered: delivered.add(1, ordering: .relaxed)
        case .unregistered: dropTokens.add(1, ordering: .relaxed)
        default: break
        }
    }

    func notificationRetried(reason: String?) {
        retries.add(1, ordering: .relaxed)
    }
}
// LIBRARY-EXAMPLE-END

final class MetricsListenerTests: XCTestCase {
    private let app = "com.example.app"

    func testNoListenerByDefault() {
        let configuration = FanoutEngineConfiguration(endpoint: .sandbox)
        XCTAssertNil(configuration.metricsListener)
    }

    /// One alert delivered by `send`, then a job of a good token and a malformed one: each notification ends once,
    /// and only the good ones were written; the connection is reported open, then closed by the shutdown.
    func testSendsReportRequestsOutcomesInFlightAndConnections() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let listener = RecordingMetricsListener()
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.metricsListener = listener }
        let delivered = try await engine.send(
            .alert(AlertPayload(title: "Goal!", body: "2-1"), to: testDeviceToken(1), app: app))
        XCTAssertEqual(delivered.outcome, .delivered)
        let afterSend = listener.events
        XCTAssertEqual(afterSend.sentAttempts, [1])
        XCTAssertEqual(afterSend.finished.count, 1)
        let first = try XCTUnwrap(afterSend.finished.first)
        XCTAssertEqual(first.outcome, .delivered)
        XCTAssertNil(first.reason)
        let latency = try XCTUnwrap(first.latency, "an answered notification has its latency")
        XCTAssertGreaterThanOrEqual(latency, .zero)
        XCTAssertLessThan(latency, .seconds(30))
        XCTAssertEqual(afterSend.inFlight.last, 0, "nothing in flight once the send returned")

        let summary = try await engine.run(
            scoreUpdateJob(id: "one-bad-token", tokens: [testDeviceToken(2), "not-a-token"])
        ) { _ in }
        XCTAssertEqual(summary.counts.delivered, 1)
        XCTAssertEqual(summary.counts.unregistered, 1)
        await engine.shutdown()

        let events = listener.events
        XCTAssertEqual(events.sentAttempts, [1, 1], "the malformed token is never sent")
        XCTAssertEqual(events.finished.count, 3, "one outcome per notification")
        XCTAssertEqual(events.finished.filter { $0.outcome == .delivered }.count, 2)
        XCTAssertEqual(
            events.finished.filter { $0.outcome == .unregistered },
            [.init(outcome: .unregistered, reason: "BadDeviceToken", latency: nil)],
            "refused before sending: no answer, no latency")
        XCTAssertEqual(events.retryReasons.count, 0)
        XCTAssertEqual(events.inFlight.last, 0)
        XCTAssertEqual(events.connectionsAdded, 1)
        XCTAssertEqual(events.connectionsRemoved, 1, "the shutdown closed the connection")
        XCTAssertEqual(events.connectionFailures, [])
        XCTAssertEqual(mock.stats.accepted, 2)
    }

    /// APNs answers 429 every time: each attempt is written and retried with APNs's reason, and the notification
    /// ends `failed` once, after its last attempt.
    func testRetriesAreReportedWithTheirReason() async throws {
        let mock = try MockHarness {
            $0.failures = [InjectedFailure(rate: 1, status: 429, reason: "TooManyRequests")]
        }
        defer { mock.stop() }
        let listener = RecordingMetricsListener()
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) {
            $0.metricsListener = listener
            $0.maxAttempts = 3
            $0.retryBase = .milliseconds(1)
            $0.retryCap = .milliseconds(5)
        }
        let result = try await engine.send(.alert(AlertPayload(body: "hi"), to: testDeviceToken(2), app: app))
        await engine.shutdown()
        XCTAssertEqual(result.outcome, .failed)
        XCTAssertEqual(result.attempts, 3)

        let events = listener.events
        XCTAssertEqual(events.sentAttempts, [1, 2, 3])
        XCTAssertEqual(events.retryReasons, ["TooManyRequests", "TooManyRequests"])
        XCTAssertEqual(events.finished.count, 1)
        XCTAssertEqual(events.finished.first?.outcome, .failed)
        XCTAssertEqual(events.finished.first?.reason, "TooManyRequests")
        XCTAssertNotNil(events.finished.first?.latency)
    }

    /// Jobs over their workspace's budget (policy `reject`): the refused notifications are reported with the
    /// workspace and priority, and each also ends `rate_limited`, as its result does.
    func testWorkspaceBudgetRefusalsAreReported() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let listener = RecordingMetricsListener()
        // 3,600 jobs an hour with a 10-second burst: priority 10 may take 5 at once, then one a second.
        let limits = try RateLimiterRegistry(
            overrides: ["acme": RateBudget(requestsPerHour: 3600, burstSeconds: 10, policy: .reject)])
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) {
            $0.metricsListener = listener
            $0.rateLimits = limits
        }
        var counts = OutcomeCounts()
        for index in 0..<8 {
            var job = scoreUpdateJob(id: "acme-\(index)", tokens: [testDeviceToken(100 + index)])
            job.workspace = "acme"
            let summary = try await engine.run(job) { _ in }
            counts.delivered += summary.counts.delivered
            counts.rateLimited += summary.counts.rateLimited
        }
        await engine.shutdown()
        XCTAssertGreaterThan(counts.rateLimited, 0, "jobs past the burst are refused")
        XCTAssertGreaterThan(counts.delivered, 0, "the burst admits the first")

        let events = listener.events
        XCTAssertEqual(events.rateLimited.map(\.count).reduce(0, +), counts.rateLimited)
        XCTAssertTrue(
            events.rateLimited.allSatisfy { $0.workspace == "acme" && $0.priority == 10 }, "\(events.rateLimited)")
        XCTAssertEqual(events.finished.count, 8, "one outcome per notification")
        XCTAssertEqual(
            events.finished.filter { $0.outcome == .rateLimited },
            Array(
                repeating: .init(outcome: .rateLimited, reason: "RateLimited", latency: nil), count: counts.rateLimited)
        )
        XCTAssertEqual(events.finished.filter { $0.outcome == .delivered }.count, counts.delivered)
        XCTAssertEqual(events.sentAttempts.count, counts.delivered, "only the admitted were written")
    }

    /// No server on the port: each connection attempt's failure is reported, and no connection is ever added.
    func testConnectionFailuresAreReported() async throws {
        let mock = try MockHarness()
        let port = mock.port
        let material = mock.material
        mock.stop()
        let listener = RecordingMetricsListener()
        let engine = try makeEngine(host: "127.0.0.1", port: port, material: material, loops: 1, connections: 1) {
            $0.metricsListener = listener
            $0.maxConnectAttempts = 2
            $0.retryBase = .milliseconds(1)
            $0.retryCap = .milliseconds(5)
        }
        let result = try await engine.send(.alert(AlertPayload(body: "hi"), to: testDeviceToken(3), app: app))
        await engine.shutdown()
        XCTAssertEqual(result.outcome, .failed)

        let events = listener.events
        XCTAssertGreaterThanOrEqual(events.connectionFailures.count, 2, "\(events.connectionFailures)")
        XCTAssertEqual(events.connectionsAdded, 0)
        XCTAssertEqual(events.connectionsRemoved, 0)
        XCTAssertEqual(events.sentAttempts, [])
        XCTAssertEqual(events.finished.count, 1)
        XCTAssertEqual(events.finished.first?.outcome, .failed)
        XCTAssertNil(events.finished.first?.latency)
    }

    /// docs/LIBRARY.md's listener, compiled above, counts a send's outcome; the guide shows it verbatim.
    func testTheGuidesListenerCountsAndIsShownVerbatim() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let metrics = GatewayMetrics()
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.metricsListener = metrics }
        let result = try await engine.send(.alert(AlertPayload(body: "hi"), to: testDeviceToken(20), app: app))
        await engine.shutdown()
        XCTAssertEqual(result.outcome, .delivered)
        XCTAssertEqual(metrics.delivered.load(ordering: .relaxed), 1)
        XCTAssertEqual(metrics.dropTokens.load(ordering: .relaxed), 0)

        let here = URL(fileURLWithPath: #filePath)
        let source = try String(contentsOf: here, encoding: .utf8)
        let begin = try XCTUnwrap(source.range(of: "// LIBRARY-EXAMPLE-BEGIN\n"))
        let end = try XCTUnwrap(source.range(of: "\n// LIBRARY-EXAMPLE-END"))
        let example = String(source[begin.upperBound..<end.lowerBound])
        let guide = here.deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("docs/LIBRARY.md")
        let library = try String(contentsOf: guide, encoding: .utf8)
        XCTAssertTrue(library.contains(example), "docs/LIBRARY.md must show GatewayMetrics as compiled here")
    }

    /// A listener that implements only `notificationFinished` compiles and counts (the rest are no-ops).
    func testAListenerImplementsOnlyWhatItCounts() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let counter = DeliveredCounter()
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.metricsListener = counter }
        for index in 0..<3 {
            let result = try await engine.send(
                .alert(AlertPayload(body: "hi"), to: testDeviceToken(10 + index), app: app))
            XCTAssertEqual(result.outcome, .delivered)
        }
        await engine.shutdown()
        XCTAssertEqual(counter.delivered.load(ordering: .relaxed), 3)
    }
}
