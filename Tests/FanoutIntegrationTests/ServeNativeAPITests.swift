// The native API of `fanout serve` (`/v1/...`) through curl, against the real binary and a mock-apns: every
// endpoint, what the mock receives, and what the reads report.
import FanoutSQLite
import FanoutTestSupport
import Foundation
import XCTest

class ServeNativeAPITests: XCTestCase {
    private var mock: MockHarness!
    private var serve: ServeHarness!

    /// Whether the registry is on Redis (`fanout serve --redis`, a redis-server of the test's own).
    class var registryOnRedis: Bool { false }

    override func setUpWithError() throws {
        mock = try MockHarness { $0.capturePayloads = true }
        serve = try ServeHarness(testCase: self, mock: mock)
        guard Self.registryOnRedis else { return try serve.start() }
        try serve.start(arguments: ["--redis", try redisURL()])
        // Teardown blocks run last-added first, before tearDown(): the server stops while Redis is still up.
        addTeardownBlock { [serve] in XCTAssertEqual(serve?.stop(), 0) }
    }

    override func tearDown() {
        serve?.stop()
        mock?.stop()
    }

    /// The `--redis` URL of a test with the registry on Redis: a redis-server of its own.
    func redisURL() throws -> String { try RedisServerProcess(for: self).url }

    static func token(_ kind: String, _ number: Int) -> String {
        let hex = String(number, radix: 16)
        return kind + String(repeating: "0", count: 62 - hex.count) + hex
    }

    private func payload(for token: String) throws -> [String: Any] {
        let payloads = mock.stats.payloadsByToken[token] ?? []
        XCTAssertEqual(payloads.count, 1, "exactly one push to \(token)")
        let bytes = try XCTUnwrap(payloads.last)
        return try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
    }

