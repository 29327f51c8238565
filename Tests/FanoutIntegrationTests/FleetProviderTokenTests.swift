import FanoutCore
// One provider token per team for the fleet, against a real redis-server. Each "worker" here is a
// FleetProviderToken with its own Redis client; the clock is fake, so the 20-minute and 50-minute rules are checked
// without waiting.
import FanoutFleet
import FanoutRedis
import FanoutTestSupport
import FanoutTransport
import Foundation
import XCTest

final class FleetProviderTokenTests: XCTestCase {
    private final class FakeClock: Sendable {
        private let seconds = FanoutMutex<Int64>(Int64(Date().timeIntervalSince1970))
        var now: Int64 { seconds.withLock { $0 } }
        func advance(by delta: Int64) { seconds.withLock { $0 += delta } }
    }

    private func makeWorkers(_ count: Int, clock: FakeClock, redis: RedisServerProcess? = nil) throws
        -> [FleetProviderToken]
    {
        let redis = try redis ?? RedisServerProcess(for: self)
        let signer = try ProviderTokenSigner(key: ES256PrivateKey.generate(), keyID: "KEYID12345", teamID: "TEAMID1234")
        var options = FleetProviderToken.Options()
        options.clock = { clock.now }
        options.pollInterval = .seconds(3600)  // the tests drive every refresh
        return try (0..<count).map { _ in
            let client = try RedisClient(url: redis.url)
            addTeardownBlock { await client.shutdown() }
            let worker = FleetProviderToken(client: client, signer: signer, options: options)
            addTeardownBlock { worker.stop() }
            return worker
        }
    }

