// Activities bound to broadcast channels: `fanout channels` against mock-apns's management listener, a channel
// created for an activity and bound in the registry, a start that subscribes to it, and the channel deleted at
// APNs once the activity has ended and its dismissal date has passed.
import Fanout
import FanoutRegistry
import Foundation
import MockAPNsKit
import XCTest

final class BroadcastChannelBindingTests: XCTestCase {
    static let app = "com.example.app"
    private var mock: MockHarness!
    private var directory = ""

    override func setUpWithError() throws {
        mock = try MockHarness {
            $0.manageListen = MockListenAddress(host: "127.0.0.1", port: 0)
            $0.capturePayloads = true
        }
        directory = try ProcessSupport.temporaryDirectory(for: self, "channels")
    }

    override func tearDown() {
        mock?.stop()
    }

    private func channels(_ arguments: [String]) throws -> ProcessResult {
        try ProcessSupport.run(
            try ProcessSupport.builtExecutable("fanout"),
            ["channels"] + arguments + [
                "--manage-endpoint", "localhost:\(try XCTUnwrap(mock.server.managePort))", "--ca-file",
                mock.material.caPEMPath, "--key", mock.material.authKeyP8Path, "--key-id", "KEYID12345", "--team-id",
                "TEAMID1234",
            ], environment: ProcessSupport.cleanEnvironment())
    }

    /// - Parameter host: `localhost`, or `127.0.0.1` for the same mock under another name: another environment.
    private func makeChannelClient(host: String = "localhost") throws -> BroadcastChannelClient {
        try BroadcastChannelClient(
            endpoint: APNsEndpoint(host: host, port: XCTUnwrap(mock.server.managePort)),
            credentials: ProviderCredentials(
                keyPath: mock.material.authKeyP8Path, keyID: "KEYID12345", teamID: "TEAMID1234"),
            caFile: mock.material.caPEMPath)
    }

    /// The app, with device d1's push-to-start token.
    private func defineAppWithOnePushToStartToken(in registry: SQLiteRegistryStore) async throws {
        try await registry.defineApps([RegistryApp(bundleID: Self.app)])
        try await registry.apply([
            .pushToStartToken(
                PushToStartRegistration(app: Self.app, deviceID: "d1", userID: "u1", token: testDeviceToken(1)))
        ])
    }

