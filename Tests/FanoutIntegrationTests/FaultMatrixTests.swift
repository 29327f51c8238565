import Fanout
import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation
import MockAPNsKit
import Synchronization
import XCTest

/// The short fault matrix: the engine against an in-process mock-apns, one run per
/// fault and one with the faults mixed. For every run:
/// - every notification ends with exactly one outcome (results counted per token);
/// - the mock's record accepts no notification twice, except those in flight on a connection that
///   died (dropped, or the mock killed): duplicates ≤ connection deaths × streams per connection;
/// - the process's resident memory does not grow across the run (see `memoryGrowthBound`);
/// - the run ends within a deadline derived from the retry and connect policy (`deadline(_:)`),
///   or the test fails instead of hanging.
///
/// `scripts/soak.sh` (`make soak`) is the long version, with `fanout send` and mock-apns processes.
final class FaultMatrixTests: XCTestCase {
    /// How one run is set up.
    struct Plan {
        var notifications = 20_000
        var loops = 2
        var connectionsPerLoop = 2
        /// Streams per connection: few, so a dropped connection loses few and the duplicate bound is tight.
        var streams = 100
        /// The mock's answer latency (mirrors the mock option, for the deadline).
        var latencyMilliseconds: UInt64 = 0
        var retryBaseMilliseconds: UInt64 = 5
        var retryCapMilliseconds: UInt64 = 50
        var maxAttempts = 8
        var maxConnectAttempts = 5
        var connectTimeoutMilliseconds: UInt64 = 1000
        var pingIntervalMilliseconds: UInt64 = 15_000
        /// Trust this CA instead of the mock's (the wrong-CA run).
        var caFile: String?
        /// Send to this port instead of the mock's (the unreachable run).
        var port: Int?
        /// The engine's in-flight limit (nil: its default).
        var maxInFlight: Int?
        /// No connection can succeed (wrong CA, unreachable): the deadline is one connect budget,
        /// whatever the job's size.
        var endpointUnusable = false
        /// Kill the mock and start it again on the same port once this share of results is in.
        var restartAfter: Double?

        var connections: Int { loops * connectionsPerLoop }
    }

    /// What one run came to.
    struct Report {
        var name: String
        var summary: JobSummary?
        var counts = OutcomeCounts()
        var reasons: [String: Int] = [:]
        /// Tokens with no result, or more than one.
        var missing = 0
        var repeated = 0
        /// Delivered tokens the mock never accepted.
        var deliveredNotAccepted = 0
        var record = RecordCounts(perToken: [], foreign: 0, lines: 0)
        var mock = MockTotals([])
        var restarts = 0
        var duplicateBound = 0
        var memoryBaseline = 0
        var memoryEnd = 0
        var memoryPeak = 0
        var seconds = 0.0
        var deadline = Duration.zero
        var timedOut = false
    }

    /// Resident memory may rise by this much from the warmed-up run (10% of results in) to its end.
    ///
    /// Why 50 MB: the engine's own working set is bounded (`maxInFlight` 1,024 pending notifications
    /// of well under 1 KB, plus per-connection nghttp2 and TLS buffers of a few hundred KB); the
    /// in-process mock legitimately grows by two 8-byte digests per accepted notification in its
    /// stats sets (about 4 MB per 200,000) and buffers up to 1 MiB of record; and glibc keeps freed
    /// memory in per-thread arenas (engine loops, mock loops, the test's cooperative pool), which
    /// shows as tens of MB of RSS that is reused, not leaked. A per-notification leak or an unbounded
    /// queue of 200,000 notifications (token, path, apns-id, pending record: ≥ 400 B each) would be
    /// 80 MB or more on the mixed run, well past the bound.
    static let memoryGrowthBound = 50 << 20

