import FanoutRegistry
import XCTest

/// Paged reads: each live token exactly once, nothing expired, nothing of another activity; selections by user,
/// device and attributes type.
class RegistryReadTests: RegistryStoreTestCase {
    /// match-7's live update tokens from `cursor` on, read page by page as a send reads them.
    private func laterPages(of store: any RegistryStore, after cursor: RegistryCursor?, limit: Int, now: Int64)
        async throws -> [UpdateTokenRecord]
    {
        var tokens: [UpdateTokenRecord] = []
        var cursor = cursor
        while let after = cursor {
            let page = try await store.liveUpdateTokens(
                app: app, activityID: "match-7", after: after, limit: limit, now: now)
            tokens += page.items
            cursor = page.next
        }
        return tokens
    }

    let app = "com.acme.app"

    /// The live tokens of the paging test: 100,000 (101 pages of 997). The Redis subclass pages 25,000: writing
    /// 100,000 registrations through the debug build's client takes about 15 s on a loaded two-core machine (the
    /// paging itself about 1 s), and the property does not depend on the size; `RegistryDifferentialTests` and
    /// `RedisRegistryStoreTests` cover the rest.
    class var pagingTokens: Int { 100_000 }

    func testPagingThrough100000TokensReturnsEachLiveOneExactlyOnce() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        var batch: [RegistryChange] = []
        func add(_ change: RegistryChange) async throws {
            batch.append(change)
            if batch.count == 10_000 {
                try await store.apply(batch)
                batch.removeAll()
            }
        }
        // 5,000 tokens of match-7 registered 7 h 59 min ago: they expire one hour from now.
        let expiredTokens = (0..<5_000).map { TestTokens.token($0, salt: 1) }
        for token in expiredTokens {
            try await add(
                .updateToken(
                    .init(
                        app: app, activityID: "match-7", token: token, registeredAt: clock.now - 8 * 3_600_000 + 60_000)
                ))
        }
        try await store.apply(batch)
        batch.removeAll()
        clock.advance(hours: 1)
        // 100,000 live ones, with 1,000 of match-8 in between.
        let count = Self.pagingTokens
        let liveTokens = (0..<count).map { TestTokens.token($0, salt: 2) }
        for (index, token) in liveTokens.enumerated() {
            try await add(.updateToken(.init(app: app, activityID: "match-7", deviceID: "d\(index)", token: token)))
            if index % 100 == 0 {
                try await add(
                    .updateToken(.init(app: app, activityID: "match-8", token: TestTokens.token(index, salt: 3))))
            }
        }
        try await store.apply(batch)

        let start = ContinuousClock.now
        var seen: [String] = []
        var pages = 0
        var cursor: RegistryCursor?
        repeat {
            let page = try await store.liveUpdateTokens(
                app: app, activityID: "match-7", after: cursor, limit: 997, now: clock.now)
            XCTAssertLessThanOrEqual(page.items.count, 997)
            XCTAssertTrue(page.items.allSatisfy { $0.activityID == "match-7" && $0.expiresAt > clock.now })
            seen += page.items.map(\.token)
            cursor = page.next
            pages += 1
        } while cursor != nil
        let elapsed = ContinuousClock.now - start
        XCTAssertEqual(seen.count, count)
        XCTAssertEqual(Set(seen), Set(liveTokens), "each live token once, no expired one, no other activity's")
        XCTAssertEqual(pages, (count + 996) / 997)
        print("paged \(count) tokens in \(pages) pages in \(elapsed) (debug build)")

