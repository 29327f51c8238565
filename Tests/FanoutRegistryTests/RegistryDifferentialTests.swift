import FanoutRedis
import FanoutRedisRegistry
import FanoutRegistry
import FanoutTestSupport
import XCTest

/// The same random changes applied to an SQLite store and a Redis store, with the same clock: every result, read and
/// sweep compared. The behaviour tests check what the product promises; this checks that the two stores agree on the
/// cases nobody wrote a test for.
final class RegistryDifferentialTests: XCTestCase {
    let apps = ["com.acme.app", "com.acme.other"]

    /// A small deterministic generator (SplitMix64), so that a failure replays.
    struct Generator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }
        mutating func chance(_ percent: Int) -> Bool { below(100) < percent }
    }

    func testRandomChangesGiveTheSameResultsOnBothStores() async throws {
        for seed in 1...5 as ClosedRange<UInt64> {
            try await run(seed: seed, steps: 300)
        }
    }

    private func run(seed: UInt64, steps: Int) async throws {
        let directory = try ScratchDirectory("differential\(seed)")
        let clock = TestClock()
        var configuration = RegistryConfiguration()
        configuration.clock = clock.registryClock
        configuration.eventRetention = 6 * 3_600_000
        let sqlite = try SQLiteRegistryStore(path: directory.file("registry.db"), configuration: configuration)
        defer { sqlite.close() }
        let server = try RedisServerProcess(for: self)
        let client = try RedisClient(url: server.url)
        let redis = RedisRegistryStore(client: client, configuration: configuration)
        let definitions = apps.map { RegistryApp(bundleID: $0, workspace: "acme") }
        try await sqlite.defineApps(definitions)
        try await redis.defineApps(definitions)

        var random = Generator(state: seed)
        let activities = ["m1", "m2", "m3"]
        let devices = ["d1", "d2", "d3", "d4"]
        let users = ["u1", "u2"]
        func token() -> String { TestTokens.token(random.below(8)) }
        /// A removal's topic: every registration, the app's Live Activity tokens, or its devices' push tokens.
        func topic(_ app: String) -> String? {
            [nil, app + ".push-type.liveactivity", app][random.below(3)]
        }
        func change() -> RegistryChange {
            let app = apps[random.below(random.chance(80) ? 1 : 2)]
            let activity = activities[random.below(activities.count)]
            let device: String? = random.chance(70) ? devices[random.below(devices.count)] : nil
            let user: String? = random.chance(40) ? users[random.below(users.count)] : nil
            let time: Int64? = random.chance(25) ? clock.now - Int64(random.below(10)) * 3_600_000 : nil
            switch random.below(14) {
            case 0, 1, 2, 3:
                return .updateToken(
                    .init(
                        app: app, activityID: activity, deviceID: device, userID: user,
                        token: random.chance(10) ? "" : token(), registeredAt: time))
            case 4: return .stopUpdateTokens(app: app, activityID: activity, deviceID: device)
            case 5:
                return .pushToStartToken(
                    .init(
                        app: app, deviceID: devices[random.below(devices.count)], userID: user,
                        attributesType: random.chance(50) ? nil : (random.chance(50) ? "A" : "B"),
                        token: random.chance(15) ? "" : token(), updatedAt: time))
            case 6:
                return .device(
                    .init(
                        app: app, deviceID: devices[random.below(devices.count)], userID: user,
                        pushToken: random.chance(30) ? nil : (random.chance(15) ? "" : token()), registeredAt: time))
            case 7: return .startActivity(app: app, activityID: activity, attributesType: random.chance(50) ? "A" : nil)
            case 8:
                let dismissal: Int64? =
                    random.chance(50) ? nil : clock.now + Int64(random.below(6) - 1) * 3_600_000
                return .endActivity(app: app, activityID: activity, dismissalDate: dismissal)
            case 9: return .contentSent(app: app, activityID: activity, timestamp: Int64(random.below(1_000)))
            case 10: return .channel(app: app, activityID: activity, channelID: random.chance(60) ? "Y2g=" : nil)
            case 11, 12:
                return .unregistered(
                    token: token(), timestamp: random.chance(30) ? nil : clock.now - Int64(random.below(4)) * 1_800_000,
                    topic: topic(app))
            default: return .invalidToken(token: token(), topic: topic(app))
            }
        }

        for step in 0..<steps {
            let context = "seed \(seed) step \(step)"
            clock.advance(milliseconds: Int64(random.below(4)) * 1_800_000 + Int64(random.below(120_000)))
            if random.chance(10) {
                let one = try await sqlite.sweep(now: clock.now, batchSize: 3)
                let other = try await redis.sweep(now: clock.now, batchSize: 3)
                XCTAssertEqual(one.expired, other.expired, context)
                XCTAssertEqual(one.ended, other.ended, context)
                XCTAssertEqual(one.eventsPruned, other.eventsPruned, context)
                continue
            }
            let batch = (0..<(1 + random.below(4))).map { _ in change() }
            let one = try await sqlite.apply(batch)
            let other = try await redis.apply(batch)
            XCTAssertEqual(one.unchanged, other.unchanged, "\(context): \(batch)")
            XCTAssertEqual(one.alreadyExpired, other.alreadyExpired, context)
            XCTAssertEqual(Set(one.events.map(\.sequence)), Set(other.events.map(\.sequence)), context)
            XCTAssertEqual(
                one.events.map(Self.unnumbered).sorted(), other.events.map(Self.unnumbered).sorted(),
                "\(context): \(batch)")
            if step % 5 == 0 { try await compareReads(sqlite, redis, now: clock.now, context: context) }
        }
        try await compareReads(sqlite, redis, now: clock.now, context: "seed \(seed) end")
        let logOne = try await sqlite.allEvents()
        let logOther = try await redis.allEvents()
        XCTAssertEqual(logOne.map(\.sequence), logOther.map(\.sequence), "seed \(seed): the event log")
        await client.shutdown()
    }

    private static func unnumbered(_ event: RegistryEvent) -> String {
        var copy = event
        copy.sequence = 0
        return copy.jsonLine + (copy.deviceID ?? "-")
    }

    private func compareReads(
        _ sqlite: SQLiteRegistryStore, _ redis: RedisRegistryStore, now: Int64, context: String
    ) async throws {
        let statsOne = try await sqlite.stats(now: now)
        let statsOther = try await redis.stats(now: now)
        XCTAssertEqual(statsOne, statsOther, context)
        for app in apps {
            for activity in ["m1", "m2", "m3"] {
                let one = try await sqlite.allLiveTokens(app: app, activityID: activity, limit: 2, now: now)
                let other = try await redis.allLiveTokens(app: app, activityID: activity, limit: 2, now: now)
                XCTAssertEqual(one, other, "\(context): \(app) \(activity) tokens")
                let recordOne = try await sqlite.activity(app: app, activityID: activity)
                let recordOther = try await redis.activity(app: app, activityID: activity)
                XCTAssertEqual(recordOne, recordOther, "\(context): \(app) \(activity)")
            }
            for selection in [RecipientSelection.all, .users(["u2", "u1"]), .devices(["d3", "d1", "d9"])] {
                let devicesOne = try await sqlite.devices(app: app, selection: selection, after: nil, limit: 100)
                let devicesOther = try await redis.devices(app: app, selection: selection, after: nil, limit: 100)
                XCTAssertEqual(devicesOne.items, devicesOther.items, "\(context): \(app) devices \(selection)")
                for type in [nil, "A"] as [String?] {
                    let startsOne = try await sqlite.pushToStartTokens(
                        app: app, attributesType: type, selection: selection, after: nil, limit: 100)
                    let startsOther = try await redis.pushToStartTokens(
                        app: app, attributesType: type, selection: selection, after: nil, limit: 100)
                    XCTAssertEqual(
                        startsOne.items, startsOther.items,
                        "\(context): \(app) push-to-start \(selection) \(type ?? "-")")
                }
            }
            for device in ["d1", "d2"] {
                let one = try await sqlite.updateTokens(app: app, deviceID: device, after: nil, limit: 100, now: now)
                let other = try await redis.updateTokens(app: app, deviceID: device, after: nil, limit: 100, now: now)
                XCTAssertEqual(
                    Set(one.items.map(\.token)), Set(other.items.map(\.token)), "\(context): \(app) \(device) tokens")
            }
        }
        let channelsOne = try await sqlite.endedChannels(now: now, limit: 100)
        let channelsOther = try await redis.endedChannels(now: now, limit: 100)
        XCTAssertEqual(Set(channelsOne), Set(channelsOther), context)
    }
}