    private static let payload = Array(#"{"aps":{"alert":"fault matrix"}}"#.utf8)

    /// The longest a run may take: a slow floor for the work itself (0.5 ms per notification, a
    /// debug build on a loaded 2-core machine does 15 times better), the latency rounds, every
    /// attempt of one notification waiting out the retry cap, and every connection slot using up
    /// its connect attempts at the connect timeout (once more per restart), plus 10 s to start.
    ///
    /// When no connection can succeed, nothing is sent, so there is no work floor: the engine gets
    /// one connect budget (every slot's attempts at the connect timeout plus the retry cap) and 2 s.
    /// Once it has found the endpoint unusable, the rest of the job must fail at once, not wait
    /// for another round of attempts per batch of `maxInFlight`.
    static func deadline(_ plan: Plan) -> Duration {
        let connectBudget =
            plan.maxConnectAttempts * plan.connectionsPerLoop
            * Int(plan.connectTimeoutMilliseconds + plan.retryCapMilliseconds)
        if plan.endpointUnusable { return .milliseconds(2000 + connectBudget) }
        let latencyRounds =
            (plan.notifications + plan.connections * plan.streams - 1) / (plan.connections * plan.streams)
        var milliseconds = 10_000 + plan.notifications / 2
        milliseconds += latencyRounds * Int(plan.latencyMilliseconds)
        milliseconds += plan.maxAttempts * Int(plan.retryCapMilliseconds + plan.latencyMilliseconds)
        milliseconds += (plan.restartAfter == nil ? 1 : 2) * connectBudget
        return .milliseconds(milliseconds)
    }

    /// Runs one job of `plan.notifications` tokens (from a tokens file, streamed) through a fresh
    /// engine against a fresh mock with `faults`, and checks what every run must satisfy.
    private func run(
        _ name: String, plan: Plan = Plan(), faults: (inout MockOptions) -> Void = { _ in },
        file: StaticString = #filePath, line: UInt = #line
    ) async throws -> Report {
        let mock = try RestartableMock(faults)
        defer { mock.stop() }
        let total = plan.notifications
        let tokensFile = try writeTestTokens(count: total, directory: mock.directory)

        var configuration = FanoutEngineConfiguration(
            endpoint: APNsEndpoint(host: "localhost", port: plan.port ?? mock.port),
            credentials: ProviderCredentials(
                keyPath: mock.material.authKeyP8Path, keyID: "KEYID12345", teamID: "TEAMID1234"),
            caFile: plan.caFile ?? mock.material.caPEMPath)
        configuration.loops = plan.loops
        configuration.connectionsPerLoop = plan.connectionsPerLoop
        configuration.maxConcurrentStreams = plan.streams
        configuration.retryBase = .milliseconds(plan.retryBaseMilliseconds)
        configuration.retryCap = .milliseconds(plan.retryCapMilliseconds)
        configuration.maxAttempts = plan.maxAttempts
        configuration.maxConnectAttempts = plan.maxConnectAttempts
        configuration.connectTimeout = .milliseconds(plan.connectTimeoutMilliseconds)
        configuration.pingInterval = .milliseconds(plan.pingIntervalMilliseconds)
        configuration.rateLimits = nil
        configuration.maxInFlight = plan.maxInFlight
        let engine = try FanoutEngine(configuration: configuration)
        let job = FanoutJob(
            id: name, headers: NotificationHeaders(pushType: .alert, topic: "com.example.app"),
            payload: .raw(Self.payload), recipients: .file(path: tokensFile))

        // Memory: sampled every 20 ms; the baseline is the first sample once 10% of results are in
        // (connections, TLS and buffers warmed up), or the one before the run when it is shorter.
        let progress = RunProgress(count: total, memory: processMemory()?.resident ?? 0)
        let sampler = Task.detached {
            while !progress.finished.load(ordering: .relaxed) {
                if let sample = processMemory() {
                    let warmedUp = progress.done.load(ordering: .relaxed) >= total / 10
                    progress.memory.withLock { $0.add(sample.resident, warmedUp: warmedUp) }
                }
                try? await Task.sleep(for: .milliseconds(20))
            }
        }
        let restarter = Task.detached { () -> Error? in
            guard let share = plan.restartAfter else { return nil }
            while !progress.finished.load(ordering: .relaxed)
                && progress.done.load(ordering: .relaxed) < Int(Double(total) * share)
            {
                try? await Task.sleep(for: .milliseconds(2))
            }
            if progress.finished.load(ordering: .relaxed) {
                return ProcessSupportError("the run ended before the restart")
            }
            do { try mock.restart() } catch { return error }
            return nil
        }

        var report = Report(name: name)
        report.deadline = Self.deadline(plan)
        let started = ContinuousClock.now
        let summary = try await withDeadline(report.deadline, onTimeout: { await engine.shutdown(gracePeriod: .zero) })
        {
            try await engine.run(job) { result in
                progress.tally.withLock { $0.add(result) }
                progress.done.add(1, ordering: .relaxed)
            }
        }
        report.seconds = (ContinuousClock.now - started) / .seconds(1)
        if let sample = processMemory() { progress.memory.withLock { $0.add(sample.resident, warmedUp: true) } }
        progress.finished.store(true, ordering: .relaxed)
        _ = await sampler.result
        if let error = await restarter.value { XCTFail("\(name): \(error)", file: file, line: line) }
        if summary == nil {
            report.timedOut = true
            XCTFail(
                "\(name): the run did not end within its deadline of \(report.deadline) "
                    + "(\(progress.done.load(ordering: .relaxed)) of \(total) results)", file: file, line: line)
            // The engine was shut down at the deadline: what it had not finished ends `failed`
            // (NotSent). Wait (bounded) for those results, so that exactly-once is still checked.
            let wait = ContinuousClock.now + .seconds(10)
            while progress.done.load(ordering: .relaxed) < total && ContinuousClock.now < wait {
                try await Task.sleep(for: .milliseconds(10))
            }
        }
        await engine.shutdown(gracePeriod: .seconds(5))
        report.summary = summary
        report.restarts = mock.restarts
        report.mock = mock.totals()
        XCTAssertTrue(mock.stop(), "\(name): mock-apns did not stop", file: file, line: line)
        report.record = try mock.acceptedPerToken(count: total)

        let tallied = progress.tally.withLock { $0 }
        report.counts = tallied.counts
        report.reasons = tallied.reasons
        for index in 0..<total {
            switch tallied.perToken[index] {
            case 0: report.missing += 1
            case 1: break
            default: report.repeated += 1
            }
            if tallied.delivered[index] && report.record.perToken[index] == 0 { report.deliveredNotAccepted += 1 }
        }
        let samples = progress.memory.withLock { $0 }
        report.memoryBaseline = samples.baseline ?? samples.start
        report.memoryEnd = samples.last
        report.memoryPeak = max(samples.peak, report.memoryBaseline)
        // Each connection that died (dropped by the mock, or all of them when it was killed) may
        // have carried up to `streams` notifications the mock had accepted but not answered.
        report.duplicateBound = (report.mock.drops + report.restarts * plan.connections) * plan.streams

        print(Self.describe(report))
        if !report.timedOut {
            XCTAssertEqual(
                summary?.notifications, total, "\(name): one outcome per notification", file: file, line: line)
        }
        XCTAssertEqual(report.counts.total, total, "\(name): results counted", file: file, line: line)
        XCTAssertEqual(report.missing, 0, "\(name): tokens without an outcome", file: file, line: line)
        XCTAssertEqual(report.repeated, 0, "\(name): tokens with more than one outcome", file: file, line: line)
        XCTAssertEqual(tallied.foreign, 0, "\(name): results for tokens not in the job", file: file, line: line)
        XCTAssertEqual(
            report.record.foreign, 0, "\(name): the mock accepted tokens not in the job", file: file, line: line)
        XCTAssertEqual(
            report.deliveredNotAccepted, 0, "\(name): delivered, yet the mock never accepted it", file: file, line: line
        )
        XCTAssertLessThanOrEqual(
            report.record.duplicates, report.duplicateBound,
            "\(name): accepted twice beyond the in-flight bound (\(report.mock.drops) drops, \(report.restarts) restarts)",
            file: file, line: line)
        // A library must not kill its host: writes to a connection the server has closed (libuv
        // uses write(2), no MSG_NOSIGNAL) raise SIGPIPE, whose default action ends the process.
        // The engine's loops ignore it (before that, the mixed run killed this test process).
        XCTAssertTrue(
            sigpipeIsHandled(), "\(name): SIGPIPE still has its default action (it ends the process)", file: file,
            line: line)
        XCTAssertLessThan(
            report.memoryEnd - report.memoryBaseline, Self.memoryGrowthBound,
            "\(name): resident memory grew from \(report.memoryBaseline >> 20) MB to \(report.memoryEnd >> 20) MB",
            file: file, line: line)
        XCTAssertLessThan(
            report.memoryPeak - report.memoryBaseline, Self.memoryGrowthBound,
            "\(name): resident memory peaked at \(report.memoryPeak >> 20) MB from \(report.memoryBaseline >> 20) MB",
            file: file, line: line)
        return report
    }

    private static func describe(_ report: Report) -> String {
        let counts = report.counts
        let reasons = report.reasons.sorted { $0.value > $1.value }.prefix(3).map { "\($0.key) ×\($0.value)" }
        return "fault-matrix \(report.name): \(counts.total) outcomes (delivered \(counts.delivered), "
            + "rejected \(counts.rejected), failed \(counts.failed), retries \(counts.retries)); "
            + "accepted \(report.record.lines), duplicates \(report.record.duplicates) ≤ \(report.duplicateBound); "
            + "mock: \(report.mock.requests) requests, \(report.mock.connections) connections, "
            + "\(report.mock.drops) drops, \(report.mock.goaways) GOAWAYs, \(report.mock.refused) refused, "
            + "\(report.mock.streamLimitViolations) stream-limit violations, "
            + "\(report.restarts) restarts; RSS \(report.memoryBaseline >> 20) → \(report.memoryEnd >> 20) MB "
            + "(peak \(report.memoryPeak >> 20)); \(String(format: "%.2f", report.seconds)) s of \(report.deadline); "
            + "SIGPIPE handled: \(sigpipeIsHandled())"
            + (reasons.isEmpty ? "" : "; reasons: \(reasons.joined(separator: ", "))")
    }

    // MARK: One fault per run

    /// GOAWAY every 250 requests over 50,000 notifications: 200 GOAWAYs, most of them in the steady
    /// state where the engine refills streams as answers come in.
    ///
    /// Found here and fixed: mock-apns used to answer (and record) streams that arrived after it had
    /// queued its GOAWAY, above the last stream id it announced; the client rightly resent them, so
    /// tens to hundreds per run were accepted twice.
    ///
    /// Also found here, and fixed in 8b52fee: the client counted an attempt for streams that were
    /// never processed. When the server closed the connection right after its GOAWAY, requests
    /// still queued in nghttp2 (ids above the GOAWAY's last stream id, never sent) were completed
    /// as `connectionLost` by `HTTP2ClientConnection.teardown` instead of `notProcessed`, so they
    /// were retried as attempts that may have reached APNs and used up the retry budget (13 to 85
    /// per run here with an instrumented build; 439 of 20,000 in a `fanout send` run with a GOAWAY
    /// every 5,000).
    func testGoawayEveryNStreamsLosesNothingAndSendsNothingTwice() async throws {
        var plan = Plan()
        plan.notifications = 50_000
        let report = try await run("goaway", plan: plan) { $0.goawayEvery = 250 }
        XCTAssertGreaterThan(report.mock.goaways, 100)
        XCTAssertEqual(report.counts.delivered, report.counts.total, "\(report.reasons)")
        // A GOAWAY is graceful: streams it covers are answered, the others were never processed,
        // so they are resent without counting an attempt, and none is accepted twice.
        XCTAssertEqual(report.record.duplicates, 0, "accepted twice after a graceful GOAWAY")
        XCTAssertEqual(report.counts.retries, 0, "streams above the GOAWAY's last stream id counted as attempts")
    }

    func testTCPDropEveryNStreamsDeliversEverythingWithBoundedDuplicates() async throws {
        let report = try await run("drop") { $0.dropEvery = 2000 }
        XCTAssertGreaterThan(report.mock.drops, 5)
        XCTAssertEqual(report.counts.delivered, report.counts.total, "\(report.reasons)")
        XCTAssertGreaterThan(report.counts.retries, 0, "notifications in flight on a dropped connection are retried")
    }

    /// One connection with a thousand streams open dropped in a small job: every stream it carried is retried. The
    /// retry budget (20% of the first attempts of the last 10 s, plus 10: about 610 here) is asked once for the lost
    /// connection, not once per stream, which failed about 400 of these for good ("RetryBudgetExhausted").
    func testOneDroppedConnectionFullOfStreamsIsRetriedWhole() async throws {
        var plan = Plan()
        plan.notifications = 3000
        plan.loops = 1
        plan.connectionsPerLoop = 1
        plan.streams = 1000
        plan.latencyMilliseconds = 50
        let report = try await run("drop-full-window", plan: plan) {
            $0.dropEvery = 1500
            $0.latencyMilliseconds = 50
        }
        XCTAssertGreaterThan(report.mock.drops, 0)
        XCTAssertEqual(report.counts.delivered, report.counts.total, "\(report.reasons)")
        XCTAssertGreaterThan(report.counts.retries, 500, "the dropped connection's streams were retried")
    }

    /// A refused stream is resent at once without counting an attempt, 8 times for one notification
    /// (EngineLoop.maxFreeResends); the 9th refusal in a row counts one. The mock refuses every 50th request it
    /// receives, a strict period that the client's batches can fall into step with under load, so that a resent
    /// notification is the 50th again and again (seen: 3 such of 20,000 with another test process on the cores).
    /// So: every counted attempt took at least 9 refusals (were refusals attempts, retries would be about 400).
    func testRefusedStreamsAreResentWithoutCountingAnAttempt() async throws {
        let report = try await run("refused-stream") { $0.refuseEvery = 50 }
        XCTAssertGreaterThan(report.mock.refused, 100)
        XCTAssertEqual(report.counts.delivered, report.counts.total, "\(report.reasons)")
        XCTAssertLessThanOrEqual(
            report.counts.retries * 9, report.mock.refused,
            "REFUSED_STREAM is not an attempt: \(report.counts.retries) retries for \(report.mock.refused) refusals")
        XCTAssertEqual(report.record.duplicates, 0)
    }

    func testThrottleAfterRejectWithRejectionsEndsEachNotificationOnce() async throws {
        let report = try await run("throttle-after-reject") {
            $0.throttleAfterReject = true
            $0.failures = [
                InjectedFailure(rate: 0.01, status: 400, reason: "BadTopic"),
                InjectedFailure(rate: 0.02, status: 503, reason: "ServiceUnavailable"),
            ]
            $0.seed = 11
        }
        let counts = report.counts
        XCTAssertGreaterThan(counts.rejected, 0, "the injected permanent rejections")
        XCTAssertEqual(counts.delivered + counts.rejected, counts.total, "\(report.reasons)")
        XCTAssertEqual(report.reasons.keys.sorted(), ["BadTopic"], "only the permanent reason remains")
        XCTAssertEqual(report.record.duplicates, 0)
    }

    func testServerErrorsAreRetriedUntilDelivered() async throws {
        let report = try await run("5xx") {
            $0.failures = [
                InjectedFailure(rate: 0.05, status: 500, reason: "InternalServerError"),
                InjectedFailure(rate: 0.05, status: 503, reason: "ServiceUnavailable"),
            ]
            $0.seed = 5
        }
        XCTAssertEqual(report.counts.delivered, report.counts.total, "\(report.reasons)")
        XCTAssertGreaterThan(report.counts.retries, report.counts.total / 20)
        XCTAssertEqual(report.record.duplicates, 0)
    }

    func testTooManyRequestsIsRetriedUntilDelivered() async throws {
        let report = try await run("429") {
            $0.failures = [InjectedFailure(rate: 0.08, status: 429, reason: "TooManyRequests")]
            $0.seed = 429
        }
        XCTAssertEqual(report.counts.delivered, report.counts.total, "\(report.reasons)")
        XCTAssertGreaterThan(report.counts.retries, report.counts.total / 20)
        XCTAssertEqual(report.record.duplicates, 0)
    }

    /// mock-apns has no latency-spike option, only a fixed latency: every answer is held 300 ms, longer
    /// than the engine's PING interval (200 ms here), so the engine pings a server that is slow but
    /// alive, and must not take it for a dead one; the run must end within the latency-derived
    /// deadline. (Fewer, narrower connections than the other runs: a debug-build mock on one loop
    /// answering 4,000 streams at once can itself be late to answer a PING.)
    func testHighLatencyIsNotMistakenForADeadConnection() async throws {
        var plan = Plan()
        plan.notifications = 6000
        plan.connectionsPerLoop = 1
        plan.streams = 500
        plan.latencyMilliseconds = 300
        plan.pingIntervalMilliseconds = 200
        let report = try await run("latency-300ms", plan: plan) { $0.latencyMilliseconds = 300 }
        XCTAssertEqual(report.counts.delivered, report.counts.total, "\(report.reasons)")
        XCTAssertEqual(report.counts.retries, 0, "no answer was given up on")
        XCTAssertEqual(report.mock.connections, plan.connections, "no connection was replaced")
        XCTAssertGreaterThanOrEqual(
            report.seconds, 0.3 * Double(plan.notifications / (plan.connections * plan.streams)))
    }

    func testMockKilledAndRestartedOnTheSamePortMidRun() async throws {
        var plan = Plan()
        plan.latencyMilliseconds = 2
        plan.restartAfter = 0.3
        plan.maxConnectAttempts = 20
        let report = try await run("mock-restart", plan: plan) { $0.latencyMilliseconds = 2 }
        XCTAssertEqual(report.restarts, 1)
        XCTAssertEqual(report.counts.delivered, report.counts.total, "\(report.reasons)")
        XCTAssertGreaterThan(report.mock.connections, plan.connections, "the engine reconnected to the new mock")
    }

    /// A plan for the runs where no connection can succeed: one loop, short connect timeouts
    /// (loopback refuses or answers at once), a 200 ms retry cap, and an in-flight limit of one
    /// batch (256), so that the job is many times `maxInFlight`, as a million-token job is with the
    /// default limit.
    private func unusableEndpointPlan() -> Plan {
        var plan = Plan()
        plan.notifications = 50_000
        plan.loops = 1
        plan.maxInFlight = 256
        plan.connectTimeoutMilliseconds = 100
        plan.retryCapMilliseconds = 200
        plan.endpointUnusable = true
        return plan
    }

    /// The engine trusts another CA than the one that signed the mock's certificate: every
    /// notification fails naming the TLS problem, within one connect budget.
    ///
    /// Found here and fixed: each later batch of up to `maxInFlight` used to wait for the slot's next
    /// reconnect timer before failing in turn, so the time to fail grew with the job (minutes for
    /// 200,000 with `fanout send`'s defaults).
    func testWrongCAFailsEveryNotificationNamingTheTLSProblem() async throws {
        let otherDirectory = try ProcessSupport.temporaryDirectory(for: self, "other-ca")
        let other = try TestTLSMaterial.createOrReuse(in: otherDirectory)
        var plan = unusableEndpointPlan()
        plan.caFile = other.caPEMPath
        let report = try await run("wrong-ca", plan: plan)
        XCTAssertEqual(report.counts.failed, report.counts.total, "\(report.reasons)")
        XCTAssertTrue(
            report.reasons.keys.allSatisfy { $0.contains("TLS") && $0.contains("unknown CA") }, "\(report.reasons)")
        XCTAssertEqual(report.mock.requests, 0, "nothing reached the mock")
        XCTAssertEqual(report.record.lines, 0)
    }

    /// Nothing listens on the port (a mock that was started and stopped, so the port is free):
    /// every notification fails, within one connect budget.
    ///
    /// Found here and fixed: each batch of up to `maxInFlight` used to wait for its own round of
    /// connect attempts at the retry cap, so the time to fail grew with the job (20,000
    /// notifications to a closed port took 74 s with `fanout send`'s defaults).
    func testUnreachableEndpointFailsEveryNotification() async throws {
        let gone = try MockHarness()
        let port = gone.port
        gone.stop()
        var plan = unusableEndpointPlan()
        plan.port = port
        let report = try await run("unreachable", plan: plan)
        XCTAssertEqual(report.counts.failed, report.counts.total, "\(report.reasons)")
        XCTAssertTrue(report.reasons.keys.allSatisfy { $0.hasPrefix("ConnectionFailed") }, "\(report.reasons)")
        XCTAssertEqual(report.record.lines, 0)
    }

    // MARK: Bounded memory

    /// Memory stays flat only if `maxInFlight` holds. With answers held 50 ms and at most 100 in
    /// flight, no more than 2,000 notifications a second can complete, and the in-flight count can
    /// never be negative.
    ///
    /// Found by this test, and fixed in 8b52fee: `InFlightLimiter.acquire` clamps a request to the
    /// capacity, so a batch of 256 took only `maxInFlight` permits when the limit was below 256, yet
    /// each of its 256 notifications released one: permits multiplied, `inFlight` went negative, and
    /// the limit was no longer enforced (the job ran at the connection's full 1,000 streams). Batches
    /// are now never larger than the limit.
    func testInFlightLimitBelowOneBatchIsStillEnforced() async throws {
        let mock = try MockHarness { $0.latencyMilliseconds = 50 }
        defer { mock.stop() }
        var configuration = FanoutEngineConfiguration(
            endpoint: APNsEndpoint(host: "localhost", port: mock.port),
            credentials: ProviderCredentials(
                keyPath: mock.material.authKeyP8Path, keyID: "KEYID12345", teamID: "TEAMID1234"),
            caFile: mock.material.caPEMPath)
        configuration.loops = 1
        configuration.maxInFlight = 100
        configuration.rateLimits = nil
        let engine = try FanoutEngine(configuration: configuration)
        let total = 3000
        let job = FanoutJob(
            id: "narrow", headers: NotificationHeaders(pushType: .alert, topic: "com.example.app"),
            payload: .raw(Self.payload), recipients: .tokens((0..<total).map { testDeviceToken($0) }))
        let lowest = Atomic<Int>(0)
        let highest = Atomic<Int>(0)
        let started = ContinuousClock.now
        let summary = try await withDeadline(.seconds(30), onTimeout: { await engine.shutdown(gracePeriod: .zero) }) {
            try await engine.run(job) { _ in
                let inFlight = engine.inFlight
                lowest.min(inFlight, ordering: .relaxed)
                highest.max(inFlight, ordering: .relaxed)
            }
        }
        let seconds = (ContinuousClock.now - started) / .seconds(1)
        await engine.shutdown()
        XCTAssertEqual(summary?.counts.delivered, total)
        XCTAssertGreaterThanOrEqual(lowest.load(ordering: .relaxed), 0, "in-flight count below zero")
        XCTAssertLessThanOrEqual(highest.load(ordering: .relaxed), 100, "in flight beyond maxInFlight")
        XCTAssertGreaterThanOrEqual(
            seconds, 0.9 * Double(total) / 2000,
            "faster than 100 in flight at 50 ms each allows: the limit was not held")
    }

    // MARK: All mixed

    /// GOAWAYs, drops, REFUSED_STREAM, throttling after rejections, 5xx, 429, permanent rejections and
    /// latency at once, and the mock killed and restarted in the middle: 200,000 notifications, long
    /// enough for the memory check to mean something.
    ///
    /// It used to kill the test process with SIGPIPE most of the time (see the check in `run`).
    func testAllFaultsMixed() async throws {
        var plan = Plan()
        plan.notifications = 200_000
        plan.latencyMilliseconds = 1
        plan.restartAfter = 0.4
        plan.maxConnectAttempts = 20
        let report = try await run("mixed", plan: plan) {
            $0.goawayEvery = 3001
            $0.dropEvery = 5003
            $0.refuseEvery = 97
            $0.throttleAfterReject = true
            $0.latencyMilliseconds = 1
            $0.failures = [
                InjectedFailure(rate: 0.02, status: 503, reason: "ServiceUnavailable"),
                InjectedFailure(rate: 0.01, status: 500, reason: "InternalServerError"),
                InjectedFailure(rate: 0.01, status: 429, reason: "TooManyRequests"),
                InjectedFailure(rate: 0.002, status: 400, reason: "BadTopic"),
            ]
            $0.seed = 2026
        }
        let counts = report.counts
        XCTAssertGreaterThan(report.mock.goaways, 0)
        XCTAssertGreaterThan(report.mock.drops, 0)
        XCTAssertGreaterThan(report.mock.refused, 0)
        XCTAssertEqual(report.restarts, 1)
        XCTAssertGreaterThan(counts.rejected, 0)
        XCTAssertEqual(counts.delivered + counts.rejected, counts.total, "\(report.reasons)")
        XCTAssertEqual(counts.failed, 0, "\(report.reasons)")
    }
}

/// What a run's threads share: results, progress, memory samples.
private final class RunProgress: Sendable {
    let tally: FanoutMutex<Tally>
    let done = Atomic<Int>(0)
    let finished = Atomic<Bool>(false)
    let memory: FanoutMutex<MemorySamples>

