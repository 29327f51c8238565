import Fanout
import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation
import MockAPNsKit
import Synchronization
import XCTest

/// The fan-out engine against mock-apns on port 0, with TLS and provider tokens on.
final class EngineTests: XCTestCase {
    /// A Live Activity update built from typed fields (`contentState` defaults to a score).
    private func liveActivityJob(id: String, tokens: [String], payload contentState: String? = nil) -> FanoutJob {
        let state = try! RawJSON(validating: contentState ?? #"{"home":2,"away":1}"#)
        return FanoutJob.liveActivity(
            id: id, bundleID: "com.example.app",
            content: LiveActivityContent(event: .update, timestamp: 1_764_460_800, contentState: state),
            recipients: .tokens(tokens))
    }

    func testOneJobOf200000TokensIsDeliveredOnceEachWithOneEncoding() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock)
        let tokens = (0..<200_000).map { testDeviceToken($0) }
        let delivered = Atomic<Int>(0)
        let summary = try await engine.run(liveActivityJob(id: "big", tokens: tokens)) { result in
            if result.outcome == .delivered { delivered.add(1, ordering: .relaxed) }
        }
        await engine.shutdown()
        XCTAssertEqual(summary.notifications, 200_000)
        XCTAssertEqual(summary.counts.delivered, 200_000)
        XCTAssertEqual(delivered.load(ordering: .relaxed), 200_000)
        XCTAssertEqual(summary.payloadEncodings, 1)
        XCTAssertEqual(engine.payloadEncodings, 1)
        XCTAssertEqual(mock.stats.accepted, 200_000)
        XCTAssertEqual(mock.stats.snapshot()["distinct_tokens"] as? Int, 200_000)
        XCTAssertEqual(mock.stats.duplicateApnsIDs, 0)
        XCTAssertEqual(mock.stats.streamLimitViolations, 0)
    }

    func testThousandJobsWithDistinctPayloadsEncodeEachOnce() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock)
        let summaries = try await withThrowingTaskGroup(of: JobSummary.self) { group in
            for job in 0..<1000 {
                let tokens = (0..<100).map { testDeviceToken(job * 100 + $0) }
                let fanoutJob = liveActivityJob(id: "job-\(job)", tokens: tokens, payload: #"{"job":\#(job)}"#)
                group.addTask { try await engine.run(fanoutJob) { _ in } }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        await engine.shutdown()
        XCTAssertEqual(summaries.count, 1000)
        XCTAssertEqual(summaries.reduce(0) { $0 + $1.counts.delivered }, 100_000)
        XCTAssertEqual(summaries.reduce(0) { $0 + $1.payloadEncodings }, 1000)
        XCTAssertEqual(engine.payloadEncodings, 1000)
        XCTAssertEqual(mock.stats.accepted, 100_000)
    }

    func testStreamLimitOfTenIsNeverExceeded() async throws {
        let mock = try MockHarness { $0.maxStreams = 10 }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock)
        let tokens = (0..<20_000).map { testDeviceToken($0) }
        let summary = try await engine.run(liveActivityJob(id: "narrow", tokens: tokens)) { _ in }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.delivered, 20_000)
        XCTAssertEqual(
            mock.stats.streamLimitViolations, 0, "no stream past the limit, nor past 1 before the first valid token")
        XCTAssertEqual(mock.stats.count(status: 200), 20_000)
    }

    /// A server that refuses every stream: each notification is resent at once a few times, then each refusal
    /// counts as an attempt, and the job ends with every token `failed` (RefusedStream). Before, a refused stream
    /// was resent at once for ever, uncounted: 90,000 refusals in 15 s for one notification, the job never ending.
    func testAServerRefusingEveryStreamEndsTheJobAsFailed() async throws {
        let mock = try MockHarness { $0.refuseEvery = 1 }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) {
            $0.maxAttempts = 3
            $0.retryBase = .milliseconds(1)
            $0.retryCap = .milliseconds(2)
            $0.retryBudgetRatio = 1
        }
        let tokens = (0..<20).map { testDeviceToken($0) }
        let reasons = FanoutMutex<[String: Int]>([:])
        let job = liveActivityJob(id: "refused", tokens: tokens)
        guard
            let finished = try await withDeadline(
                .seconds(30),
                {
                    try await engine.run(job) { result in
                        reasons.withLock { $0[result.reason ?? "none", default: 0] += 1 }
                    }
                })
        else {
            return XCTFail("the job did not end within 30 s (\(mock.stats.snapshot()["streams_refused"] ?? 0) refused)")
        }
        await engine.shutdown()
        XCTAssertEqual(finished.counts.failed, 20, "\(finished.counts)")
        // With no success the retry budget runs out too: "RetryBudgetExhausted: RefusedStream" for some.
        let seen = reasons.withLock { $0 }
        XCTAssertEqual(seen.values.reduce(0, +), 20)
        XCTAssertTrue(seen.keys.allSatisfy { $0.hasSuffix("RefusedStream") }, "\(seen)")
        // 8 free resends each (EngineLoop.maxFreeResends), then the first counted attempt and at most 2 retries.
        let refused = try XCTUnwrap(mock.stats.snapshot()["streams_refused"] as? Int)
        XCTAssertTrue((20 * (8 + 1))...(20 * (8 + 3)) ~= refused, "\(refused) refusals")
    }

    /// A server that raises its stream limit while it holds every open stream: the engine hears the SETTINGS and
    /// fills the new room at once. Before, only a stream's completion woke its queue, so the requests waited for an
    /// answer the server was never going to give first (here: until the request deadline).
    func testARaisedStreamLimitIsFilledWithoutWaitingForAnAnswer() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("fanout-tls-\(UUID().uuidString)")
            .path
        TemporaryDirectories.removeAtExit(directory)
        let material = try TestTLSMaterial.createOrReuse(in: directory)
        let handler = LimitRaisingHandler()
        let server = try HTTP2Server(
            host: "127.0.0.1", port: 0, threads: 1,
            tls: TLSServerContext(
                TLSServerConfiguration(certificateFile: material.serverCertPath, privateKeyFile: material.serverKeyPath)
            ),
            initialMaxStreams: 2, makeHandler: { _ in handler })
        defer { server.shutdown() }
        let engine = try makeEngine(port: server.port, material: material, loops: 1, connections: 1) {
            $0.requestTimeout = .seconds(60)
        }
        let job = liveActivityJob(id: "raised", tokens: (0..<200).map { testDeviceToken($0) })
        guard let finished = try await withDeadline(.seconds(30), { try await engine.run(job) { _ in } }) else {
            return XCTFail("the job did not end within 30 s: held \(handler.peakHeld.load(ordering: .relaxed))")
        }
        await engine.shutdown()
        XCTAssertEqual(finished.counts.delivered, 200, "\(finished.counts)")
        XCTAssertGreaterThanOrEqual(handler.peakHeld.load(ordering: .relaxed), LimitRaisingHandler.heldToRelease)
        XCTAssertEqual(handler.violations.load(ordering: .relaxed), 0)
    }

    /// A connection whose stream ids run out (2^31 - 1 of them: an hour and a half at full speed) drains and another
    /// takes its place: the job goes on, each token delivered once. Before, the request nghttp2 refused was put back
    /// and offered to the same connection for ever, the loop thread spinning and the job never ending.
    func testAConnectionOutOfStreamIDsIsReplacedAndTheJobGoesOn() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        // Stream ids from 2^31 - 41 to 2^31 - 1: 21 streams per connection.
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.firstStreamID = Int32.max - 40 }
        let job = liveActivityJob(id: "long", tokens: (0..<1_000).map { testDeviceToken($0) })
        guard let finished = try await withDeadline(.seconds(60), { try await engine.run(job) { _ in } }) else {
            // Left running: a loop stuck like that would hang shutdown too.
            return XCTFail("the job did not end within 60 s")
        }
        await engine.shutdown()
        XCTAssertEqual(finished.counts.delivered, 1_000, "\(finished.counts)")
        XCTAssertEqual(mock.stats.accepted, 1_000)
        XCTAssertEqual(mock.stats.duplicateApnsIDs, 0)
        let connections = try XCTUnwrap(mock.stats.snapshot()["connections"] as? Int)
        XCTAssertGreaterThanOrEqual(connections, 1_000 / 21, "a new connection for every 21 streams")
    }

    /// `Shutdown`, `ServiceUnavailable` and `IdleTimeout` mean "reconnect": their retries go to a new connection, not
    /// back to the server that is going away (before, only the provider-token reasons closed the connection).
    func testAnAnswerThatAsksForANewConnectionGetsOne() async throws {
        for (status, reason) in [(503, "Shutdown"), (400, "IdleTimeout")] {
            let mock = try MockHarness { $0.failures = [InjectedFailure(rate: 0.05, status: status, reason: reason)] }
            defer { mock.stop() }
            let engine = try makeEngine(for: mock, loops: 1, connections: 1) {
                $0.retryBase = .milliseconds(1)
                $0.retryCap = .milliseconds(5)
                $0.retryBudgetRatio = 1
            }
            let job = liveActivityJob(id: "reconnect", tokens: (0..<400).map { testDeviceToken($0) })
            let summary = try await engine.run(job) { _ in }
            await engine.shutdown()
            XCTAssertEqual(summary.counts.delivered, 400, "\(reason): \(summary.counts)")
            let refusals = mock.stats.count(reason: reason)
            XCTAssertGreaterThan(refusals, 0, reason)
            let connections = try XCTUnwrap(mock.stats.snapshot()["connections"] as? Int)
            XCTAssertGreaterThan(connections, 1, "\(reason): \(refusals) answers asked for a new connection")
        }
    }

    /// `ServiceUnavailable` (an overloaded APNs) gets a new connection only once the one it came on has been up
    /// `overloadReconnectInterval` (5 s; 0.2 s here): a connection opens one stream until its first answer, so
    /// reconnecting at every 503 would be a handshake per request, a storm while the service is overloaded.
    func testAnOverloadedServiceIsNotReconnectedToAtEvery503() async throws {
        let retries: (inout FanoutEngineConfiguration) -> Void = {
            $0.retryBase = .milliseconds(1)
            $0.retryCap = .milliseconds(5)
            $0.retryBudgetRatio = 1
        }
        let everyAnswer = try MockHarness {
            $0.failures = [InjectedFailure(rate: 1, status: 503, reason: "ServiceUnavailable")]
        }
        defer { everyAnswer.stop() }
        let storm = try makeEngine(for: everyAnswer, loops: 1, connections: 1) {
            retries(&$0)
            $0.maxAttempts = 3
            $0.overloadReconnectInterval = .seconds(60)
        }
        let failed = try await storm.run(liveActivityJob(id: "storm", tokens: (0..<50).map { testDeviceToken($0) })) {
            _ in
        }
        await storm.shutdown()
        XCTAssertEqual(failed.counts.failed, 50, "\(failed.counts)")
        XCTAssertEqual(everyAnswer.stats.snapshot()["connections"] as? Int, 1, "150 answers of 503 on one connection")

        let someAnswers = try MockHarness {
            $0.failures = [InjectedFailure(rate: 0.05, status: 503, reason: "ServiceUnavailable")]
        }
        defer { someAnswers.stop() }
        let engine = try makeEngine(for: someAnswers, loops: 1, connections: 1) {
            retries(&$0)
            $0.overloadReconnectInterval = .milliseconds(200)
        }
        let count = 20_000
        let started = ContinuousClock.now
        let summary = try await engine.run(liveActivityJob(id: "some", tokens: (0..<count).map { testDeviceToken($0) }))
        {
            _ in
        }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.delivered, count, "\(summary.counts)")
        let connections = try XCTUnwrap(someAnswers.stats.snapshot()["connections"] as? Int)
        XCTAssertGreaterThan(connections, 1, "a 503 on a connection up 0.2 s reconnects")
        let seconds = Double((ContinuousClock.now - started).components.seconds) + 1
        XCTAssertLessThanOrEqual(Double(connections), seconds / 0.2 + 1, "at most one new connection per 0.2 s")
    }

    func testUnregisteredTokensGetTheirOwnOutcome() async throws {
        let unregistered = (0..<50).map { testDeviceToken(1_000_000 + $0) }
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("unregistered-\(UUID().uuidString)")
            .path
        try unregistered.joined(separator: "\n").write(toFile: file, atomically: true, encoding: .utf8)
        let mock = try MockHarness { $0.unregisteredPath = file }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock)
        let valid = (0..<950).map { testDeviceToken($0) }
        let outcomes = FanoutMutex<[String: NotificationResult]>([:])
        let summary = try await engine.run(liveActivityJob(id: "mixed", tokens: (valid + unregistered).shuffled())) {
            result in
            outcomes.withLock { $0[result.token!] = result }
        }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.delivered, 950)
        XCTAssertEqual(summary.counts.unregistered, 50)
        let results = outcomes.withLock { $0 }
        XCTAssertEqual(results.count, 1000)
        for token in unregistered {
            XCTAssertEqual(results[token]?.outcome, .unregistered)
            XCTAssertEqual(results[token]?.status, 410)
            XCTAssertEqual(results[token]?.reason, "Unregistered")
            XCTAssertNotNil(results[token]?.timestamp)
        }
        for token in valid { XCTAssertEqual(results[token]?.outcome, .delivered) }
    }

    func testTokensFileIsStreamedAndBadTokensAreDroppedWithoutSending() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("tokens-\(UUID().uuidString)").path
        let lines = (0..<5000).map { testDeviceToken($0) } + ["not-a-token", "", "  \(testDeviceToken(9999))  "]
        try lines.joined(separator: "\n").write(toFile: file, atomically: true, encoding: .utf8)
        let job = FanoutJob(
            id: "file", headers: NotificationHeaders(pushType: .alert, topic: "com.example.app"),
            payload: .raw(Array(#"{"aps":{"alert":"hi"}}"#.utf8)), recipients: .file(path: file))
        let summary = try await engine.run(job) { _ in }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.delivered, 5001)
        XCTAssertEqual(summary.counts.unregistered, 1, "a malformed token ends as APNs's BadDeviceToken does")
        XCTAssertEqual(mock.stats.accepted, 5001)
    }

    /// Tokens go out and come back in results exactly as read: a 64-digit lowercase token (kept as bytes inside the
    /// engine) as it was, an uppercase or mixed-case one in lowercase, a longer one as it was, and a line that is no
    /// token in the rejected result as the file has it, from a tokens file and from an inline list alike.
    func testTokensAreSentAndReportedAsTheirSourceSpellsThem() async throws {
        let mock = try MockHarness { $0.capturePayloads = true }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let lowercase = testDeviceToken(1)
        let uppercase = testDeviceToken(2).uppercased()
        let mixed = String(testDeviceToken(3).prefix(32)) + testDeviceToken(3).dropFirst(32).uppercased()
        let long = String(repeating: "0123456789abcdef", count: 6) + "cafe"
        let sent = [lowercase, testDeviceToken(2), testDeviceToken(3), long]
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("tokens-\(UUID().uuidString)").path
        try ["\(lowercase)\r", "  \(uppercase)", mixed, long, "not-a-token"].joined(separator: "\n").write(
            toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let recipients: [Recipients] = [
            .file(path: file), .tokens([lowercase, uppercase, mixed, long, "not-a-token"]),
        ]
        for (index, recipients) in recipients.enumerated() {
            let job = FanoutJob(
                id: "spelling-\(index)", headers: NotificationHeaders(pushType: .alert, topic: "com.example.app"),
                payload: .raw(Array(#"{"aps":{"alert":"hi"}}"#.utf8)), recipients: recipients)
            let results = FanoutMutex<[Int: NotificationResult]>([:])
            let summary = try await engine.run(job) { result in results.withLock { $0[result.position] = result } }
            XCTAssertEqual(summary.counts.delivered, 4, "\(recipients)")
            XCTAssertEqual(summary.counts.unregistered, 1, "\(recipients)")
            let byPosition = results.withLock { $0 }
            XCTAssertEqual((0..<4).map { byPosition[$0]?.token }, sent, "\(recipients)")
            XCTAssertEqual((0..<4).map { byPosition[$0]?.outcome }, Array(repeating: .delivered, count: 4))
            // A tokens file may be any file: a line that is not hex is named by its number, not copied into the
            // results (a file of a signing key's lines would have been, whole). Inline tokens are the job's own.
            XCTAssertEqual(byPosition[4]?.token, index == 0 ? "line 5 (not hex, not shown)" : "not-a-token")
            XCTAssertEqual(byPosition[4]?.reason, "BadDeviceToken")
        }
        await engine.shutdown()
        XCTAssertEqual(Set(mock.stats.payloadsByToken.keys), Set(sent), "the paths APNs saw")
        XCTAssertEqual(mock.stats.payloadsByToken.values.map(\.count), [2, 2, 2, 2])
    }

    /// `summary()` keeps its first waiter inline and any others in a list: every one of them is resumed, once,
    /// with the same summary, and a caller that asks after the job finished gets it at once.
    func testEveryTaskAwaitingARunsSummaryGetsIt() async throws {
        let mock = try MockHarness { $0.latencyMilliseconds = 50 }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let tokens = (0..<200).map { testDeviceToken($0) }
        let run = try engine.submit(liveActivityJob(id: "watched", tokens: tokens))
        let waiting = (0..<5).map { _ in Task { await run.summary() } }
        var summaries: [JobSummary] = []
        for (index, task) in waiting.enumerated() {
            guard let summary = try await withDeadline(.seconds(30), { await task.value }) else {
                return XCTFail("waiter \(index) was never resumed")
            }
            summaries.append(summary)
        }
        let late = await run.summary()
        await engine.shutdown()
        XCTAssertEqual(summaries.count, 5)
        for summary in summaries + [late] {
            XCTAssertEqual(summary.notifications, 200)
            XCTAssertEqual(summary.counts.delivered, 200)
            XCTAssertEqual(summary.seconds, summaries[0].seconds, "one summary, made once")
        }
    }

    /// Latency is measured on a high-resolution clock from the first send to the answer: a loopback answer takes a
    /// fraction of a millisecond (not a whole number of them), and an answer the mock holds 30 ms takes about that (its timer
    /// may fire up to a millisecond early).
    func testLatencyHasSubMillisecondPrecisionAndCoversTheWholeRoundTrip() async throws {
        let fast = try MockHarness()
        defer { fast.stop() }
        let slow = try MockHarness { $0.latencyMilliseconds = 30 }
        defer { slow.stop() }
        let notification = try PushNotification.alert(
            AlertPayload(title: "t", body: "b"), to: testDeviceToken(1), app: "com.example.app")
        let fastEngine = try makeEngine(for: fast, loops: 1, connections: 1)
        _ = try await fastEngine.send(notification)  // connects; the next sends find the connection ready
        var latencies: [Duration] = []
        for _ in 0..<5 { latencies.append(try await fastEngine.send(notification).latency) }
        await fastEngine.shutdown()
        XCTAssertTrue(latencies.allSatisfy { $0 > .zero && $0 < .seconds(5) }, "\(latencies)")
        XCTAssertTrue(
            latencies.contains { $0.components.attoseconds % 1_000_000_000_000_000 != 0 },
            "whole milliseconds only: \(latencies)")
        let slowEngine = try makeEngine(for: slow, loops: 1, connections: 1)
        let held = try await slowEngine.send(notification)
        await slowEngine.shutdown()
        XCTAssertEqual(held.outcome, .delivered)
        // The mock holds the answer on a libuv timer, whose clock is the loop's, read once per turn in whole
        // milliseconds: it may fire up to a millisecond before 30 ms have passed.
        XCTAssertGreaterThanOrEqual(held.latency, .milliseconds(29))
        XCTAssertEqual(held.latencyMilliseconds, held.latency / .milliseconds(1), accuracy: 1e-9)
    }

    func testShutdownDuringALargeJobAccountsForEveryNotification() async throws {
        let mock = try MockHarness { $0.latencyMilliseconds = 20 }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.maxInFlight = 2000 }
        let total = 50_000
        let tokens = (0..<total).map { testDeviceToken($0) }
        let run = try engine.submit(liveActivityJob(id: "interrupted", tokens: tokens))
        // Shut down once some notifications have been delivered, long before the job can finish.
        let deadline = ContinuousClock.now + .seconds(30)
        while run.countsSoFar.delivered < 100 && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        await engine.shutdown(gracePeriod: .zero)
        let summary = await run.summary()
        XCTAssertEqual(summary.notifications, total, "every notification has exactly one outcome")
        XCTAssertEqual(summary.counts.delivered + summary.counts.failed, total)
        XCTAssertGreaterThan(summary.counts.failed, 0, "the job was cut short")
        XCTAssertGreaterThanOrEqual(summary.counts.delivered, 100)
        XCTAssertLessThanOrEqual(mock.stats.accepted, summary.counts.delivered + 2000, "at most what was in flight")
    }

    func testInvalidJobsEndWithOneInvalidResultNamingTheFieldAndSendNothing() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let wrongTopic = FanoutJob(
            id: "wrong-topic", headers: NotificationHeaders(pushType: .liveactivity, topic: "com.example.app"),
            payload: .raw(Array(#"{"aps":{"timestamp":1,"event":"update"}}"#.utf8)),
            recipients: .tokens([testDeviceToken()]))
        let startWithoutAttributes = FanoutJob.liveActivity(
            id: "bad-start", bundleID: "com.example.app",
            content: LiveActivityContent(
                event: .update, timestamp: 1, contentState: try RawJSON(validating: "{}"),
                attributes: try RawJSON(validating: #"{"team":"A"}"#)),
            recipients: .tokens([testDeviceToken()]))
        let tooLarge = FanoutJob(
            id: "too-large", headers: NotificationHeaders(pushType: .alert, topic: "com.example.app"),
            payload: .raw(
                Array(#"{"aps":{"alert":""#.utf8) + [UInt8](repeating: 120, count: 5000) + Array(#""}}"#.utf8)),
            recipients: .tokens([testDeviceToken()]))
        let missingFile = FanoutJob(
            id: "missing-file", headers: NotificationHeaders(pushType: .alert, topic: "com.example.app"),
            payload: .raw(Array(#"{"aps":{"alert":"hi"}}"#.utf8)), recipients: .file(path: "/nonexistent/tokens.txt"))
        let notJSON = FanoutJob(
            id: "not-json", headers: NotificationHeaders(pushType: .alert, topic: "com.example.app"),
            payload: .raw(Array("hello".utf8)), recipients: .tokens([testDeviceToken()]))
        let broadcastNotJSON = FanoutJob(
            id: "broadcast-not-json",
            headers: NotificationHeaders(pushType: .liveactivity, topic: "com.example.app.push-type.liveactivity"),
            payload: .raw(Array(#"{"aps":{"event":"update"}"#.utf8)),
            recipients: .channel(app: "com.example.app", id: "dHN0LTIxMDk4NzY1NDMyMQ=="))
        let expectations = [
            (wrongTopic, "topic"), (startWithoutAttributes, "live_activity.attributes"), (tooLarge, "4096"),
            (missingFile, "/nonexistent/tokens.txt"), (notJSON, "payload: not valid JSON"),
            (broadcastNotJSON, "payload: not valid JSON"),
        ]
        for (job, mention) in expectations {
            let results = FanoutMutex<[NotificationResult]>([])
            do {
                _ = try await engine.run(job) { result in results.withLock { $0.append(result) } }
                XCTFail("job \(job.id) should have been refused")
            } catch {
                XCTAssertTrue(error.message.contains(mention), "\(job.id): \(error.message)")
            }
            let recorded = results.withLock { $0 }
            XCTAssertEqual(recorded.count, 1, job.id)
            XCTAssertEqual(recorded.first?.outcome, .invalid, job.id)
            XCTAssertNil(recorded.first?.token, job.id)
        }
        XCTAssertEqual(engine.payloadEncodings, 0)
        await engine.shutdown()
        XCTAssertEqual(mock.stats.requests, 0, "nothing was sent")
    }

    func testUnreachableEndpointFailsTheJobInsteadOfHanging() async throws {
        let mock = try MockHarness()
        let port = mock.port
        let material = mock.material
        mock.stop()
        let engine = try makeEngine(host: "127.0.0.1", port: port, material: material, loops: 1, connections: 1) {
            $0.maxConnectAttempts = 2
            $0.retryBase = .milliseconds(5)
        }
        let summary = try await engine.run(liveActivityJob(id: "nowhere", tokens: (0..<10).map { testDeviceToken($0) }))
        { result in
            XCTAssertTrue(result.reason?.contains("ECONNREFUSED") ?? false, result.reason ?? "no reason")
        }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.failed, 10)
    }

    /// A setting the engine cannot run with is refused by `FanoutEngine(configuration:)` with a `.configuration` error
    /// naming the field and its range. Each of these trapped instead: a precondition (loops, maxInFlight,
    /// maxPendingSends, retryBudgetRatio) or an overflow on the loop thread at the first send (the huge times).
    func testOutOfRangeSettingsAreRefusedNamingTheFieldInsteadOfTrapping() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let huge = Duration.seconds(Int64.max / 2)
        let cases: [(field: String, range: String, configure: (inout FanoutEngineConfiguration) -> Void)] = [
            ("loops", "1 to 1024", { $0.loops = 0 }),
            ("connectionsPerLoop", "1 to 1024", { $0.connectionsPerLoop = 0 }),
            ("maxConcurrentStreams", "1 to", { $0.maxConcurrentStreams = 0 }),
            ("maxInFlight", "1 to", { $0.maxInFlight = 0 }),
            ("maxPendingSends", "at least 1", { $0.maxPendingSends = 0 }),
            ("maxAttempts", "at least 1", { $0.maxAttempts = 0 }),
            ("maxConnectAttempts", "1 to", { $0.maxConnectAttempts = 0 }),
            ("retryBudgetRatio", "a finite number of at least 0", { $0.retryBudgetRatio = -1 }),
            ("retryBudgetRatio", "a finite number of at least 0", { $0.retryBudgetRatio = .nan }),
            ("retryBudgetRatio", "a finite number of at least 0", { $0.retryBudgetRatio = .infinity }),
            ("requestTimeout", "1 ms to 1 day", { $0.requestTimeout = huge }),
            ("requestTimeout", "1 ms to 1 day", { $0.requestTimeout = .zero }),
            ("pingInterval", "1 ms to 1 day", { $0.pingInterval = huge }),
            ("pingInterval", "1 ms to 1 day", { $0.pingInterval = .seconds(-1) }),
            ("connectTimeout", "1 ms to 1 day", { $0.connectTimeout = huge }),
            ("retryBase", "0 to 1 day", { $0.retryBase = .milliseconds(-1) }),
            ("retryCap", "0 to 1 day", { $0.retryCap = huge }),
        ]
        for (field, range, configure) in cases {
            do {
                let engine = try makeEngine(for: mock, loops: 1, connections: 1, configure: configure)
                await engine.shutdown()
                XCTFail("\(field): an engine was made")
            } catch let error as FanoutError {
                XCTAssertEqual(error.kind, .configuration, error.message)
                XCTAssertTrue(error.message.hasPrefix("\(field) must be \(range)"), error.message)
            }
        }
        // The bounds themselves are taken, and such an engine sends.
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) {
            $0.maxInFlight = 1
            $0.maxPendingSends = 1
            $0.retryBudgetRatio = 0
            $0.requestTimeout = .seconds(86_400)
            $0.pingInterval = .seconds(86_400)
            $0.retryBase = .zero
        }
        let result = try await engine.send(
            PushNotification(
                deviceToken: testDeviceToken(1),
                headers: NotificationHeaders(pushType: .alert, topic: "com.example.app"),
                payload: Array(#"{"aps":{"alert":"hi"}}"#.utf8)))
        await engine.shutdown()
        XCTAssertEqual(result.outcome, .delivered)
        // The channel client's deadline too.
        let credentials = ProviderCredentials(
            keyPath: mock.material.authKeyP8Path, keyID: "KEYID12345", teamID: "TEAMID1234")
        XCTAssertThrowsError(
            try BroadcastChannelClient(
                endpoint: APNsEndpoint(host: "localhost", port: mock.port), credentials: credentials,
                caFile: mock.material.caPEMPath, requestTimeout: huge)
        ) { error in
            XCTAssertEqual((error as? FanoutError)?.kind, .configuration)
            XCTAssertTrue("\(error)".hasPrefix("requestTimeout must be 1 ms to 1 day"), "\(error)")
        }
    }
}

/// Answers the first request (the client's ramp), then holds the next two, the server's limit, and raises the limit
/// to 100 while it holds them; once it holds `heldToRelease` (only a client that heard the raise sends them) it
/// answers everything, then answers every later request at once. One loop thread: its state is the loop's.
private final class LimitRaisingHandler: HTTP2ServerHandler, @unchecked Sendable {
    static let heldToRelease = 10
    let peakHeld = Atomic<Int>(0)
    let violations = Atomic<Int>(0)
    private var held: [Int32] = []
    private var answered = 0
    private var released = false

    func serverConnection(_ connection: HTTP2ServerConnection, didReceive request: HTTP2ServerRequest) {
        if answered == 0 || released {
            answer(request.streamID, on: connection)
            return
        }
        held.append(request.streamID)
        peakHeld.store(max(peakHeld.load(ordering: .relaxed), held.count), ordering: .relaxed)
        if held.count == 2 { connection.setMaxConcurrentStreams(100) }
        if held.count == Self.heldToRelease {
            released = true
            for streamID in held { answer(streamID, on: connection) }
            held.removeAll()
        }
    }

    private func answer(_ streamID: Int32, on connection: HTTP2ServerConnection) {
        answered += 1
        connection.respond(streamID: streamID, status: 200)
    }

    func serverConnectionStreamLimitViolated(_ connection: HTTP2ServerConnection) {
        violations.add(1, ordering: .relaxed)
    }

    func serverConnectionDidClose(_ connection: HTTP2ServerConnection, error: TransportError?) {}
}
