// Broadcast push (iOS 18) end to end against mock-apns: channels managed through the management listener, one
// broadcast per channel, activities bound to channels, and the refusals that happen before anything is sent.
import Fanout
import FanoutCore
import FanoutRegistry
import FanoutTransport
import Foundation
import MockAPNsKit
import XCTest

final class BroadcastTests: XCTestCase {
    static let app = "com.example.app"
    private var mock: MockHarness!

    override func setUpWithError() throws {
        mock = try MockHarness { $0.manageListen = MockListenAddress(host: "127.0.0.1", port: 0) }
    }

    override func tearDown() {
        mock?.stop()
    }

    private func makeChannelClient() throws -> BroadcastChannelClient {
        try BroadcastChannelClient(
            endpoint: APNsEndpoint(host: "localhost", port: XCTUnwrap(mock.server.managePort)),
            credentials: ProviderCredentials(
                keyPath: mock.material.authKeyP8Path, keyID: "KEYID12345", teamID: "TEAMID1234"),
            caFile: mock.material.caPEMPath, requestTimeout: .seconds(10))
    }

    private func update(_ id: String, recipients: Recipients, expiration: Int64? = nil) -> FanoutJob {
        FanoutJob.liveActivity(
            id: id, bundleID: Self.app,
            content: LiveActivityContent(
                event: .update, timestamp: 1_764_460_800, contentState: try! RawJSON(validating: #"{"home":2}"#)),
            expiration: expiration, recipients: recipients)
    }

    func testChannelsAreCreatedReadListedAndDeleted() async throws {
        let client = try makeChannelClient()
        defer { client.shutdown() }
        let stored = try await client.create(app: Self.app, storagePolicy: .mostRecentMessageStored)
        let unstored = try await client.create(app: Self.app, storagePolicy: .noMessageStored)
        XCTAssertNotEqual(stored, unstored)
        let storedPolicy = try await client.read(app: Self.app, channelID: stored)
        let unstoredPolicy = try await client.read(app: Self.app, channelID: unstored)
        XCTAssertEqual(storedPolicy, .mostRecentMessageStored)
        XCTAssertEqual(unstoredPolicy, .noMessageStored)
        let listed = try await client.list(app: Self.app)
        XCTAssertEqual(Set(listed), [stored, unstored])
        try await client.delete(app: Self.app, channelID: stored)
        do {
            _ = try await client.read(app: Self.app, channelID: stored)
            XCTFail("a deleted channel cannot be read")
        } catch {
            XCTAssertEqual(error.reason, "ChannelNotRegistered")
            XCTAssertEqual(error.status, 400)
        }
        let remaining = try await client.list(app: Self.app)
        XCTAssertEqual(remaining, [unstored])
    }

    /// A provider token APNs calls expired (here: older than the mock's 1 s) is refreshed and the request sent again,
    /// as the engine does. Before, the channel client failed every request until its token's own refresh, 50
    /// minutes on.
    func testAnExpiredProviderTokenIsRefreshedAndTheRequestSentAgain() async throws {
        let maxAge: Int64 = 1
        let strict = try MockHarness {
            $0.manageListen = MockListenAddress(host: "127.0.0.1", port: 0)
            $0.tokenMaxAge = maxAge
        }
        defer { strict.stop() }
        let signer = try ProviderTokenSigner(
            key: ES256PrivateKey(pemFilePath: strict.material.authKeyP8Path), keyID: "KEYID12345",
            teamID: "TEAMID1234")
        // A source that may mint again at once (APNs's 20 minutes would make the test wait).
        let tokens = try ProviderTokenCache(signer: signer, refreshAfter: 3000, minimumInterval: 0)
        let client = try BroadcastChannelClient(
            endpoint: APNsEndpoint(host: "localhost", port: XCTUnwrap(strict.server.managePort)), tokenSource: tokens,
            caFile: strict.material.caPEMPath, requestTimeout: .seconds(10))
        defer { client.shutdown() }
        let channel = try await client.create(app: Self.app, storagePolicy: .mostRecentMessageStored)
        let first = try tokens.currentToken()
        // Past the mock's age limit: it refuses a token once the clock, in whole seconds, is more than `maxAge` past
        // the token's iat. Wait for that clock (a little over 1 to 2 s), not for a guessed time.
        let issuedAt = try XCTUnwrap(tokens.issuedAt)
        let deadline = Date().addingTimeInterval(10)
        while Int64(time(nil)) <= issuedAt + maxAge && Date() < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        XCTAssertGreaterThan(Int64(time(nil)), issuedAt + maxAge, "the token is past the mock's age limit")
        let policy = try await client.read(app: Self.app, channelID: channel)
        XCTAssertEqual(policy, .mostRecentMessageStored)
        // Only a refusal mints within refreshAfter (3000 s): the read was refused once, then sent with this one.
        XCTAssertNotEqual(try tokens.currentToken(), first, "a new token was minted")
    }

    /// A channel created and pushes sent from one process with one key: one provider token, not the channel client's
    /// beside the engine's (APNs counts two tokens minted apart as refreshes, TooManyProviderTokenUpdates).
    func testTheChannelClientAndTheEngineSendOneProviderToken() async throws {
        let client = try makeChannelClient()
        defer { client.shutdown() }
        let engine = try makeEngine(for: mock)
        let channel = try await client.create(app: Self.app, storagePolicy: .mostRecentMessageStored)
        let pushes = try await engine.run(scoreUpdateJob(id: "u", tokens: (0..<20).map { testDeviceToken($0) })) { _ in
        }
        let broadcast = try await engine.run(update("b", recipients: .channel(app: Self.app, id: channel))) { _ in }
        _ = try await client.list(app: Self.app)
        await engine.shutdown()
        XCTAssertEqual(pushes.counts.delivered, 20)
        XCTAssertEqual(broadcast.counts.delivered, 1)
        XCTAssertEqual(mock.stats.distinctProviderTokens, 1, "one token for the key in this process")
    }

    func testTheTenThousandAndFirstChannelIsRefused() async throws {
        // 9,999 made directly in the mock, then the 10,000th and the 10,001st through the client.
        for _ in 0..<9_999 { XCTAssertNotNil(mock.server.channels.create(app: Self.app)) }
        let client = try makeChannelClient()
        defer { client.shutdown() }
        _ = try await client.create(app: Self.app, storagePolicy: .mostRecentMessageStored)
        do {
            _ = try await client.create(app: Self.app, storagePolicy: .mostRecentMessageStored)
            XCTFail("the 10,001st channel must be refused")
        } catch {
            XCTAssertEqual(error.reason, "CannotCreateChannelConfig")
        }
        XCTAssertEqual(mock.server.channels.list(app: Self.app).count, 10_000)
    }

    func testABroadcastReachesItsChannelAndAnUnknownChannelIsRejected() async throws {
        let channel = try XCTUnwrap(mock.server.channels.create(app: Self.app))
        let engine = try makeEngine(for: mock)
        let log = ResultLog()
        let summary = try await engine.run(update("b1", recipients: .channel(app: Self.app, id: channel))) {
            log.add($0)
        }
        XCTAssertEqual(summary.counts.delivered, 1)
        XCTAssertEqual(summary.broadcasts, 1)
        XCTAssertEqual(mock.stats.broadcasts(channel: channel), 1)
        XCTAssertEqual(mock.stats.accepted, 0, "no device push")

        let unknown = "AAAAAAAAAAAAAAAAAAAAAAAA"
        let results = FanoutMutex<[NotificationResult]>([])
        let refused = try await engine.run(update("b2", recipients: .channel(app: Self.app, id: unknown))) { result in
            results.withLock { $0.append(result) }
        }
        XCTAssertEqual(refused.counts.rejected, 1)
        let result = try XCTUnwrap(results.withLock { $0.first })
        XCTAssertEqual(result.reason, "ChannelNotRegistered")
        XCTAssertEqual(result.channel, unknown)
        XCTAssertNil(result.token)
        await engine.shutdown()
    }

    func testRefusedBeforeSendingWithTheFieldNamed() async throws {
        let engine = try makeEngine(for: mock)
        let channel = try XCTUnwrap(mock.server.channels.create(app: Self.app, policy: .noMessageStored))
        func refusal(_ job: FanoutJob) async -> String {
            do {
                _ = try await engine.run(job) { _ in }
                return "sent"
            } catch {
                return error.message
            }
        }
        let expiring = await refusal(
            update(
                "p0", recipients: .channel(app: Self.app, id: channel, storagePolicy: .noMessageStored),
                expiration: 1_900_000_000))
        XCTAssertTrue(expiring.contains("expiration"), expiring)
        let startPayload =
            #"{"aps":{"event":"start","timestamp":1,"content-state":{},"attributes-type":"T","attributes":{},"alert":{"title":"t","body":"b"}}}"#
        let start = await refusal(
            FanoutJob(
                id: "s",
                headers: NotificationHeaders(pushType: .liveactivity, topic: Self.app + ".push-type.liveactivity"),
                payload: .raw(Array(startPayload.utf8)), recipients: .channel(app: Self.app, id: channel)))
        XCTAssertTrue(start.contains("live_activity.event"), start)
        // A raw payload of 5,121 bytes: one over the broadcast limit.
        var padding = #"{"aps":{"event":"update","timestamp":1,"content-state":{"p":""}}}"#
        let fill = String(repeating: "x", count: 5_121 - padding.utf8.count)
        padding = #"{"aps":{"event":"update","timestamp":1,"content-state":{"p":"\#(fill)"}}}"#
        XCTAssertEqual(padding.utf8.count, 5_121)
        let large = FanoutJob(
            id: "big",
            headers: NotificationHeaders(pushType: .liveactivity, topic: Self.app + ".push-type.liveactivity"),
            payload: .raw(Array(padding.utf8)), recipients: .channel(app: Self.app, id: channel))
        let tooLarge = await refusal(large)
        XCTAssertTrue(tooLarge.contains("payload") && tooLarge.contains("5121"), tooLarge)
        XCTAssertEqual(mock.stats.requests, 0, "nothing reached APNs")
        await engine.shutdown()
    }

    /// A broadcast whose job gives no expiration is kept for offline devices by a channel that keeps the latest
    /// message (sent with 8 hours less a minute), and sent with 0 to one that stores nothing or whose policy the
    /// registry does not know (0 is what any channel accepts; a single attempt).
    func testABroadcastWithoutAnExpirationIsKeptByAChannelThatStoresTheLatestMessage() async throws {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "broadcast-stored")
        let registry = try SQLiteRegistryStore(path: "\(directory)/registry.db")
        defer { registry.close() }
        try await registry.defineApps([RegistryApp(bundleID: Self.app)])
        let keeps = try XCTUnwrap(mock.server.channels.create(app: Self.app, policy: .mostRecentMessageStored))
        let storesNothing = try XCTUnwrap(mock.server.channels.create(app: Self.app, policy: .noMessageStored))
        try await registry.apply([
            .channel(app: Self.app, activityID: "keeps", channelID: keeps, storagePolicy: 1),
            .channel(app: Self.app, activityID: "stores-nothing", channelID: storesNothing, storagePolicy: 0),
            .channel(app: Self.app, activityID: "unknown", channelID: keeps),
        ])
        let engine = try makeEngine(for: mock) { $0.registry = registry }
        for activity in ["keeps", "stores-nothing", "unknown"] {
            let summary = try await engine.run(update(activity, recipients: .activity(app: Self.app, id: activity))) {
                _ in
            }
            XCTAssertEqual(summary.counts.delivered, 1, "\(activity): \(summary)")
        }
        XCTAssertEqual(mock.stats.broadcasts, 3)
        XCTAssertEqual(mock.stats.broadcastsStored, 1, "only the policy-1 channel bound with its policy")

        // A channel job that names the policy is kept too; one with `expiration: 0` is a single attempt.
        let direct = try await engine.run(
            update("direct", recipients: .channel(app: Self.app, id: keeps, storagePolicy: .mostRecentMessageStored))
        ) { _ in }
        XCTAssertEqual(direct.counts.delivered, 1)
        XCTAssertEqual(mock.stats.broadcastsStored, 2)
        let once = try await engine.run(
            update(
                "once", recipients: .channel(app: Self.app, id: keeps, storagePolicy: .mostRecentMessageStored),
                expiration: 0)
        ) { _ in }
        XCTAssertEqual(once.counts.delivered, 1)
        XCTAssertEqual(mock.stats.broadcastsStored, 2, "expiration 0 as the job gives it")
        await engine.shutdown()
    }

    func testAnActivityWithAChannelGetsOneBroadcastPlusItsTokenPushes() async throws {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "broadcast")
        let registry = try SQLiteRegistryStore(path: "\(directory)/registry.db")
        defer { registry.close() }
        try await registry.defineApps([RegistryApp(bundleID: Self.app)])
        let channel = try XCTUnwrap(mock.server.channels.create(app: Self.app))
        var changes: [RegistryChange] = [.channel(app: Self.app, activityID: "match-7", channelID: channel)]
        for index in 0..<1_000 {
            changes.append(
                .updateToken(
                    UpdateTokenRegistration(
                        app: Self.app, activityID: "match-7", deviceID: "d\(index)", token: testDeviceToken(index))))
        }
        try await registry.apply(changes)
        let engine = try makeEngine(for: mock) { $0.registry = registry }
        let summary = try await engine.run(update("m7", recipients: .activity(app: Self.app, id: "match-7"))) { _ in }
        XCTAssertEqual(summary.broadcasts, 1)
        XCTAssertEqual(summary.notifications, 1_001, "1,000 token pushes and one broadcast")
        XCTAssertEqual(summary.counts.delivered, 1_001)
        XCTAssertEqual(mock.stats.broadcasts, 1, "exactly one broadcast")
        XCTAssertEqual(mock.stats.broadcasts(channel: channel), 1)
        XCTAssertEqual(mock.stats.accepted, 1_000, "and one push per token")
        await engine.shutdown()
    }
}