    init(count: Int, memory start: Int) {
        tally = FanoutMutex(Tally(count: count))
        memory = FanoutMutex(MemorySamples(start: start))
    }
}

/// Results of one run, per token (`testDeviceToken(index)`), filled from the engine's threads.
private struct Tally {
    var perToken: [UInt8]
    var delivered: [Bool]
    var counts = OutcomeCounts()
    var reasons: [String: Int] = [:]
    var foreign = 0

    init(count: Int) {
        perToken = [UInt8](repeating: 0, count: count)
        delivered = [Bool](repeating: false, count: count)
    }

    mutating func add(_ result: NotificationResult) {
        counts.add(result)
        if result.outcome != .delivered { reasons[result.reason ?? "nil", default: 0] += 1 }
        guard let token = result.token, token.hasPrefix("f"), let index = Int(token.dropFirst(), radix: 16),
            index >= 0, index < perToken.count
        else {
            foreign += 1
            return
        }
        perToken[index] = perToken[index] &+ 1
        if result.outcome == .delivered { delivered[index] = true }
    }
}

/// Resident-memory samples of one run.
private struct MemorySamples {
    var start: Int
    var baseline: Int?
    var last: Int
    var peak: Int

    init(start: Int) {
        self.start = start
        last = start
        peak = 0
    }

    mutating func add(_ resident: Int, warmedUp: Bool) {
        if warmedUp && baseline == nil { baseline = resident }
        last = resident
        if baseline != nil { peak = max(peak, resident) }
    }
}
