// The fleet sends registry-addressed jobs: tokens
// registered in the registry on a real redis-server (through a RedisRegistryStore, as `fanout serve --redis` keeps
// it), an `activity_id` job enqueued by the real `fanout` binary, two real workers against mock-apns in process,
// and the registry pruned of the tokens the mock answers 410.
import FanoutFleet
import FanoutRedis
import FanoutRedisRegistry
import FanoutRegistry
import FanoutTestSupport
import Foundation
import XCTest

final class FleetRegistryTests: XCTestCase {
    private static let app = "com.example.app"
    private static let activity = "match-7"
    /// Live tokens of the activity: `testDeviceToken(0..<live)`.
    private static let live = 3_000
    /// Tokens mock-apns answers 410 Unregistered.
    private static let unregistered = [7, 1_500, 2_999]
    private static let shardSize = 500

    private func fanout(_ arguments: [String], timeout: TimeInterval = 60) throws -> ProcessResult {
        try ProcessSupport.run(
            try ProcessSupport.builtExecutable("fanout"), arguments, environment: ProcessSupport.cleanEnvironment(),
            timeout: timeout)
    }

    private static func object(_ line: some StringProtocol) throws -> [String: Any] {
        try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], String(line))
    }

    func testAnActivityJobIsSentToTheTokensLiveAtEnqueueAndTheRegistryIsPruned() async throws {
        let redis = try RedisServerProcess(for: self)
        let directory = try ProcessSupport.temporaryDirectory(for: self, "fleet-registry")
        let unregisteredFile = "\(directory)/unregistered.txt"
        try (Self.unregistered.map(testDeviceToken).joined(separator: "\n") + "\n").write(
            toFile: unregisteredFile, atomically: true, encoding: .utf8)
        let mock = try RestartableMock { $0.unregisteredPath = unregisteredFile }
        addTeardownBlock { _ = mock.stop() }
        let channel = try XCTUnwrap(mock.createChannel(app: Self.app))
        let config = "\(directory)/config.json"
        try """
        {"endpoint": "localhost:\(mock.port)", "ca_file": "\(mock.material.caPEMPath)",
         "key_path": "\(mock.material.authKeyP8Path)", "key_id": "KEYID12345", "team_id": "TEAMID1234",
         "loops": 1, "connections": 2}
        """.write(toFile: config, atomically: true, encoding: .utf8)

        // The registry on Redis, with the default prefix `fanout serve --redis` uses: the activity's live tokens, one
        // stopped and one expired (registered 9 hours ago; update tokens live 8), a second activity bound to a
        // broadcast channel. The others were registered two minutes ago, before the 410s mock-apns dates now.
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: redis.url)))
        defer { Task { await client.shutdown() } }
        let store = RedisRegistryStore(client: client)
        try await store.defineApps([RegistryApp(bundleID: Self.app)])
        let now = store.clock.now()
        var changes: [RegistryChange] = (0...Self.live + 1).map { index in
            .updateToken(
                UpdateTokenRegistration(
                    app: Self.app, activityID: Self.activity, deviceID: "d-\(index)", token: testDeviceToken(index),
                    registeredAt: index == Self.live + 1 ? now - 9 * 3_600_000 : now - 120_000))
        }
        changes.append(.stopUpdateTokens(app: Self.app, activityID: Self.activity, deviceID: "d-\(Self.live)"))
        changes += (0..<2).map { index in
            .updateToken(
                UpdateTokenRegistration(
                    app: Self.app, activityID: "with-channel", deviceID: "c-\(index)",
                    token: testDeviceToken(10_000 + index)))
        }
        // Bound with its policy (the mock's default, 1: the latest message kept), as `fanout serve` binds it.
        changes.append(.channel(app: Self.app, activityID: "with-channel", channelID: channel, storagePolicy: 1))
        _ = try await store.apply(changes)
        let liveBefore = try await store.liveUpdateTokenCount(app: Self.app, activityID: Self.activity, now: now)
        XCTAssertEqual(liveBefore, Self.live)

        let head =
            #""topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", "app": "com.example.app""#
        let jobs = "\(directory)/jobs.jsonl"
        try
            ([
                #"{"id": "by-activity", \#(head), "activity_id": "match-7", "live_activity": {"event": "update", "timestamp": 1764460800, "content_state": {"home": 1}}}"#,
                // Not newer than the activity's last content (the line before): superseded, refused.
                #"{"id": "stale", \#(head), "activity_id": "match-7", "live_activity": {"event": "update", "timestamp": 1764460800, "content_state": {"home": 0}}}"#,
                #"{"id": "unknown-app", "topic": "com.other.push-type.liveactivity", "push_type": "liveactivity", "app": "com.other", "activity_id": "x", "live_activity": {"event": "update", "content_state": {}}}"#,
                #"{"id": "broadcast", \#(head), "activity_id": "with-channel", "live_activity": {"event": "update", "timestamp": 1764460800, "content_state": {"home": 2}}}"#,
            ].joined(separator: "\n") + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let enqueued = try fanout([
            "enqueue", "--redis", redis.url, "--jobs", jobs, "--shard-size", String(Self.shardSize),
        ])
        XCTAssertEqual(enqueued.exitCode, 1, enqueued.summary)
        XCTAssertEqual(
            enqueued.stdoutLines, [#"{"job": "by-activity", "shards": 6}"#, #"{"job": "broadcast", "shards": 2}"#],
            enqueued.summary)
        XCTAssertTrue(enqueued.stderr.contains("line 2: superseded"), enqueued.summary)
        XCTAssertTrue(enqueued.stderr.contains(#"line 3: app: "com.other" is not in the registry"#), enqueued.summary)
        let recorded = try await store.activity(app: Self.app, activityID: Self.activity)
        XCTAssertEqual(recorded?.lastContentTimestamp, 1_764_460_800, "the job's content is the activity's last")

        // Registered after the enqueue: not in the job (its audience is the tokens live at enqueue).
        _ = try await store.apply([
            .updateToken(
                UpdateTokenRegistration(
                    app: Self.app, activityID: Self.activity, deviceID: "late", token: testDeviceToken(20_000)))
        ])

        let workers = try (0..<2).map { index in
            let worker = try RunningProcess(
                try ProcessSupport.builtExecutable("fanout"),
                ["worker", "--redis", redis.url, "--config", config, "--name", "w\(index)", "--claim-idle", "1"],
                environment: ProcessSupport.cleanEnvironment())
            addTeardownBlock { worker.kill(SIGKILL) }
            return worker
        }
        let deadline = Date().addingTimeInterval(120)
        while true {
            let status = try fanout(["status", "--redis", redis.url])
            let states = try status.stdoutLines.map { try Self.object($0)["state"] as? String }
            if states.count == 2 && states.allSatisfy({ $0 == "done" }) { break }
            guard Date() < deadline else { throw ProcessSupportError("the fleet did not finish: \(status.stdout)") }
            usleep(200_000)
        }
        // Stopped: each engine has applied its pruning to the registry before it exits.
        for worker in workers { XCTAssertEqual(try worker.stop(timeout: 20), 0, "SIGTERM: a clean exit") }

        // Exactly one result per live token; the 410s are `unregistered`.
        let out = "\(directory)/results.jsonl"
        let results = try fanout(["results", "--redis", redis.url, "--job", "by-activity", "--out", out])
        XCTAssertEqual(results.exitCode, 1, "done, with 3 notifications not delivered: \(results.summary)")
        let summary = try Self.object(try XCTUnwrap(results.stdoutLines.last, results.summary))
        XCTAssertEqual(summary["notifications"] as? Int, Self.live, "\(summary)")
        XCTAssertEqual(summary["unregistered"] as? Int, Self.unregistered.count, "\(summary)")
        var outcomes: [String: String] = [:]
        for line in try String(contentsOfFile: out, encoding: .utf8).split(separator: "\n") {
            let object = try Self.object(line)
            let token = try XCTUnwrap(object["token"] as? String, String(line))
            XCTAssertNil(outcomes[token], "one line per token: \(token)")
            outcomes[token] = object["outcome"] as? String
        }
        XCTAssertEqual(Set(outcomes.keys), Set((0..<Self.live).map(testDeviceToken)), "the live tokens, no other")
        for index in 0..<Self.live {
            let expected = Self.unregistered.contains(index) ? "unregistered" : "delivered"
            XCTAssertEqual(outcomes[testDeviceToken(index)], expected, "token \(index)")
        }

        // The activity with a channel: its two tokens, then the broadcast as one more recipient.
        let broadcastOut = "\(directory)/broadcast.jsonl"
        let broadcast = try fanout(["results", "--redis", redis.url, "--job", "broadcast", "--out", broadcastOut])
        XCTAssertEqual(broadcast.exitCode, 0, broadcast.summary)
        let broadcastSummary = try Self.object(try XCTUnwrap(broadcast.stdoutLines.last, broadcast.summary))
        XCTAssertEqual(broadcastSummary["notifications"] as? Int, 3, "\(broadcastSummary)")
        XCTAssertEqual(broadcastSummary["broadcasts"] as? Int, 1, "\(broadcastSummary)")
        let lines = try String(contentsOfFile: broadcastOut, encoding: .utf8).split(separator: "\n").map(Self.object)
        XCTAssertEqual(lines.count, 3, "\(lines)")
        XCTAssertEqual(
            Set(lines.compactMap { $0["token"] as? String }), [testDeviceToken(10_000), testDeviceToken(10_001)])
        XCTAssertEqual(lines.last?["channel"] as? String, channel, "\(lines)")
        XCTAssertEqual(lines.last?["outcome"] as? String, "delivered", "\(lines)")
        XCTAssertEqual(mock.totals().broadcastsStored, 1, "kept for offline devices: the bound channel's policy")

        // mock-apns accepted every delivered token once, and nothing else of the activity.
        XCTAssertTrue(mock.stop())
        let counts = try mock.acceptedPerToken(count: Self.live + 2)
        for index in 0..<Self.live + 2 {
            let expected: UInt16 = index < Self.live && !Self.unregistered.contains(index) ? 1 : 0
            XCTAssertEqual(counts.perToken[index], expected, "token \(index)")
        }

        // The registry is pruned of the 410s: the worker applied them as `fanout send --registry` does.
        let after = try await store.liveUpdateTokenCount(
            app: Self.app, activityID: Self.activity, now: store.clock.now())
        XCTAssertEqual(after, Self.live - Self.unregistered.count + 1, "the 410s gone, the late registration kept")
        var remaining = Set<String>()
        var cursor: RegistryCursor?
        repeat {
            let page = try await store.liveUpdateTokens(
                app: Self.app, activityID: Self.activity, after: cursor, limit: 1000, now: store.clock.now())
            remaining.formUnion(page.items.map(\.token))
            cursor = page.next
        } while cursor != nil
        for index in Self.unregistered {
            XCTAssertFalse(remaining.contains(testDeviceToken(index)), "token \(index) was pruned")
        }
        XCTAssertTrue(remaining.contains(testDeviceToken(0)))
    }

    /// A broadcast by `channel_id` is enqueued as one shard whose one recipient is the channel, and a worker sends it
    /// once, as the line says (its storage policy gives the expiration that lets APNs keep it).
    func testAChannelJobIsEnqueuedAsOneBroadcastShardAndSentOnce() async throws {
        let redis = try RedisServerProcess(for: self)
        let directory = try ProcessSupport.temporaryDirectory(for: self, "fleet-channel")
        let mock = try RestartableMock()
        addTeardownBlock { _ = mock.stop() }
        let channel = try XCTUnwrap(mock.createChannel(app: Self.app))
        let config = "\(directory)/config.json"
        try """
        {"endpoint": "localhost:\(mock.port)", "ca_file": "\(mock.material.caPEMPath)",
         "key_path": "\(mock.material.authKeyP8Path)", "key_id": "KEYID12345", "team_id": "TEAMID1234",
         "loops": 1, "connections": 1}
        """.write(toFile: config, atomically: true, encoding: .utf8)
        let jobs = "\(directory)/jobs.jsonl"
        try
            (#"{"id": "to-channel", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", "app": "com.example.app", "channel_id": "\#(channel)", "channel_storage_policy": 1, "live_activity": {"event": "update", "timestamp": 1764460800, "content_state": {"home": 3}}}"#
            + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let enqueued = try fanout(["enqueue", "--redis", redis.url, "--jobs", jobs])
        XCTAssertEqual(enqueued.exitCode, 0, enqueued.summary)
        XCTAssertEqual(enqueued.stdoutLines, [#"{"job": "to-channel", "shards": 1}"#], enqueued.summary)
        let worker = try RunningProcess(
            try ProcessSupport.builtExecutable("fanout"),
            ["worker", "--redis", redis.url, "--config", config, "--name", "w0", "--claim-idle", "1"],
            environment: ProcessSupport.cleanEnvironment())
        addTeardownBlock { worker.kill(SIGKILL) }
        let deadline = Date().addingTimeInterval(60)
        while true {
            let status = try fanout(["status", "--redis", redis.url])
            if try status.stdoutLines.map({ try Self.object($0)["state"] as? String }) == ["done"] { break }
            guard Date() < deadline else { throw ProcessSupportError("the fleet did not finish: \(status.stdout)") }
            usleep(100_000)
        }
        XCTAssertEqual(try worker.stop(timeout: 20), 0, "SIGTERM: a clean exit")
        let out = "\(directory)/results.jsonl"
        let results = try fanout(["results", "--redis", redis.url, "--job", "to-channel", "--out", out])
        XCTAssertEqual(results.exitCode, 0, results.summary)
        let summary = try Self.object(try XCTUnwrap(results.stdoutLines.last, results.summary))
        XCTAssertEqual(summary["notifications"] as? Int, 1, "\(summary)")
        XCTAssertEqual(summary["broadcasts"] as? Int, 1, "\(summary)")
        let lines = try String(contentsOfFile: out, encoding: .utf8).split(separator: "\n").map(Self.object)
        XCTAssertEqual(lines.count, 1, "\(lines)")
        XCTAssertEqual(lines.first?["channel"] as? String, channel, "\(lines)")
        XCTAssertTrue(lines.first?["token"] is NSNull, "\(lines)")
        XCTAssertEqual(lines.first?["outcome"] as? String, "delivered", "\(lines)")
        XCTAssertEqual(mock.totals().broadcastsStored, 1, "sent once, kept for offline devices (policy 1)")
    }

    /// Users, devices and push-to-start jobs take their tokens from the registry at enqueue; an `end` by activity id
    /// An update and the end after it in one file, neither with a `timestamp`: read in the same second they had one
    /// default timestamp, and the end was refused at enqueue as `superseded`. Both are enqueued, the end with the
    /// later default timestamp (what the workers parse its line with).
    func testAnUpdateAndTheEndAfterItInOneFileAreBothEnqueued() async throws {
        let redis = try RedisServerProcess(for: self)
        let directory = try ProcessSupport.temporaryDirectory(for: self, "fleet-registry-order")
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: redis.url)))
        defer { Task { await client.shutdown() } }
        let store = RedisRegistryStore(client: client)
        try await store.defineApps([RegistryApp(bundleID: Self.app)])
        _ = try await store.apply(
            (0..<3).map { index in
                .updateToken(
                    UpdateTokenRegistration(
                        app: Self.app, activityID: Self.activity, deviceID: "d-\(index)", token: testDeviceToken(index))
                )
            })
        let head =
            #""topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", "app": "com.example.app", "activity_id": "match-7""#
        let jobs = "\(directory)/jobs.jsonl"
        try
            ([
                #"{"id": "update", \#(head), "live_activity": {"event": "update", "content_state": {"home": 1}}}"#,
                #"{"id": "end", \#(head), "live_activity": {"event": "end", "content_state": {"home": 2}}}"#,
            ].joined(separator: "\n") + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let enqueued = try fanout(["enqueue", "--redis", redis.url, "--jobs", jobs])
        XCTAssertEqual(enqueued.exitCode, 0, enqueued.summary)
        XCTAssertEqual(
            enqueued.stdoutLines, [#"{"job": "update", "shards": 1}"#, #"{"job": "end", "shards": 1}"#],
            enqueued.summary)
        func defaultTimestamp(_ job: String) async throws -> Int64 {
            let reply = try await client.command(["HGET", FleetKeys(job: job).meta, "now"])
            return try XCTUnwrap(reply.integer, "\(reply)")
        }
        let update = try await defaultTimestamp("update")
        let end = try await defaultTimestamp("end")
        XCTAssertGreaterThan(end, update)
        let recorded = try await store.activity(app: Self.app, activityID: Self.activity)
        XCTAssertEqual(recorded?.lastContentTimestamp, end, "the end's content is the activity's last")
    }

    /// marks the activity ended once its tokens are read; a push-to-start naming its activity id is refused.
    func testUsersDevicesPushToStartAndEndJobsResolveFromTheRegistryOnRedis() async throws {
        let redis = try RedisServerProcess(for: self)
        let directory = try ProcessSupport.temporaryDirectory(for: self, "fleet-registry-kinds")
        let mock = try RestartableMock()
        addTeardownBlock { _ = mock.stop() }
        let config = "\(directory)/config.json"
        try """
        {"endpoint": "localhost:\(mock.port)", "ca_file": "\(mock.material.caPEMPath)",
         "key_path": "\(mock.material.authKeyP8Path)", "key_id": "KEYID12345", "team_id": "TEAMID1234",
         "loops": 1, "connections": 2}
        """.write(toFile: config, atomically: true, encoding: .utf8)

        // Devices d-0..<10 of users u-(i % 3) with push tokens 0..<10; push-to-start tokens 100..<110 for the same
        // devices; the activity "final" with update tokens 200..<204.
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: redis.url)))
        defer { Task { await client.shutdown() } }
        let store = RedisRegistryStore(client: client)
        try await store.defineApps([RegistryApp(bundleID: Self.app)])
        var changes: [RegistryChange] = []
        for index in 0..<10 {
            changes.append(
                .device(
                    DeviceRegistration(
                        app: Self.app, deviceID: "d-\(index)", userID: "u-\(index % 3)",
                        pushToken: testDeviceToken(index))))
            changes.append(
                .pushToStartToken(
                    PushToStartRegistration(
                        app: Self.app, deviceID: "d-\(index)", attributesType: "MatchAttributes",
                        token: testDeviceToken(100 + index))))
        }
        for index in 0..<4 {
            changes.append(
                .updateToken(
                    UpdateTokenRegistration(
                        app: Self.app, activityID: "final", deviceID: "d-\(index)", token: testDeviceToken(200 + index))
                ))
        }
        _ = try await store.apply(changes)

        let alert = #""topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}"#
        let live = #""topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity""#
        let start =
            #""live_activity": {"event": "start", "content_state": {"home": 0}, "attributes_type": "MatchAttributes", "attributes": {"team": "A"}, "alert": {"title": "Kick-off"}}"#
        let jobs = "\(directory)/jobs.jsonl"
        try
            ([
                #"{"id": "users", \#(alert), "users": ["u-0"]}"#,
                #"{"id": "devices", \#(alert), "devices": ["d-1", "d-2", "d-missing"]}"#,
                #"{"id": "start", \#(live), \#(start), "push_to_start": {"attributes_type": "MatchAttributes", "all": true}}"#,
                #"{"id": "start-named", \#(live), \#(start), "push_to_start": {"all": true}, "activity_id": "match-9"}"#,
                #"{"id": "end", \#(live), "activity_id": "final", "live_activity": {"event": "end", "content_state": {"home": 3}, "dismissal_date": 4102444800}}"#,
            ].joined(separator: "\n") + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let enqueued = try fanout(["enqueue", "--redis", redis.url, "--jobs", jobs, "--shard-size", "3"])
        XCTAssertEqual(enqueued.exitCode, 1, enqueued.summary)
        XCTAssertEqual(
            enqueued.stdoutLines,
            [
                #"{"job": "users", "shards": 2}"#, #"{"job": "devices", "shards": 1}"#,
                #"{"job": "start", "shards": 4}"#, #"{"job": "end", "shards": 2}"#,
            ], enqueued.summary)
        XCTAssertTrue(
            enqueued.stderr.contains("line 4: push_to_start jobs that name their activity_id"), enqueued.summary)
        let ended = try await store.activity(app: Self.app, activityID: "final")
        XCTAssertEqual(ended?.state, .ended, "the end is recorded once its tokens are read")

        let worker = try RunningProcess(
            try ProcessSupport.builtExecutable("fanout"),
            ["worker", "--redis", redis.url, "--config", config, "--name", "w0", "--claim-idle", "1"],
            environment: ProcessSupport.cleanEnvironment())
        addTeardownBlock { worker.kill(SIGKILL) }
        let deadline = Date().addingTimeInterval(60)
        while true {
            let status = try fanout(["status", "--redis", redis.url])
            let states = try status.stdoutLines.map { try Self.object($0)["state"] as? String }
            if states.count == 4 && states.allSatisfy({ $0 == "done" }) { break }
            guard Date() < deadline else { throw ProcessSupportError("the fleet did not finish: \(status.stdout)") }
            usleep(200_000)
        }
        XCTAssertEqual(try worker.stop(timeout: 20), 0)

        let expected: [String: Set<Int>] = [
            "users": [0, 3, 6, 9], "devices": [1, 2], "start": Set(100..<110), "end": Set(200..<204),
        ]
        for (job, indices) in expected {
            let out = "\(directory)/\(job).jsonl"
            let results = try fanout(["results", "--redis", redis.url, "--job", job, "--out", out])
            XCTAssertEqual(results.exitCode, 0, results.summary)
            let lines = try String(contentsOfFile: out, encoding: .utf8).split(separator: "\n").map(Self.object)
            XCTAssertEqual(lines.count, indices.count, "\(job): one line per token")
            XCTAssertEqual(Set(lines.compactMap { $0["token"] as? String }), Set(indices.map(testDeviceToken)), job)
            XCTAssertTrue(lines.allSatisfy { $0["outcome"] as? String == "delivered" }, "\(job): \(lines)")
        }
        XCTAssertTrue(mock.stop())
        let counts = try mock.acceptedPerToken(count: 204)
        XCTAssertEqual(counts.duplicates, 0)
        XCTAssertEqual(counts.distinct, 4 + 2 + 10 + 4)
    }
}