        let other = try await store.allLiveTokens(activityID: "match-8", now: clock.now)
        XCTAssertEqual(other.count, count / 100)
        let stats = try await store.stats()
        XCTAssertEqual(stats.updateTokens, count + count / 100, "expired tokens are never counted, even before a sweep")
        XCTAssertEqual(stats.liveActivities, 2)
        let swept = try await store.sweep()
        XCTAssertEqual(swept.expired, 5_000)
    }

    func testATokenRegisteredWhilePagingIsReachedAndNoneIsRepeated() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        try await store.apply(
            (0..<10).map {
                .updateToken(.init(app: app, activityID: "match-7", deviceID: "d\($0)", token: TestTokens.token($0)))
            })
        let first = try await store.liveUpdateTokens(
            app: app, activityID: "match-7", after: nil, limit: 4, now: clock.now)
        clock.advance(milliseconds: 1_000)
        try await store.register(
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "late", token: TestTokens.token(99))))
        var seen = first.items.map(\.token)
        var cursor = first.next
        while let after = cursor {
            let page = try await store.liveUpdateTokens(
                app: app, activityID: "match-7", after: after, limit: 4, now: clock.now)
            seen += page.items.map(\.token)
            cursor = page.next
        }
        XCTAssertEqual(seen.count, 11)
        XCTAssertEqual(Set(seen).count, 11)
        XCTAssertTrue(seen.contains(TestTokens.token(99)))
    }

    func testAnUnknownActivityHasNoTokensAndAForeignCursorIsRefused() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let page = try await store.liveUpdateTokens(
            app: app, activityID: "nope", after: nil, limit: 10, now: clock.now)
        XCTAssertEqual(page.items, [])
        XCTAssertNil(page.next)
        await assertRegistryError(.invalidInput, field: "cursor") {
            try await store.liveUpdateTokens(
                app: self.app, activityID: "nope", after: RegistryCursor(rawValue: "x"), limit: 10, now: clock.now)
        }
        await assertRegistryError(.invalidInput, field: "app") {
            try await store.liveUpdateTokens(app: "com.unknown", activityID: "m", after: nil, limit: 10, now: clock.now)
        }
        await assertRegistryError(.invalidInput, field: "limit") {
            try await store.liveUpdateTokens(app: self.app, activityID: "m", after: nil, limit: 0, now: clock.now)
        }
    }

    func testPushToStartTokensByUserDeviceAndAttributesType() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        var changes: [RegistryChange] = []
        for index in 0..<30 {
            changes.append(
                .pushToStartToken(
                    .init(
                        app: app, deviceID: "d\(index)", userID: "u\(index % 3)",
                        attributesType: index % 5 == 0 ? nil : (index % 2 == 0 ? "MatchAttributes" : "OrderAttributes"),
                        token: TestTokens.token(index))))
        }
        try await store.apply(changes)

        func all(_ type: String?, _ selection: RecipientSelection, limit: Int = 4) async throws -> [PushToStartRecord] {
            var records: [PushToStartRecord] = []
            var cursor: RegistryCursor?
            repeat {
                let page = try await store.pushToStartTokens(
                    app: app, attributesType: type, selection: selection, after: cursor, limit: limit)
                records += page.items
                cursor = page.next
            } while cursor != nil
            return records
        }
        let everything = try await all(nil, .all)
        XCTAssertEqual(everything.count, 30)
        let match = try await all("MatchAttributes", .all)
        // Even indexes not divisible by 5 are MatchAttributes; multiples of 5 have no type and match every type.
        let expectedMatch = (0..<30).filter { $0 % 5 == 0 || $0 % 2 == 0 }.map { "d\($0)" }
        XCTAssertEqual(Set(match.map(\.deviceID)), Set(expectedMatch))
        let users = try await all("MatchAttributes", .users(["u1", "u2", "u1"]), limit: 3)
        let expectedUsers = expectedMatch.filter { Int($0.dropFirst())! % 3 != 0 }
        XCTAssertEqual(users.map(\.deviceID).count, expectedUsers.count, "a user named twice is read once")
        XCTAssertEqual(Set(users.map(\.deviceID)), Set(expectedUsers))
        let devices = try await all(nil, .devices(["d3", "d4", "missing"]))
        XCTAssertEqual(devices.map(\.deviceID), ["d3", "d4"])
        XCTAssertEqual(devices.first?.attributesType, "OrderAttributes")
        XCTAssertEqual(devices.first?.userID, "u0")
    }

    func testDevicesAndTheirPushTokens() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let result = try await store.apply([
            .device(.init(app: app, deviceID: "d1", userID: "u1", pushToken: TestTokens.token(1))),
            .device(.init(app: app, deviceID: "d2", userID: "u1")),
            .device(.init(app: app, deviceID: "d3", userID: "u2", pushToken: TestTokens.token(3))),
        ])
        XCTAssertEqual(result.events.map(\.kind), [.push, .push])
        clock.advance(hours: 1)
        let rotated = try await store.register(.device(.init(app: app, deviceID: "d1", pushToken: TestTokens.token(9))))
        XCTAssertEqual(rotated.events.map(\.change), [.rotated])
        let cleared = try await store.register(.device(.init(app: app, deviceID: "d3", pushToken: "")))
        XCTAssertEqual(cleared.events.map(\.reason), [.stopped])

        let byUser = try await store.devices(app: app, selection: .users(["u1"]), after: nil, limit: 10)
        XCTAssertEqual(byUser.items.map(\.deviceID), ["d1", "d2"])
        XCTAssertEqual(byUser.items.map(\.pushToken), [TestTokens.token(9), nil])
        XCTAssertEqual(byUser.items.first?.userID, "u1", "a registration without a user keeps the recorded one")
        let everyone = try await store.devices(app: app, selection: .all, after: nil, limit: 2)
        XCTAssertEqual(everyone.items.count, 2)
        let rest = try await store.devices(app: app, selection: .all, after: everyone.next, limit: 2)
        XCTAssertEqual(rest.items.map(\.deviceID), ["d3"])
        XCTAssertNil(rest.next)
    }

    /// Devices found by their push token (Pushwoosh's `devices`): the current token only (not one rotated away or
    /// cleared), of the app asked about, each device once, in the order the tokens were given, whatever their case.
    func testDevicesFoundByTheirPushTokens() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock, apps: [app, "com.acme.other"])
        try await store.apply([
            .device(.init(app: app, deviceID: "d1", userID: "u1", pushToken: TestTokens.token(1))),
            .device(.init(app: app, deviceID: "d2", pushToken: TestTokens.token(2))),
            .device(.init(app: app, deviceID: "d3", pushToken: TestTokens.token(3))),
            .device(.init(app: "com.acme.other", deviceID: "o4", pushToken: TestTokens.token(4))),
        ])
        try await store.apply([
            .device(.init(app: app, deviceID: "d2", pushToken: TestTokens.token(5))),
            .device(.init(app: app, deviceID: "d3", pushToken: "")),
        ])
        let found = try await store.devices(
            app: app,
            pushTokens: [
                TestTokens.token(5).uppercased(), TestTokens.token(2), TestTokens.token(3), TestTokens.token(4),
                TestTokens.token(1), TestTokens.token(5), TestTokens.token(6),
            ])
        XCTAssertEqual(found.map(\.deviceID), ["d2", "d1"], "current tokens only, of this app, each device once")
        XCTAssertEqual(found.map(\.pushToken), [TestTokens.token(5), TestTokens.token(1)])
        XCTAssertEqual(found.last?.userID, "u1")
        let none = try await store.devices(app: app, pushTokens: [])
        XCTAssertEqual(none.count, 0)
        do {
            _ = try await store.devices(app: app, pushTokens: ["not-hex"])
            XCTFail("a token that is not hex is refused")
        } catch {
            XCTAssertEqual(error.kind, .invalidInput)
        }
    }

    func testUpdateTokensOfADevice() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        try await store.apply([
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: TestTokens.token(1))),
            .updateToken(.init(app: app, activityID: "match-8", deviceID: "d1", token: TestTokens.token(2))),
            .updateToken(.init(app: app, activityID: "match-8", deviceID: "d2", token: TestTokens.token(3))),
        ])
        let page = try await store.updateTokens(app: app, deviceID: "d1", after: nil, limit: 10, now: clock.now)
        XCTAssertEqual(page.items.map(\.activityID), ["match-7", "match-8"])
        XCTAssertEqual(page.items.map(\.token), [TestTokens.token(1), TestTokens.token(2)])
    }

    func testPagingGoesOnAfterTheCursorsTokenIsStoppedAndAReturnedOneRotates() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        // One registration time, so one expiry: the cursor's position within it is what matters.
        try await store.apply(
            (0..<12).map {
                .updateToken(.init(app: app, activityID: "match-7", deviceID: "d\($0)", token: TestTokens.token($0)))
            })
        let first = try await store.liveUpdateTokens(
            app: app, activityID: "match-7", after: nil, limit: 5, now: clock.now)
        XCTAssertEqual(first.items.count, 5)
        let cursorDevice = try XCTUnwrap(first.items.last?.deviceID)
        let returnedDevice = try XCTUnwrap(first.items.first?.deviceID)
        clock.advance(milliseconds: 1_000)
        try await store.apply([
            .stopUpdateTokens(app: app, activityID: "match-7", deviceID: cursorDevice),
            .updateToken(.init(app: app, activityID: "match-7", deviceID: returnedDevice, token: TestTokens.token(50))),
        ])
        let rest = try await laterPages(of: store, after: first.next, limit: 5, now: clock.now)
        let returned = Set(first.items.compactMap(\.deviceID))
        let expected = (0..<12).map { "d\($0)" }.filter { !returned.contains($0) }
        XCTAssertEqual(Set(rest.dropLast().compactMap(\.deviceID)), Set(expected), "each not yet returned, once")
        XCTAssertEqual(rest.count, expected.count + 1)
        XCTAssertEqual(rest.last?.token, TestTokens.token(50), "the rotated token moved to the end")
    }

    /// docs/REGISTRY.md: "A send therefore reaches each token once". The same token registered again a minute or
    /// more later moves its registration time and expiry forward; a send paging the activity must not read it a
    /// second time after the cursor (two results for one (job, token)). One registered with a device, one without.
    func testATokenRegisteredAgainWhilePagingIsNotReturnedASecondTime() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let tokens = (0..<3).map { TestTokens.token($0) }
        try await store.apply([
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d0", token: tokens[0])),
            .updateToken(.init(app: app, activityID: "match-7", token: tokens[1])),
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d2", token: tokens[2])),
        ])
        let first = try await store.liveUpdateTokens(
            app: app, activityID: "match-7", after: nil, limit: 2, now: clock.now)
        XCTAssertEqual(first.items.count, 2)
        clock.advance(milliseconds: 61_000)
        for returned in first.items {
            try await store.register(
                .updateToken(
                    .init(app: app, activityID: "match-7", deviceID: returned.deviceID, token: returned.token)))
        }
        let rest = try await laterPages(of: store, after: first.next, limit: 2, now: clock.now)
        let returned = Set(first.items.map(\.token))
        XCTAssertEqual(rest.map(\.token), tokens.filter { !returned.contains($0) }, "each token once")
    }

    /// The same for a device taking over a token registered without a device, by a first registration or by a
    /// rotation, whether the send read the token already or not.
    func testATokenTakenOverByADeviceWhilePagingIsNotReturnedASecondTime() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let tokens = (0..<4).map { TestTokens.token($0) }
        try await store.apply(
            tokens.map { .updateToken(.init(app: app, activityID: "match-7", token: $0)) } + [
                .updateToken(.init(app: app, activityID: "match-7", deviceID: "dB", token: TestTokens.token(10)))
            ])
        let first = try await store.liveUpdateTokens(
            app: app, activityID: "match-7", after: nil, limit: 2, now: clock.now)
        XCTAssertEqual(first.items.map(\.token), Array(tokens[0..<2]))
        clock.advance(milliseconds: 1_000)
        let changes = try await store.apply([
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "dA", token: tokens[0])),
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "dB", token: tokens[1])),
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "dC", token: tokens[2])),
        ])
        XCTAssertEqual(changes.events.map(\.change), [.rotated], "dB's token rotated; the others were live all along")
        let rest = try await laterPages(of: store, after: first.next, limit: 2, now: clock.now)
        XCTAssertEqual(rest.map(\.token), [tokens[2], tokens[3]], "each token once, and dB's old one is gone")
        XCTAssertEqual(rest.map(\.deviceID), ["dC", nil])
        let all = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(all.map(\.deviceID), ["dA", "dB", "dC", nil], "a takeover keeps the token's place")
    }

    /// A token registered after the one at the cursor went is still reached: a new registration's place is after
    /// every other's, even one that is gone (SQLite alone would give the new row the gone row's id again).
    func testATokenRegisteredAfterTheCursorsTokenWentIsReached() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        try await store.apply(
            (0..<4).map {
                .updateToken(.init(app: app, activityID: "match-7", deviceID: "d\($0)", token: TestTokens.token($0)))
            })
        let first = try await store.liveUpdateTokens(
            app: app, activityID: "match-7", after: nil, limit: 4, now: clock.now)
        XCTAssertEqual(first.items.count, 4)
        clock.advance(milliseconds: 1_000)
        try await store.apply([.stopUpdateTokens(app: app, activityID: "match-7", deviceID: "d3")])
        try await store.apply([
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d9", token: TestTokens.token(9)))
        ])
        let rest = try await store.liveUpdateTokens(
            app: app, activityID: "match-7", after: first.next, limit: 4, now: clock.now)
        XCTAssertEqual(rest.items.map(\.token), [TestTokens.token(9)])
    }
}
