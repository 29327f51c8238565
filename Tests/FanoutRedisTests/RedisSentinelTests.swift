import FanoutRedis
import FanoutTestSupport
import Foundation
import XCTest

/// The client on `redis+sentinel://` against real servers (RedisSentinelSetup: one primary, one replica, three
/// sentinels, each a `redis-server` on a free port): it finds the primary through the sentinels, and after the
/// primary is killed it follows the failover to the promoted replica. No mock.
final class RedisSentinelTests: XCTestCase {
    func testSentinelURLs() throws {
        let url = try RedisURL(parsing: "redis+sentinel://:s3cr%40t@10.0.0.1,10.0.0.2:26380/prod/2")
        XCTAssertTrue(url.isSentinel)
        XCTAssertFalse(url.isCluster)
        XCTAssertEqual(url.sentinelMaster, "prod")
        XCTAssertEqual(
            url.seeds,
            [RedisNodeAddress(host: "10.0.0.1", port: 26379), RedisNodeAddress(host: "10.0.0.2", port: 26380)])
        XCTAssertEqual(url.database, 2)
        XCTAssertEqual(url.password, "s3cr@t")
        XCTAssertEqual(url.description, "redis+sentinel://:***@10.0.0.1:26379,10.0.0.2:26380/prod/2")
        let primary = url.primary(RedisNodeAddress(host: "10.0.0.9", port: 6380))
        XCTAssertEqual(primary.description, "redis://:***@10.0.0.9:6380/2")
        XCTAssertFalse(primary.isSentinel)

        for bad in ["redis+sentinel://10.0.0.1", "redis+sentinel://10.0.0.1/", "redis+sentinel://h/name/x"] {
            XCTAssertThrowsError(try RedisURL(parsing: bad), bad) { error in
                XCTAssertEqual((error as? RedisError)?.kind, .invalidURL, bad)
            }
        }
    }

    /// Commands go to the primary the sentinels name; the primary killed mid-run, the client rides the failover out
    /// (its commands answered by the promoted replica within their deadlines) and every increment acknowledged after
    /// the failover is there.
    func testTheClientFollowsAFailoverToThePromotedReplica() async throws {
        let setup = try RedisSentinelSetup()
        addTeardownBlock { setup.discard() }
        var configuration = RedisConfiguration(url: try RedisURL(parsing: setup.url))
        configuration.commandTimeout = .seconds(20)
        let client = RedisClient(configuration: configuration)
        let set = try await client.command(["SET", "k", "before"])
        XCTAssertEqual(set, .status("OK"))
        // Written to the primary the sentinels named: the replica has it once replication catches up.
        let replica = try RedisClient(url: setup.replica.url)
        let replicated = await eventually { (try? await replica.command(["GET", "k"]))?.string == "before" }
        XCTAssertTrue(replicated, "the replica did not get the primary's write")

        for _ in 0..<100 { _ = try await client.command(["INCR", "n"]) }
        setup.killPrimary()
        // Each INCR is retried by the client until the new primary answers (connection lost, READONLY, a sentinel
        // not yet naming the new one); a lost reply may have run, so the count is at least the acknowledged ones.
        var acknowledged = 100
        let started = Date()
        while acknowledged < 200 {
            do {
                _ = try await client.command(["INCR", "n"])
                acknowledged += 1
            } catch {
                XCTAssertLessThan(Date().timeIntervalSince(started), 30, "no new primary after 30 s: \(error)")
                if Date().timeIntervalSince(started) >= 30 { break }
            }
        }
        let role = try await replica.command(["ROLE"]).array?.first?.string
        XCTAssertEqual(role, "master", "the replica was promoted: \(setup.sentinelLogs.suffix(2000))")
        let count = Int(try await replica.command(["GET", "n"]).string ?? "") ?? 0
        XCTAssertGreaterThanOrEqual(count, 100, "the writes after the failover are on the promoted replica")
        XCTAssertEqual(acknowledged, 200)
        await client.shutdown()
        await replica.shutdown()
    }

    private func eventually(timeout: TimeInterval = 10, _ condition: () async -> Bool) async -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if await condition() { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return await condition()
    }
}
