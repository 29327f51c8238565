import FanoutCore
// `fanout serve --redis URL`. Two real `fanout serve` processes on one real redis-server (each
// with its own --db for its dispatch queue) behind no load balancer: the test is the load balancer, sending each
// request to the instance it chooses. Both send to one in-process mock-apns.
import FanoutPolicy
import FanoutRedis
import FanoutRedisRegistry
import FanoutRegistry
import FanoutTestSupport
import Foundation
import MockAPNsKit
import XCTest

final class ServeRedisTests: XCTestCase {
    private var mock: MockHarness!
    private var instances: [ServeHarness] = []
    private var redisURL = ""

    override func tearDown() {
        mock?.stop()
    }

    /// Two instances on one Redis.
    /// - Parameter mockLatency: mock-apns's answer delay, in milliseconds.
    /// - Parameter acmeRateLimit: acme's API budget in both instances' configs.
    /// - Parameter manageListen: give the mock its channel management listener (and the apps its `manage_endpoint`).
    private func startTwo(
        mockLatency: UInt64 = 0, acmeRateLimit: (perHour: Int, burst: Int)? = nil, manageListen: Bool = false
    ) throws -> (ServeHarness, ServeHarness) {
        let redis = try RedisServerProcess(for: self)
        redisURL = redis.url
        mock = try MockHarness {
            $0.capturePayloads = true
            $0.latencyMilliseconds = mockLatency
            if manageListen { $0.manageListen = MockListenAddress(host: "127.0.0.1", port: 0) }
        }
        for _ in 0..<2 {
            let instance = try ServeHarness(testCase: self, mock: mock, acmeRateLimit: acmeRateLimit)
            try instance.start(arguments: ["--redis", redis.url])
            instances.append(instance)
            // Each as it starts, so that one that started is stopped even when the next fails to. Teardown blocks run
            // last-added first, before tearDown(): the instances stop while Redis is still up.
            addTeardownBlock { XCTAssertEqual(instance.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        }
        return (instances[0], instances[1])
    }

    /// With Redis gone, an endpoint that reads the registry answers 503 to retry, naming no Redis address or error:
    /// a device key, which ships inside the app, reaches some of them. The detail is the service's log's.
    func testA503WhileRedisIsGoneSaysNothingOfRedis() throws {
        let redis = try RedisServerProcess(for: self)
        mock = try MockHarness()
        let instance = try ServeHarness(testCase: self, mock: mock)
        try instance.start(arguments: ["--redis", redis.url])
        addTeardownBlock { XCTAssertEqual(instance.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        try register(0..<1, activity: "act-a", through: instance)
        redis.kill()
        let port = String(redis.url.split(separator: ":").last ?? "")
        // (The Pushwoosh endpoints' reads answer through the same helper, ServiceCore.unavailable.)
        let answer = try instance.curl("GET", "/v1/activities/act-a", key: ServeKeys.acmeServer)
        XCTAssertEqual(answer.status, 503, answer.text)
        XCTAssertFalse(answer.text.contains(port), answer.text)
        XCTAssertFalse(answer.text.lowercased().contains("redis"), answer.text)
    }

    /// One `fanout serve --redis` and two `fanout worker`s send for one workspace whose budget is 7,200 an hour (two
    /// a second) with a 5-second burst, waiting when it is out: together they send what one sender would be
    /// allowed to, not three times it.
    func testServeAndWorkersShareOneWorkspaceBudget() throws {
        let redis = try RedisServerProcess(for: self)
        mock = try MockHarness()
        let budget: [String: Any] = [
            "requests_per_hour": 7_200, "burst_seconds": 5, "counting": "notification", "policy": "wait",
        ]
        let instance = try ServeHarness(testCase: self, mock: mock, acmeExtra: ["send_budget": budget])
        try instance.start(arguments: ["--redis", redis.url])
        let directory = try ProcessSupport.temporaryDirectory(for: self, "shared-budget")
        let config = "\(directory)/send.json"
        let sendConfig: [String: Any] = [
            "endpoint": "127.0.0.1:\(mock.port)", "ca_file": mock.material.caPEMPath,
            "key_path": mock.material.authKeyP8Path, "key_id": "KEYID12345", "team_id": "TEAMID1234", "loops": 1,
            "connections": 1, "rate_limits": ["workspaces": ["acme": budget]],
        ]
        try JSONSerialization.data(withJSONObject: sendConfig).write(to: URL(fileURLWithPath: config))
        let fanout = try ProcessSupport.builtExecutable("fanout")
        let workers = try (0..<2).map { index in
            let worker = try RunningProcess(
                fanout, ["worker", "--redis", redis.url, "--config", config, "--name", "budget-\(index)"],
                environment: ProcessSupport.cleanEnvironment())
            addTeardownBlock { worker.kill(SIGKILL) }
            return worker
        }
        addTeardownBlock { XCTAssertEqual(instance.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        let started = Date()
        // 200 notifications through the API and 200 through the fleet, far more than the budget lets out in 10 s.
        let tokens = (0..<400).map { Self.token($0) }
        let pushed = try instance.curl(
            "POST", "/v1/push", key: ServeKeys.acmeServer,
            json:
                #"{"alert": {"title": "t"}, "audience": {"tokens": [\#(tokens.prefix(200).map { "\"\($0)\"" }.joined(separator: ","))]}}"#
        )
        XCTAssertEqual(pushed.status, 202, pushed.text)
        let jobs = "\(directory)/jobs.jsonl"
        let list = tokens.suffix(200).map { "\"\($0)\"" }.joined(separator: ",")
        try
            (#"{"id": "fleet-part", "workspace": "acme", "topic": "\#(ServeHarness.acmeApp)", "push_type": "alert", "payload": {"aps": {"alert": "t"}}, "tokens": [\#(list)]}"#
            + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let enqueued = try ProcessSupport.run(
            fanout, ["enqueue", "--redis", redis.url, "--jobs", jobs], environment: ProcessSupport.cleanEnvironment())
        XCTAssertEqual(enqueued.exitCode, 0, enqueued.summary)
        Thread.sleep(forTimeInterval: 10)
        let sent = mock.stats.accepted
        let elapsed = Date().timeIntervalSince(started)
        // One budget: what priority 10 may take at once (its burst, less the other priorities' reservations), two a
        // second since the start, and what the three holders had leased and not spent yet (a chunk each, at most a
        // second's worth: two). Each sender on a budget of its own would have sent the first two terms each.
        let priority10Burst = WorkspaceRateLimiter(
            budget: RateBudget(requestsPerHour: 7_200, burstSeconds: 5, countingUnit: .notification, policy: .wait)
        ).maximumCost(priority: 10)
        let bound = priority10Burst + Int((2 * elapsed).rounded(.up)) + 3 * 2
        XCTAssertLessThanOrEqual(sent, bound, "\(sent) sent in \(elapsed) s: more than one budget (\(bound))")
        XCTAssertGreaterThanOrEqual(sent, 15, "the budget lets two a second out: \(sent) in \(elapsed) s")
        for worker in workers { XCTAssertEqual(try worker.stop(timeout: 20), 0, worker.stderrText()) }
    }

    /// Every `fanout serve --redis` is also a worker of the fleet: a job from `fanout enqueue` is sent by an instance
    /// (with the engine of its app's team), and not by one whose config says `"fleet_worker": false`.
    func testAnInstanceSendsTheFleetsShardsUnlessItIsAPIOnly() throws {
        let redis = try RedisServerProcess(for: self)
        mock = try MockHarness()
        let apiOnly = try ServeHarness(testCase: self, mock: mock, extraConfig: ["fleet_worker": false])
        try apiOnly.start(arguments: ["--redis", redis.url])
        addTeardownBlock { XCTAssertEqual(apiOnly.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        let directory = try ProcessSupport.temporaryDirectory(for: self, "serve-fleet")
        let jobs = "\(directory)/jobs.jsonl"
        let tokens = (0..<300).map { "\"\(Self.token($0))\"" }.joined(separator: ",")
        try
            (#"{"id": "from-the-fleet", "workspace": "acme", "topic": "\#(ServeHarness.acmeApp)", "push_type": "alert", "payload": {"aps": {"alert": "t"}}, "tokens": [\#(tokens)]}"#
            + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let fanout = try ProcessSupport.builtExecutable("fanout")
        func run(_ arguments: [String]) throws -> ProcessResult {
            try ProcessSupport.run(fanout, arguments, environment: ProcessSupport.cleanEnvironment())
        }
        let enqueued = try run(["enqueue", "--redis", redis.url, "--jobs", jobs, "--shard-size", "100"])
        XCTAssertEqual(enqueued.exitCode, 0, enqueued.summary)
        func state() throws -> String? {
            let status = try run(["status", "--redis", redis.url])
            let line = try XCTUnwrap(status.stdoutLines.first, status.summary)
            return try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])["state"]
                as? String
        }
        // The API-only instance reads no shard: past a whole blocked read (1 s), the job still waits.
        Thread.sleep(forTimeInterval: 1.5)
        XCTAssertEqual(try state(), "waiting")
        XCTAssertEqual(mock.stats.accepted, 0)
        let worker = try ServeHarness(testCase: self, mock: mock)
        try worker.start(arguments: ["--redis", redis.url])
        addTeardownBlock { XCTAssertEqual(worker.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        let deadline = Date().addingTimeInterval(60)
        while try state() != "done" {
            guard Date() < deadline else { return XCTFail("the instance did not send the fleet's job") }
            usleep(100_000)
        }
        let results = try run([
            "results", "--redis", redis.url, "--job", "from-the-fleet", "--out", "\(directory)/r.jsonl",
        ])
        XCTAssertEqual(results.exitCode, 0, results.summary)
        let summary = try XCTUnwrap(
            try JSONSerialization.jsonObject(with: Data(try XCTUnwrap(results.stdoutLines.last).utf8)) as? [String: Any]
        )
        XCTAssertEqual(summary["delivered"] as? Int, 300, "\(summary)")
        XCTAssertEqual(mock.stats.accepted, 300)
    }

    private static func token(_ number: Int) -> String {
        let hex = String(number, radix: 16)
        return "a7" + String(repeating: "0", count: 62 - hex.count) + hex
    }

    /// Registers `token(index)` for device `d-index` of `activity`, for each index, through `instance`.
    private func register(_ indices: Range<Int>, activity: String, through instance: ServeHarness) throws {
        for index in indices {
            let registered = try instance.curl(
                "POST", "/v1/activities/\(activity)/tokens", key: ServeKeys.acmeDevice,
                json: #"{"token": "\#(Self.token(index))", "device_id": "d-\#(index)"}"#)
            XCTAssertEqual(registered.status, 200, registered.text)
        }
    }

    private func aps(for token: String) throws -> [[String: Any]] {
        try (mock.stats.payloadsByToken[token] ?? []).map { bytes in
            let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
            return try XCTUnwrap(object["aps"] as? [String: Any])
        }
    }

    func testARegistrationThroughOneInstanceIsUsedByAnUpdateThroughTheOther() throws {
        let (first, second) = try startTwo()
        try register(0..<10, activity: "match-7", through: first)
        // A device stops its activity through the second instance: the first one no longer sends to it.
        let stopped = try second.curl(
            "DELETE", "/v1/activities/match-7/tokens", key: ServeKeys.acmeDevice, json: #"{"device_id": "d-9"}"#)
        XCTAssertEqual(try stopped.object()["removed"] as? Int, 1, stopped.text)
        let activity = try second.curl("GET", "/v1/activities/match-7", key: ServeKeys.acmeServer)
        XCTAssertEqual(try activity.object()["live_tokens"] as? Int, 9, activity.text)

        let update = try second.curl(
            "POST", "/v1/activities/match-7/update", key: ServeKeys.acmeServer,
            json: #"{"content_state": {"home": 1, "away": 0}}"#)
        XCTAssertEqual(update.status, 202, update.text)
        let updateID = try XCTUnwrap(try update.object()["dispatch_id"] as? String)
        let done = try second.waitForDispatch(updateID)
        XCTAssertEqual(done["delivered"] as? Int, 9, "\(done)")
        // The dispatch is visible through the other instance too (as the accepting one published it), and only to
        // its own workspace.
        let seenElsewhere = try first.waitForDispatch(updateID)
        XCTAssertEqual(seenElsewhere["delivered"] as? Int, 9, "\(seenElsewhere)")
        XCTAssertEqual(seenElsewhere["kind"] as? String, "update")
        XCTAssertEqual(try first.curl("GET", "/v1/dispatches/\(updateID)", key: ServeKeys.globexServer).status, 404)
        // The status page of either instance lists it; another workspace's does not.
        let status = try first.curl("GET", "/v1/status", key: ServeKeys.acmeServer)
        let listed = try XCTUnwrap(try status.object()["dispatches"] as? [[String: Any]], status.text)
        XCTAssertEqual(listed.first?["id"] as? String, updateID, status.text)
        let foreignStatus = try first.curl("GET", "/v1/status", key: ServeKeys.globexServer)
        XCTAssertFalse(foreignStatus.text.contains(updateID), foreignStatus.text)
        // Its results too, page by page, the same lines the accepting instance serves.
        let owned = try second.curl("GET", "/v1/dispatches/\(updateID)/results", key: ServeKeys.acmeServer)
        XCTAssertEqual(owned.status, 200, owned.text)
        var pagedElsewhere = ""
        var after = "-1"
        while true {
            let page = try first.curl(
                "GET", "/v1/dispatches/\(updateID)/results?limit=4&after=\(after)", key: ServeKeys.acmeServer)
            XCTAssertEqual(page.status, 200, page.text)
            if page.text.isEmpty { break }
            XCTAssertLessThanOrEqual(page.text.split(separator: "\n").count, 4)
            pagedElsewhere += page.text
            after = try XCTUnwrap(page.headers["x-fanout-last-position"])
        }
        XCTAssertEqual(pagedElsewhere, owned.text, "the other instance serves the same results lines in order")
        XCTAssertEqual(owned.text.split(separator: "\n").count, 9)
        XCTAssertEqual(
            try first.curl("GET", "/v1/dispatches/\(updateID)/results", key: ServeKeys.globexServer).status, 404)
        for index in 0..<9 {
            let received = try aps(for: Self.token(index))
            XCTAssertEqual(received.count, 1, "token \(index)")
            XCTAssertEqual(received.first?["event"] as? String, "update")
        }
        XCTAssertTrue(try aps(for: Self.token(9)).isEmpty, "the stopped token got nothing")

        // The same activity updated through the first instance: it sees the same nine tokens.
        let again = try first.curl(
            "POST", "/v1/activities/match-7/update", key: ServeKeys.acmeServer,
            json: #"{"content_state": {"home": 2, "away": 0}}"#)
        XCTAssertEqual(again.status, 202, again.text)
        let doneAgain = try first.waitForDispatch(try XCTUnwrap(try again.object()["dispatch_id"] as? String))
        XCTAssertEqual(doneAgain["delivered"] as? Int, 9, "\(doneAgain)")

        // Another workspace, through either instance, sees none of it.
        let foreign = try first.curl("GET", "/v1/activities/match-7", key: ServeKeys.globexServer)
        XCTAssertEqual(foreign.status, 404, foreign.text)
        // One provider token for the team across both instances (they share it through Redis).
        XCTAssertEqual(mock.stats.distinctProviderTokens, 1)
    }

    /// With the registry on Redis, the channel client sends the team's shared token too: a channel created through one
    /// instance and pushes and broadcasts sent by both are one provider token (the channel client minted its own).
    func testChannelManagementSendsTheTeamsSharedProviderToken() throws {
        let (first, second) = try startTwo(manageListen: true)
        let created = try first.curl(
            "POST", "/v1/activities/match-9/channel", key: ServeKeys.acmeServer, json: #"{"storage_policy": 1}"#)
        XCTAssertEqual(created.status, 201, created.text)
        let channel = try XCTUnwrap(try created.object()["channel_id"] as? String)
        try register(0..<3, activity: "match-9", through: second)
        for instance in [first, second] {
            let update = try instance.curl(
                "POST", "/v1/activities/match-9/update", key: ServeKeys.acmeServer,
                json: #"{"content_state": {"home": 1}}"#)
            XCTAssertEqual(update.status, 202, update.text)
            let done = try instance.waitForDispatch(try XCTUnwrap(try update.object()["dispatch_id"] as? String))
            XCTAssertEqual(done["delivered"] as? Int, 4, "three tokens and the broadcast: \(done)")
        }
        XCTAssertEqual(mock.stats.broadcasts(channel: channel), 2)
        XCTAssertEqual(mock.stats.distinctProviderTokens, 1, "one token for the team: channels, pushes, both instances")
    }

    func testUpdatesAcceptedAtOnceByBothInstancesNeverShareATimestamp() throws {
        // Each push takes 300 ms, so all six updates are accepted before the first is sent, and none can take the
        // last sent timestamp from the registry as its floor.
        let (first, second) = try startTwo(mockLatency: 300)
        let token = Self.token(1)
        try register(1..<2, activity: "match-8", through: first)
        // Three rounds of two updates sent at the same moment, one to each instance. Each instance alone would stamp
        // both with the same "now" (the same second, the same last sent timestamp).
        var dispatches: [(ServeHarness, String)] = []
        for round in 0..<3 {
            let answers = FanoutMutex<[Int: Result<CurlResponse, any Error>]>([:])
            DispatchQueue.concurrentPerform(iterations: 2) { side in
                let answer = Result {
                    try (side == 0 ? first : second).curl(
                        "POST", "/v1/activities/match-8/update", key: ServeKeys.acmeServer,
                        json: #"{"content_state": {"home": \#(round), "away": \#(side)}}"#)
                }
                answers.withLock { $0[side] = answer }
            }
            for side in 0..<2 {
                let update = try XCTUnwrap(answers.withLock { $0[side] }).get()
                XCTAssertEqual(update.status, 202, update.text)
                dispatches.append(
                    (side == 0 ? first : second, try XCTUnwrap(try update.object()["dispatch_id"] as? String)))
            }
        }
        var delivered = 0
        for (instance, id) in dispatches {
            delivered += try instance.waitForDispatch(id)["delivered"] as? Int ?? 0
        }
        let timestamps = try aps(for: token).compactMap { $0["timestamp"] as? Int }
        XCTAssertEqual(timestamps.count, delivered, "every update delivered carries a timestamp")
        // The activity's dispatches run one at a time, whichever instance takes each; one that runs after a newer
        // one is superseded (not sent), so the device sees at least one and never an older after a newer.
        XCTAssertGreaterThanOrEqual(delivered, 1)
        XCTAssertEqual(Set(timestamps).count, timestamps.count, "no two updates share a timestamp: \(timestamps)")
        XCTAssertEqual(timestamps, timestamps.sorted(), "never an older update after a newer one: \(timestamps)")
    }

    func testARetryWithTheSameIdempotencyKeyThroughTheOtherInstanceReturnsTheFirstDispatch() throws {
        let (first, second) = try startTwo()
        try register(0..<5, activity: "match-9", through: first)
        let body = #"{"content_state": {"home": 3, "away": 1}}"#
        let key = ["Idempotency-Key": "goal-3-1"]
        let original = try first.curl(
            "POST", "/v1/activities/match-9/update", key: ServeKeys.acmeServer, json: body, headers: key)
        XCTAssertEqual(original.status, 202, original.text)
        let id = try XCTUnwrap(try original.object()["dispatch_id"] as? String)
        let retried = try second.curl(
            "POST", "/v1/activities/match-9/update", key: ServeKeys.acmeServer, json: body, headers: key)
        XCTAssertEqual(retried.status, 202, retried.text)
        XCTAssertEqual(try retried.object()["dispatch_id"] as? String, id, "the retry names the first dispatch")
        // The key sent with another request, through either instance, is refused (the key is Redis's).
        let reused = try second.curl(
            "POST", "/v1/activities/match-9/update", key: ServeKeys.acmeServer,
            json: #"{"content_state": {"home": 4, "away": 1}}"#, headers: key)
        XCTAssertEqual(reused.status, 422, reused.text)
        XCTAssertEqual(try first.waitForDispatch(id)["delivered"] as? Int, 5)
        // Another workspace's use of the same key is its own.
        let other = try second.curl(
            "POST", "/v1/push", key: ServeKeys.globexServer,
            json: #"{"alert": {"title": "hi"}, "audience": {"devices": ["x"]}}"#,
            headers: key)
        XCTAssertEqual(other.status, 202, other.text)
        XCTAssertNotEqual(try other.object()["dispatch_id"] as? String, id)
        for index in 0..<5 {
            XCTAssertEqual(try aps(for: Self.token(index)).count, 1, "token \(index) got the update once")
        }
    }

    func testTheResultsOfALargeDispatchArePagedThroughTheOtherInstance() async throws {
        let (first, second) = try startTwo()
        // 4,500 tokens straight into the registry on Redis (as a bulk import would), more than one pipeline of
        // published results.
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: redisURL)))
        let store = RedisRegistryStore(client: client)
        let count = 4_500
        _ = try await store.apply(
            (0..<count).map { index in
                .updateToken(
                    UpdateTokenRegistration(
                        app: ServeHarness.acmeApp, activityID: "big", deviceID: "d-\(index)", token: Self.token(index)))
            })
        await client.shutdown()
        let update = try second.curl(
            "POST", "/v1/activities/big/update", key: ServeKeys.acmeServer, json: #"{"content_state": {"n": 1}}"#)
        XCTAssertEqual(update.status, 202, update.text)
        let id = try XCTUnwrap(try update.object()["dispatch_id"] as? String)
        XCTAssertEqual(try first.waitForDispatch(id)["delivered"] as? Int, count)
        let lines = try first.resultObjects(of: id)
        XCTAssertEqual(Set(lines.map { $0["outcome"] as? String }), ["delivered"])
        let tokens = lines.compactMap { $0["token"] as? String }
        XCTAssertEqual(tokens.count, count, "one line per token")
        XCTAssertEqual(Set(tokens).count, count, "each token once")
        XCTAssertTrue(Set(tokens).isSubset(of: Set((0..<count).map(Self.token))), "only the activity's tokens")
    }

    func testTheInstancesShareOneWorkspaceBudget() throws {
        // 100 requests an hour with a burst of 10: the 12 requests below, split between the instances, find one
        // bucket of 10 (each instance alone would admit all 6 it gets).
        let (first, second) = try startTwo(acmeRateLimit: (perHour: 100, burst: 10))
        var statuses: [Int] = []
        var remaining: [Int] = []
        for index in 0..<12 {
            let response = try (index.isMultiple(of: 2) ? first : second).curl(
                "GET", "/v1/status", key: ServeKeys.acmeServer)
            statuses.append(response.status)
            if response.status == 200 {
                let left = Int(response.headers["x-ratelimit-remaining"] ?? "") ?? -1
                remaining.append(left)
                // The status page shows the shared bucket too.
                let budget = try XCTUnwrap(try response.object()["budget"] as? [String: Any])
                XCTAssertEqual(budget["remaining"] as? Int, left, response.text)
            }
            if response.status == 429 {
                XCTAssertNotNil(response.headers["retry-after"], "a refusal says when to retry")
                XCTAssertEqual(response.headers["x-ratelimit-limit"], "100")
            }
        }
        XCTAssertEqual(statuses.filter { $0 == 200 }.count, 10, "\(statuses)")
        XCTAssertEqual(statuses.filter { $0 == 429 }.count, 2, "\(statuses)")
        XCTAssertEqual(remaining, Array((0..<10).reversed()), "one count across both instances")
        // Another workspace has its own bucket.
        XCTAssertEqual(try first.curl("GET", "/v1/status", key: ServeKeys.globexServer).status, 200)
    }

    func testRedisThatCannotBeReachedAtStartIsAClearErrorWithExitStatusTwo() throws {
        mock = try MockHarness()
        let instance = try ServeHarness(testCase: self, mock: mock)
        let port = try LoopbackPort.free()
        let result = try ProcessSupport.run(
            instance.fanout,
            [
                "serve", "--config", instance.configPath, "--db", instance.database, "--listen", "127.0.0.1:0",
                "--redis", "redis://:s3cret@127.0.0.1:\(port)",
            ],
            environment: ProcessSupport.cleanEnvironment(), timeout: 30)
        XCTAssertEqual(result.exitCode, 2, result.summary)
        XCTAssertTrue(result.stderr.contains("cannot reach Redis at redis://"), result.stderr)
        XCTAssertFalse(result.stderr.contains("s3cret"), "the password never appears: \(result.stderr)")
        XCTAssertTrue(result.stdout.isEmpty, "nothing listened: \(result.stdout)")
    }
}
