// The Pushwoosh- and Braze-shaped endpoints of `fanout serve`, played by real clients: a Python script that sends
// what the Pushwoosh iOS SDK and a Pushwoosh backend send, and curl for Braze's REST calls. The mock must receive
// exactly the expected pushes, with the activity id where each SDK reads it.
import Foundation
import XCTest

final class ServeCompatibilityTests: XCTestCase {
    private var mock: MockHarness!
    private var serve: ServeHarness!

    override func setUpWithError() throws {
        mock = try MockHarness { $0.capturePayloads = true }
        serve = try ServeHarness(testCase: self, mock: mock)
        try serve.start()
    }

    override func tearDown() {
        serve?.stop()
        mock?.stop()
    }

    private func payloads(_ token: String) throws -> [[String: Any]] {
        try (mock.stats.payloadsByToken[token] ?? []).map { bytes in
            try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
        }
    }

    private static var scriptsDirectory: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Scripts").path
    }

    func testPushwooshSDKAndServerCallsFieldByField() throws {
        let python = try XCTUnwrap(ProcessSupport.findTool("python3"), "python3 is needed for the SDK script")
        let pushToken = ServeNativeAPITests.token("c1", 1)
        let startToken = ServeNativeAPITests.token("b1", 1)
        let activityToken = ServeNativeAPITests.token("a9", 1)
        let result = try ProcessSupport.run(
            python,
            [
                Self.scriptsDirectory + "/pushwoosh_sdk_flow.py", serve.baseURL, ServeHarness.pushwooshApplication,
                ServeKeys.acmeDevice, ServeKeys.acmeServer, pushToken, startToken, activityToken,
            ], timeout: 60)
        XCTAssertEqual(result.exitCode, 0, result.summary)
        let ids = try XCTUnwrap(
            try JSONSerialization.jsonObject(with: Data(try XCTUnwrap(result.stdoutLines.last).utf8))
                as? [String: String], result.summary)

        let start = try serve.waitForDispatch(try XCTUnwrap(ids["start"]))
        XCTAssertEqual(start["delivered"] as? Int, 1, "\(start)")
        let update = try serve.waitForDispatch(try XCTUnwrap(ids["update"]))
        XCTAssertEqual(update["delivered"] as? Int, 1, "\(update)")
        let afterStop = try serve.waitForDispatch(try XCTUnwrap(ids["after_stop"]))
        XCTAssertEqual(afterStop["notifications"] as? Int, 0, "the stopped token gets nothing: \(afterStop)")
        let end = try serve.waitForDispatch(try XCTUnwrap(ids["end"]))
        XCTAssertEqual(end["notifications"] as? Int, 0, "\(end)")

        // Exactly: one start to the push-to-start token, one update to the activity token, nothing else.
        XCTAssertEqual(mock.stats.accepted, 2)
        let startPayload = try XCTUnwrap(try payloads(startToken).first)
        let aps = try XCTUnwrap(startPayload["aps"] as? [String: Any])
        XCTAssertEqual(aps["event"] as? String, "start")
        XCTAssertEqual(aps["attributes-type"] as? String, "MatchAttributes")
        let attributes = try XCTUnwrap(aps["attributes"] as? [String: Any])
        XCTAssertEqual((attributes["pushwoosh"] as? [String: Any])?["activityId"] as? String, "match-9")
        XCTAssertEqual(attributes["home"] as? String, "Acme FC")
        XCTAssertEqual(((aps["alert"] as? [String: Any])?["title"] as? String), "Kick-off")
        let updatePayload = try XCTUnwrap(try payloads(activityToken).first)
        let updateAPS = try XCTUnwrap(updatePayload["aps"] as? [String: Any])
        XCTAssertEqual(updateAPS["event"] as? String, "update")
        XCTAssertEqual((updateAPS["content-state"] as? [String: Any])?["home"] as? Int, 1)
        XCTAssertTrue(try payloads(pushToken).isEmpty)
    }

    /// A Pushwoosh request of several notifications is checked whole before any is accepted: its clients send no
    /// Idempotency-Key, so one resent after a refusal would otherwise send its good entries twice.
    func testPushwooshRefusesABadEntryBeforeAcceptingAny() throws {
        let activityToken = ServeNativeAPITests.token("a7", 1)
        XCTAssertEqual(
            try serve.curl(
                "POST", "/v1/activities/match-7/tokens", key: ServeKeys.acmeDevice,
                json: #"{"token": "\#(activityToken)", "device_id": "dev-7"}"#
            ).status, 200)
        func update(_ contentStates: [String]) throws -> [String: Any] {
            let entries = contentStates.map {
                #"{"live_activity": {"event": "update", "content-state": \#($0)}, "live_activity_id": "match-7"}"#
            }
            let answer = try serve.curl(
                "POST", "/json/1.3/updateLiveActivity",
                json:
                    #"{"request": {"application": "\#(ServeHarness.pushwooshApplication)", "auth": "\#(ServeKeys.acmeServer)", "notifications": [\#(entries.joined(separator: ","))]}}"#
            )
            XCTAssertEqual(answer.status, 200, answer.text)
            return try answer.object()
        }
        // The second entry's payload is over APNs's 4 KB: only `accept`'s own checks find that.
        let tooLarge = #"{"commentary": "\#(String(repeating: "x", count: 5_000))"}"#
        let refused = try update([#"{"home": 1}"#, tooLarge])
        XCTAssertEqual(refused["status_code"] as? Int, 210, "\(refused)")
        let message = try XCTUnwrap(refused["status_message"] as? String)
        XCTAssertTrue(message.contains("notifications[1]"), "names the entry at fault: \(message)")
        // A field the job-line checks refuse is named as Pushwoosh spells it.
        let notObject = try update([#"{"home": 1}"#, "5"])
        XCTAssertEqual(notObject["status_code"] as? Int, 210, "\(notObject)")
        let named = try XCTUnwrap(notObject["status_message"] as? String)
        XCTAssertTrue(named.contains(": notifications[1].live_activity.content-state: must be"), named)

        // The same request fixed: both entries are accepted and sent, and the first only once.
        let accepted = try update([#"{"home": 1}"#, #"{"home": 2}"#])
        XCTAssertEqual(accepted["status_code"] as? Int, 200, "\(accepted)")
        let ids = try XCTUnwrap((accepted["response"] as? [String: Any])?["Messages"] as? [String], "\(accepted)")
        XCTAssertEqual(ids.count, 2)
        for id in ids { XCTAssertEqual(try serve.waitForDispatch(id)["delivered"] as? Int, 1) }
        let homes = try payloads(activityToken).compactMap {
            (($0["aps"] as? [String: Any])?["content-state"] as? [String: Any])?["home"] as? Int
        }
        XCTAssertEqual(homes.sorted(), [1, 2], "each update sent once, none from the refused request")
    }

    /// Pushwoosh's `end` example leaves `content-state` out: the end then carries none, as a native end without
    /// `content_state` does (the activity keeps its last state), not an empty one.
    func testPushwooshEndWithoutContentStateSendsNone() throws {
        let activityToken = ServeNativeAPITests.token("a8", 1)
        XCTAssertEqual(
            try serve.curl(
                "POST", "/v1/activities/match-8/tokens", key: ServeKeys.acmeDevice,
                json: #"{"token": "\#(activityToken)", "device_id": "dev-8"}"#
            ).status, 200)
        let answer = try serve.curl(
            "POST", "/json/1.3/updateLiveActivity",
            json: """
                {"request": {"application": "\(ServeHarness.pushwooshApplication)", "auth": "\(ServeKeys.acmeServer)",
                 "notifications": [{"live_activity": {"event": "end", "dismissal-date": 0}, "live_activity_id": "match-8"}]}}
                """)
        let object = try answer.object()
        XCTAssertEqual(object["status_code"] as? Int, 200, answer.text)
        let id = try XCTUnwrap(((object["response"] as? [String: Any])?["Messages"] as? [String])?.first)
        XCTAssertEqual(try serve.waitForDispatch(id)["delivered"] as? Int, 1)
        let aps = try XCTUnwrap(try payloads(activityToken).first?["aps"] as? [String: Any])
        XCTAssertEqual(aps["event"] as? String, "end")
        XCTAssertNil(aps["content-state"], "no content-state was given: \(aps)")
    }

    /// Pushwoosh's `devices` are the devices' push tokens (as `registerDevice` gave them; in any case) or, as its
    /// older docs allow, their HWIDs: a start to them goes to those devices' push-to-start tokens, never to the push
    /// tokens themselves, which APNs would not start a Live Activity on.
    func testPushwooshStartToDevicesGoesToTheirPushToStartTokens() throws {
        let devices = [("hwid-a", "c6", "b6"), ("hwid-b", "c7", "b7"), ("hwid-c", "c8", "b8")].map {
            (hwid: $0.0, push: ServeNativeAPITests.token($0.1, 1), start: ServeNativeAPITests.token($0.2, 1))
        }
        func sdk(_ method: String, _ fields: String) throws {
            let answer = try serve.curl(
                "POST", "/json/1.3/\(method)", key: ServeKeys.acmeDevice, scheme: "Token",
                json: #"{"request": {"application": "\#(ServeHarness.pushwooshApplication)", \#(fields)}}"#)
            XCTAssertEqual(try answer.object()["status_code"] as? Int, 200, "\(method): \(answer.text)")
        }
        for device in devices {
            try sdk("registerDevice", #""hwid": "\#(device.hwid)", "push_token": "\#(device.push)", "device_type": 1"#)
            try sdk(
                "setActivityPushToStartToken",
                #""hwid": "\#(device.hwid)", "activity_push_to_start_token": "\#(device.start)""#)
        }
        // Two devices by push token (one in capitals), the third by HWID, and one push token nobody registered.
        let named = [
            devices[0].push.uppercased(), devices[1].push, devices[2].hwid, ServeNativeAPITests.token("c9", 1),
        ]
        let answer = try serve.curl(
            "POST", "/json/1.3/startLiveActivity",
            json: """
                {"request": {"application": "\(ServeHarness.pushwooshApplication)", "auth": "\(ServeKeys.acmeServer)",
                 "notifications": [{"live_activity_id": "pw-dev", "content": "c",
                   "devices": [\(named.map { "\"\($0)\"" }.joined(separator: ", "))],
                   "live_activity": {"content-state": {}, "attributes-type": "T", "attributes": {}}}]}}
                """)
        let object = try answer.object()
        XCTAssertEqual(object["status_code"] as? Int, 200, answer.text)
        let id = try XCTUnwrap(((object["response"] as? [String: Any])?["Messages"] as? [String])?.first, answer.text)
        let done = try serve.waitForDispatch(id)
        XCTAssertEqual(done["delivered"] as? Int, 3, "\(done)")
        for device in devices {
            let aps = try XCTUnwrap(try payloads(device.start).first?["aps"] as? [String: Any], device.hwid)
            XCTAssertEqual(aps["event"] as? String, "start")
            XCTAssertEqual(try payloads(device.start).count, 1, device.hwid)
            XCTAssertTrue(try payloads(device.push).isEmpty, "nothing to \(device.hwid)'s regular push token")
        }
        XCTAssertEqual(mock.stats.accepted, 3)
    }

    /// Pushwoosh's and Braze's fields the checkers found accepted: a `relevance-score` past Double's range, an
    /// impossible date on a start, ids with control characters. Each is refused naming the field as the API spells
    /// it (Pushwoosh: `status_code` 210), and nothing is sent.
    func testPushwooshAndBrazeRefuseOutOfRangeScoresImpossibleDatesAndControlCharacters() throws {
        func pushwoosh(_ method: String, _ entry: String) throws -> String {
            let answer = try serve.curl(
                "POST", "/json/1.3/\(method)",
                json: """
                    {"request": {"application": "\(ServeHarness.pushwooshApplication)", "auth": "\(ServeKeys.acmeServer)",
                     "notifications": [\(entry)]}}
                    """)
            let object = try answer.object()
            XCTAssertEqual(object["status_code"] as? Int, 210, "\(method): \(answer.text)")
            return object["status_message"] as? String ?? ""
        }
        let start =
            #""content": "c", "users": ["u-1"], "live_activity": {"content-state": {}, "attributes-type": "T", "attributes": {}"#
        for (method, entry, field) in [
            (
                "startLiveActivity", #"{"live_activity_id": "pw", \#(start), "relevance-score": 1e309}}"#,
                "notifications[0].live_activity.relevance-score"
            ),
            (
                "startLiveActivity",
                #"{"live_activity_id": "pw", \#(start), "dismissal-date": "2026-02-30T00:00:00Z"}}"#,
                "notifications[0].live_activity.dismissal-date"
            ),
            (
                "updateLiveActivity",
                #"{"live_activity_id": "pw", "live_activity": {"event": "update", "content-state": {}, "relevance-score": 1e400}}"#,
                "notifications[0].live_activity.relevance-score"
            ),
            (
                "startLiveActivity", #"{"live_activity_id": "pw\u0000", \#(start)}}"#,
                "notifications[0].live_activity_id"
            ),
            (
                "updateLiveActivity",
                #"{"live_activity_id": "p\tw", "live_activity": {"event": "update", "content-state": {}}}"#,
                "notifications[0].live_activity_id"
            ),
            (
                "startLiveActivity",
                #"{"live_activity_id": "pw", "content": "c", "devices": ["hwid\u0001"], "live_activity": {"content-state": {}, "attributes-type": "T", "attributes": {}}}"#,
                "notifications[0].devices[0]"
            ),
        ] {
            let message = try pushwoosh(method, entry)
            XCTAssertTrue(message.hasPrefix("Argument error: \(field)"), "\(method): \(message)")
        }
        for (fields, field) in [
            (#""hwid": "h\u0000", "push_token": "\#(ServeNativeAPITests.token("c1", 9))""#, "hwid"),
            (#""hwid": "h-1", "userId": "u\u001f""#, "userId"),
        ] {
            let answer = try serve.curl(
                "POST", "/json/1.3/registerDevice", key: ServeKeys.acmeDevice, scheme: "Token",
                json: #"{"request": {"application": "\#(ServeHarness.pushwooshApplication)", \#(fields)}}"#)
            let object = try answer.object()
            XCTAssertEqual(object["status_code"] as? Int, 210, answer.text)
            XCTAssertTrue(
                (object["status_message"] as? String ?? "").hasPrefix("Argument error: \(field)"), answer.text)
        }

        let brazeStart = #""activity_attributes_type": "T", "activity_attributes": {}, "content_state": {}"#
        let alert = #""alert": {"title": "t", "body": "b"}"#
        for (path, body, field) in [
            (
                "start",
                #""activity_id": "bz", \#(brazeStart), "notification": {\#(alert), "relevance_score": 1e309}, "external_user_ids": ["u-1"]"#,
                "notification.relevance_score"
            ),
            (
                "update", #""activity_id": "bz", "content_state": {}, "notification": {"relevance_score": -1e999}"#,
                "notification.relevance_score"
            ),
            (
                "start",
                #""activity_id": "bz", \#(brazeStart), "dismissal_date": "2026-02-30T00:00:00Z", "notification": {\#(alert)}, "external_user_ids": ["u-1"]"#,
                "dismissal_date"
            ),
            (
                "update", #""activity_id": "bz", "content_state": {}, "dismissal_date": "2026-02-30T00:00:00Z""#,
                "dismissal_date"
            ),
            (
                "start",
                #""activity_id": "bz", \#(brazeStart), "notification": {\#(alert)}, "external_user_ids": ["u-1", "u\u0000"]"#,
                "external_user_ids[1]"
            ),
            ("update", #""activity_id": "b\u007fz", "content_state": {}"#, "activity_id"),
        ] {
            let answer = try serve.curl(
                "POST", "/messages/live_activity/\(path)", key: ServeKeys.acmeServer,
                json: #"{"app_id": "\#(ServeHarness.brazeAppID)", \#(body)}"#)
            XCTAssertEqual(answer.status, 400, "\(path): \(answer.text)")
            XCTAssertTrue((try answer.object()["error"] as? String ?? "").hasPrefix(field), "\(path): \(answer.text)")
        }
        XCTAssertEqual(mock.stats.requests, 0, "nothing was sent")
    }

    /// A start's `live_activity.attributes` must be an object: anything else is Pushwoosh's argument error (HTTP 200,
    /// `status_code` 210) naming it, and nothing is sent.
    func testPushwooshStartRefusesAttributesThatAreNotAnObject() throws {
        for attributes in [#""hello""#, "[1, 2]"] {
            let answer = try serve.curl(
                "POST", "/json/1.3/startLiveActivity",
                json: """
                    {"request": {"application": "\(ServeHarness.pushwooshApplication)", "auth": "\(ServeKeys.acmeServer)",
                     "notifications": [{"live_activity_id": "pw", "content": "c",
                       "devices": ["\(ServeNativeAPITests.token("b4", 1))"],
                       "live_activity": {"content-state": {}, "attributes-type": "T", "attributes": \(attributes)}}]}}
                    """)
            XCTAssertEqual(answer.status, 200, answer.text)
            let object = try answer.object()
            XCTAssertEqual(object["status_code"] as? Int, 210, "\(attributes): \(answer.text)")
            XCTAssertTrue(
                (object["status_message"] as? String ?? "").hasPrefix(
                    "Argument error: notifications[0].live_activity.attributes must be an object"), answer.text)
        }
        XCTAssertEqual(mock.stats.requests, 0, "nothing was sent")
    }

    /// Pushwoosh takes at most 1,000 `users`, and 1,000 `devices`, per start notification: past that it is an
    /// argument error that says the cap, and nothing is accepted.
    func testPushwooshStartRefusesMoreThan1000UsersOrDevices() throws {
        func start(_ audience: String) throws -> [String: Any] {
            let answer = try serve.curl(
                "POST", "/json/1.3/startLiveActivity",
                json: """
                    {"request": {"application": "\(ServeHarness.pushwooshApplication)", "auth": "\(ServeKeys.acmeServer)",
                     "notifications": [{"live_activity_id": "pw-many", "content": "c", \(audience),
                       "live_activity": {"content-state": {}, "attributes-type": "T", "attributes": {}}}]}}
                    """)
            XCTAssertEqual(answer.status, 200, answer.text)
            return try answer.object()
        }
        func names(_ count: Int, _ prefix: String) -> String {
            "[" + (0..<count).map { #""\#(prefix)-\#($0)""# }.joined(separator: ",") + "]"
        }
        for field in ["users", "devices"] {
            let refused = try start(#""\#(field)": \#(names(1001, field))"#)
            XCTAssertEqual(refused["status_code"] as? Int, 210, "\(field): \(refused)")
            let message = refused["status_message"] as? String ?? ""
            XCTAssertTrue(
                message.hasPrefix("Argument error: notifications[0].\(field) has 1001 entries"), "\(field): \(message)")
            XCTAssertTrue(message.contains("at most 1000"), "says the cap: \(message)")
        }
        let taken = try start(#""users": \#(names(1000, "users"))"#)
        XCTAssertEqual(taken["status_code"] as? Int, 200, "\(taken)")
        XCTAssertEqual(((taken["response"] as? [String: Any])?["Messages"] as? [String])?.count, 1, "\(taken)")
    }

    /// The Pushwoosh SDK's device methods name a refused field as the SDK spells it (`hwid`, `userId`,
    /// `activity_token`, `activity_push_to_start_token`), not as the registry does (`device`, `user`, `token`).
    func testPushwooshRegistrationRefusalsNameTheSDKsFields() throws {
        let long = String(repeating: "h", count: 300)
        let token = ServeNativeAPITests.token("a3", 1)
        for (method, fields, field) in [
            ("registerDevice", #""hwid": "\#(long)", "push_token": "\#(token)""#, "hwid"),
            ("registerDevice", #""hwid": "h-1", "userId": "\#(long)""#, "userId"),
            ("registerDevice", #""hwid": "h-1", "push_token": "not-hex""#, "push_token"),
            ("unregisterDevice", #""hwid": "\#(long)""#, "hwid"),
            ("setActivityToken", #""hwid": "\#(long)", "activity_id": "m", "activity_token": "\#(token)""#, "hwid"),
            (
                "setActivityToken",
                #""hwid": "h-1", "userId": "\#(long)", "activity_id": "m", "activity_token": "\#(token)""#,
                "userId"
            ),
            ("setActivityToken", #""hwid": "h-1", "activity_id": "m", "activity_token": "not-hex""#, "activity_token"),
            ("setActivityToken", #""hwid": "\#(long)", "activity_id": "m", "activity_token": """#, "hwid"),
            (
                "setActivityPushToStartToken", #""hwid": "\#(long)", "activity_push_to_start_token": "\#(token)""#,
                "hwid"
            ),
            (
                "setActivityPushToStartToken", #""hwid": "h-1", "activity_push_to_start_token": "not-hex""#,
                "activity_push_to_start_token"
            ),
        ] {
            let answer = try serve.curl(
                "POST", "/json/1.3/\(method)", key: ServeKeys.acmeDevice, scheme: "Token",
                json: #"{"request": {"application": "\#(ServeHarness.pushwooshApplication)", \#(fields)}}"#)
            XCTAssertEqual(answer.status, 200, "\(method): \(answer.text)")
            let object = try answer.object()
            XCTAssertEqual(object["status_code"] as? Int, 210, "\(method): \(answer.text)")
            let message = object["status_message"] as? String ?? ""
            XCTAssertTrue(message.hasPrefix("Argument error: \(field): "), "\(method): \(answer.text)")
        }
    }

    /// Braze's bodies have no registrations (its SDK registers with Braze), so an id the registry would refuse is
    /// refused by the dispatch's checks, named as Braze spells it.
    func testBrazeRefusalsNameBrazesFields() throws {
        let long = String(repeating: "g", count: 300)
        for (path, body) in [
            (
                "start",
                #""activity_id": "\#(long)", "activity_attributes_type": "T", "activity_attributes": {}, "content_state": {}, "notification": {"alert": {"title": "t", "body": "b"}}, "external_user_ids": ["u-1"]"#
            ),
            ("update", #""activity_id": "\#(long)", "content_state": {}"#),
        ] {
            let answer = try serve.curl(
                "POST", "/messages/live_activity/\(path)", key: ServeKeys.acmeServer,
                json: #"{"app_id": "\#(ServeHarness.brazeAppID)", \#(body)}"#)
            XCTAssertEqual(answer.status, 400, "\(path): \(answer.text)")
            let object = try answer.object()
            let error = object["error"] as? String ?? object["message"] as? String ?? ""
            XCTAssertTrue(error.hasPrefix("activity_id"), "\(path): \(answer.text)")
        }
        XCTAssertEqual(mock.stats.requests, 0, "nothing was sent")
    }

    /// A start writes the activity id only where the SDK of the API that took it reads it (`brazeActivityId`,
    /// `pushwoosh.activityId`): an `activityId` of the customer's own attributes arrives as the customer wrote it.
    func testBrazeAndPushwooshStartsLeaveTheCustomersActivityIdAlone() throws {
        let brazeToken = ServeNativeAPITests.token("b3", 1)
        let pushwooshToken = ServeNativeAPITests.token("b3", 2)
        for (user, token) in [("u-bz", brazeToken), ("u-pw", pushwooshToken)] {
            let registered = try serve.curl(
                "POST", "/v1/push-to-start-tokens", key: ServeKeys.acmeDevice,
                json: #"{"device_id": "\#(user)", "user_id": "\#(user)", "attributes_type": "T", "token": "\#(token)"}"#
            )
            XCTAssertEqual(registered.status, 200, registered.text)
        }
        let braze = try serve.curl(
            "POST", "/messages/live_activity/start", key: ServeKeys.acmeServer,
            json: """
                {"app_id": "\(ServeHarness.brazeAppID)", "activity_id": "bz1", "activity_attributes_type": "T",
                 "activity_attributes": {"h": "A", "activityId": "mine"}, "content_state": {},
                 "notification": {"alert": {"title": "t", "body": "b"}}, "external_user_ids": ["u-bz"]}
                """)
        XCTAssertEqual(braze.status, 201, braze.text)
        _ = try serve.waitForDispatch(try XCTUnwrap(try braze.object()["dispatch_id"] as? String))
        let pushwoosh = try serve.curl(
            "POST", "/json/1.3/startLiveActivity",
            json: """
                {"request": {"application": "\(ServeHarness.pushwooshApplication)", "auth": "\(ServeKeys.acmeServer)",
                 "notifications": [{"live_activity_id": "pw1", "users": ["u-pw"], "content": "c",
                   "live_activity": {"content-state": {}, "attributes-type": "T",
                                     "attributes": {"h": "A", "activityId": "mine"}}}]}}
                """)
        let answer = try pushwoosh.object()
        XCTAssertEqual(answer["status_code"] as? Int, 200, pushwoosh.text)
        let id = try XCTUnwrap(((answer["response"] as? [String: Any])?["Messages"] as? [String])?.first)
        _ = try serve.waitForDispatch(id)

        func attributes(_ token: String) throws -> NSDictionary {
            let aps = try XCTUnwrap(try payloads(token).first?["aps"] as? [String: Any])
            return try XCTUnwrap(aps["attributes"] as? [String: Any]) as NSDictionary
        }
        XCTAssertEqual(
            try attributes(brazeToken), ["h": "A", "activityId": "mine", "brazeActivityId": "bz1"] as NSDictionary)
        XCTAssertEqual(
            try attributes(pushwooshToken),
            ["h": "A", "activityId": "mine", "pushwoosh": ["activityId": "pw1"]] as NSDictionary)
    }

    func testBrazeStartAndUpdateEndpoints() throws {
        // A user with a push-to-start token, registered through the native device API.
        let startToken = ServeNativeAPITests.token("b2", 1)
        let registered = try serve.curl(
            "POST", "/v1/push-to-start-tokens", key: ServeKeys.acmeDevice,
            json:
                #"{"device_id": "dev-1", "user_id": "ext-user-1", "attributes_type": "MatchAttributes", "token": "\#(startToken)"}"#
        )
        XCTAssertEqual(registered.status, 200, registered.text)

        let start = try serve.curl(
            "POST", "/messages/live_activity/start", key: ServeKeys.acmeServer,
            json: """
                {"app_id": "\(ServeHarness.brazeAppID)", "activity_id": "game-1", "activity_attributes_type": "MatchAttributes",
                 "activity_attributes": {"home": "Acme FC"}, "content_state": {"home": 0},
                 "stale_date": "2030-01-01T00:00:00+0000",
                 "notification": {"alert": {"title": "Kick-off", "body": "It starts"}},
                 "external_user_ids": ["ext-user-1"]}
                """)
        XCTAssertEqual(start.status, 201, start.text)
        XCTAssertEqual(try start.object()["message"] as? String, "success")
        XCTAssertNotNil(start.headers["x-ratelimit-remaining"])
        let started = try serve.waitForDispatch(try XCTUnwrap(try start.object()["dispatch_id"] as? String))
        XCTAssertEqual(started["delivered"] as? Int, 1, "\(started)")
        let aps = try XCTUnwrap(try payloads(startToken).first?["aps"] as? [String: Any])
        XCTAssertEqual((aps["attributes"] as? [String: Any])?["brazeActivityId"] as? String, "game-1")
        XCTAssertEqual(aps["stale-date"] as? Int, 1_893_456_000)

        // The app uploads the activity's update token; Braze's update and then end reach it.
        let activityToken = ServeNativeAPITests.token("a2", 1)
        XCTAssertEqual(
            try serve.curl(
                "POST", "/v1/activities/game-1/tokens", key: ServeKeys.acmeDevice,
                json: #"{"token": "\#(activityToken)", "device_id": "dev-1"}"#
            ).status, 200)
        let update = try serve.curl(
            "POST", "/messages/live_activity/update", key: ServeKeys.acmeServer,
            json:
                #"{"app_id": "\#(ServeHarness.brazeAppID)", "activity_id": "game-1", "content_state": {"home": 1}, "notification": {"alert": {"title": "Goal", "body": "1-0"}, "apns_priority": 5}}"#
        )
        XCTAssertEqual(update.status, 201, update.text)
        let updated = try serve.waitForDispatch(try XCTUnwrap(try update.object()["dispatch_id"] as? String))
        XCTAssertEqual(updated["delivered"] as? Int, 1, "\(updated)")
        let end = try serve.curl(
            "POST", "/messages/live_activity/update", key: ServeKeys.acmeServer,
            json:
                #"{"app_id": "\#(ServeHarness.brazeAppID)", "activity_id": "game-1", "content_state": {"home": 2}, "end_activity": true, "dismissal_date": "2020-01-01T00:00:00Z"}"#
        )
        XCTAssertEqual(end.status, 201, end.text)
        _ = try serve.waitForDispatch(try XCTUnwrap(try end.object()["dispatch_id"] as? String))
        let events = try payloads(activityToken).compactMap { ($0["aps"] as? [String: Any])?["event"] as? String }
        XCTAssertEqual(events, ["update", "end"])

        // Braze's error shapes.
        let noAlert = try serve.curl(
            "POST", "/messages/live_activity/start", key: ServeKeys.acmeServer,
            json:
                #"{"app_id": "\#(ServeHarness.brazeAppID)", "activity_id": "g", "activity_attributes_type": "T", "activity_attributes": {}, "content_state": {}, "external_user_ids": ["x"]}"#
        )
        XCTAssertEqual(noAlert.status, 400, noAlert.text)
        XCTAssertTrue((try noAlert.object()["error"] as? String ?? "").contains("notification"), noAlert.text)
        let segment = try serve.curl(
            "POST", "/messages/live_activity/start", key: ServeKeys.acmeServer,
            json:
                #"{"app_id": "\#(ServeHarness.brazeAppID)", "activity_id": "g", "activity_attributes_type": "T", "activity_attributes": {}, "content_state": {}, "notification": {"alert": {"title": "t", "body": "b"}}, "segment_id": "s"}"#
        )
        XCTAssertEqual(segment.status, 400, segment.text)
        let badContent = try serve.curl(
            "POST", "/messages/live_activity/update", key: ServeKeys.acmeServer,
            json: #"{"app_id": "\#(ServeHarness.brazeAppID)", "activity_id": "game-1", "content_state": [1]}"#)
        XCTAssertEqual(badContent.status, 400, badContent.text)
        XCTAssertTrue(
            (try badContent.object()["error"] as? String ?? "").hasPrefix("content_state: must be"), badContent.text)
        let unauthorized = try serve.curl(
            "POST", "/messages/live_activity/update", key: "wrong", json: #"{"app_id": "x"}"#)
        XCTAssertEqual(unauthorized.status, 401)
        XCTAssertEqual(try unauthorized.object()["message"] as? String, "Invalid API key")
        XCTAssertEqual(mock.stats.accepted, 3)
    }
}
