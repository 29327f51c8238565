// `fanout serve --redis` with its dispatches on the shared queue: three real `fanout serve` processes on one real
// redis-server (AOF on) and one in-process mock-apns. A dispatch one instance accepted is finished by the others when
// that instance is killed and never comes back.
import FanoutCore
import FanoutRedis
import FanoutRedisRegistry
import FanoutRegistry
import FanoutTestSupport
import Foundation
import XCTest

final class ServeQueueTests: XCTestCase {
    /// A 200,000-token activity update accepted by A, and A killed with SIGKILL while it sends it, never to return:
    /// B and C (started after the kill, so that A is the one that took it) take the dispatch over once A's hold on it
    /// is idle past `claim_idle_seconds`, and finish it. Every token has exactly one result, paged through B; the
    /// mock got each token at least once, and more than once only for what A had sent.
    func testADispatchWhoseInstanceWasKilledIsFinishedByTheOthers() async throws {
        let redis = try RedisServerProcess(for: self, appendOnly: true)
        let mock = try MockHarness { $0.capturePayloads = true }
        defer { mock.stop() }
        func instance() throws -> ServeHarness {
            let instance = try ServeHarness(testCase: self, mock: mock, extraConfig: ["claim_idle_seconds": 3])
            try instance.start(arguments: ["--redis", redis.url])
            return instance
        }
        let a = try instance()
        let count = 200_000
        try await RedisActivitySeed.register(count, activity: "match", redisURL: redis.url)

        let id = try acceptedUpdate(of: "match", through: a)
        let sending = Date().addingTimeInterval(60 * testTimeScale)
        while mock.stats.accepted < 20_000 && Date() < sending { try await Task.sleep(for: .milliseconds(5)) }
        a.kill()
        let sentByA = mock.stats.accepted
        XCTAssertGreaterThanOrEqual(sentByA, 20_000, "A was sending when it was killed")
        XCTAssertLessThan(sentByA, count, "A was killed before it finished")
        let b = try instance()
        let c = try instance()
        addTeardownBlock {
            for instance in [b, c] { XCTAssertEqual(instance.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        }

        let done = try b.waitForDispatch(id, timeout: 240)
        XCTAssertEqual(done["delivered"] as? Int, count, "\(done)")
        let lines = try b.resultObjects(of: id, limit: 10_000)
        XCTAssertEqual(Set(lines.map { $0["outcome"] as? String }), ["delivered"])
        let tokens = lines.compactMap { $0["token"] as? String }
        XCTAssertEqual(tokens.count, count, "one result per token")
        XCTAssertEqual(Set(tokens).count, count, "no token twice")

        let queueLines = [b.log, c.log].joined().split(separator: "\n").filter { $0.contains("dispatch \(id)") }
        let takeovers = queueLines.filter { $0.contains("taken over (run") }.count
        let perToken = mock.stats.payloadsByToken
        let missing = (0..<count).filter { (perToken[RedisActivitySeed.token($0)]?.count ?? 0) == 0 }.count
        let twice = perToken.values.reduce(0) { $0 + max(0, $1.count - 1) }
        XCTAssertEqual(missing, 0, "every token reached the mock")
        XCTAssertGreaterThan(takeovers, 0, "B or C took the dispatch over from A: \(queueLines)")
        // Sent twice: only what A had sent without its result published (docs/SERVE.md's bound for a takeover:
        // the kill -9 bound, twice the in-flight limit plus 1,024, plus the batch being published).
        let inFlight = 1 * 2 * 1_000 * 2
        XCTAssertLessThanOrEqual(twice, 2 * inFlight + 1_024 + 1_024, "sent twice after the takeover")
        print(
            "serve queue takeover: A sent \(sentByA) before the kill, \(twice) sent twice; \(queueLines)"
        )
    }

    /// Twenty updates of one activity accepted through three instances in turn: whichever instances run them, the
    /// activity's dispatches run one at a time (its run lock on Redis), so every device's last update is the newest
    /// content (the mock's record per token ends on the highest timestamp, the twentieth update).
    func testUpdatesOfOneActivityThroughThreeInstancesEndOnTheNewestContentOnEveryDevice() async throws {
        let redis = try RedisServerProcess(for: self, appendOnly: true)
        // Answers 20 ms late, so that each update sends for longer than the next one takes to be accepted: run side
        // by side, they would overlap.
        let mock = try MockHarness {
            $0.capturePayloads = true
            $0.latencyMilliseconds = 20
        }
        defer { mock.stop() }
        var instances: [ServeHarness] = []
        for _ in 0..<3 {
            let instance = try ServeHarness(testCase: self, mock: mock)
            try instance.start(arguments: ["--redis", redis.url])
            instances.append(instance)
        }
        addTeardownBlock { [instances] in
            for instance in instances { XCTAssertEqual(instance.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        }
        let count = 5_000
        try await RedisActivitySeed.register(count, activity: "race", redisURL: redis.url)
        var ids: [String] = []
        for update in 0..<20 {
            let response = try instances[update % 3].curl(
                "POST", "/v1/activities/race/update", key: ServeKeys.acmeServer,
                json: #"{"content_state": {"n": \#(update)}}"#)
            XCTAssertEqual(response.status, 202, response.text)
            ids.append(try XCTUnwrap(try response.object()["dispatch_id"] as? String))
        }
        for id in ids { _ = try instances[0].waitForDispatch(id, timeout: 120) }

        let payloads = mock.stats.payloadsByToken
        var notNewest = 0
        var highest: Int64 = 0
        for index in 0..<count {
            let last = try XCTUnwrap(payloads[RedisActivitySeed.token(index)]?.last, "token \(index) got no update")
            let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(last)) as? [String: Any])
            let aps = try XCTUnwrap(object["aps"] as? [String: Any])
            let state = try XCTUnwrap(aps["content-state"] as? [String: Any])
            let timestamp = try XCTUnwrap((aps["timestamp"] as? NSNumber)?.int64Value)
            highest = max(highest, timestamp)
            if state["n"] as? Int != 19 { notNewest += 1 }
        }
        XCTAssertEqual(notNewest, 0, "devices whose last update is not the newest content")
        for index in 0..<count {
            let last = payloads[RedisActivitySeed.token(index)]?.last ?? []
            let aps = (try? JSONSerialization.jsonObject(with: Data(last)) as? [String: Any])?["aps"] as? [String: Any]
            XCTAssertEqual((aps?["timestamp"] as? NSNumber)?.int64Value, highest, "token \(index)")
        }
    }

    /// With Redis gone, a dispatch cannot be queued: the request gets `503` with `Retry-After`, and nothing of it is
    /// left anywhere (no record on this instance, nothing sent once Redis is back).
    func testADispatchWhileRedisIsGoneIsA503AndNothingIsHalfAccepted() async throws {
        let redis = try RedisServerProcess(for: self, appendOnly: true)
        let mock = try MockHarness()
        defer { mock.stop() }
        let instance = try ServeHarness(testCase: self, mock: mock)
        try instance.start(arguments: ["--redis", redis.url])
        addTeardownBlock { XCTAssertEqual(instance.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        let tokens = (0..<3).map { "\"\(RedisActivitySeed.token($0))\"" }.joined(separator: ", ")
        let push = #"{"alert": {"title": "t"}, "audience": {"tokens": [\#(tokens)]}}"#

        redis.kill()
        let refused = try instance.curl("POST", "/v1/push", key: ServeKeys.acmeServer, json: push)
        XCTAssertEqual(refused.status, 503, refused.text)
        XCTAssertEqual(refused.headers["retry-after"], "1")
        _ = try redis.restart()

        // Once Redis answers, the same request is accepted and sent; the refused one never is.
        let deadline = Date().addingTimeInterval(20 * testTimeScale)
        var accepted = try instance.curl("POST", "/v1/push", key: ServeKeys.acmeServer, json: push)
        while accepted.status == 503 && Date() < deadline {
            try await Task.sleep(for: .milliseconds(100))
            accepted = try instance.curl("POST", "/v1/push", key: ServeKeys.acmeServer, json: push)
        }
        XCTAssertEqual(accepted.status, 202, accepted.text)
        let id = try XCTUnwrap(try accepted.object()["dispatch_id"] as? String)
        XCTAssertEqual(try instance.waitForDispatch(id)["delivered"] as? Int, 3)
        XCTAssertEqual(mock.stats.accepted, 3, "the refused request sent nothing")
    }

    /// Redis restarted (with AOF) while a 100,000-token dispatch is being sent: the instance rides it out, the
    /// dispatch completes with one result per token, and nothing is lost.
    func testRedisRestartedMidDispatchLosesNothing() async throws {
        let redis = try RedisServerProcess(for: self, appendOnly: true)
        let mock = try MockHarness { $0.capturePayloads = true }
        defer { mock.stop() }
        let instance = try ServeHarness(testCase: self, mock: mock, extraConfig: ["claim_idle_seconds": 3])
        try instance.start(arguments: ["--redis", redis.url])
        addTeardownBlock { XCTAssertEqual(instance.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        let count = 100_000
        try await RedisActivitySeed.register(count, activity: "restart", redisURL: redis.url)
        let id = try acceptedUpdate(of: "restart", through: instance)
        let sending = Date().addingTimeInterval(60 * testTimeScale)
        while mock.stats.accepted < 10_000 && Date() < sending { try await Task.sleep(for: .milliseconds(5)) }
        redis.kill()
        _ = try redis.restart()

        let done = try instance.waitForDispatch(id, timeout: 180)
        XCTAssertEqual(done["delivered"] as? Int, count, "\(done)")
        let perToken = mock.stats.payloadsByToken
        let missing = (0..<count).filter { (perToken[RedisActivitySeed.token($0)]?.count ?? 0) == 0 }.count
        XCTAssertEqual(missing, 0, "every token reached the mock")
        let twice = perToken.values.reduce(0) { $0 + max(0, $1.count - 1) }
        XCTAssertEqual(twice, 0, "one instance that lived through the restart sends nothing twice")
    }

    /// SIGTERM of an instance in the middle of a dispatch: once its grace period is over it publishes what it
    /// finished and queues the rest again, so another instance takes it over at once, not after
    /// `claim_idle_seconds` (30 here). Every token ends with one result.
    func testAStoppedInstanceHandsItsUnfinishedDispatchToAnotherAtOnce() async throws {
        let redis = try RedisServerProcess(for: self, appendOnly: true)
        // Slow answers, so that the dispatch outlasts A's grace period.
        let mock = try MockHarness {
            $0.capturePayloads = true
            $0.latencyMilliseconds = 500
        }
        defer { mock.stop() }
        let a = try ServeHarness(testCase: self, mock: mock, extraConfig: ["grace_seconds": 1])
        try a.start(arguments: ["--redis", redis.url])
        let count = 40_000
        try await RedisActivitySeed.register(count, activity: "handover", redisURL: redis.url)
        let id = try acceptedUpdate(of: "handover", through: a)
        let sending = Date().addingTimeInterval(60 * testTimeScale)
        while mock.stats.accepted < 4_000 && Date() < sending { try await Task.sleep(for: .milliseconds(5)) }
        let b = try ServeHarness(testCase: self, mock: mock)
        try b.start(arguments: ["--redis", redis.url])
        addTeardownBlock { XCTAssertEqual(b.stop(), 0, "fanout serve exits 0 on SIGTERM") }

        XCTAssertEqual(a.stop(), 0, "A exits 0 on SIGTERM")
        XCTAssertTrue(a.log.contains("queued again for another instance"), a.log)
        let stoppedAt = Date()
        let done = try b.waitForDispatch(id, timeout: 25)
        XCTAssertLessThan(Date().timeIntervalSince(stoppedAt), 25, "taken over before claim_idle_seconds")
        XCTAssertEqual(done["delivered"] as? Int, count, "\(done)")
        let perToken = mock.stats.payloadsByToken
        let missing = (0..<count).filter { (perToken[RedisActivitySeed.token($0)]?.count ?? 0) == 0 }.count
        XCTAssertEqual(missing, 0, "every token reached the mock")
    }

    /// `fanout worker --serve-config`: the service without HTTP. An API-only instance accepts a 20,000-token update
    /// and never sends; the worker, on the same config and Redis, takes the dispatch and sends it, and the API instance
    /// answers its state and pages its results. Every token once at the mock, one result each.
    func testAWorkerOnTheServeConfigSendsWhatAnAPIOnlyInstanceAccepts() async throws {
        let redis = try RedisServerProcess(for: self)
        let mock = try MockHarness { $0.capturePayloads = true }
        defer { mock.stop() }
        let api = try ServeHarness(testCase: self, mock: mock, extraConfig: ["fleet_worker": false])
        try api.start(arguments: ["--redis", redis.url])
        addTeardownBlock { XCTAssertEqual(api.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        let count = 20_000
        try await RedisActivitySeed.register(count, activity: "worker-run", redisURL: redis.url)

        let id = try acceptedUpdate(of: "worker-run", through: api)
        // Nothing sends it yet: the only instance is API-only.
        try await Task.sleep(for: .milliseconds(500))
        XCTAssertEqual(mock.stats.accepted, 0, "an API-only instance does not send")

        let database = (api.directory as NSString).appendingPathComponent("worker.db")
        let worker = try RunningProcess(
            api.fanout,
            [
                "worker", "--redis", redis.url, "--serve-config", api.configPath, "--db", database, "--log-format",
                "json",
            ],
            environment: ProcessSupport.cleanEnvironment())
        addTeardownBlock { worker.kill(SIGKILL) }
        let done = try api.waitForDispatch(id, timeout: 120)
        XCTAssertEqual(done["delivered"] as? Int, count, "\(done)")
        let tokens = try api.resultObjects(of: id, limit: 10_000).compactMap { $0["token"] as? String }
        XCTAssertEqual(tokens.count, count, "one result per token")
        XCTAssertEqual(Set(tokens).count, count, "no token twice")
        let perToken = mock.stats.payloadsByToken
        XCTAssertEqual(perToken.count, count, "every token reached the mock")
        XCTAssertEqual(perToken.values.filter { $0.count > 1 }.count, 0, "none twice")

        worker.kill(SIGTERM)
        XCTAssertTrue(worker.waitForExit(timeout: 30), "the worker stops on SIGTERM")
        XCTAssertEqual(worker.process.terminationStatus, 0, worker.stderrText())
    }

    /// A send flag beside `--serve-config` is refused by name: the service's config says how to send.
    func testAWorkerOnTheServeConfigRefusesSendFlags() throws {
        let fanout = try ProcessSupport.builtExecutable("fanout")
        let result = try ProcessSupport.run(
            fanout,
            ["worker", "--redis", "redis://127.0.0.1:1", "--serve-config", "serve.json", "--connections", "4"],
            timeout: 30)
        XCTAssertEqual(result.exitCode, 2, result.summary)
        XCTAssertTrue(result.stderr.contains("--connections does not go with --serve-config"), result.summary)
        let db = try ProcessSupport.run(
            fanout, ["worker", "--redis", "redis://127.0.0.1:1", "--db", "x.db"], timeout: 30)
        XCTAssertEqual(db.exitCode, 2, db.summary)
        XCTAssertTrue(db.stderr.contains("--db goes with --serve-config"), db.summary)
    }

    /// Instances take dispatches as they have room (`max_running_dispatches`, here 1), so one whose APNs answers
    /// slowly (300 ms a request) takes fewer of them than one whose APNs answers at once: twenty dispatches of 200
    /// tokens accepted through the fast one, every token once across both mocks, the slow one's share the smaller.
    func testASlowerInstanceTakesFewerDispatches() async throws {
        let redis = try RedisServerProcess(for: self)
        let fastMock = try MockHarness { $0.capturePayloads = true }
        defer { fastMock.stop() }
        // The same TLS material and signing key: the instances share one provider token per team on Redis.
        let slowMock = try MockHarness {
            $0.capturePayloads = true
            $0.latencyMilliseconds = 300
            $0.tls = .directory(fastMock.directory)
        }
        defer { slowMock.stop() }
        let fast = try ServeHarness(testCase: self, mock: fastMock, extraConfig: ["max_running_dispatches": 1])
        try fast.start(arguments: ["--redis", redis.url])
        let slow = try ServeHarness(testCase: self, mock: slowMock, extraConfig: ["max_running_dispatches": 1])
        try slow.start(arguments: ["--redis", redis.url])
        addTeardownBlock {
            for instance in [fast, slow] { XCTAssertEqual(instance.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        }
        let dispatches = 20
        let perActivity = 200
        for activity in 0..<dispatches {
            try await RedisActivitySeed.register(
                perActivity, activity: "slow-\(activity)", redisURL: redis.url, offset: activity * perActivity)
        }
        var ids: [String] = []
        for activity in 0..<dispatches {
            let update = try fast.curl(
                "POST", "/v1/activities/slow-\(activity)/update", key: ServeKeys.acmeServer,
                json: #"{"content_state": {"n": 1}}"#)
            XCTAssertEqual(update.status, 202, update.text)
            ids.append(try XCTUnwrap(try update.object()["dispatch_id"] as? String))
        }
        for id in ids {
            let done = try fast.waitForDispatch(id, timeout: 120)
            XCTAssertEqual(done["delivered"] as? Int, perActivity, "\(done)")
        }
        let total = dispatches * perActivity
        let fastTokens = fastMock.stats.payloadsByToken
        let slowTokens = slowMock.stats.payloadsByToken
        XCTAssertEqual(fastTokens.count + slowTokens.count, total, "every token reached one of the mocks")
        XCTAssertEqual(Set(fastTokens.keys).intersection(slowTokens.keys).count, 0, "no token at both")
        XCTAssertEqual((fastTokens.values.map(\.count) + slowTokens.values.map(\.count)).max(), 1, "none twice")
        XCTAssertLessThan(slowTokens.count, fastTokens.count, "the slower instance sent fewer dispatches")
        print(
            "slower instance: \(slowTokens.count / perActivity) of \(dispatches) dispatches, the faster \(fastTokens.count / perActivity)"
        )
    }

    /// A later run of a dispatch fences the earlier one's publications: once another instance has counted a run (its
    /// `INCR` of the dispatch's runs, made here by hand while A still sends, as a takeover after a late heartbeat
    /// would), nothing A publishes lands any more, so its results cannot sit beside the new run's nor its record
    /// overwrite the new run's.
    func testPublicationsOfAnEarlierRunAreFencedOnceALaterRunBegins() async throws {
        let redis = try RedisServerProcess(for: self)
        let mock = try MockHarness { $0.latencyMilliseconds = 200 }
        defer { mock.stop() }
        let a = try ServeHarness(testCase: self, mock: mock)
        try a.start(arguments: ["--redis", redis.url])
        addTeardownBlock { XCTAssertEqual(a.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        let count = 40_000
        try await RedisActivitySeed.register(count, activity: "fenced", redisURL: redis.url)
        let id = try acceptedUpdate(of: "fenced", through: a)
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: redis.url)))
        defer { Task { await client.shutdown() } }
        func published() async throws -> Int { try await publishedResultCount(of: id, on: client) }

        let sending = Date().addingTimeInterval(30 * testTimeScale)
        while try await published() == 0 && Date() < sending { try await Task.sleep(for: .milliseconds(20)) }
        let before = try await published()
        XCTAssertGreaterThan(before, 0, "A publishes as it sends")
        _ = try await client.command(["INCR", RedisArgument("fanout:dispatch:{\(id)}:runs")])
        let fenced = Date().addingTimeInterval(30 * testTimeScale)
        while !a.log.contains("another instance took it over") && Date() < fenced {
            try await Task.sleep(for: .milliseconds(20))
        }
        XCTAssertTrue(a.log.contains("dispatch \(id): another instance took it over"), a.log)
        let atFence = try await published()
        let sentAtFence = mock.stats.accepted
        XCTAssertLessThan(sentAtFence, count - 4_000, "A was still sending at the fence")
        // A goes on sending (nobody claimed its entry); what it publishes is refused.
        while mock.stats.accepted < sentAtFence + 4_000 && Date() < fenced {
            try await Task.sleep(for: .milliseconds(20))
        }
        XCTAssertGreaterThanOrEqual(mock.stats.accepted, sentAtFence + 4_000, "A sent on after the fence")
        try await Task.sleep(for: .milliseconds(600))  // more than two of A's publication rounds (250 ms)
        let after = try await published()
        XCTAssertEqual(after, atFence, "nothing published after the fence")
    }

    /// A few notifications the mock never answers (every 2,500th stream, until their 30 s request timeout) hold the
    /// dispatch's first positions without a result while the rest of it is sent and committed. Those results are on
    /// Redis all the same, so an instance taking the dispatch over would not send them again; and the results page
    /// through another instance stops at the first position still without one, so that a reader's cursor never
    /// passes a result that comes later.
    func testResultsCommittedPastAPositionStillWithoutOneArePublishedAndPagedOnlyBelowIt() async throws {
        let redis = try RedisServerProcess(for: self)
        let mock = try MockHarness { $0.blackholeEvery = 2_500 }
        defer { mock.stop() }
        let sender = try ServeHarness(testCase: self, mock: mock, extraConfig: ["grace_seconds": 1])
        try sender.start(arguments: ["--redis", redis.url])
        let api = try ServeHarness(testCase: self, mock: mock, extraConfig: ["fleet_worker": false])
        try api.start(arguments: ["--redis", redis.url])
        addTeardownBlock {
            for instance in [sender, api] { XCTAssertEqual(instance.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        }
        let count = 10_000
        try await RedisActivitySeed.register(count, activity: "gaps", redisURL: redis.url)
        let id = try acceptedUpdate(of: "gaps", through: api)
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: redis.url)))
        defer { Task { await client.shutdown() } }
        func published() async throws -> Int { try await publishedResultCount(of: id, on: client) }

        // Every stream but the unanswered ones (one in 2,500 of those the mock got) has its result published.
        let unanswered = count / 2_500
        let deadline = Date().addingTimeInterval(20 * testTimeScale)
        while try await published() < count - unanswered && Date() < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        let publishedNow = try await published()
        XCTAssertGreaterThanOrEqual(publishedNow, count - unanswered, "published while the gaps hold")
        let status = try api.curl("GET", "/v1/dispatches/\(id)", key: ServeKeys.acmeServer)
        XCTAssertEqual(try status.object()["state"] as? String, "running", "the unanswered ones still hold it")

        let record = try await client.command(["GET", RedisArgument("fanout:dispatch:{\(id)}")])
        let published = try XCTUnwrap(
            try JSONSerialization.jsonObject(with: Data(XCTUnwrap(record.string).utf8)) as? [String: Any])
        let below = try XCTUnwrap(published["resultsBelow"] as? Int, "a running dispatch's record bounds its pages")
        XCTAssertLessThan(below, count - unanswered, "the first gap is well before the end")
        let lines = try api.resultObjects(of: id, limit: 1_000)
        XCTAssertEqual(lines.count, below, "the page stops at the first position still without a result")
        XCTAssertEqual(Set(lines.compactMap { $0["token"] as? String }).count, lines.count, "no token twice")
    }

    /// How many results lines of dispatch `id` are on Redis (its results set's `ZCARD`).
    private func publishedResultCount(of id: String, on client: RedisClient) async throws -> Int {
        Int(try await client.command(["ZCARD", RedisArgument("fanout:dispatch:{\(id)}:results")]).integer ?? 0)
    }

    /// The id of the dispatch an activity update (`{"n": 1}`) got through `instance`, asserting its `202`.
    private func acceptedUpdate(of activity: String, through instance: ServeHarness) throws -> String {
        let update = try instance.curl(
            "POST", "/v1/activities/\(activity)/update", key: ServeKeys.acmeServer,
            json: #"{"content_state": {"n": 1}}"#)
        XCTAssertEqual(update.status, 202, update.text)
        return try XCTUnwrap(try update.object()["dispatch_id"] as? String)
    }
}
