// Every Lua script and every transaction the fleet, the registry on Redis and `fanout serve --redis` issue, run on a
// real Redis Cluster (three primaries, RedisClusterProcess) through the real types: a transaction or a script whose
// keys are in more than one slot fails there (`CROSSSLOT`: the client refuses such a transaction before sending it,
// Redis refuses such a script), where one redis-server takes it. Each test asserts its work was done and that nothing
// logged or threw a cross-slot error.
import Fanout
import FanoutCore
import FanoutPolicy
import FanoutRedis
import FanoutRedisRegistry
import FanoutRegistry
import FanoutTestSupport
import FanoutTransport
import Foundation
import XCTest

@testable import FanoutFleet

final class ClusterKeyLayoutTests: XCTestCase {
    /// What a cluster answers for a command, a transaction or a script whose keys span slots, in any of its forms.
    private static func isCrossSlot(_ text: String) -> Bool {
        let lower = text.lowercased()
        return lower.contains("crossslot") || lower.contains("cross-slot")
            || lower.contains("hash to the same slot") || lower.contains("non local key")
            || lower.contains("different slot")
    }

    /// Log lines of the types under test, kept for the cross-slot check.
    private final class Lines: Sendable {
        private let lines = FanoutMutex<[String]>([])
        func add(_ line: String) { lines.withLock { $0.append(line) } }
        var all: [String] { lines.withLock { $0 } }
    }

    private func makeCluster() throws -> RedisClusterProcess {
        let cluster = try RedisClusterProcess(primaries: 3)
        addTeardownBlock { cluster.discard() }
        return cluster
    }

    private func client(_ url: String, timeout: Duration = .seconds(10)) throws -> RedisClient {
        var configuration = RedisConfiguration(url: try RedisURL(parsing: url))
        configuration.commandTimeout = timeout
        let client = RedisClient(configuration: configuration)
        addTeardownBlock { await client.shutdown() }
        return client
    }

    private func assertNoCrossSlot(_ lines: [String], file: StaticString = #filePath, line: UInt = #line) {
        for text in lines where Self.isCrossSlot(text) { XCTFail("cross-slot: \(text)", file: file, line: line) }
    }

    /// Runs `body` and fails the test on a cross-slot error, with `what` in the message; other errors are rethrown.
    private func noCrossSlot<T>(_ what: String, _ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch {
            let text = (error as? RedisError)?.message ?? "\(error)"
            if (error as? RedisError)?.kind == .crossSlot || Self.isCrossSlot(text) {
                XCTFail("\(what): cross-slot: \(text)")
            }
            throw error
        }
    }

    // MARK: The fleet

