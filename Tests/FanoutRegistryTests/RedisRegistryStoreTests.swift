import FanoutRedis
import FanoutRedisRegistry
import FanoutRegistry
import FanoutTestSupport
import XCTest

/// What only the Redis store has: several store objects (several `fanout serve`) on one server, the key layout, the
/// key prefix, and Redis being unreachable.
final class RedisRegistryStoreTests: XCTestCase {
    let app = "com.acme.app"

    private func withClient(_ url: String, _ body: (RedisClient) async throws -> Void) async throws {
        var configuration = RedisConfiguration(url: try RedisURL(parsing: url))
        configuration.commandTimeout = .seconds(2)
        let client = RedisClient(configuration: configuration)
        do {
            try await body(client)
        } catch {
            await client.shutdown()
            throw error
        }
        await client.shutdown()
    }

    private func store(_ client: RedisClient, clock: TestClock, prefix: String = "fanout:registry:") async throws
        -> RedisRegistryStore
    {
        var configuration = RegistryConfiguration()
        configuration.clock = clock.registryClock
        let store = RedisRegistryStore(client: client, configuration: configuration, keyPrefix: prefix)
        try await store.defineApps([RegistryApp(bundleID: app, workspace: "acme")])
        return store
    }

    func testTwoStoresOnOneServerShareRegistrationsAndRemovals() async throws {
        let server = try RedisServerProcess(for: self)
        let clock = TestClock()
        try await withClient(server.url) { first in
            try await withClient(server.url) { second in
                let one = try await store(first, clock: clock)
                let other = RedisRegistryStore(client: second, configuration: one.configuration)
                try await one.register(
                    .updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: TestTokens.token(1))))
                let seen = try await other.allLiveTokens(activityID: "match-7", now: clock.now)
                XCTAssertEqual(
                    seen.map(\.token), [TestTokens.token(1)], "registered through one, read through the other")
                let removed = try await other.recordInvalid(token: TestTokens.token(1))
                XCTAssertEqual(removed.events.map(\.reason), [.unregistered])
                let left = try await one.allLiveTokens(activityID: "match-7", now: clock.now)
                XCTAssertEqual(left, [])
                let events = try await one.allEvents()
                XCTAssertEqual(events.map(\.sequence), [1, 2], "one log, numbered across both")
            }
        }
    }

    func testEachActivitysKeysShareAHashTagAndThePrefixIsolatesRegistries() async throws {
        let server = try RedisServerProcess(for: self)
        let clock = TestClock()
        try await withClient(server.url) { client in
            let store = try await store(client, clock: clock)
            try await store.apply([
                .updateToken(.init(app: app, activityID: "match/7{x}", deviceID: "d1", token: TestTokens.token(1))),
                .pushToStartToken(.init(app: app, deviceID: "d1", token: TestTokens.token(2))),
            ])
            let keys = try await client.command(["KEYS", "fanout:registry:*"]).array?.compactMap(\.string) ?? []
            let activityKeys = keys.filter { $0.contains("match") }
            XCTAssertEqual(
                Set(activityKeys),
                Set(
                    ["meta", "tokens", "slots", "devices", "bytoken", "order"].map {
                        "fanout:registry:{com.acme.app/match%2F7%7Bx%7D}:\($0)"
                    }))
            XCTAssertTrue(keys.allSatisfy { $0.hasPrefix("fanout:registry:") })

            let isolated = try await self.store(client, clock: clock, prefix: "other:")
            let none = try await isolated.allLiveTokens(activityID: "match/7{x}", now: clock.now)
            XCTAssertEqual(none, [])
            let mine = try await store.allLiveTokens(activityID: "match/7{x}", now: clock.now)
            XCTAssertEqual(mine.map(\.token), [TestTokens.token(1)])
        }
    }

    /// A registry written before the order set existed (its pages were by expiry and slot, `expiry:slot` cursors):
    /// the first page rebuilds the set, each slot at its own number, and such a cursor goes on after its slot.
    func testARegistryWrittenBeforeThePagingOrderIsPagedAndItsCursorsStillWork() async throws {
        let server = try RedisServerProcess(for: self)
        let clock = TestClock()
        try await withClient(server.url) { client in
            let store = try await store(client, clock: clock)
            let tokens = (0..<4).map { TestTokens.token($0) }
            try await store.apply(
                tokens.enumerated().map { index, token in
                    .updateToken(
                        .init(
                            app: app, activityID: "match-7", deviceID: index == 3 ? nil : "d\(index)", token: token))
                })
            let order = "fanout:registry:{com.acme.app/match-7}:order"
            _ = try await client.command(["DEL", RedisArgument(order)])
            let first = try await store.liveUpdateTokens(
                app: app, activityID: "match-7", after: nil, limit: 2, now: clock.now)
            XCTAssertEqual(first.items.map(\.token), Array(tokens[0..<2]))
            let size = try await client.command(["ZCARD", RedisArgument(order)]).integer
            XCTAssertEqual(size, 4, "rebuilt")
            // A slot an older Fanout removed stays in the order set: the next page takes it out.
            _ = try await client.command(["ZADD", RedisArgument(order), "99", "99"])
            _ = try await store.liveUpdateTokens(app: app, activityID: "match-7", after: nil, limit: 1, now: clock.now)
            let mended = try await client.command(["ZCARD", RedisArgument(order)]).integer
            XCTAssertEqual(mended, 4, "a slot that is gone left the order")
            clock.advance(milliseconds: 61_000)
            try await store.register(
                .updateToken(.init(app: app, activityID: "match-7", deviceID: "d0", token: tokens[0])))
            // The second token's slot is number 2.
            let before = RegistryCursor(rawValue: "\(first.items[1].expiresAt):2")
            for start in [first.next, before] {
                let rest = try await store.liveUpdateTokens(
                    app: app, activityID: "match-7", after: start, limit: 10, now: clock.now)
                XCTAssertEqual(rest.items.map(\.token), Array(tokens[2...]), "from \(start?.rawValue ?? "")")
            }
        }
    }

    func testAnUnreachableServerIsUnavailable() async throws {
        let server = try RedisServerProcess(for: self)
        let clock = TestClock()
        try await withClient(server.url) { client in
            let store = try await store(client, clock: clock)
            server.kill()
            await assertRegistryError(.unavailable) { try await store.stats() }
            await assertRegistryError(.unavailable) {
                try await store.register(
                    .updateToken(.init(app: self.app, activityID: "m", token: TestTokens.token(1))))
            }
        }
    }

    func testScriptsFlushedFromTheServerAreLoadedAgain() async throws {
        let server = try RedisServerProcess(for: self)
        let clock = TestClock()
        try await withClient(server.url) { client in
            let store = try await store(client, clock: clock)
            try await store.register(.updateToken(.init(app: app, activityID: "m", token: TestTokens.token(1))))
            _ = try await client.command(["SCRIPT", "FLUSH"])
            let result = try await store.apply([
                .updateToken(.init(app: app, activityID: "m", token: TestTokens.token(2))),
                .updateToken(.init(app: app, activityID: "m", token: TestTokens.token(3))),
            ])
            XCTAssertEqual(result.added, 2)
            XCTAssertEqual(result.events.map(\.sequence), [2, 3])
            let count = try await store.liveUpdateTokenCount(app: app, activityID: "m", now: clock.now)
            XCTAssertEqual(count, 3)
        }
    }
}
