import Fanout
import FanoutCore
import FanoutObservability
import FanoutSQLite
import Foundation
import MockAPNsKit
import Synchronization
import XCTest

/// Jobs that address the registry instead of naming tokens, against mock-apns: an activity's live
/// tokens are read in pages, sent to once each, and the ones APNs invalidates are pruned.
final class RegistryEngineTests: XCTestCase {
    static let app = "com.example.app"
    /// Unix ms of the tests' "now": the registry's clock is moved around it.
    static let realNow = Int64(Date().timeIntervalSince1970 * 1000)

    private func makeRegistry(clock: TestClock) throws -> SQLiteRegistryStore {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "registry")
        var configuration = RegistryConfiguration()
        configuration.clock = clock.registryClock
        let store = try SQLiteRegistryStore(path: "\(directory)/registry.db", configuration: configuration)
        addTeardownBlock { store.close() }
        return store
    }

    private func registerUpdateTokens(
        _ store: SQLiteRegistryStore, activity: String, tokens: some Sequence<(device: String, token: String)>
    ) async throws {
        var batch: [RegistryChange] = []
        for entry in tokens {
            batch.append(
                .updateToken(
                    UpdateTokenRegistration(
                        app: Self.app, activityID: activity, deviceID: entry.device, token: entry.token)
                ))
            if batch.count == 10_000 {
                try await store.apply(batch)
                batch.removeAll(keepingCapacity: true)
            }
        }
        if !batch.isEmpty { try await store.apply(batch) }
    }

    /// A registry (clock at the tests' now) with the app and ten live tokens of activity `m`.
    private func registryWithTenTokensOfM() async throws -> SQLiteRegistryStore {
        let store = try makeRegistry(clock: TestClock(Self.realNow))
        try await store.defineApps([RegistryApp(bundleID: Self.app, workspace: "default")])
        try await registerUpdateTokens(store, activity: "m", tokens: (0..<10).map { ("d\($0)", testDeviceToken($0)) })
        return store
    }

    private func liveTokens(_ store: SQLiteRegistryStore, activity: String) async throws -> Set<String> {
        var tokens = Set<String>()
        var cursor: RegistryCursor?
        repeat {
            let page = try await store.liveUpdateTokens(app: Self.app, activityID: activity, after: cursor, limit: 5000)
            tokens.formUnion(page.items.map(\.token))
            cursor = page.next
        } while cursor != nil
        return tokens
    }

    private func updateJob(_ id: String, activity: String, timestamp: Int64 = 1_764_460_800) -> FanoutJob {
        FanoutJob.liveActivity(
            id: id, bundleID: Self.app,
            content: LiveActivityContent(
                event: .update, timestamp: timestamp, contentState: try! RawJSON(validating: #"{"home":2,"away":1}"#)),
            recipients: .activity(app: Self.app, id: activity))
    }

    /// 100,000 live tokens of `match-7`, 1,000 of another activity and 5,000 expired ones of `match-7`:
    /// an update by activity id reaches exactly the 100,000, with one encoding; the 500 the mock calls
    /// unregistered leave the registry, each with one removed/unregistered event.
    func testUpdateByActivityReachesEveryLiveTokenOnceAndPrunesUnregistered() async throws {
        let clock = TestClock(Self.realNow - 9 * 3_600_000)
        let store = try makeRegistry(clock: clock)
        try await store.defineApps([RegistryApp(bundleID: Self.app, workspace: "default")])
        // Registered 9 hours ago: expired by now.
        try await registerUpdateTokens(
            store, activity: "match-7", tokens: (0..<5000).map { ("old-\($0)", testDeviceToken(500_000 + $0)) })
        clock.set(Self.realNow - 3_600_000)
        let live = (0..<100_000).map { testDeviceToken($0) }
        try await registerUpdateTokens(store, activity: "match-7", tokens: live.enumerated().map { ("d\($0)", $1) })
        try await registerUpdateTokens(
            store, activity: "match-8", tokens: (0..<1000).map { ("other-\($0)", testDeviceToken(700_000 + $0)) })
        clock.set(Self.realNow)

        let gone = Array(live[1000..<1500])
        let directory = try ProcessSupport.temporaryDirectory(for: self, "unregistered")
        let unregisteredFile = "\(directory)/unregistered.txt"
        try gone.joined(separator: "\n").write(toFile: unregisteredFile, atomically: true, encoding: .utf8)
        let mock = try MockHarness { $0.unregisteredPath = unregisteredFile }
        defer { mock.stop() }

        let events = store.subscribe()
        let removed = Task {
            var reasons: [String: Int] = [:]
            for await event in events where event.change == .removed {
                reasons[event.reason?.rawValue ?? "nil", default: 0] += 1
                if reasons.values.reduce(0, +) == 500 { break }
            }
            return reasons
        }

        let engine = try makeEngine(for: mock) { $0.registry = store }
        let log = ResultLog()
        let summary = try await engine.run(updateJob("match-7-update", activity: "match-7")) { log.add($0) }
        await engine.shutdown()

        XCTAssertEqual(summary.notifications, 100_000)
        XCTAssertEqual(summary.counts.delivered, 99_500)
        XCTAssertEqual(summary.counts.unregistered, 500)
        XCTAssertEqual(summary.payloadEncodings, 1)
        XCTAssertEqual(log.tokensWithResults, 100_000)
        XCTAssertEqual(log.tokensWithMoreThanOneResult, 0)
        XCTAssertEqual(mock.stats.accepted, 99_500)
        XCTAssertEqual(mock.stats.snapshot()["distinct_tokens"] as? Int, 99_500)

        let remaining = try await liveTokens(store, activity: "match-7")
        XCTAssertEqual(remaining.count, 99_500)
        XCTAssertTrue(remaining.isDisjoint(with: gone), "unregistered tokens were pruned")
        let other = try await liveTokens(store, activity: "match-8")
        XCTAssertEqual(other.count, 1000, "another activity is untouched")
        let reasons = await withTaskGroup(of: [String: Int]?.self) { group in
            group.addTask { await removed.value }
            group.addTask {
                try? await Task.sleep(for: .seconds(10))
                return nil
            }
            let first = await group.next()!
            group.cancelAll()
            removed.cancel()
            return first
        }
        XCTAssertEqual(reasons, ["unregistered": 500])
    }

    /// The 410 rule through the engine: a token registered again after APNs's timestamp stays.
    func testA410RemovesOnlyTokensRegisteredBeforeItsTimestamp() async throws {
        let clock = TestClock(Self.realNow - 3_600_000)
        let store = try makeRegistry(clock: clock)
        try await store.defineApps([RegistryApp(bundleID: Self.app, workspace: "default")])
        let before = testDeviceToken(1)
        let after = testDeviceToken(2)
        try await registerUpdateTokens(store, activity: "m", tokens: [("a", before)])
        // Registered an hour from now: later than the mock's 410 timestamp (its own now).
        clock.set(Self.realNow + 3_600_000)
        try await registerUpdateTokens(store, activity: "m", tokens: [("b", after)])

        let directory = try ProcessSupport.temporaryDirectory(for: self, "unregistered")
        let unregisteredFile = "\(directory)/unregistered.txt"
        try [before, after].joined(separator: "\n").write(toFile: unregisteredFile, atomically: true, encoding: .utf8)
        let mock = try MockHarness { $0.unregisteredPath = unregisteredFile }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.registry = store }
        let summary = try await engine.run(updateJob("m-update", activity: "m")) { _ in }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.unregistered, 2)
        let kept = try await liveTokens(store, activity: "m")
        XCTAssertEqual(kept, [after])
    }

    /// A token APNs refuses for one app's topic (`DeviceTokenNotForTopic`: another app's token, perhaps another
    /// workspace's) is pruned from that app's registrations only: a send to another app's tokens by inline tokens
    /// cannot remove them. The same refusal for the app that holds it does.
    func testARefusedTokenIsPrunedOnlyFromTheAppWhoseTopicItWasSentTo() async throws {
        let clock = TestClock(Self.realNow - 3_600_000)
        let store = try makeRegistry(clock: clock)
        let other = "com.example.other"
        try await store.defineApps([
            RegistryApp(bundleID: Self.app, workspace: "default"), RegistryApp(bundleID: other, workspace: "beta"),
        ])
        let token = testDeviceToken(1)
        try await registerUpdateTokens(store, activity: "m", tokens: [("a", token)])
        clock.set(Self.realNow)
        let mock = try MockHarness {
            $0.failures = [InjectedFailure(rate: 1, status: 400, reason: "DeviceTokenNotForTopic")]
        }
        defer { mock.stop() }
        // One engine per send: its shutdown applies whatever its pruner still holds, so each check sees the prune.
        func send(_ id: String, bundleID: String) async throws -> JobSummary {
            let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.registry = store }
            let summary = try await engine.run(
                FanoutJob.liveActivity(
                    id: id, bundleID: bundleID,
                    content: LiveActivityContent(
                        event: .update, timestamp: 1_764_460_800, contentState: try RawJSON(validating: #"{"h":2}"#)),
                    recipients: .tokens([token]))
            ) { _ in }
            await engine.shutdown()
            return summary
        }
        let foreign = try await send("other-app", bundleID: other)
        XCTAssertEqual(foreign.counts.unregistered, 1)
        let kept = try await liveTokens(store, activity: "m")
        XCTAssertEqual(kept, [token], "another app's send must not remove this app's token")

        let own = try await send("own-app", bundleID: Self.app)
        XCTAssertEqual(own.counts.unregistered, 1)
        let left = try await liveTokens(store, activity: "m")
        XCTAssertEqual(left, [], "the app's own refusal prunes it")
    }

    /// A prune the registry refuses (another process holds its write lock past the busy timeout) is not dropped
    /// silently: the engine's warning handler gets one line saying how many tokens stay and why.
    func testAPruneTheRegistryRefusesIsLoggedAsAWarning() async throws {
        let clock = TestClock(Self.realNow - 3_600_000)
        let directory = try ProcessSupport.temporaryDirectory(for: self, "busy")
        var registryConfiguration = RegistryConfiguration()
        registryConfiguration.clock = clock.registryClock
        registryConfiguration.busyTimeoutMilliseconds = 200
        let store = try SQLiteRegistryStore(path: "\(directory)/registry.db", configuration: registryConfiguration)
        addTeardownBlock { store.close() }
        try await store.defineApps([RegistryApp(bundleID: Self.app, workspace: "default")])
        let gone = testDeviceToken(1)
        try await registerUpdateTokens(store, activity: "m", tokens: [("a", gone)])
        clock.set(Self.realNow)

        try [gone].joined(separator: "\n").write(
            toFile: "\(directory)/unregistered.txt", atomically: true, encoding: .utf8)
        let mock = try MockHarness { $0.unregisteredPath = "\(directory)/unregistered.txt" }
        defer { mock.stop() }
        let lines = FanoutMutex<[String]>([])
        let logger = FanoutLogger(
            format: .text, sink: .init { bytes in lines.withLock { $0.append(String(decoding: bytes, as: UTF8.self)) } }
        )
        // Another connection (as another process would) holds the write lock for the whole send.
        let other = try SQLiteDatabase(path: "\(directory)/registry.db", busyTimeoutMilliseconds: 0)
        try other.execute("BEGIN IMMEDIATE")
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) {
            $0.registry = store
            $0.warningHandler = { logger.warning($0, fields: $1) }
        }
        let summary = try await engine.run(updateJob("m-update", activity: "m")) { _ in }
        await engine.shutdown()
        try other.execute("ROLLBACK")

        XCTAssertEqual(summary.counts.unregistered, 1)
        let logged = lines.withLock { $0 }
        XCTAssertEqual(logged.count, 1, "\(logged)")
        let line = try XCTUnwrap(logged.first)
        XCTAssertTrue(line.contains(" warning registry prune failed: 1 invalidated tokens not removed "), line)
        XCTAssertTrue(line.contains("not_removed=1"), line)
        XCTAssertTrue(line.contains("kind=busy"), line)
        XCTAssertTrue(line.contains("locked by another process"), line)
        XCTAssertFalse(line.contains(gone), "no token in the line: \(line)")
        // The token stays (the next 410 for it removes it).
        let kept = try await liveTokens(store, activity: "m")
        XCTAssertEqual(kept, [gone])
    }

    /// Push-to-start by users and by attributes type; the activity id lands in `attributes` at each
    /// preset's key path.
    func testPushToStartWritesTheActivityIDUnderEachPresetKey() async throws {
        let clock = TestClock(Self.realNow)
        let store = try makeRegistry(clock: clock)
        try await store.defineApps([RegistryApp(bundleID: Self.app, workspace: "default")])
        var changes: [RegistryChange] = []
        for index in 0..<6 {
            changes.append(
                .pushToStartToken(
                    PushToStartRegistration(
                        app: Self.app, deviceID: "dev-\(index)", userID: index < 3 ? "fan" : "other",
                        attributesType: index % 2 == 0 ? "MatchAttributes" : "OtherAttributes",
                        token: testDeviceToken(900 + index))))
        }
        try await store.apply(changes)
        let mock = try MockHarness { $0.capturePayloads = true }
        defer { mock.stop() }

        let presets: [(ActivityIDAttribute, String)] = [
            (.fanout, #""activityId":"match-9""#),
            (.pushwoosh, #""pushwoosh":{"activityId":"match-9"}"#),
            (.braze, #""brazeActivityId":"match-9""#),
        ]
        for (preset, expected) in presets {
            let engine = try makeEngine(for: mock, loops: 1, connections: 1) {
                $0.registry = store
                $0.activityIDAttribute = preset
            }
            let start = FanoutJob.liveActivity(
                id: "start-\(expected.count)", bundleID: Self.app,
                content: LiveActivityContent(
                    event: .start, timestamp: 1_764_460_800, contentState: try RawJSON(validating: #"{"home":0}"#),
                    alert: LiveActivityAlert(title: "Kick-off"), attributesType: "MatchAttributes",
                    attributes: try RawJSON(validating: #"{"team":"A"}"#)),
                recipients: .pushToStart(
                    app: Self.app, attributesType: "MatchAttributes", selection: .users(["fan"]), activityID: "match-9")
            )
            let summary = try await engine.run(start) { _ in }
            await engine.shutdown()
            // Users "fan" own devices 0, 1, 2; of those, 0 and 2 registered MatchAttributes.
            XCTAssertEqual(summary.counts.delivered, 2, "\(preset)")
        }
        let payloads = mock.stats.payloadsByToken
        XCTAssertEqual(Set(payloads.keys), [testDeviceToken(900), testDeviceToken(902)])
        for token in payloads.keys {
            let texts = payloads[token]!.map { String(decoding: $0, as: UTF8.self) }
            XCTAssertEqual(texts.count, 3)
            for ((_, expected), text) in zip(presets, texts) {
                XCTAssertTrue(text.contains(expected), "\(expected) in \(text)")
                XCTAssertTrue(text.contains(#""team":"A""#), "the job's own attributes are kept: \(text)")
            }
        }
    }

    /// A path with nowhere to write the id (no key, or an empty key) is nil, not a trap: a gateway may build the path
    /// from its own settings at run time.
    func testAnActivityIDAttributeWithNoKeyOrAnEmptyKeyIsNilInsteadOfTrapping() {
        XCTAssertNil(ActivityIDAttribute(path: []))
        XCTAssertNil(ActivityIDAttribute(path: [""]))
        XCTAssertNil(ActivityIDAttribute(path: ["acme", ""]))
        XCTAssertEqual(ActivityIDAttribute(path: ["acme", "activityId"])?.path, ["acme", "activityId"])
        XCTAssertEqual(ActivityIDAttribute(path: ["pushwoosh", "activityId"]), .pushwoosh)
    }

    // MARK: Latest wins

    /// Ten updates to one activity of 20,000 tokens, submitted together against a mock that answers
    /// in 20 ms: every token gets the newest, older ones still queued end `superseded`, and far fewer
    /// than 200,000 requests reach the mock.
    func testNewerUpdatesSupersedeQueuedOlderOnes() async throws {
        let clock = TestClock(Self.realNow)
        let store = try makeRegistry(clock: clock)
        try await store.defineApps([RegistryApp(bundleID: Self.app, workspace: "default")])
        let tokens = (0..<20_000).map { testDeviceToken($0) }
        try await registerUpdateTokens(store, activity: "match-7", tokens: tokens.enumerated().map { ("d\($0)", $1) })
        let mock = try MockHarness {
            $0.latencyMilliseconds = 20
            $0.capturePayloads = true
        }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock) { $0.registry = store }
        let base: Int64 = 1_764_460_800
        var runs: [FanoutRun] = []
        for index in 1...10 {
            runs.append(
                try engine.submit(updateJob("update-\(index)", activity: "match-7", timestamp: base + Int64(index))))
        }
        var delivered = 0
        var superseded = 0
        var notifications = 0
        for run in runs {
            let summary = await run.summary()
            notifications += summary.notifications
            delivered += summary.counts.delivered
            superseded += summary.counts.superseded
            XCTAssertEqual(summary.counts.delivered + summary.counts.superseded, summary.notifications, run.jobID)
        }
        let newest = await runs.last!.summary()
        await engine.shutdown()

        XCTAssertEqual(newest.counts.delivered, 20_000, "the newest update reaches every token")
        XCTAssertEqual(notifications, 200_000)
        XCTAssertEqual(delivered + superseded, notifications)
        XCTAssertGreaterThan(superseded, 0)
        let requests = mock.stats.snapshot()["requests"] as? Int ?? 0
        XCTAssertEqual(requests, delivered)
        XCTAssertLessThan(requests, 200_000)
        let newestTimestamp = "\"timestamp\":\(base + 10)"
        let payloads = mock.stats.payloadsByToken
        XCTAssertEqual(payloads.count, 20_000)
        let missing = tokens.filter { token in
            !(payloads[token] ?? []).contains { String(decoding: $0, as: UTF8.self).contains(newestTimestamp) }
        }
        XCTAssertEqual(missing.count, 0, "tokens that never got the newest update")
        let stored = try await store.activity(app: Self.app, activityID: "match-7")
        XCTAssertEqual(stored?.lastContentTimestamp, base + 10)
    }

    /// A job whose timestamp is not newer than what was already sent ends `superseded`, unsent.
    func testAnUpdateNoNewerThanTheLastSentIsSupersededWithoutSending() async throws {
        let store = try await registryWithTenTokensOfM()
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock) { $0.registry = store }
        let first = try await engine.run(updateJob("first", activity: "m", timestamp: 1_000)) { _ in }
        let again = try await engine.run(updateJob("same", activity: "m", timestamp: 1_000)) { _ in }
        let older = try await engine.run(updateJob("older", activity: "m", timestamp: 999)) { _ in }
        await engine.shutdown()
        XCTAssertEqual(first.counts.delivered, 10)
        XCTAssertEqual(again.counts.superseded, 10)
        XCTAssertEqual(older.counts.superseded, 10)
        XCTAssertEqual(mock.stats.accepted, 10)
        // Another engine (another process) sees the registry's record.
        let mock2 = try MockHarness()
        defer { mock2.stop() }
        let engine2 = try makeEngine(for: mock2) { $0.registry = store }
        let elsewhere = try await engine2.run(updateJob("elsewhere", activity: "m", timestamp: 1_000)) { _ in }
        await engine2.shutdown()
        XCTAssertEqual(elsewhere.counts.superseded, 10)
        XCTAssertEqual(mock2.stats.snapshot()["requests"] as? Int, 0)
    }

    /// A job by activity id that sent nothing (its task cancelled before its first notification went out; a job the
    /// rate limit refuses is the same case) gives its claim back: its retry with the same timestamp goes out. It was
    /// `superseded`, unsent, by the claim of the very job it retries (a gateway retrying after a 429 lost the update
    /// without a word).
    func testARetryOfAnUpdateThatSentNothingIsSent() async throws {
        let store = try await registryWithTenTokensOfM()
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.registry = store }
        let cancelledJob = updateJob("cancelled", activity: "m", timestamp: 1_000)
        let cancelled = Task { () async throws -> JobSummary in
            withUnsafeCurrentTask { $0?.cancel() }
            return try await engine.run(cancelledJob) { _ in }
        }
        let first = try await cancelled.value
        XCTAssertEqual(first.counts.cancelled, 10, "\(first.counts)")
        XCTAssertEqual(mock.stats.requests, 0)
        let retried = try await engine.run(updateJob("retry", activity: "m", timestamp: 1_000)) { _ in }
        XCTAssertEqual(retried.counts.delivered, 10, "\(retried.counts)")
        // Content that went out stays the latest: the same timestamp again is stale.
        let again = try await engine.run(updateJob("again", activity: "m", timestamp: 1_000)) { _ in }
        XCTAssertEqual(again.counts.superseded, 10)
        await engine.shutdown()
    }

    /// An `end` by activity id marks the activity ended in the registry: with a dismissal date already
    /// past, its tokens are gone from reads at once; without one, they stay (4 hours by default).
    func testAnEndByActivityMarksTheActivityEnded() async throws {
        let store = try makeRegistry(clock: TestClock(Self.realNow))
        try await store.defineApps([RegistryApp(bundleID: Self.app, workspace: "default")])
        try await registerUpdateTokens(store, activity: "past", tokens: (0..<3).map { ("p\($0)", testDeviceToken($0)) })
        try await registerUpdateTokens(
            store, activity: "later", tokens: (3..<6).map { ("l\($0)", testDeviceToken($0)) })
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock) { $0.registry = store }
        func end(_ activity: String, dismissal: Int64?) -> FanoutJob {
            FanoutJob.liveActivity(
                id: "end-\(activity)", bundleID: Self.app,
                content: LiveActivityContent(event: .end, timestamp: 100, dismissalDate: dismissal),
                recipients: .activity(app: Self.app, id: activity))
        }
        let pastEnd = try await engine.run(end("past", dismissal: Self.realNow / 1000 - 60)) { _ in }
        let laterEnd = try await engine.run(end("later", dismissal: nil)) { _ in }
        await engine.shutdown()
        XCTAssertEqual(pastEnd.counts.delivered, 3)
        XCTAssertEqual(laterEnd.counts.delivered, 3)
        let past = try await store.activity(app: Self.app, activityID: "past")
        XCTAssertNotEqual(past?.state, .active)
        let pastTokens = try await liveTokens(store, activity: "past")
        XCTAssertEqual(pastTokens.count, 0, "dismissed: no token is returned")
        let later = try await store.activity(app: Self.app, activityID: "later")
        XCTAssertEqual(later?.state, .ended)
        let laterTokens = try await liveTokens(store, activity: "later")
        XCTAssertEqual(laterTokens.count, 3, "kept until the default dismissal, 4 hours on")
    }

    // MARK: Priority-10 guard

    /// With a limit of 2 priority-10 updates per activity per hour, the 3rd and 4th go out at
    /// priority 5 and count as demoted; an update with an alert and an end keep priority 10.
    func testPriority10GuardDemotesUpdatesPastTheLimit() async throws {
        let store = try makeRegistry(clock: TestClock(Self.realNow))
        try await store.defineApps([RegistryApp(bundleID: Self.app, workspace: "default")])
        try await registerUpdateTokens(store, activity: "m", tokens: (0..<5).map { ("d\($0)", testDeviceToken($0)) })
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock) {
            $0.registry = store
            $0.priority10UpdatesPerHour = [Self.app: 2]
        }
        var demoted: [Int] = []
        for index in 1...4 {
            let summary = try await engine.run(updateJob("u\(index)", activity: "m", timestamp: Int64(index))) { _ in }
            XCTAssertEqual(summary.counts.delivered, 5)
            demoted.append(summary.demoted)
        }
        XCTAssertEqual(demoted, [0, 0, 5, 5])
        var alert = updateJob("alert", activity: "m", timestamp: 10)
        if case .liveActivity(var content) = alert.payload {
            content.alert = LiveActivityAlert(title: "Goal!")
            alert.payload = .liveActivity(content)
        }
        let withAlert = try await engine.run(alert) { _ in }
        XCTAssertEqual(withAlert.demoted, 0, "an alert keeps priority 10")
        let end = FanoutJob.liveActivity(
            id: "end", bundleID: Self.app, content: LiveActivityContent(event: .end, timestamp: 11, dismissalDate: 12),
            recipients: .activity(app: Self.app, id: "m"))
        let ended = try await engine.run(end) { _ in }
        XCTAssertEqual(ended.demoted, 0, "an end keeps priority 10")
        XCTAssertEqual(ended.counts.delivered, 5)
        await engine.shutdown()
        XCTAssertEqual(mock.stats.snapshot()["by_status"] as? [String: Int], ["200": 30])
        // Two updates of five tokens went at priority 5; the rest (2 updates, the alert, the end) at 10.
        XCTAssertEqual(mock.stats.snapshot()["accepted_by_priority"] as? [String: Int], ["5": 10, "10": 20])
    }

    /// An app the registry does not know, and a registry job on an engine without a registry, are
    /// refused naming the field; nothing is sent.
    func testUnknownAppAndMissingRegistryAreRefused() async throws {
        let store = try makeRegistry(clock: TestClock(Self.realNow))
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock) { $0.registry = store }
        do {
            _ = try await engine.run(updateJob("unknown", activity: "x")) { _ in }
            XCTFail("an unknown app was accepted")
        } catch {
            XCTAssertTrue(error.message.contains("app"), error.message)
        }
        let bare = try makeEngine(for: mock)
        do {
            _ = try await bare.run(updateJob("no-registry", activity: "x")) { _ in }
            XCTFail("a registry job ran without a registry")
        } catch {
            XCTAssertTrue(error.message.contains("registry"), error.message)
        }
        await engine.shutdown()
        await bare.shutdown()
        XCTAssertEqual(mock.stats.snapshot()["requests"] as? Int, 0)
    }

    /// An activity with no live tokens is not an error: the job ends with 0 notifications.
    func testAnActivityWithNoLiveTokensEndsWithNothingSent() async throws {
        let store = try makeRegistry(clock: TestClock(Self.realNow))
        try await store.defineApps([RegistryApp(bundleID: Self.app, workspace: "default")])
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock) { $0.registry = store }
        let summary = try await engine.run(updateJob("empty", activity: "nobody-watches")) { _ in }
        await engine.shutdown()
        XCTAssertEqual(summary.notifications, 0)
        XCTAssertEqual(mock.stats.snapshot()["requests"] as? Int, 0)
    }
}

/// A registry clock a test moves by hand.
final class TestClock: Sendable {
    private let millis: Atomic<Int64>

    init(_ start: Int64) {
        millis = Atomic(start)
    }

    func set(_ value: Int64) { millis.store(value, ordering: .relaxed) }
    func now() -> Int64 { millis.load(ordering: .relaxed) }
    var registryClock: RegistryClock { RegistryClock { self.now() } }
}