    /// A start to every push-to-start token of the app, by activity id.
    private func startJob(id: String, title: String, activityID: String) throws -> FanoutJob {
        FanoutJob.liveActivity(
            id: id, bundleID: Self.app,
            content: LiveActivityContent(
                event: .start, timestamp: 1_764_460_800, contentState: try RawJSON(validating: #"{"home":0}"#),
                alert: LiveActivityAlert(title: .plain(title), body: "0-0"), attributesType: "MatchAttributes",
                attributes: try RawJSON(validating: #"{"home":"Acme"}"#)),
            recipients: .pushToStart(app: Self.app, attributesType: nil, selection: .all, activityID: activityID))
    }

    private static func object(_ result: ProcessResult) throws -> [String: Any] {
        try XCTUnwrap(
            try JSONSerialization.jsonObject(with: Data(XCTUnwrap(result.stdoutLines.last).utf8)) as? [String: Any],
            result.summary)
    }

    func testTheChannelsCommand() throws {
        let created = try channels(["create", "--app", Self.app, "--policy", "0"])
        XCTAssertEqual(created.exitCode, 0, created.summary)
        let id = try XCTUnwrap(try Self.object(created)["channel"] as? String)
        let read = try channels(["read", "--app", Self.app, "--channel", id])
        XCTAssertEqual(try Self.object(read)["policy"] as? Int, 0, read.summary)
        let listed = try channels(["list", "--app", Self.app])
        XCTAssertEqual(try Self.object(listed)["channels"] as? [String], [id], listed.summary)
        XCTAssertEqual(try channels(["delete", "--app", Self.app, "--channel", id]).exitCode, 0)
        let gone = try channels(["read", "--app", Self.app, "--channel", id])
        XCTAssertEqual(gone.exitCode, 1, gone.summary)
        XCTAssertTrue(gone.stderr.contains("ChannelNotRegistered"), gone.summary)
        let usage = try channels(["read", "--app", Self.app])
        XCTAssertEqual(usage.exitCode, 2)
        XCTAssertTrue(usage.stderr.contains("--channel"), usage.summary)
        // A push endpoint is refused, not replaced by Apple's management host.
        let pushEndpoint = try ProcessSupport.run(
            try ProcessSupport.builtExecutable("fanout"),
            [
                "channels", "list", "--app", Self.app, "--endpoint", "localhost:\(mock.port)", "--key",
                mock.material.authKeyP8Path, "--key-id", "KEYID12345", "--team-id", "TEAMID1234",
            ], environment: ProcessSupport.cleanEnvironment())
        XCTAssertEqual(pushEndpoint.exitCode, 2, pushEndpoint.summary)
        let missing = try channels(["prune", "--db", "\(directory)/no-such-registry.db"])
        XCTAssertEqual(missing.exitCode, 2, "a bad argument: \(missing.summary)")
        XCTAssertTrue(missing.stderr.contains("does not exist"), missing.summary)
        XCTAssertTrue(pushEndpoint.stderr.contains("--manage-endpoint"), pushEndpoint.summary)
    }

    func testABoundChannelIsSubscribedAtStartAndDeletedAfterTheActivityEnds() async throws {
        let clock = TestClock(Int64(Date().timeIntervalSince1970 * 1000))
        var configuration = RegistryConfiguration()
        configuration.clock = clock.registryClock
        let registry = try SQLiteRegistryStore(path: "\(directory)/registry.db", configuration: configuration)
        defer { registry.close() }
        try await defineAppWithOnePushToStartToken(in: registry)
        let client = try makeChannelClient()
        defer { client.shutdown() }
        let channel = try await client.createChannel(
            forActivity: "match-9", app: Self.app, storagePolicy: .mostRecentMessageStored, registry: registry)
        let bound = try await registry.activity(app: Self.app, activityID: "match-9")
        XCTAssertEqual(bound?.channelID, channel)
        XCTAssertEqual(bound?.channelStoragePolicy, 1)
        // A second creation for the activity (a script run again) is refused and creates nothing: binding another
        // would cut off the activities subscribed to the first.
        do {
            _ = try await client.createChannel(
                forActivity: "match-9", app: Self.app, storagePolicy: .noMessageStored, registry: registry)
            XCTFail("a second channel was bound")
        } catch {
            XCTAssertEqual(error.reason, BroadcastChannelClient.alreadyBound)
            XCTAssertTrue(error.message.contains(channel), error.message)
        }
        let listed = try await client.list(app: Self.app)
        XCTAssertEqual(listed, [channel], "no second channel at APNs")
        let unchanged = try await registry.activity(app: Self.app, activityID: "match-9")
        XCTAssertEqual(unchanged?.channelID, channel)

        // A start by activity id: the new activity subscribes to the bound channel.
        let engine = try makeEngine(for: mock) { $0.registry = registry }
        let start = try startJob(id: "start", title: "Kick-off", activityID: "match-9")
        let started = try await engine.run(start) { _ in }
        XCTAssertEqual(started.counts.delivered, 1)
        let payload = try XCTUnwrap(mock.stats.payloadsByToken[testDeviceToken(1)]?.first)
        let aps = try XCTUnwrap(
            (try JSONSerialization.jsonObject(with: Data(payload)) as? [String: Any])?["aps"] as? [String: Any])
        XCTAssertEqual(aps["input-push-channel"] as? String, channel)
        await engine.shutdown()

        // Ended with a dismissal date in the past: the channel is deleted at APNs and unbound, and the next sweep
        // removes the activity.
        let now = clock.registryClock.now() / 1000
        try await registry.apply([.endActivity(app: Self.app, activityID: "match-9", dismissalDate: now - 1)])
        XCTAssertTrue(mock.server.channels.exists(app: Self.app, channel: channel))
        _ = try await registry.sweep()
        let kept = try await registry.activity(app: Self.app, activityID: "match-9")
        XCTAssertNotNil(kept, "kept while bound")
        let deleted = try await client.deleteEndedChannels(registry: registry)
        XCTAssertEqual(deleted.map(\.channelID), [channel])
        XCTAssertFalse(mock.server.channels.exists(app: Self.app, channel: channel))
        _ = try await registry.sweep()
        let removed = try await registry.activity(app: Self.app, activityID: "match-9")
        XCTAssertNil(removed)

        // A channel APNs refuses to delete (a malformed id: BadChannelId), first in line, and another team's: the
        // channel after them is still deleted; the refusal is reported and stays bound for the next prune.
        let next = try await client.createChannel(
            forActivity: "match-10", app: Self.app, storagePolicy: .mostRecentMessageStored, registry: registry)
        try await registry.defineApps([RegistryApp(bundleID: "com.other.app")])
        try await registry.apply([
            .channel(app: Self.app, activityID: "stuck", channelID: "not base64!"),
            .channel(app: "com.other.app", activityID: "theirs", channelID: "dGhlaXJz"),
            .endActivity(app: Self.app, activityID: "stuck", dismissalDate: now - 30),
            .endActivity(app: "com.other.app", activityID: "theirs", dismissalDate: now - 20),
            .endActivity(app: Self.app, activityID: "match-10", dismissalDate: now - 10),
        ])
        do {
            _ = try await client.deleteEndedChannels(registry: registry, apps: [Self.app])
            XCTFail("the refusal is reported")
        } catch {
            XCTAssertEqual(error.reason, "BadChannelId", error.message)
            XCTAssertTrue(error.message.contains("deleted 1"), error.message)
        }
        XCTAssertFalse(mock.server.channels.exists(app: Self.app, channel: next), "deleted past the stuck one")
        let stuck = try await registry.activity(app: Self.app, activityID: "stuck")
        XCTAssertEqual(stuck?.channelID, "not base64!", "left bound")
        let theirs = try await registry.activity(app: "com.other.app", activityID: "theirs")
        XCTAssertEqual(theirs?.channelID, "dGhlaXJz", "another team's is not touched")
    }

    /// A start by the id of an ended activity begins a new session: the activity is live again, so the channel the
    /// new session subscribes to is not deleted at the old dismissal date.
    func testAStartByAnEndedActivitysIDKeepsItsChannelForTheNewSession() async throws {
        let registry = try SQLiteRegistryStore(path: "\(directory)/registry.db")
        defer { registry.close() }
        try await defineAppWithOnePushToStartToken(in: registry)
        let client = try makeChannelClient()
        defer { client.shutdown() }
        let channel = try await client.createChannel(
            forActivity: "final", app: Self.app, storagePolicy: .mostRecentMessageStored, registry: registry)
        let now = registry.clock.now() / 1000
        try await registry.apply([.endActivity(app: Self.app, activityID: "final", dismissalDate: now - 1)])

        let engine = try makeEngine(for: mock) { $0.registry = registry }
        let start = try startJob(id: "rematch", title: "Rematch", activityID: "final")
        let started = try await engine.run(start) { _ in }
        XCTAssertEqual(started.counts.delivered, 1)
        // A start that names the channel already bound leaves the binding as it was, policy included.
        var naming = start
        if case .liveActivity(var content) = naming.payload {
            content.inputPushChannel = channel
            naming.payload = .liveActivity(content)
        }
        naming.id = "rematch-named"
        let named = try await engine.run(naming) { _ in }
        XCTAssertEqual(named.counts.delivered, 1)
        await engine.shutdown()
        let activity = try await registry.activity(app: Self.app, activityID: "final")
        XCTAssertEqual(activity?.state, .active)
        XCTAssertEqual(activity?.channelID, channel)
        XCTAssertEqual(activity?.channelStoragePolicy, 1, "the policy it was bound with")
        let deleted = try await client.deleteEndedChannels(registry: registry)
        XCTAssertEqual(deleted, [], "the new session's channel is kept")
        XCTAssertTrue(mock.server.channels.exists(app: Self.app, channel: channel))
    }

    /// A channel lives in one APNs environment, and the registry records which. A prune against another leaves it
    /// bound and does not ask (there it would be "not found"); a prune in its own deletes it, and one APNs no longer
    /// has there counts as gone. A channel bound without its environment (a version 3 registry, or a start job sent to
    /// a mock) is taken to be the pruning client's, as before. Before, every "not found" was
    /// taken for gone: a prune pointed at the wrong environment dropped every binding, and the channels' ids with
    /// them while they still counted against the app's 10,000.
    func testAPruneInAnotherEnvironmentLeavesTheChannelsBound() async throws {
        let clock = TestClock(Int64(Date().timeIntervalSince1970 * 1000))
        var configuration = RegistryConfiguration()
        configuration.clock = clock.registryClock
        let registry = try SQLiteRegistryStore(path: "\(directory)/registry.db", configuration: configuration)
        defer { registry.close() }
        try await registry.defineApps([RegistryApp(bundleID: Self.app)])
        let client = try makeChannelClient()
        defer { client.shutdown() }
        let elsewhere = try makeChannelClient(host: "127.0.0.1")
        defer { elsewhere.shutdown() }
        XCTAssertEqual(client.environment, "localhost:\(try XCTUnwrap(mock.server.managePort))")
        XCTAssertNotEqual(elsewhere.environment, client.environment)
        let here = try await client.createChannel(
            forActivity: "here", app: Self.app, storagePolicy: .mostRecentMessageStored, registry: registry)
        let recorded = try await registry.activity(app: Self.app, activityID: "here")
        XCTAssertEqual(recorded?.channelEnvironment, client.environment, "recorded where it was created")
        let gone = try await client.createChannel(
            forActivity: "gone", app: Self.app, storagePolicy: .mostRecentMessageStored, registry: registry)
        XCTAssertTrue(mock.server.channels.delete(app: Self.app, channel: gone), "deleted behind the registry's back")
        let now = clock.registryClock.now() / 1000
        try await registry.apply([
            // Created in production: this mock has never heard of it.
            .channel(app: Self.app, activityID: "prod", channelID: "cHJvZC0x", environment: "production"),
            // Bound without its environment (a version 3 registry), and unknown here.
            .channel(app: Self.app, activityID: "legacy", channelID: "bGVnYWN5"),
            .endActivity(app: Self.app, activityID: "here", dismissalDate: now - 40),
            .endActivity(app: Self.app, activityID: "gone", dismissalDate: now - 30),
            .endActivity(app: Self.app, activityID: "prod", dismissalDate: now - 20),
            .endActivity(app: Self.app, activityID: "legacy", dismissalDate: now - 10),
        ])
        func channel(_ activity: String) async throws -> String? {
            try await registry.activity(app: Self.app, activityID: activity)?.channelID
        }

        // From another environment: the channels recorded elsewhere are not asked about and stay bound, nothing is
        // deleted at the mock; the legacy one, its environment not recorded, is taken to be this one's, as before the
        // registry recorded it, and unknown here it counts as gone.
        let away = try await elsewhere.pruneEndedChannels(registry: registry)
        XCTAssertEqual(away.deleted.map(\.channelID), ["bGVnYWN5"])
        XCTAssertEqual(Set(away.otherEnvironment.map(\.channelID)), [here, gone, "cHJvZC0x"])
        for activity in ["here", "gone", "prod"] {
            let bound = try await channel(activity)
            XCTAssertNotNil(bound, "\(activity) stays bound")
        }
        let unboundLegacy = try await channel("legacy")
        XCTAssertNil(unboundLegacy)
        XCTAssertTrue(mock.server.channels.exists(app: Self.app, channel: here))

        // In its own environment: the channel is deleted, the one gone there unbound; production's is left bound
        // for a prune there.
        let home = try await client.pruneEndedChannels(registry: registry)
        XCTAssertEqual(Set(home.deleted.map(\.channelID)), [here, gone])
        XCTAssertEqual(home.otherEnvironment.map(\.channelID), ["cHJvZC0x"])
        XCTAssertFalse(mock.server.channels.exists(app: Self.app, channel: here))
        let unboundHere = try await channel("here")
        let unboundGone = try await channel("gone")
        let keptProd = try await channel("prod")
        XCTAssertNil(unboundHere)
        XCTAssertNil(unboundGone)
        XCTAssertEqual(keptProd, "cHJvZC0x")

        // Production's is refused here by its activity too, naming where it was created, and left bound.
        do {
            _ = try await client.deleteChannel(forActivity: "prod", app: Self.app, registry: registry)
            XCTFail("a channel of another environment is not deleted here")
        } catch {
            XCTAssertEqual(error.reason, BroadcastChannelClient.otherEnvironment)
            XCTAssertTrue(error.message.contains("production"), error.message)
        }
        let prune = try await client.pruneEndedChannels(registry: registry)
        XCTAssertEqual(prune.deleted, [])
        XCTAssertEqual(prune.otherEnvironment.map(\.channelID), ["cHJvZC0x"])
        XCTAssertEqual(prune.otherEnvironment.first?.environment, "production")
        let stillProd = try await channel("prod")
        XCTAssertEqual(stillProd, "cHJvZC0x")
    }

    /// `fanout channels prune` against another environment says so and drops nothing; `delete --db --activity`
    /// deletes an activity's channel and unbinds it.
    func testTheChannelsCommandPrunesOnlyTheEnvironmentItIsPointedAt() async throws {
        let database = "\(directory)/registry.db"
        do {
            let registry = try SQLiteRegistryStore(path: database)
            try await registry.defineApps([RegistryApp(bundleID: Self.app)])
            registry.close()
        }
        let managePort = try XCTUnwrap(mock.server.managePort)
        for activity in ["m1", "m2"] {
            let made = try channels(["create", "--app", Self.app, "--db", database, "--activity", activity])
            XCTAssertEqual(made.exitCode, 0, made.summary)
        }
        let m1: String
        do {
            let registry = try SQLiteRegistryStore(path: database)
            let bound = try await registry.activity(app: Self.app, activityID: "m1")?.channelID
            m1 = try XCTUnwrap(bound)
            let now = registry.clock.now() / 1000
            try await registry.apply([.endActivity(app: Self.app, activityID: "m1", dismissalDate: now - 1)])
            registry.close()
        }
        // The same mock under another name is another environment: left bound, and the way to prune it is named.
        func prune(_ host: String) throws -> ProcessResult {
            try ProcessSupport.run(
                try ProcessSupport.builtExecutable("fanout"),
                [
                    "channels", "prune", "--db", database, "--manage-endpoint", "\(host):\(managePort)", "--ca-file",
                    mock.material.caPEMPath, "--key", mock.material.authKeyP8Path, "--key-id", "KEYID12345",
                    "--team-id", "TEAMID1234",
                ], environment: ProcessSupport.cleanEnvironment())
        }
        let wrong = try prune("127.0.0.1")
        XCTAssertEqual(wrong.exitCode, 0, wrong.summary)
        XCTAssertEqual(try Self.object(wrong)["deleted"] as? Int, 0, wrong.summary)
        XCTAssertEqual(try Self.object(wrong)["other_environment"] as? Int, 1, wrong.summary)
        XCTAssertTrue(wrong.stderr.contains("--manage-endpoint localhost:\(managePort)"), wrong.summary)
        XCTAssertEqual(mock.server.channels.list(app: Self.app).count, 2, "nothing deleted")
        let right = try prune("localhost")
        XCTAssertEqual(try Self.object(right)["deleted"] as? Int, 1, right.summary)
        XCTAssertEqual(try Self.object(right)["other_environment"] as? Int, 0, right.summary)
        XCTAssertEqual(mock.server.channels.list(app: Self.app).count, 1)
        XCTAssertFalse(mock.server.channels.exists(app: Self.app, channel: m1))

        // Deleting by activity: the channel goes at APNs and in the registry.
        let usage = try channels(["delete", "--app", Self.app, "--db", database])
        XCTAssertEqual(usage.exitCode, 2, usage.summary)
        let deleted = try channels(["delete", "--app", Self.app, "--db", database, "--activity", "m2"])
        XCTAssertEqual(deleted.exitCode, 0, deleted.summary)
        XCTAssertEqual(mock.server.channels.list(app: Self.app), [])
        let registry = try SQLiteRegistryStore(path: database)
        defer { registry.close() }
        let m2 = try await registry.activity(app: Self.app, activityID: "m2")
        XCTAssertNil(m2?.channelID)
    }

    /// An activity keeps its channel: a start naming another channel than the one bound is refused before anything
    /// is sent, naming both, and the binding stays (rebinding lost the bound channel's id while it still counted
    /// against the app's 10,000, and cut the activity's updates off from its subscribers). An ended activity is not
    /// made live again by the refused start.
    func testAStartNamingAnotherChannelThanTheBoundOneIsRefused() async throws {
        let registry = try SQLiteRegistryStore(path: "\(directory)/registry.db")
        defer { registry.close() }
        try await defineAppWithOnePushToStartToken(in: registry)
        let client = try makeChannelClient()
        defer { client.shutdown() }
        let bound = try await client.createChannel(
            forActivity: "derby", app: Self.app, storagePolicy: .mostRecentMessageStored, registry: registry)
        let other = try XCTUnwrap(mock.server.channels.create(app: Self.app))
        func start(_ id: String, activityID: String, channel: String) throws -> FanoutJob {
            var job = try startJob(id: id, title: "Derby", activityID: activityID)
            if case .liveActivity(var content) = job.payload {
                content.inputPushChannel = channel
                job.payload = .liveActivity(content)
            }
            return job
        }
        let engine = try makeEngine(for: mock) { $0.registry = registry }
        func refusal(_ job: FanoutJob) async -> String {
            do {
                let summary = try await engine.run(job) { _ in }
                return "sent: \(summary.counts)"
            } catch {
                return error.message
            }
        }
        let refused = await refusal(try start("s1", activityID: "derby", channel: other))
        XCTAssertTrue(refused.contains("live_activity.input_push_channel"), refused)
        XCTAssertTrue(refused.contains(bound) && refused.contains(other), "both channels named: \(refused)")
        XCTAssertEqual(mock.stats.accepted, 0, "nothing sent")
        var activity = try await registry.activity(app: Self.app, activityID: "derby")
        XCTAssertEqual(activity?.channelID, bound)
        XCTAssertEqual(activity?.channelStoragePolicy, 1)

        // Ended: the refused start leaves it ended, and its channel bound for the prune after its dismissal.
        try await registry.apply([.endActivity(app: Self.app, activityID: "derby", dismissalDate: nil)])
        let refusedEnded = await refusal(try start("s2", activityID: "derby", channel: other))
        XCTAssertTrue(refusedEnded.contains(bound), refusedEnded)
        activity = try await registry.activity(app: Self.app, activityID: "derby")
        XCTAssertEqual(activity?.state, .ended)
        XCTAssertEqual(activity?.channelID, bound)

        // Naming the bound channel starts it; an activity with no channel binds the one named.
        let same = try await engine.run(try start("s3", activityID: "derby", channel: bound)) { _ in }
        XCTAssertEqual(same.counts.delivered, 1)
        let fresh = try await engine.run(try start("s4", activityID: "cup", channel: other)) { _ in }
        XCTAssertEqual(fresh.counts.delivered, 1)
        await engine.shutdown()
        let cup = try await registry.activity(app: Self.app, activityID: "cup")
        XCTAssertEqual(cup?.channelID, other)
        XCTAssertEqual(mock.stats.accepted, 2)
    }

    /// An activity's broadcast goes at the priority its token pushes go at: past the priority-10 guard both are sent
    /// at 5 (before, the broadcast stayed at 10 and reached every subscribed device past the guard).
    func testAnActivitysBroadcastIsDemotedWithItsTokenPushes() async throws {
        let registry = try SQLiteRegistryStore(path: "\(directory)/registry.db")
        defer { registry.close() }
        try await registry.defineApps([RegistryApp(bundleID: Self.app)])
        try await registry.apply([
            .updateToken(
                UpdateTokenRegistration(app: Self.app, activityID: "m", deviceID: "d1", token: testDeviceToken(7)))
        ])
        let client = try makeChannelClient()
        defer { client.shutdown() }
        _ = try await client.createChannel(
            forActivity: "m", app: Self.app, storagePolicy: .mostRecentMessageStored, registry: registry)
        let engine = try makeEngine(for: mock) {
            $0.registry = registry
            $0.priority10UpdatesPerHour = [Self.app: 1]
        }
        for index in 1...2 {
            let update = FanoutJob.liveActivity(
                id: "u\(index)", bundleID: Self.app,
                content: LiveActivityContent(
                    event: .update, timestamp: 1_764_460_800 + Int64(index),
                    contentState: try RawJSON(validating: #"{"home":\#(index)}"#)),
                recipients: .activity(app: Self.app, id: "m"))
            let summary = try await engine.run(update) { _ in }
            XCTAssertEqual(summary.counts.delivered, 2, "the token and the broadcast: \(summary.counts)")
        }
        await engine.shutdown()
        let stats = mock.stats.snapshot()
        XCTAssertEqual(stats["accepted_by_priority"] as? [String: Int], ["10": 1, "5": 1])
        XCTAssertEqual(stats["broadcasts_by_priority"] as? [String: Int], ["10": 1, "5": 1])
    }
}