    func testEveryNativeEndpointFromRegistrationToEnd() throws {
        let device = ServeKeys.acmeDevice
        let server = ServeKeys.acmeServer
        XCTAssertEqual(try serve.curl("GET", "/healthz").status, 200)

        // Devices: a regular push token per user, push-to-start tokens, all with the device key.
        for index in 0..<4 {
            let registered = try serve.curl(
                "POST", "/v1/devices", key: device,
                json:
                    #"{"device_id": "d-\#(index)", "user_id": "u-\#(index % 2)", "push_token": "\#(Self.token("c0", index))"}"#
            )
            XCTAssertEqual(registered.status, 200, registered.text)
            let pushToStart = try serve.curl(
                "POST", "/v1/push-to-start-tokens", key: device,
                json:
                    #"{"device_id": "d-\#(index)", "user_id": "u-\#(index % 2)", "attributes_type": "MatchAttributes", "token": "\#(Self.token("b0", index))"}"#
            )
            XCTAssertEqual(pushToStart.status, 200, pushToStart.text)
        }

        // Start match-7 for user u-0 (devices d-0 and d-2): two push-to-start pushes carrying the activity id.
        let start = try serve.curl(
            "POST", "/v1/activities/match-7/start", key: server,
            json: """
                {"attributes_type": "MatchAttributes", "attributes": {"home": "Acme FC", "away": "Rivals"},
                 "content_state": {"home": 0, "away": 0}, "alert": {"title": "Kick-off", "body": "Acme FC - Rivals"},
                 "audience": {"users": ["u-0"]}}
                """)
        XCTAssertEqual(start.status, 202, start.text)
        let startID = try XCTUnwrap(try start.object()["dispatch_id"] as? String)
        XCTAssertEqual(start.headers["location"], "/v1/dispatches/\(startID)")
        let started = try serve.waitForDispatch(startID)
        XCTAssertEqual(started["delivered"] as? Int, 2, "\(started)")
        XCTAssertEqual(started["notifications"] as? Int, 2)
        for index in [0, 2] {
            let aps = try XCTUnwrap(try payload(for: Self.token("b0", index))["aps"] as? [String: Any])
            XCTAssertEqual(aps["event"] as? String, "start")
            let attributes = try XCTUnwrap(aps["attributes"] as? [String: Any])
            XCTAssertEqual(attributes["activityId"] as? String, "match-7")
            XCTAssertEqual(attributes["home"] as? String, "Acme FC")
            XCTAssertEqual(aps["attributes-type"] as? String, "MatchAttributes")
        }
        XCTAssertNil(mock.stats.payloadsByToken[Self.token("b0", 1)], "u-1's device got no start")

        // The app registers the new activity's update tokens (20 devices), one stops again.
        for index in 0..<20 {
            let response = try serve.curl(
                "POST", "/v1/activities/match-7/tokens", key: device,
                json: #"{"token": "\#(Self.token("a7", index))", "device_id": "a-\#(index)"}"#)
            XCTAssertEqual(response.status, 200, response.text)
        }
        let stop = try serve.curl(
            "DELETE", "/v1/activities/match-7/tokens", key: device, json: #"{"device_id": "a-19"}"#)
        XCTAssertEqual(stop.status, 200, stop.text)
        XCTAssertEqual(try stop.object()["removed"] as? Int, 1, stop.text)
        let activity = try serve.curl("GET", "/v1/activities/match-7", key: server)
        XCTAssertEqual(activity.status, 200, activity.text)
        XCTAssertEqual(try activity.object()["live_tokens"] as? Int, 19, activity.text)
        XCTAssertEqual(try activity.object()["state"] as? String, "active", activity.text)

        // Update by activity id: the 19 live tokens, with the content state, relevance and stale date.
        let update = try serve.curl(
            "POST", "/v1/activities/match-7/update", key: server,
            json:
                #"{"content_state": {"home": 1, "away": 0}, "relevance_score": 75, "stale_date": "2030-01-01T00:00:00Z", "priority": 5}"#
        )
        XCTAssertEqual(update.status, 202, update.text)
        let updateID = try XCTUnwrap(try update.object()["dispatch_id"] as? String)
        let updated = try serve.waitForDispatch(updateID)
        XCTAssertEqual(updated["delivered"] as? Int, 19, "\(updated)")
        let aps = try XCTUnwrap(try payload(for: Self.token("a7", 3))["aps"] as? [String: Any])
        XCTAssertEqual(aps["event"] as? String, "update")
        XCTAssertEqual((aps["content-state"] as? [String: Any])?["home"] as? Int, 1)
        XCTAssertEqual(aps["stale-date"] as? Int, 1_893_456_000)
        XCTAssertNil(mock.stats.payloadsByToken[Self.token("a7", 19)], "the stopped token got nothing")

        // Its results, as JSON lines, one per token.
        let results = try serve.curl("GET", "/v1/dispatches/\(updateID)/results", key: server)
        XCTAssertEqual(results.status, 200, results.text)
        let lines = results.text.split(separator: "\n")
        XCTAssertEqual(lines.count, 19)
        var tokens = Set<String>()
        for line in lines {
            let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            XCTAssertEqual(object["job"] as? String, updateID)
            XCTAssertEqual(object["outcome"] as? String, "delivered")
            tokens.insert(try XCTUnwrap(object["token"] as? String))
        }
        XCTAssertEqual(tokens, Set((0..<19).map { Self.token("a7", $0) }))

        // A regular push to user u-1's devices (d-1, d-3).
        let push = try serve.curl(
            "POST", "/v1/push", key: server,
            json: #"{"alert": {"title": "Match report", "body": "Acme FC won"}, "audience": {"users": ["u-1"]}}"#)
        XCTAssertEqual(push.status, 202, push.text)
        let pushed = try serve.waitForDispatch(try XCTUnwrap(try push.object()["dispatch_id"] as? String))
        XCTAssertEqual(pushed["delivered"] as? Int, 2, "\(pushed)")
        let alert = try XCTUnwrap(try payload(for: Self.token("c0", 3))["aps"] as? [String: Any])
        XCTAssertEqual((alert["alert"] as? [String: Any])?["title"] as? String, "Match report")

        // End: the activity is ended and its tokens get the end event.
        let end = try serve.curl(
            "POST", "/v1/activities/match-7/end", key: server,
            json: #"{"content_state": {"home": 2, "away": 1}, "dismissal_date": 0}"#)
        XCTAssertEqual(end.status, 202, end.text)
        let ended = try serve.waitForDispatch(try XCTUnwrap(try end.object()["dispatch_id"] as? String))
        XCTAssertEqual(ended["delivered"] as? Int, 19, "\(ended)")
        XCTAssertEqual(
            try serve.curl("GET", "/v1/activities/match-7", key: server).object()["state"] as? String, "ended")

        // Metrics count what was sent.
        let metrics = try serve.curl("GET", "/metrics")
        XCTAssertEqual(metrics.status, 200)
        XCTAssertTrue(metrics.text.contains("fanout_notifications_total"), metrics.text)
        XCTAssertEqual(mock.stats.duplicateApnsIDs, 0)
    }

    func testRefusalsNameTheFieldAndChangeNothing() throws {
        let server = ServeKeys.acmeServer
        let malformed = try serve.curl("POST", "/v1/activities/m/update", key: server, json: #"{"content_state": "#)
        XCTAssertEqual(malformed.status, 400)
        XCTAssertTrue(try malformed.object()["error"] as? String ?? "" != "", malformed.text)
        let wrongType = try serve.curl(
            "POST", "/v1/activities/m/update", key: server, json: #"{"content_state": {"a": 1}, "priority": "high"}"#)
        XCTAssertEqual(wrongType.status, 400, wrongType.text)
        XCTAssertEqual(try wrongType.object()["field"] as? String, "priority", wrongType.text)
        let unknown = try serve.curl(
            "POST", "/v1/activities/m/update", key: server, json: #"{"content_state": {"a": 1}, "colour": "red"}"#)
        XCTAssertEqual(unknown.status, 400, unknown.text)
        XCTAssertEqual(try unknown.object()["field"] as? String, "colour", unknown.text)
        let noType = try serve.curl("POST", "/v1/activities/m/start", key: server, json: #"{"content_state": {}}"#)
        XCTAssertEqual(noType.status, 400, noType.text)
        XCTAssertEqual(try noType.object()["field"] as? String, "attributes_type", noType.text)
        let twoAudiences = try serve.curl(
            "POST", "/v1/activities/m/start", key: server,
            json: #"{"attributes_type": "T", "content_state": {}, "audience": {"users": ["u"], "devices": ["d"]}}"#)
        XCTAssertEqual(twoAudiences.status, 400, twoAudiences.text)
        XCTAssertEqual(try twoAudiences.object()["field"] as? String, "audience", twoAudiences.text)
        // A VoIP push goes to PushKit tokens; the registry holds the devices' regular ones.
        let voipToUsers = try serve.curl(
            "POST", "/v1/push", key: server,
            json: #"{"push_type": "voip", "payload": {"aps": {}}, "audience": {"users": ["u"]}}"#)
        XCTAssertEqual(voipToUsers.status, 400, voipToUsers.text)
        XCTAssertEqual(try voipToUsers.object()["field"] as? String, "push_type", voipToUsers.text)
        // What the job-line checks refuse is named as the request spells it, not as the job line it becomes.
        for (path, json, field) in [
            ("/v1/activities/m/update", #"{"content_state": 5}"#, "content_state"),
            // Dates past year 9999: Int64.max seconds in milliseconds overflowed and crashed the service, at once
            // (an end's dismissal date) or at the activity's next update (a timestamp), and at every restart.
            (
                "/v1/activities/m/end", #"{"content_state": {}, "dismissal_date": 9223372036854775807}"#,
                "dismissal_date"
            ),
            ("/v1/activities/m/update", #"{"content_state": {}, "timestamp": 9223372036854775807}"#, "timestamp"),
            ("/v1/activities/m/update", #"{"content_state": {}, "alert": {"title": 5}}"#, "alert.title"),
            (
                "/v1/activities/m/start",
                #"{"attributes_type": "T", "content_state": {}, "audience": {"tokens": ["not-hex"]}}"#,
                "audience.tokens[0]"
            ),
            (
                "/v1/push",
                #"{"payload": {"aps": {}}, "audience": {"tokens": ["\#(Self.token("ab", 1))", "not-hex"]}}"#,
                "audience.tokens[1]"
            ),
        ] {
            let refused = try serve.curl("POST", path, key: server, json: json)
            XCTAssertEqual(refused.status, 400, refused.text)
            XCTAssertEqual(try refused.object()["field"] as? String, field, refused.text)
            XCTAssertTrue((try refused.object()["error"] as? String ?? "").hasPrefix(field), refused.text)
        }
        let tooLarge = try serve.curl(
            "POST", "/v1/activities/m/update", key: server,
            json: #"{"content_state": {"note": "\#(String(repeating: "x", count: 5_000))"}}"#)
        XCTAssertEqual(tooLarge.status, 400, tooLarge.text)
        XCTAssertNil(try tooLarge.object()["field"], "the payload as a whole: \(tooLarge.text)")
        XCTAssertTrue(
            (try tooLarge.object()["error"] as? String ?? "").hasPrefix("the encoded payload is"), tooLarge.text)
        XCTAssertEqual(try serve.curl("GET", "/v1/nothing-here", key: server).status, 404)
        XCTAssertEqual(mock.stats.requests, 0, "nothing was sent")
    }

    /// A start's `attributes` must be an object (the app's ActivityAttributes): a string or an array is refused
    /// naming `attributes`, not replaced by `{"activityId": …}` and sent.
    func testStartRefusesAttributesThatAreNotAnObject() throws {
        for attributes in [#""hello""#, "[1, 2]", "5"] {
            let refused = try serve.curl(
                "POST", "/v1/activities/na/start", key: ServeKeys.acmeServer,
                json:
                    #"{"attributes_type": "T", "attributes": \#(attributes), "content_state": {}, "audience": {"tokens": ["\#(Self.token("b0", 7))"]}}"#
            )
            XCTAssertEqual(refused.status, 400, "\(attributes): \(refused.text)")
            XCTAssertEqual(try refused.object()["field"] as? String, "attributes", refused.text)
            XCTAssertTrue((try refused.object()["error"] as? String ?? "").hasPrefix("attributes"), refused.text)
        }
        XCTAssertEqual(mock.stats.requests, 0, "nothing was sent")
    }

    /// A start sent to tokens the caller gives is still a push of its activity: its timestamp is strictly newer than
    /// the activity's last one and the next update's is newer than its own, as for a start by users or devices,
    /// Pushwoosh's `devices` given as the devices' push tokens included.
    func testAStartToTokensFollowsItsActivitysTimestamps() throws {
        let server = ServeKeys.acmeServer
        XCTAssertEqual(
            try serve.curl(
                "POST", "/v1/activities/t1/tokens", key: ServeKeys.acmeDevice,
                json: #"{"token": "\#(Self.token("a5", 1))", "device_id": "d-5"}"#
            ).status, 200)
        // The activity's last timestamp is well ahead of the clock.
        let last = Int(Date().timeIntervalSince1970) + 10_000
        let update = try serve.curl(
            "POST", "/v1/activities/t1/update", key: server, json: #"{"content_state": {}, "timestamp": \#(last)}"#)
        XCTAssertEqual(update.status, 202, update.text)
        XCTAssertEqual(
            try serve.waitForDispatch(try XCTUnwrap(try update.object()["dispatch_id"] as? String))["delivered"]
                as? Int,
            1)
        func timestamp(_ token: String) throws -> Int {
            try XCTUnwrap((try payload(for: token)["aps"] as? [String: Any])?["timestamp"] as? Int)
        }
        XCTAssertEqual(try timestamp(Self.token("a5", 1)), last)

        let start = try serve.curl(
            "POST", "/v1/activities/t1/start", key: server,
            json:
                #"{"attributes_type": "T", "content_state": {}, "audience": {"tokens": ["\#(Self.token("b5", 1))"]}}"#)
        XCTAssertEqual(start.status, 202, start.text)
        XCTAssertEqual(
            try serve.waitForDispatch(try XCTUnwrap(try start.object()["dispatch_id"] as? String))["delivered"] as? Int,
            1)
        XCTAssertGreaterThan(try timestamp(Self.token("b5", 1)), last, "newer than the activity's last push")

        // Pushwoosh's `devices` are the devices' push tokens: the start goes to their push-to-start tokens.
        XCTAssertEqual(
            try serve.curl(
                "POST", "/v1/devices", key: ServeKeys.acmeDevice,
                json: #"{"device_id": "d-6", "push_token": "\#(Self.token("c5", 2))"}"#
            ).status, 200)
        XCTAssertEqual(
            try serve.curl(
                "POST", "/v1/push-to-start-tokens", key: ServeKeys.acmeDevice,
                json: #"{"device_id": "d-6", "token": "\#(Self.token("b5", 2))"}"#
            ).status, 200)
        let pushwoosh = try serve.curl(
            "POST", "/json/1.3/startLiveActivity",
            json: """
                {"request": {"application": "\(ServeHarness.pushwooshApplication)", "auth": "\(server)",
                 "notifications": [{"live_activity_id": "t1", "content": "c", "devices": ["\(Self.token("c5", 2))"],
                   "live_activity": {"content-state": {}, "attributes-type": "T", "attributes": {}}}]}}
                """)
        let id = try XCTUnwrap(
            ((try pushwoosh.object()["response"] as? [String: Any])?["Messages"] as? [String])?.first, pushwoosh.text)
        XCTAssertEqual(try serve.waitForDispatch(id)["delivered"] as? Int, 1)
        XCTAssertGreaterThan(try timestamp(Self.token("b5", 2)), try timestamp(Self.token("b5", 1)))
    }

    /// What the checkers found accepted: a number past Double's range (`1e309`, which had no JSON form and left the
    /// payload unnoticed) and ids with control characters (stored, then printed into logs and results). Each is a
    /// `400` naming its field, and nothing is sent or stored.
    func testOutOfRangeNumbersAndControlCharactersInIdsAreRefused() throws {
        let server = ServeKeys.acmeServer
        let device = ServeKeys.acmeDevice
        let token = Self.token("a1", 3)
        for (method, path, key, json, field) in [
            (
                "POST", "/v1/activities/m/update", server, #"{"content_state": {}, "relevance_score": 1e309}"#,
                "relevance_score"
            ),
            (
                "POST", "/v1/activities/m/end", server, #"{"content_state": {}, "relevance_score": -1e309}"#,
                "relevance_score"
            ),
            ("POST", "/v1/activities/m%00x/update", server, #"{"content_state": {}}"#, "activity_id"),
            (
                "POST", "/v1/activities/m%0Ax/tokens", device, #"{"token": "\#(token)", "device_id": "d-1"}"#,
                "activity_id"
            ),
            ("GET", "/v1/dispatches/d_%01", server, nil, "dispatch_id"),
            ("GET", "/v1/activities/m%7F", server, nil, "activity_id"),
            ("POST", "/v1/devices", device, #"{"device_id": "d\u0000x", "push_token": "\#(token)"}"#, "device_id"),
            ("POST", "/v1/devices", device, #"{"device_id": "d-1", "user_id": "u\u001b[31m"}"#, "user_id"),
            ("POST", "/v1/activities/m/tokens", device, #"{"token": "\#(token)", "device_id": "d\n1"}"#, "device_id"),
            (
                "POST", "/v1/push-to-start-tokens", device,
                #"{"device_id": "d-1", "user_id": "u\u0085", "token": "\#(token)"}"#, "user_id"
            ),
            (
                "POST", "/v1/push-to-start-tokens", device,
                #"{"device_id": "d-1", "attributes_type": "T\u0000", "token": "\#(token)"}"#, "attributes_type"
            ),
            (
                "POST", "/v1/activities/m/start", server,
                #"{"attributes_type": "T", "content_state": {}, "audience": {"users": ["u-1", "u\u0000"]}}"#,
                "audience.users[1]"
            ),
            (
                "POST", "/v1/push", server, #"{"alert": {"body": "b"}, "audience": {"devices": ["d\r"]}}"#,
                "audience.devices[0]"
            ),
        ] {
            let refused = try serve.curl(method, path, key: key, json: json)
            XCTAssertEqual(refused.status, 400, "\(method) \(path) \(json ?? ""): \(refused.text)")
            XCTAssertEqual(try refused.object()["field"] as? String, field, "\(path): \(refused.text)")
            XCTAssertTrue((try refused.object()["error"] as? String ?? "").hasPrefix(field), refused.text)
        }
        // A C0 control is refused by the HTTP parser itself; a C1 control (U+0085, UTF-8 bytes that HTTP takes as
        // obs-text) reaches the API, which names the header.
        for (character, named) in [("\u{01}", false), ("\u{85}", true)] {
            let key = try serve.curl(
                "POST", "/v1/activities/m/update", key: server, json: #"{"content_state": {}}"#,
                headers: ["Idempotency-Key": "retry\(character)1"])
            XCTAssertEqual(key.status, 400, key.text)
            if named { XCTAssertEqual(try key.object()["field"] as? String, "Idempotency-Key", key.text) }
        }
        // Nothing was stored or sent.
        for path in ["/v1/activities/m", "/v1/activities/m%00x"] {
            XCTAssertNotEqual(try serve.curl("GET", path, key: server).status, 200, path)
        }
        XCTAssertEqual(mock.stats.requests, 0, "nothing was sent")
    }

    /// An ISO-8601 date that does not exist (February 30th, April 31st, February 29th of a common year, an offset past
    /// 23:59) is refused naming its field, not normalised into another date; the days that do exist are taken.
    func testDatesThatDoNotExistAreRefused() throws {
        for (event, field, date) in [
            ("update", "stale_date", "2026-02-30T00:00:00Z"), ("update", "stale_date", "2026-04-31T12:00:00Z"),
            ("update", "stale_date", "2027-02-29T00:00:00Z"), ("update", "stale_date", "2100-02-29T00:00:00Z"),
            ("update", "stale_date", "2026-01-01T00:00:00+99:00"),
            ("end", "dismissal_date", "2026-01-01T00:00:00-24:00"),
            ("end", "dismissal_date", "2026-01-01T00:00:00+01:60"),
        ] {
            let refused = try serve.curl(
                "POST", "/v1/activities/m/\(event)", key: ServeKeys.acmeServer,
                json: #"{"content_state": {}, "\#(field)": "\#(date)"}"#)
            XCTAssertEqual(refused.status, 400, "\(date): \(refused.text)")
            XCTAssertEqual(try refused.object()["field"] as? String, field, "\(date): \(refused.text)")
        }
        for date in ["2028-02-29T00:00:00Z", "2000-02-29T00:00:00Z", "2026-12-31T23:59:59+14:00"] {
            let taken = try serve.curl(
                "POST", "/v1/activities/m/update", key: ServeKeys.acmeServer,
                json: #"{"content_state": {}, "stale_date": "\#(date)"}"#)
            XCTAssertEqual(taken.status, 202, "\(date): \(taken.text)")
        }
    }

    /// What the registry's checks refuse in a registration is named as the native request spells it (`device_id`,
    /// `user_id`, a push-to-start `token`), not as the registry does (`device`, `user`, `push_to_start_token`).
    func testRegistrationRefusalsNameTheRequestsFields() throws {
        let device = ServeKeys.acmeDevice
        let long = String(repeating: "d", count: 300)
        let token = Self.token("a1", 1)
        for (method, path, json, field) in [
            ("POST", "/v1/activities/match-7/tokens", #"{"token": "\#(token)", "device_id": "\#(long)"}"#, "device_id"),
            (
                "POST", "/v1/activities/match-7/tokens",
                #"{"token": "\#(token)", "device_id": "d-1", "user_id": "\#(long)"}"#, "user_id"
            ),
            ("POST", "/v1/activities/match-7/tokens", #"{"token": "not-hex", "device_id": "d-1"}"#, "token"),
            ("DELETE", "/v1/activities/match-7/tokens", #"{"device_id": "\#(long)"}"#, "device_id"),
            ("POST", "/v1/devices", #"{"device_id": "\#(long)", "push_token": "\#(token)"}"#, "device_id"),
            ("POST", "/v1/devices", #"{"device_id": "d-1", "user_id": "\#(long)"}"#, "user_id"),
            ("POST", "/v1/devices", #"{"device_id": "d-1", "push_token": "not-hex"}"#, "push_token"),
            ("POST", "/v1/push-to-start-tokens", #"{"device_id": "\#(long)", "token": "\#(token)"}"#, "device_id"),
            (
                "POST", "/v1/push-to-start-tokens",
                #"{"device_id": "d-1", "user_id": "\#(long)", "token": "\#(token)"}"#,
                "user_id"
            ),
            ("POST", "/v1/push-to-start-tokens", #"{"device_id": "d-1", "token": "not-hex"}"#, "token"),
        ] {
            let refused = try serve.curl(method, path, key: device, json: json)
            XCTAssertEqual(refused.status, 400, "\(method) \(path): \(refused.text)")
            XCTAssertEqual(try refused.object()["field"] as? String, field, "\(method) \(path): \(refused.text)")
            XCTAssertTrue(
                (try refused.object()["error"] as? String ?? "").hasPrefix("\(field): "),
                "\(method) \(path): \(refused.text)")
        }
        let stats = try serve.curl("GET", "/v1/activities/match-7", key: ServeKeys.acmeServer)
        XCTAssertNotEqual(try? stats.object()["live_tokens"] as? Int, 1, "nothing was registered: \(stats.text)")
    }

    func testIdempotencyKeyReturnsTheFirstDispatch() throws {
        let body = #"{"content_state": {"home": 1}}"#
        let first = try serve.curl(
            "POST", "/v1/activities/m-1/update", key: ServeKeys.acmeServer, json: body,
            headers: ["Idempotency-Key": "retry-42"])
        let second = try serve.curl(
            "POST", "/v1/activities/m-1/update", key: ServeKeys.acmeServer, json: body,
            headers: ["Idempotency-Key": "retry-42"])
        XCTAssertEqual(first.status, 202, first.text)
        XCTAssertEqual(second.status, 202, second.text)
        XCTAssertEqual(
            try first.object()["dispatch_id"] as? String, try second.object()["dispatch_id"] as? String)
        let third = try serve.curl(
            "POST", "/v1/activities/m-1/update", key: ServeKeys.acmeServer, json: body,
            headers: ["Idempotency-Key": "retry-43"])
        XCTAssertNotEqual(try first.object()["dispatch_id"] as? String, try third.object()["dispatch_id"] as? String)
        // The same key with another request is refused, not answered with the first one's dispatch (the new update
        // would never be sent, and the caller would think it was); the first dispatch is named.
        let reused = try serve.curl(
            "POST", "/v1/activities/m-1/update", key: ServeKeys.acmeServer, json: #"{"content_state": {"home": 2}}"#,
            headers: ["Idempotency-Key": "retry-42"])
        XCTAssertEqual(reused.status, 422, reused.text)
        XCTAssertEqual(try reused.object()["field"] as? String, "Idempotency-Key", reused.text)
        let firstID = try XCTUnwrap(try first.object()["dispatch_id"] as? String)
        XCTAssertTrue(try XCTUnwrap(try reused.object()["error"] as? String).contains(firstID), reused.text)
    }
}

/// The same endpoints with the registry on Redis. XCTest on Linux runs only the test methods a class declares, so each
/// is declared again here.
final class ServeNativeAPIRedisTests: ServeNativeAPITests {
    override class var registryOnRedis: Bool { true }

    override func testEveryNativeEndpointFromRegistrationToEnd() throws {
        try super.testEveryNativeEndpointFromRegistrationToEnd()
    }
    override func testRefusalsNameTheFieldAndChangeNothing() throws {
        try super.testRefusalsNameTheFieldAndChangeNothing()
    }
    override func testStartRefusesAttributesThatAreNotAnObject() throws {
        try super.testStartRefusesAttributesThatAreNotAnObject()
    }
    override func testDatesThatDoNotExistAreRefused() throws {
        try super.testDatesThatDoNotExistAreRefused()
    }
    override func testAStartToTokensFollowsItsActivitysTimestamps() throws {
        try super.testAStartToTokensFollowsItsActivitysTimestamps()
    }
    override func testRegistrationRefusalsNameTheRequestsFields() throws {
        try super.testRegistrationRefusalsNameTheRequestsFields()
    }
    override func testIdempotencyKeyReturnsTheFirstDispatch() throws {
        try super.testIdempotencyKeyReturnsTheFirstDispatch()
    }
}

/// The same endpoints with everything on a Redis Cluster (three primaries), `fanout serve --redis redis+cluster://`.
/// One cluster serves the class's tests (starting one takes seconds), emptied (FLUSHALL on every primary) before each.
final class ServeNativeAPIClusterTests: ServeNativeAPITests {
    override class var registryOnRedis: Bool { true }

    nonisolated(unsafe) private static var cluster: RedisClusterProcess?

    override class func tearDown() {
        cluster?.discard()
        cluster = nil
        super.tearDown()
    }

    override func redisURL() throws -> String {
        let cluster = try Self.cluster ?? RedisClusterProcess(primaries: 3)
        Self.cluster = cluster
        for primary in try cluster.nodes() where primary.isPrimary {
            XCTAssertEqual(try cluster.cli(primary.port, ["FLUSHALL"]), "OK")
        }
        return cluster.url
    }

    override func testEveryNativeEndpointFromRegistrationToEnd() throws {
        try super.testEveryNativeEndpointFromRegistrationToEnd()
    }
    override func testRefusalsNameTheFieldAndChangeNothing() throws {
        try super.testRefusalsNameTheFieldAndChangeNothing()
    }
    override func testStartRefusesAttributesThatAreNotAnObject() throws {
        try super.testStartRefusesAttributesThatAreNotAnObject()
    }
    override func testDatesThatDoNotExistAreRefused() throws {
        try super.testDatesThatDoNotExistAreRefused()
    }
    override func testAStartToTokensFollowsItsActivitysTimestamps() throws {
        try super.testAStartToTokensFollowsItsActivitysTimestamps()
    }
    override func testRegistrationRefusalsNameTheRequestsFields() throws {
        try super.testRegistrationRefusalsNameTheRequestsFields()
    }
    override func testIdempotencyKeyReturnsTheFirstDispatch() throws {
        try super.testIdempotencyKeyReturnsTheFirstDispatch()
    }
}

/// The SQLite registry's own case, in a class of its own so that the Redis subclass above does not run it.
final class ServeRegistryBusyTests: XCTestCase {
    private var mock: MockHarness!
    private var serve: ServeHarness!

    override func setUpWithError() throws {
        mock = try MockHarness()
        serve = try ServeHarness(testCase: self, mock: mock)
        try serve.start()
    }

    override func tearDown() {
        serve?.stop()
        mock?.stop()
    }

    /// A registration the registry cannot write now (another process holds the SQLite file's write lock past the busy
    /// timeout) is a 503 with `Retry-After`, so the SDK comes back; once the lock is gone the same request is taken.
    func testARegistrationTheRegistryCannotWriteNowIs503WithRetryAfter() throws {
        let other = try SQLiteDatabase(path: serve.database, busyTimeoutMilliseconds: 5000)
        try other.execute("BEGIN IMMEDIATE")
        let json = #"{"token": "\#(ServeNativeAPITests.token("a1", 9))", "device_id": "d-9"}"#
        let refused = try serve.curl("POST", "/v1/activities/match-9/tokens", key: ServeKeys.acmeDevice, json: json)
        try other.execute("ROLLBACK")
        XCTAssertEqual(refused.status, 503, refused.text)
        XCTAssertEqual(refused.headers["retry-after"], "1", "\(refused.headers)")
        let taken = try serve.curl("POST", "/v1/activities/match-9/tokens", key: ServeKeys.acmeDevice, json: json)
        XCTAssertTrue((200..<300).contains(taken.status), taken.text)
        XCTAssertNil(taken.headers["retry-after"])
    }
}
