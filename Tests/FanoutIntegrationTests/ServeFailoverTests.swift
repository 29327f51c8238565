// `fanout serve --redis` across a Redis failover: two real `fanout serve` processes on Redis Sentinel (one primary,
// one replica, three sentinels) and one in-process mock-apns, the primary killed with SIGKILL mid-dispatch; and, on
// one redis-server, published results a failover lost (removed by hand) published again before the dispatch ends.
import FanoutCore
import FanoutRedis
import FanoutRedisRegistry
import FanoutRegistry
import FanoutTestSupport
import Foundation
import XCTest

final class ServeFailoverTests: XCTestCase {
    /// The `WAIT` commands a server has run (`INFO commandstats`), 0 when it ran none.
    private static func waits(port: Int) -> Int {
        let stats = RedisServerProcess.inline("INFO commandstats", port: port, whole: true) ?? ""
        guard let line = stats.split(whereSeparator: \.isNewline).first(where: { $0.hasPrefix("cmdstat_wait:") }),
            let calls = line.dropFirst("cmdstat_wait:".count).split(separator: ",").first(where: {
                $0.hasPrefix("calls=")
            })
        else { return 0 }
        return Int(calls.dropFirst("calls=".count)) ?? 0
    }

    /// Accepts an update of `activity` through `instance`; a `503` (Redis away: nothing accepted) or no answer is
    /// retried with the same `Idempotency-Key`, as a client would, for up to `within` seconds. Returns its id.
    private func accept(_ activity: String, through instance: ServeHarness, within: TimeInterval) async throws
        -> String
    {
        let key = UUID().uuidString
        let deadline = Date().addingTimeInterval(within)
        while true {
            let response = try? instance.curl(
                "POST", "/v1/activities/\(activity)/update", key: ServeKeys.acmeServer,
                json: #"{"content_state": {"n": 2}}"#, headers: ["Idempotency-Key": key])
            if let response, response.status == 202 || response.status == 200,
                let id = try response.object()["dispatch_id"] as? String
            {
                return id
            }
            guard Date() < deadline else {
                XCTFail("\(activity) was not accepted in \(within) s: \(response?.status ?? 0) \(response?.text ?? "")")
                throw CancellationError()
            }
            if let response { XCTAssertEqual(response.status, 503, response.text) }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    /// Two instances on Redis Sentinel; an 80,000-token activity update accepted, and the primary killed with
    /// SIGKILL while it is sent: the sentinels promote the replica, the instances follow it, and the dispatch ends
    /// with one result per token, paged through either instance (the one that did not send it reads Redis). Every
    /// accept, of the big update and of small ones before and after the kill, was followed by a `WAIT` for the
    /// replica, so every dispatch that got a `202` exists after the failover and finishes.
    func testAnUpdateOnSentinelRidesOutThePrimaryKilledMidDispatch() async throws {
        let sentinel = try RedisSentinelSetup()
        addTeardownBlock { sentinel.discard() }
        let mock = try MockHarness {
            $0.capturePayloads = true
            $0.latencyMilliseconds = 5
        }
        defer { mock.stop() }
        let count = 80_000
        let small = 6
        var instances: [ServeHarness] = []
        for _ in 0..<2 {
            let instance = try ServeHarness(testCase: self, mock: mock, extraConfig: ["claim_idle_seconds": 3])
            try instance.start(arguments: ["--redis", sentinel.url])
            instances.append(instance)
        }
        // After the first start, which defines the apps in the registry.
        try await RedisActivitySeed.register(count, activity: "final", redisURL: sentinel.url)
        for index in 0..<small {
            try await RedisActivitySeed.register(
                10, activity: "small-\(index)", redisURL: sentinel.url, offset: count + 10 * index)
        }
        let (a, b) = (instances[0], instances[1])
        addTeardownBlock {
            for instance in instances { XCTAssertEqual(instance.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        }

        let waitsBefore = Self.waits(port: sentinel.primary.port)
        let id = try await accept("final", through: a, within: 10)
        var smallIDs: [String] = []
        for index in 0..<2 {
            smallIDs.append(try await accept("small-\(index)", through: instances[index], within: 10))
        }
        XCTAssertGreaterThanOrEqual(
            Self.waits(port: sentinel.primary.port) - waitsBefore, 3, "each accept waited for the replica")

        let sending = Date().addingTimeInterval(30 * testTimeScale)
        while mock.stats.accepted < 15_000 && Date() < sending { try await Task.sleep(for: .milliseconds(5)) }
        sentinel.killPrimary()
        let killedAt = Date()
        let sentAtKill = mock.stats.accepted
        XCTAssertGreaterThanOrEqual(sentAtKill, 15_000, "the dispatch was sending at the kill")
        XCTAssertLessThan(sentAtKill, count, "the kill came before the dispatch ended")
        // Accepted while the sentinels promote the replica, and after.
        for index in 2..<small {
            smallIDs.append(try await accept("small-\(index)", through: instances[index % 2], within: 30))
        }

        let done = try b.waitForDispatch(id, timeout: 60)
        let seconds = Date().timeIntervalSince(killedAt)
        XCTAssertEqual(done["delivered"] as? Int, count, "\(done)")
        // Each instance answers done once it is (the one that finished it at once; the other once the record it
        // reads says so, after the last results): then its pages are whole.
        for instance in [a, b] {
            let record = try instance.waitForDispatch(id, timeout: 30)
            XCTAssertEqual(record["delivered"] as? Int, count, "\(record)")
        }
        for (name, instance) in [("A", a), ("B", b)] {
            let lines = try instance.resultObjects(of: id, limit: 10_000)
            let tokens = lines.compactMap { $0["token"] as? String }
            XCTAssertEqual(tokens.count, count, "one result per token, paged through \(name)")
            XCTAssertEqual(Set(tokens).count, count, "no token twice, paged through \(name)")
            XCTAssertEqual(Set(lines.map { $0["outcome"] as? String }), ["delivered"])
        }
        for smallID in smallIDs {
            let record = try a.waitForDispatch(smallID, timeout: 30)
            XCTAssertEqual(record["delivered"] as? Int, 10, "\(record)")
        }

        let perToken = mock.stats.payloadsByToken
        let missing = (0..<count + 10 * small).filter { (perToken[RedisActivitySeed.token($0)]?.count ?? 0) == 0 }.count
        XCTAssertEqual(missing, 0, "every token reached the mock")
        let twice = perToken.values.reduce(0) { $0 + max(0, $1.count - 1) }
        // Sent twice: at most what a takeover sends again (docs/SERVE.md's bound, as ServeQueueTests), should Redis
        // be away longer than `claim_idle_seconds` and the other instance take the dispatch over; none otherwise.
        let inFlight = 1 * 2 * 1_000 * 2
        XCTAssertLessThanOrEqual(twice, 2 * inFlight + 1_024 + 1_024 + inFlight, "sent twice")
        let notes = [a.log, b.log].joined().split(separator: "\n").filter {
            $0.contains("publishing them again") || $0.contains("taken over") || $0.contains("acknowledged")
        }
        print(
            "serve sentinel failover: sent \(sentAtKill) of \(count) at the kill; done \(String(format: "%.1f", seconds)) "
                + "s after it; \(twice) sent twice; \(notes)")
    }

    /// Results the owner had published, lost from Redis (a failover's promoted replica without the old primary's
    /// last writes, done here by hand: the first 1,000 members removed while the dispatch sends): the owner's last
    /// publication finds Redis short of its store and publishes every line again, so `/results` through another
    /// instance has one line per token. With one Redis and no replica, nothing waits (`WAIT` never runs).
    func testPublishedResultsAFailoverLostArePublishedAgainBeforeTheDispatchEnds() async throws {
        let redis = try RedisServerProcess(for: self, appendOnly: true)
        let mock = try MockHarness { $0.latencyMilliseconds = 5 }
        defer { mock.stop() }
        let count = 50_000
        let a = try ServeHarness(testCase: self, mock: mock)
        try a.start(arguments: ["--redis", redis.url])
        addTeardownBlock { XCTAssertEqual(a.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        // After the first start, which defines the apps in the registry.
        try await RedisActivitySeed.register(count, activity: "lost", redisURL: redis.url)
        let id = try await accept("lost", through: a, within: 10)

        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: redis.url)))
        let key = RedisArgument("fanout:dispatch:{\(id)}:results")
        let published = Date().addingTimeInterval(30 * testTimeScale)
        while try await client.command(["ZCARD", key]).integer ?? 0 < 2_000 && Date() < published {
            try await Task.sleep(for: .milliseconds(5))
        }
        let removed = try await client.command(["ZREMRANGEBYRANK", key, "0", "999"]).integer ?? 0
        await client.shutdown()
        XCTAssertEqual(removed, 1_000, "published results removed")
        XCTAssertLessThan(mock.stats.accepted, count, "removed while the dispatch was sending")
        // B starts after A took the dispatch, and A lives: B only reads what A published.
        let b = try ServeHarness(testCase: self, mock: mock)
        try b.start(arguments: ["--redis", redis.url])
        addTeardownBlock { XCTAssertEqual(b.stop(), 0, "fanout serve exits 0 on SIGTERM") }

        let done = try b.waitForDispatch(id, timeout: 60)
        XCTAssertEqual(done["delivered"] as? Int, count, "\(done)")
        let lines = try b.resultObjects(of: id, limit: 10_000)
        let tokens = lines.compactMap { $0["token"] as? String }
        XCTAssertEqual(tokens.count, count, "one result per token through B")
        XCTAssertEqual(Set(tokens).count, count, "no token twice through B")
        XCTAssertTrue(a.log.contains("publishing them again"), a.log)
        XCTAssertEqual(Self.waits(port: redis.port), 0, "no WAIT without a replica")
    }

    /// On a Redis Cluster whose primaries each have a replica, the accept's `WAIT` goes to the node holding the
    /// queue's stream and each publication's to the node holding the dispatch's results (the client keeps a `WAIT`
    /// with the keyed command before it), and the replica there acknowledges: nothing is logged as unacknowledged.
    func testOnAClusterWithReplicasTheWaitsGoToTheNodesOfTheirWrites() async throws {
        let cluster = try RedisClusterProcess(primaries: 3, replicasPerPrimary: 1)
        addTeardownBlock { cluster.discard() }
        let mock = try MockHarness()
        defer { mock.stop() }
        // The instance reads the replicas when it starts (then every 5 s): from whichever node it asks, once every
        // node's slot map lists the replicas (gossip brings them some time after the cluster is created).
        let primaries = try cluster.nodes().filter(\.isPrimary).map(\.port)
        let listed = Date().addingTimeInterval(20)
        for port in try cluster.nodes().map(\.port) {
            let node = RedisClient(
                configuration: RedisConfiguration(url: try RedisURL(parsing: "redis://127.0.0.1:\(port)")))
            while try await (node.command(["CLUSTER", "SLOTS"]).array ?? []).contains(where: {
                ($0.array?.count ?? 0) < 4
            }) {
                XCTAssertTrue(Date() < listed, "node \(port) lists a range without its replica")
                if Date() >= listed { break }
                try await Task.sleep(for: .milliseconds(50))
            }
            await node.shutdown()
        }
        let instance = try ServeHarness(testCase: self, mock: mock)
        try instance.start(arguments: ["--redis", cluster.url])
        addTeardownBlock { XCTAssertEqual(instance.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        let count = 2_000
        try await RedisActivitySeed.register(count, activity: "cluster", redisURL: cluster.url)

        let streamNode = try cluster.primary(
            servingSlot: RedisClusterSlot.slot(of: Array("fanout:dispatch-queue".utf8)))
        let before = primaries.map { Self.waits(port: $0) }
        let id = try await accept("cluster", through: instance, within: 10)
        let afterAccept = primaries.map { Self.waits(port: $0) }
        let streamIndex = try XCTUnwrap(primaries.firstIndex(of: streamNode.port))
        // The accept's Idempotency-Key (in the workspace's slot) waited on its own node too.
        let keyNode = try cluster.primary(servingSlot: RedisClusterSlot.slot(of: Array("{acme}".utf8)))
        let keyIndex = try XCTUnwrap(primaries.firstIndex(of: keyNode.port))
        XCTAssertGreaterThanOrEqual(
            afterAccept[streamIndex] - before[streamIndex], keyIndex == streamIndex ? 2 : 1, "the accept waited there")
        XCTAssertGreaterThanOrEqual(afterAccept[keyIndex] - before[keyIndex], 1, "the key's claim waited there")

        let done = try instance.waitForDispatch(id, timeout: 60)
        XCTAssertEqual(done["delivered"] as? Int, count, "\(done)")
        XCTAssertEqual(try instance.resultObjects(of: id).count, count)
        // The instance's own store says done first; its last publication follows.
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: cluster.url)))
        let publishedDone = Date().addingTimeInterval(30)
        while try await !(client.command(["GET", RedisArgument("fanout:dispatch:{\(id)}")]).string ?? "").contains(
            #""state":"done""#)
        {
            XCTAssertTrue(Date() < publishedDone, "the done record was not published")
            if Date() >= publishedDone { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        let held = try await client.command(["ZCARD", RedisArgument("fanout:dispatch:{\(id)}:results")]).integer
        XCTAssertEqual(held, Int64(count), "every result published")
        await client.shutdown()
        let resultsNode = try cluster.primary(
            servingSlot: RedisClusterSlot.slot(of: Array("fanout:dispatch:{\(id)}:results".utf8)))
        let resultsIndex = try XCTUnwrap(primaries.firstIndex(of: resultsNode.port))
        let afterDone = primaries.map { Self.waits(port: $0) }
        // Counted from before the accept: a dispatch this small can be sent and published before the 202 is read.
        XCTAssertGreaterThanOrEqual(
            afterDone[resultsIndex] - before[resultsIndex], resultsIndex == streamIndex ? 2 : 1,
            "the results' publications waited there")
        XCTAssertFalse(instance.log.contains("no Redis replica acknowledged"), instance.log)
    }
}