    /// `FleetEnqueuer.enqueue` of a tokens job (three shards) and of an activity job read from the registry on the
    /// cluster, one `FleetWorker` sending both (results, marks, counts, completion, acknowledgement, heartbeats,
    /// claims), then every fleet script once more with the keys it is given in production, the rate budget's lease and
    /// return, the provider token's mint under its lock and its restore, a worker name's claim and release.
    func testTheFleetsScriptsAndTransactionsRunOnACluster() async throws {
        let cluster = try makeCluster()
        let lines = Lines()
        let mock = try MockHarness { $0.latencyMilliseconds = 20 }
        defer { mock.stop() }
        let app = "com.example.app"
        let store = RedisRegistryStore(client: try client(cluster.url))
        try await noCrossSlot("defineApps") { try await store.defineApps([RegistryApp(bundleID: app)]) }
        let registered = 30
        _ = try await noCrossSlot("apply") {
            try await store.apply(
                (0..<registered).map { index in
                    .updateToken(
                        UpdateTokenRegistration(
                            app: app, activityID: "match", deviceID: "d-\(index)",
                            token: testDeviceToken(50_000 + index)))
                })
        }

        let directory = try ProcessSupport.temporaryDirectory(for: self, "cluster-fleet")
        let jobs = "\(directory)/jobs.jsonl"
        let tokens = (0..<2_500).map { testDeviceToken($0) }
        let list = tokens.map { "\"\($0)\"" }.joined(separator: ", ")
        let head =
            #""topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", "app": "com.example.app""#
        try
            ([
                #"{"id": "tokens-job", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": [\#(list)]}"#,
                #"{"id": "activity-job", \#(head), "activity_id": "match", "live_activity": {"event": "update", "timestamp": 1764460800, "content_state": {"home": 1}}}"#,
            ].joined(separator: "\n") + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let enqueueClient = try client(cluster.url)
        var reports: [FleetEnqueuer.Report] = []
        let enqueuer = FleetEnqueuer(
            client: enqueueClient, shardSize: 1_000, registry: store, log: { lines.add("[enqueue] \($0)") })
        try await noCrossSlot("enqueue") { try await enqueuer.enqueue(jobsPath: jobs) { reports.append($0) } }
        XCTAssertEqual(reports.count, 2)
        for report in reports {
            guard case .enqueued = report else {
                XCTFail("not enqueued: \(report)")
                continue
            }
        }
        // The shards' entries are on the stream once each (the entry is added after the job's keys, in its slot).
        let entries = try await enqueueClient.command(["XLEN", RedisArgument(FleetKeys.stream)])
        XCTAssertEqual(entries.integer, 4, "three shards of the tokens job, one of the activity job")

        var options = FleetWorkerOptions(name: "cluster-worker")
        options.claimIdle = .milliseconds(600)
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let writer = try await FleetConnection.connect(cluster.url)
        let reader = try await FleetConnection.connect(cluster.url, commandTimeout: options.block + .seconds(10))
        let worker = FleetWorker(
            engine: engine, reader: reader, writer: writer, options: options, log: { lines.add("[worker] \($0)") })
        let running = Task { try await worker.run() }
        let status = FleetReader(client: enqueueClient)
        let deadline = ContinuousClock.now + .seconds(60) * testTimeScale
        var done: [String: FleetReader.JobStatus] = [:]
        while done.count < 2 && ContinuousClock.now < deadline {
            for job in ["tokens-job", "activity-job"] where done[job] == nil {
                if let state = try await noCrossSlot("status", { try await status.status(job: job) }), state.isDone {
                    done[job] = state
                }
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        worker.stop()
        await engine.shutdown(gracePeriod: .seconds(5))
        _ = try await noCrossSlot("worker") { try await running.value }
        await writer.shutdown()
        await reader.shutdown()
        XCTAssertEqual(done.count, 2, "both jobs done: \(lines.all.suffix(20))")
        for (job, count) in [("tokens-job", tokens.count), ("activity-job", registered)] {
            var output: [UInt8] = []
            _ = try await noCrossSlot("results") {
                try await FleetReader(client: enqueueClient).writeResults(job: job) { output += $0 }
            }
            let results = String(decoding: output, as: UTF8.self).split(separator: "\n")
            XCTAssertEqual(results.count, count, "one result per token of \(job)")
            XCTAssertTrue(results.allSatisfy { $0.contains(#""outcome":"delivered""#) }, job)
        }
        XCTAssertEqual(mock.stats.accepted, tokens.count + registered)
        let recorded = try await store.activity(app: app, activityID: "match")
        XCTAssertEqual(recorded?.lastContentTimestamp, 1_764_460_800, "the enqueue recorded the content")

        // Every fleet script once more, with the keys production gives it.
        let keys = FleetKeys(job: "scripts")
        let scripts: [(String, RedisScript, [RedisArgument], [RedisArgument])] = [
            ("claimJob", FleetEnqueuer.claimJob, [keys.meta], [RedisArgument(FleetKeys.enqueueIDField), "e1"]),
            (
                "addShard", FleetEnqueuer.addShard,
                [RedisArgument(FleetKeys.stream), FleetKeys.entryMarker(stream: FleetKeys.stream, "e1", 0)],
                ["60000", "job", "scripts", "shard", "0", "start", "0", "count", "1", "enqueue_id", "e1"]
            ),
            (
                "recordResults", FleetScripts.recordResults,
                [keys.marks(shard: 0), keys.results(shard: 0), keys.counts],
                ["0", "1", "0", "0 {\"outcome\":\"delivered\",\"attempts\":1}\n", "delivered", "1"]
            ),
            ("recordJobResult", FleetScripts.recordJobResult, [keys.results, keys.counts], ["line", "invalid", "0"]),
            (
                "completeShard", FleetScripts.completeShard,
                [keys.done, keys.counts, keys.meta, keys.tokens(shard: 0), keys.marks(shard: 0), keys.results],
                ["0", "0", "0", "0", "1", "1"]
            ),
            (
                "heartbeat", FleetScripts.heartbeat, [RedisArgument(FleetKeys.stream)],
                [RedisArgument(FleetKeys.group), "w", "0-1"]
            ),
        ]
        for (name, script, scriptKeys, arguments) in scripts {
            _ = try await noCrossSlot(name) {
                try await enqueueClient.evalScript(script, keys: scriptKeys, arguments: arguments)
            }
        }
        // The marker makes the entry once: the same (enqueue, shard) again adds nothing.
        let before = try await enqueueClient.command(["XLEN", RedisArgument(FleetKeys.stream)]).integer
        let again = try await enqueueClient.evalScript(
            FleetEnqueuer.addShard,
            keys: [RedisArgument(FleetKeys.stream), FleetKeys.entryMarker(stream: FleetKeys.stream, "e1", 0)],
            arguments: ["60000", "job", "scripts", "shard", "0", "start", "0", "count", "1", "enqueue_id", "e1"])
        XCTAssertNotNil(again.string)
        let after = try await enqueueClient.command(["XLEN", RedisArgument(FleetKeys.stream)]).integer
        XCTAssertEqual(after, before, "an entry added again for the same enqueue and shard is not added twice")

        // The rate budget: a lease taken, then returned.
        let limits = try RateLimiterRegistry(defaultBudget: RateBudget(requestsPerHour: 36_000, burstSeconds: 10))
        let budget = FleetRateBudget(
            client: try client(cluster.url), limits: limits, options: FleetRateBudget.Options(leaseID: "cluster"),
            log: { lines.add("[budget] \($0)") })
        let now = DispatchTime.now().uptimeNanoseconds
        let decision = await budget.decide(workspace: "ws", priority: 10, cost: 1, now: now)
        guard case .admit = decision else { return XCTFail("the lease admits: \(decision)") }
        XCTAssertGreaterThan(budget.leaseRequests, 0)
        XCTAssertGreaterThan(budget.heldUnits(workspace: "ws", priority: 10, now: now), 0, "a lease is held")
        let returned = await budget.returnLeases()
        XCTAssertGreaterThan(returned, 0, "the lease went back")

        // The provider token: minted under the lock by one worker, adopted by another; restored after a flush.
        let signer = try ProviderTokenSigner(key: ES256PrivateKey.generate(), keyID: "KEYID12345", teamID: "TEAMID1234")
        var tokenOptions = FleetProviderToken.Options()
        tokenOptions.pollInterval = .seconds(3600)
        let tokenClient = try client(cluster.url)
        let first = FleetProviderToken(client: tokenClient, signer: signer, options: tokenOptions)
        let second = FleetProviderToken(client: try client(cluster.url), signer: signer, options: tokenOptions)
        defer {
            first.stop()
            second.stop()
        }
        let minted = try await noCrossSlot("provider token") { try await first.refresh() }
        let adopted = try await noCrossSlot("provider token") { try await second.refresh() }
        XCTAssertEqual(minted, adopted)
        XCTAssertEqual(first.mintCount + second.mintCount, 1)
        _ = try await tokenClient.command(["DEL", "fanout:token:{TEAMID1234}"])
        let restored = try await noCrossSlot("provider token restore") { try await first.refresh() }
        XCTAssertEqual(restored, minted, "the held token is stored again, not minted")

        // A worker name: claimed, refreshed by a second claim of the same holder's, released.
        let nameClient = try client(cluster.url)
        let name = try await noCrossSlot("worker name") {
            try await FleetWorkerName.claim("cluster-name", expiry: .seconds(5), client: nameClient)
        }
        await name.release(client: nameClient, timeout: .seconds(5))
        let exists = try await nameClient.command(["EXISTS", RedisArgument(FleetWorkerName.key("cluster-name"))])
        XCTAssertEqual(exists.integer, 0, "released")

        assertNoCrossSlot(lines.all)
    }

    /// `fanout enqueue --partitions 6` on the cluster: the shards' entries spread over six streams, on more than one
    /// primary, and a worker started before the enqueue (which knew only `fanout:shards`) finds the new streams at its
    /// next claim check, sends every shard once and leaves every stream empty.
    func testShardsSpreadOverPartitionStreamsOnSeveralPrimaries() async throws {
        let cluster = try makeCluster()
        let lines = Lines()
        let mock = try MockHarness()
        defer { mock.stop() }
        let client = try client(cluster.url)
        let partitions = 6
        let streams = (0..<partitions).map { FleetKeys.stream(partition: $0) }
        let primaries = try Set(
            streams.map { try cluster.primary(servingSlot: RedisClusterSlot.slot(of: Array($0.utf8))).port })
        XCTAssertGreaterThan(primaries.count, 1, "the partitions' streams are on several primaries")

        func startWorker(_ name: String) async throws -> (FleetWorker, FanoutEngine, Task<FleetWorkerStats, any Error>)
        {
            var options = FleetWorkerOptions(name: name)
            options.claimIdle = .milliseconds(600)
            let engine = try makeEngine(for: mock, loops: 1, connections: 1)
            let writer = try await FleetConnection.connect(cluster.url)
            let reader = try await FleetConnection.connect(cluster.url, commandTimeout: options.block + .seconds(10))
            addTeardownBlock {
                await writer.shutdown()
                await reader.shutdown()
            }
            let worker = FleetWorker(
                engine: engine, reader: reader, writer: writer, options: options, log: { lines.add("[\(name)] \($0)") })
            return (worker, engine, Task { try await worker.run() })
        }
        let early = try await startWorker("early")

        let directory = try ProcessSupport.temporaryDirectory(for: self, "cluster-partitions")
        let jobs = "\(directory)/jobs.jsonl"
        let tokens = (0..<6_000).map { testDeviceToken($0) }
        func line(_ id: String, _ tokens: ArraySlice<String>) -> String {
            let list = tokens.map { "\"\($0)\"" }.joined(separator: ", ")
            return
                #"{"id": "\#(id)", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens": [\#(list)]}"#
        }
        try (line("big", tokens[0..<5_500]) + "\n" + line("small", tokens[5_500...]) + "\n").write(
            toFile: jobs, atomically: true, encoding: .utf8)
        var reports: [FleetEnqueuer.Report] = []
        try await noCrossSlot("enqueue") {
            try await FleetEnqueuer(client: client, shardSize: 500, partitions: partitions).enqueue(jobsPath: jobs) {
                reports.append($0)
            }
        }
        XCTAssertEqual(reports.count, 2)

        let deadline = ContinuousClock.now + .seconds(60) * testTimeScale
        var done = Set<String>()
        while done.count < 2 && ContinuousClock.now < deadline {
            for job in ["big", "small"] where !done.contains(job) {
                if try await FleetReader(client: client).status(job: job)?.isDone == true { done.insert(job) }
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        let (worker, engine, task) = early
        worker.stop()
        await engine.shutdown(gracePeriod: .seconds(5))
        let stats = try await noCrossSlot("worker") { try await task.value }
        XCTAssertEqual(stats.shardsCompleted, 12, "every shard, from every partition")
        XCTAssertEqual(done, ["big", "small"], "\(lines.all.suffix(20))")
        for (job, count) in [("big", 5_500), ("small", 500)] {
            var output: [UInt8] = []
            _ = try await FleetReader(client: client).writeResults(job: job) { output += $0 }
            XCTAssertEqual(String(decoding: output, as: UTF8.self).split(separator: "\n").count, count, job)
        }
        XCTAssertEqual(mock.stats.accepted, tokens.count, "every token sent once")
        // Every partition held some of the 12 shards, and none is left on any.
        var sent = 0
        for stream in streams {
            let info = try await client.command(["XINFO", "STREAM", RedisArgument(stream)])
            let fields = info.array ?? []
            let added = zip(fields, fields.dropFirst()).first { $0.0.string == "entries-added" }?.1.integer
            sent += Int(added ?? 0)
            XCTAssertGreaterThan(added ?? 0, 0, "\(stream) had shards")
            let left = try await client.command(["XLEN", RedisArgument(stream)]).integer
            XCTAssertEqual(left, 0, stream)
        }
        XCTAssertEqual(sent, 12, "11 shards of the big job, 1 of the small one")
        assertNoCrossSlot(lines.all)
    }

    // MARK: The registry

    /// Every write and read of `RedisRegistryStore` on the cluster: each kind of change, the reads and their pages,
    /// the event log and its pruning, the sweep.
    func testTheRegistrysScriptsRunOnACluster() async throws {
        let cluster = try makeCluster()
        let clock = FanoutMutex<Int64>(Int64(Date().timeIntervalSince1970 * 1000))
        var configuration = RegistryConfiguration()
        configuration.clock = RegistryClock { clock.withLock { $0 } }
        let store = RedisRegistryStore(client: try client(cluster.url), configuration: configuration)
        let app = "com.acme.app"
        try await noCrossSlot("defineApps") {
            try await store.defineApps([RegistryApp(bundleID: app, workspace: "acme")])
        }
        let now = clock.withLock { $0 }
        var changes: [RegistryChange] = []
        for activity in ["a-1", "a-2"] {
            changes.append(.startActivity(app: app, activityID: activity, attributesType: "Match"))
            changes += (0..<40).map { index in
                .updateToken(
                    UpdateTokenRegistration(
                        app: app, activityID: activity, deviceID: "d-\(index)", userID: "u-\(index % 4)",
                        token: testDeviceToken(activity == "a-1" ? index : 1_000 + index)))
            }
        }
        changes += (0..<10).map { index in
            .device(
                DeviceRegistration(
                    app: app, deviceID: "d-\(index)", userID: "u-\(index % 4)",
                    pushToken: testDeviceToken(2_000 + index)))
        }
        changes += (0..<10).map { index in
            .pushToStartToken(
                PushToStartRegistration(
                    app: app, deviceID: "d-\(index)", userID: "u-\(index % 4)", attributesType: "Match",
                    token: testDeviceToken(3_000 + index)))
        }
        changes.append(.contentSent(app: app, activityID: "a-1", timestamp: now / 1000))
        changes.append(.channel(app: app, activityID: "a-2", channelID: "Y2hhbm5lbA==", storagePolicy: 1))
        changes.append(.stopUpdateTokens(app: app, activityID: "a-1", deviceID: "d-39"))
        changes.append(.unregistered(token: testDeviceToken(38), timestamp: nil))
        changes.append(.invalidToken(token: testDeviceToken(1_037), topic: app + ".push-type.liveactivity"))
        changes.append(.endActivity(app: app, activityID: "a-2", dismissalDate: now + 1_000))
        let applied = try await noCrossSlot("apply") { try await store.apply(changes) }
        XCTAssertFalse(applied.events.isEmpty)

        var paged: [String] = []
        var cursor: RegistryCursor?
        repeat {
            let page = try await noCrossSlot("liveUpdateTokens") {
                try await store.liveUpdateTokens(app: app, activityID: "a-1", after: cursor, limit: 7, now: now)
            }
            paged += page.items.map(\.token)
            cursor = page.next
        } while cursor != nil
        XCTAssertEqual(Set(paged).count, 38, "40 registered, one stopped, one unregistered")
        let count = try await store.liveUpdateTokenCount(app: app, activityID: "a-1", now: now)
        XCTAssertEqual(count, 38)
        let activity = try await noCrossSlot("activity") { try await store.activity(app: app, activityID: "a-1") }
        XCTAssertEqual(activity?.lastContentTimestamp, now / 1000)
        _ = try await noCrossSlot("updateTokens") {
            try await store.updateTokens(app: app, deviceID: "d-1", after: nil, limit: 10, now: now)
        }
        let starts = try await noCrossSlot("pushToStartTokens") {
            try await store.pushToStartTokens(
                app: app, attributesType: "Match", selection: .users(["u-1"]), after: nil, limit: 10)
        }
        XCTAssertFalse(starts.items.isEmpty)
        let devices = try await noCrossSlot("devices") {
            try await store.devices(app: app, selection: .all, after: nil, limit: 4)
        }
        XCTAssertEqual(devices.items.count, 4)
        let byToken = try await noCrossSlot("devices by token") {
            try await store.devices(app: app, pushTokens: [testDeviceToken(2_003)])
        }
        XCTAssertEqual(byToken.count, 1)
        var events = 0
        cursor = nil
        repeat {
            let page = try await noCrossSlot("events") { try await store.events(after: cursor, limit: 25) }
            events += page.items.count
            cursor = page.items.isEmpty ? nil : page.next
        } while cursor != nil
        XCTAssertGreaterThan(events, 0)
        _ = try await noCrossSlot("stats") { try await store.stats(now: now) }
        _ = try await noCrossSlot("endedChannels") {
            try await store.endedChannels(now: now + 2_000, limit: 10, skipping: 0)
        }

        // Past every token's lifetime: the sweep removes them all, activity by activity, and prunes the events.
        let later = now + 9 * 3_600_000
        clock.withLock { $0 = later }
        var swept = RegistrySweepResult()
        while true {
            let round = try await noCrossSlot("sweep") { try await store.sweep(now: later, batchSize: 16) }
            swept.expired += round.expired
            swept.ended += round.ended
            swept.activitiesRemoved += round.activitiesRemoved
            if round.expired == 0 && round.ended == 0 && round.activitiesRemoved == 0 { break }
        }
        XCTAssertGreaterThan(swept.expired + swept.ended, 0)
        let left = try await store.liveUpdateTokenCount(app: app, activityID: "a-1", now: later)
        XCTAssertEqual(left, 0)
    }

    // MARK: fanout serve

    /// `fanout serve --redis redis+cluster://...`: registrations, an update with an idempotency key (the key's claim,
    /// the content timestamp's claim, the request quota, the record and the shared queue's entry, the take, the
    /// activity's run lock, the published results), its retry, a push to devices, the status page; the dispatch
    /// runs and the log names no cross-slot error.
    func testServeOnAClusterAcceptsRunsAndPublishesDispatches() throws {
        let cluster = try makeCluster()
        let mock = try MockHarness { $0.capturePayloads = true }
        defer { mock.stop() }
        let serve = try ServeHarness(testCase: self, mock: mock, acmeRateLimit: (perHour: 36_000, burst: 100))
        try serve.start(arguments: ["--redis", cluster.url])
        defer { XCTAssertEqual(serve.stop(), 0, "fanout serve exits 0 on SIGTERM: \(serve.log.suffix(2000))") }
        for index in 0..<5 {
            let registered = try serve.curl(
                "POST", "/v1/activities/match/tokens", key: ServeKeys.acmeDevice,
                json: #"{"token": "\#(testDeviceToken(index))", "device_id": "d-\#(index)"}"#)
            XCTAssertEqual(registered.status, 200, registered.text)
        }
        let body = #"{"content_state": {"home": 1, "away": 0}}"#
        let key = ["Idempotency-Key": "goal-1-0"]
        let update = try serve.curl(
            "POST", "/v1/activities/match/update", key: ServeKeys.acmeServer, json: body, headers: key)
        XCTAssertEqual(update.status, 202, update.text + serve.log.suffix(2000))
        let id = try XCTUnwrap(try update.object()["dispatch_id"] as? String)
        let retried = try serve.curl(
            "POST", "/v1/activities/match/update", key: ServeKeys.acmeServer, json: body, headers: key)
        XCTAssertEqual(try retried.object()["dispatch_id"] as? String, id, "the retry names the first dispatch")
        let done = try serve.waitForDispatch(id)
        XCTAssertEqual(done["delivered"] as? Int, 5, "\(done)")
        let results = try serve.curl("GET", "/v1/dispatches/\(id)/results", key: ServeKeys.acmeServer)
        XCTAssertEqual(results.text.split(separator: "\n").count, 5, results.text)
        let push = try serve.curl(
            "POST", "/v1/push", key: ServeKeys.acmeServer,
            json: #"{"alert": {"title": "hi"}, "audience": {"devices": ["nobody"]}}"#)
        XCTAssertEqual(push.status, 202, push.text)
        let pushID = try XCTUnwrap(try push.object()["dispatch_id"] as? String)
        _ = try serve.waitForDispatch(pushID)
        let status = try serve.curl("GET", "/v1/status", key: ServeKeys.acmeServer)
        let listed = try XCTUnwrap(try status.object()["dispatches"] as? [[String: Any]], status.text)
        XCTAssertEqual(Set(listed.compactMap { $0["id"] as? String }), [id, pushID], status.text)
        for index in 0..<5 {
            XCTAssertEqual(mock.stats.payloadsByToken[testDeviceToken(index)]?.count, 1, "token \(index) got it once")
        }
        assertNoCrossSlot(serve.log.split(separator: "\n").map(String.init))
    }
}
