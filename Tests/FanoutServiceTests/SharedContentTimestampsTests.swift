// The activities' content timestamps on a real redis-server: the claim's and the accept's scripts read the
// registry's last sent timestamp in the activity's own keys, and the accept's script runs its commands only with a
// timestamp newer than every one handed out or sent.
import FanoutRedis
import FanoutRedisRegistry
import FanoutRegistry
import FanoutTestSupport
import XCTest

@testable import FanoutService

final class SharedContentTimestampsTests: XCTestCase {
    private var client: RedisClient!
    private var registry: RedisRegistryStore!
    private var timestamps: SharedContentTimestamps!
    // Ids with the characters the registry escapes in its keys: the timestamp's key must share their hash tag.
    private let app = "com.example.scores"
    private let activity = "match/{7}%"

    override func setUp() async throws {
        let redis = try RedisServerProcess()
        addTeardownBlock { redis.discard() }
        client = try RedisClient(url: redis.url)
        registry = RedisRegistryStore(client: client)
        timestamps = SharedContentTimestamps(client: client, registry: registry)
        let client = client!
        addTeardownBlock { await client.shutdown() }
    }

    private func sent(_ timestamp: Int64) async throws {
        try await registry.defineApps([RegistryApp(bundleID: app, workspace: "acme")])
        _ = try await registry.apply([
            .startActivity(app: app, activityID: activity, attributesType: nil),
            .contentSent(app: app, activityID: activity, timestamp: timestamp),
        ])
    }

    /// Runs the accept's script with `timestamp`: nil when it claimed it and ran `SET marker value`.
    private func commit(_ timestamp: Int64, marker value: String) async throws -> Int64? {
        let script = timestamps.commitArguments(
            [["SET", "marker", RedisArgument(value)]], claiming: timestamp, app: app, activityID: activity)
        let reply = try await client.evalScript(
            SharedContentTimestamps.commitScript, keys: script.keys, arguments: script.arguments)
        let floor = try XCTUnwrap(reply.integer, "\(reply)")
        return floor == 0 ? nil : floor
    }

    private func marker() async throws -> String? {
        try await client.command(["GET", "marker"]).string
    }

    func testAClaimIsNewerThanTheLastSentAndTheLastHandedOut() async throws {
        let first = try await timestamps.claim(app: app, activityID: activity, atLeast: 1_000)
        XCTAssertEqual(first, 1_000, "nothing handed out or sent yet: the least acceptable")
        let second = try await timestamps.claim(app: app, activityID: activity, atLeast: 1_000)
        XCTAssertEqual(second, 1_001, "one past the last handed out")
        try await sent(5_000)
        let third = try await timestamps.claim(app: app, activityID: activity, atLeast: 1_000)
        XCTAssertEqual(third, 5_001, "one past the last sent, read from the registry")
    }

    func testTheAcceptsScriptRunsItsCommandsOnlyWithANewerTimestamp() async throws {
        let fresh = try await commit(2_000, marker: "first")
        XCTAssertNil(fresh)
        let firstMarker = try await marker()
        XCTAssertEqual(firstMarker, "first")

        let again = try await commit(2_000, marker: "second")
        XCTAssertEqual(again, 2_000, "the same timestamp again is stale: the floor is the one handed out")
        let older = try await commit(1_999, marker: "second")
        XCTAssertEqual(older, 2_000)
        let unchanged = try await marker()
        XCTAssertEqual(unchanged, "first", "a stale choice runs nothing")

        try await sent(3_000)
        let belowSent = try await commit(2_500, marker: "third")
        XCTAssertEqual(belowSent, 3_000, "the registry's last sent is a floor too")
        let newer = try await commit(3_001, marker: "fourth")
        XCTAssertNil(newer)
        let lastMarker = try await marker()
        XCTAssertEqual(lastMarker, "fourth")
        let next = try await timestamps.claim(app: app, activityID: activity, atLeast: 1)
        XCTAssertEqual(next, 3_002, "a claim goes past what the accept's script claimed")
    }

    func testTheTimestampsKeyIsInTheSlotOfTheActivitysRegistryKeys() throws {
        let script = timestamps.commitArguments([], claiming: 1, app: app, activityID: activity)
        let tag = RedisRegistryStore.activityHashTag(app: app, activityID: activity)
        XCTAssertEqual(script.keys.count, 2)
        for key in script.keys {
            let name = String(decoding: key.bytes, as: UTF8.self)
            // The first `{...}` of a key is its hash tag.
            let open = try XCTUnwrap(name.firstIndex(of: "{"))
            let close = try XCTUnwrap(name[open...].firstIndex(of: "}"))
            XCTAssertEqual(String(name[open...close]), tag, name)
        }
    }
}