    private func refreshAll(_ workers: [FleetProviderToken], rejected: String? = nil) async throws -> [String] {
        try await withThrowingTaskGroup(of: String.self) { group in
            for worker in workers { group.addTask { try await worker.refresh(rejected: rejected) } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
    }

    private func mints(_ workers: [FleetProviderToken]) -> Int { workers.map(\.mintCount).reduce(0, +) }

    func testWorkersRefreshingAtOnceWithNoTokenMintOneUnderTheLock() async throws {
        let clock = FakeClock()
        let workers = try makeWorkers(5, clock: clock)
        XCTAssertThrowsError(try workers[0].currentToken(), "no token before the first refresh")
        let tokens = try await refreshAll(workers)
        XCTAssertEqual(Set(tokens).count, 1, "every worker holds the same token")
        XCTAssertEqual(mints(workers), 1, "one worker minted it")
        for worker in workers {
            XCTAssertEqual(try worker.currentToken(), tokens[0])
            XCTAssertEqual(worker.issuedAt, clock.now)
        }
    }

    func testARefreshAfterRejectionWithinTwentyMinutesOfTheLastMintDoesNotMintAgain() async throws {
        let clock = FakeClock()
        let workers = try makeWorkers(3, clock: clock)
        let first = try await workers[0].refresh()
        XCTAssertEqual(mints(workers), 1)

        // Rejected 10 and 19:59 minutes after the mint: every worker keeps the token, nobody mints.
        clock.advance(by: 600)
        let tenMinutes = try await refreshAll(workers, rejected: first)
        XCTAssertEqual(tenMinutes, [first, first, first])
        clock.advance(by: 599)
        let justUnder = try await refreshAll(workers, rejected: first)
        XCTAssertEqual(justUnder, [first, first, first])
        XCTAssertEqual(mints(workers), 1, "no new token within 20 minutes of the last mint")

        // At 20 minutes, all three see the rejection: the fleet mints once, and all take the new token.
        clock.advance(by: 1)
        let second = try await refreshAll(workers, rejected: first)
        XCTAssertEqual(Set(second).count, 1)
        XCTAssertNotEqual(second[0], first)
        XCTAssertEqual(mints(workers), 2)
        // A late rejection of the old token (a request in flight) takes the new one; one of the new token inside the
        // interval does not mint either.
        let late = try await workers[1].refresh(rejected: first)
        XCTAssertEqual(late, second[0])
        clock.advance(by: 60)
        let again = try await workers[2].refresh(rejected: second[0])
        XCTAssertEqual(again, second[0])
        XCTAssertEqual(mints(workers), 2)
    }

    func testATokenPastTheRefreshAgeIsReplacedOnceForTheFleet() async throws {
        let clock = FakeClock()
        let workers = try makeWorkers(3, clock: clock)
        let first = try await refreshAll(workers)[0]
        clock.advance(by: 2999)
        let kept = try await refreshAll(workers)
        XCTAssertEqual(Set(kept), [first], "49:59 old: kept")
        clock.advance(by: 1)
        let second = try await refreshAll(workers)
        XCTAssertEqual(Set(second).count, 1)
        XCTAssertNotEqual(second[0], first)
        XCTAssertEqual(mints(workers), 2)
    }

    func testARejectionOnTheLoopThreadRefreshesInTheBackgroundWithoutBlocking() async throws {
        let clock = FakeClock()
        let workers = try makeWorkers(2, clock: clock)
        try await workers[0].start()
        try await workers[1].start()
        let first = try workers[0].currentToken()
        XCTAssertEqual(try workers[1].currentToken(), first)
        clock.advance(by: 1200)
        workers[0].refreshAfterRejection()
        // Returns at once with the old token; the new one arrives in the background.
        let deadline = Date().addingTimeInterval(10)
        while try workers[0].currentToken() == first {
            guard Date() < deadline else { return XCTFail("no new token after the rejection") }
            try await Task.sleep(for: .milliseconds(20))
        }
        let second = try workers[0].currentToken()
        // The other worker, rejected too, takes the fleet's new token.
        workers[1].refreshAfterRejection()
        while try workers[1].currentToken() != second {
            guard Date() < deadline else { return XCTFail("worker 1 did not take the new token") }
            try await Task.sleep(for: .milliseconds(20))
        }
        XCTAssertEqual(mints(workers), 2)
    }

    /// A background refresh that fails logs its reason once: the message already says "provider token: ", which the
    /// log line repeated ("provider token: provider token: ...").
    func testAFailedBackgroundRefreshLogsItsReasonWithOnePrefix() async throws {
        let redis = try RedisServerProcess(for: self)
        let signer = try ProviderTokenSigner(key: ES256PrivateKey.generate(), keyID: "KEYID12345", teamID: "TEAMID1234")
        var options = FleetProviderToken.Options()
        options.pollInterval = .milliseconds(50)
        let lines = FanoutMutex<[String]>([])
        let client = try RedisClient(url: redis.url)
        addTeardownBlock { await client.shutdown() }
        let worker = FleetProviderToken(
            client: client, signer: signer, options: options, log: { line in lines.withLock { $0.append(line) } })
        try await worker.start()
        addTeardownBlock { worker.stop() }
        // The token's key holds a string now: every HMGET fails with WRONGTYPE.
        _ = try await client.command(["SET", "fanout:token:{TEAMID1234}", "not a hash"])
        let deadline = Date().addingTimeInterval(10)
        while !lines.withLock({ $0.contains { $0.contains("WRONGTYPE") } }) {
            guard Date() < deadline else { return XCTFail("no failed refresh logged: \(lines.withLock { $0 })") }
            try await Task.sleep(for: .milliseconds(20))
        }
        let failed = try XCTUnwrap(lines.withLock { $0.first { $0.contains("WRONGTYPE") } })
        XCTAssertTrue(failed.hasPrefix("provider token: "), failed)
        XCTAssertFalse(failed.contains("provider token: provider token"), failed)
        XCTAssertTrue(failed.hasSuffix("; keeping the current one"), failed)
    }

    /// Redis lost the shared token (FLUSHALL) seconds after the mint: the workers, whose local copies are fresh, store
    /// one back instead of minting (APNs answers TooManyProviderTokenUpdates to refreshes within 20 minutes). Only once
    /// the copy is due for a refresh does the fleet mint, once.
    func testATokenLostByRedisIsStoredBackFromAFreshLocalCopyNotMintedAgain() async throws {
        let clock = FakeClock()
        let redis = try RedisServerProcess(for: self)
        let workers = try makeWorkers(3, clock: clock, redis: redis)
        let first = try await refreshAll(workers)[0]
        XCTAssertEqual(mints(workers), 1)
        let admin = try RedisClient(url: redis.url)
        addTeardownBlock { await admin.shutdown() }

        clock.advance(by: 5)
        _ = try await admin.command(["FLUSHALL"])
        let afterFlush = try await refreshAll(workers)
        XCTAssertEqual(afterFlush, [first, first, first], "every worker keeps the token")
        XCTAssertEqual(mints(workers), 1, "no mint for a token lost by Redis 5 s after it was minted")
        let stored = try await admin.command(["HMGET", "fanout:token:{TEAMID1234}", "token", "iat"]).array
        XCTAssertEqual(stored?.first?.string, first, "the local copy is stored back")
        XCTAssertEqual(stored?.last?.integer, clock.now - 5, "with its own iat")
        let ttl = try await admin.command(["TTL", "fanout:token:{TEAMID1234}"]).integer ?? 0
        XCTAssertTrue((3590...3595).contains(ttl), "expires an hour after its iat: \(ttl)")

        // Lost again when the copies are due for a refresh: the fleet mints once.
        clock.advance(by: 2995)
        _ = try await admin.command(["FLUSHALL"])
        let due = try await refreshAll(workers)
        XCTAssertEqual(Set(due).count, 1)
        XCTAssertNotEqual(due[0], first)
        XCTAssertEqual(mints(workers), 2)
    }
}
