// Broadcast channels through `fanout serve`'s native API: a channel created for an activity, an update by
// activity id that sends one broadcast plus the token pushes, and the dispatch that says so.
import FanoutRegistry
import Foundation
import MockAPNsKit
import XCTest

final class ServeBroadcastTests: XCTestCase {
    func testAChannelForAnActivityThroughTheNativeAPI() throws {
        let mock = try MockHarness { $0.manageListen = MockListenAddress(host: "127.0.0.1", port: 0) }
        defer { mock.stop() }
        let serve = try ServeHarness(testCase: self, mock: mock)
        try serve.start()
        defer { serve.stop() }
        let server = ServeKeys.acmeServer

        let created = try serve.curl(
            "POST", "/v1/activities/match-3/channel", key: server, json: #"{"storage_policy": 1}"#)
        XCTAssertEqual(created.status, 201, created.text)
        let channel = try XCTUnwrap(try created.object()["channel_id"] as? String)
        XCTAssertTrue(mock.server.channels.exists(app: ServeHarness.acmeApp, channel: channel))
        let again = try serve.curl("POST", "/v1/activities/match-3/channel", key: server, json: "{}")
        XCTAssertEqual(again.status, 200, "already bound: the same channel")
        XCTAssertEqual(try again.object()["channel_id"] as? String, channel)
        XCTAssertEqual(
            try serve.curl(
                "POST", "/v1/activities/match-3/channel", key: ServeKeys.globexServer,
                json: #"{"app": "\#(ServeHarness.acmeApp)"}"#
            ).status, 404, "another workspace's app is unknown")

        // Devices that subscribed with a token (no channel) register as usual.
        for index in 0..<50 {
            XCTAssertEqual(
                try serve.curl(
                    "POST", "/v1/activities/match-3/tokens", key: ServeKeys.acmeDevice,
                    json: #"{"token": "\#(testDeviceToken(index))", "device_id": "d\#(index)"}"#
                ).status, 200)
        }
        let activity = try serve.curl("GET", "/v1/activities/match-3", key: server).object()
        XCTAssertEqual(activity["channel_id"] as? String, channel)
        XCTAssertEqual(activity["live_tokens"] as? Int, 50)

        let update = try serve.curl(
            "POST", "/v1/activities/match-3/update", key: server, json: #"{"content_state": {"home": 1}}"#)
        XCTAssertEqual(update.status, 202, update.text)
        let done = try serve.waitForDispatch(try XCTUnwrap(try update.object()["dispatch_id"] as? String))
        XCTAssertEqual(done["broadcasts"] as? Int, 1, "\(done)")
        XCTAssertEqual(done["notifications"] as? Int, 51, "50 token pushes and one broadcast: \(done)")
        XCTAssertEqual(done["delivered"] as? Int, 51, "\(done)")
        XCTAssertEqual(mock.stats.broadcasts(channel: channel), 1)
        XCTAssertEqual(mock.stats.accepted, 50)
        let results = try serve.curl(
            "GET", "/v1/dispatches/\(try XCTUnwrap(done["id"] as? String))/results", key: server)
        let broadcastLines = results.text.split(separator: "\n").filter { $0.contains("\"channel\":") }
        XCTAssertEqual(broadcastLines.count, 1, results.text)

        let deleted = try serve.curl("DELETE", "/v1/activities/match-3/channel", key: server)
        XCTAssertEqual(deleted.status, 200, deleted.text)
        XCTAssertFalse(mock.server.channels.exists(app: ServeHarness.acmeApp, channel: channel))
        XCTAssertNil(try serve.curl("GET", "/v1/activities/match-3", key: server).object()["channel_id"])
        // The channel client and the engine of the team send one provider token, not one each.
        XCTAssertEqual(mock.stats.distinctProviderTokens, 1)
    }

    /// A channel created in another environment than the app's management host (the app moved from the sandbox) is
    /// not deleted there, where APNs would only say it does not exist: 409, and it stays bound.
    func testAChannelOfAnotherEnvironmentIsNotDeletedHere() async throws {
        let mock = try MockHarness { $0.manageListen = MockListenAddress(host: "127.0.0.1", port: 0) }
        defer { mock.stop() }
        let serve = try ServeHarness(testCase: self, mock: mock)
        try serve.start()
        defer { serve.stop() }
        let registry = try SQLiteRegistryStore(path: serve.database)
        defer { registry.close() }
        try await registry.apply([
            .channel(
                app: ServeHarness.acmeApp, activityID: "final", channelID: "ZGV2LTE=", storagePolicy: 1,
                environment: "development")
        ])
        let refused = try serve.curl("DELETE", "/v1/activities/final/channel", key: ServeKeys.acmeServer)
        XCTAssertEqual(refused.status, 409, refused.text)
        XCTAssertTrue(refused.text.contains("development"), refused.text)
        let activity = try serve.curl("GET", "/v1/activities/final", key: ServeKeys.acmeServer).object()
        XCTAssertEqual(activity["channel_id"] as? String, "ZGV2LTE=", "still bound")
    }
}
