import FanoutCore
import MockAPNsKit
import XCTest

/// The pure rules of broadcast sends (`BroadcastRequestValidator`): one test per row of its table.
final class BroadcastValidatorTests: XCTestCase {
    typealias Headers = [(name: String, value: String)]

    let validator = BroadcastRequestValidator()
    let app = "com.acme.app"
    let stored = "c3RvcmVkLWNoYW5uZWwtaWQ="  // policy 1
    let unstored = "dW5zdG9yZWQtY2hhbm5lbA=="  // policy 0
    let requestID = "0b3a6f5e-9f2a-4c61-8a55-1f0d7c1c2e3f"
    let updateBody = #"{"aps":{"timestamp":1685952000,"event":"update","content-state":{"score":"2-1"}}}"#

    func headers(channel: String? = nil, replacing: [String: String?] = [:], extra: Headers = []) -> Headers {
        var base: [(name: String, value: String?)] = [
            ("apns-channel-id", channel ?? stored), ("apns-push-type", "liveactivity"), ("apns-priority", "10"),
            ("apns-expiration", "0"),
        ]
        for index in base.indices {
            if let replacement = replacing[base[index].name] { base[index].value = replacement }
        }
        return base.compactMap { header in header.value.map { (header.name, $0) } } + extra
    }

    func check(
        method: String = "POST", path: String? = nil, headers: Headers? = nil, body: String? = nil
    ) -> Result<ValidatedBroadcast, APNsRejection> {
        validator.check(
            method: method, path: path ?? "/4/broadcasts/apps/\(app)", headers: headers ?? self.headers(),
            body: Array((body ?? updateBody).utf8),
            channelPolicy: { [stored, unstored] bundleID, channel in
                guard bundleID == "com.acme.app" else { return nil }
                if channel == stored { return .mostRecentMessageStored }
                if channel == unstored { return .noMessageStored }
                return nil
            })
    }

    func assertRejected(
        _ result: Result<ValidatedBroadcast, APNsRejection>, _ status: Int, _ reason: String,
        file: StaticString = #filePath, line: UInt = #line
    ) {
        switch result {
        case .success: XCTFail("accepted; expected \(status) \(reason)", file: file, line: line)
        case .failure(let rejection):
            XCTAssertEqual(rejection.status, status, file: file, line: line)
            XCTAssertEqual(rejection.reason.rawValue, reason, file: file, line: line)
        }
    }

    func testValidBroadcastPassesWithItsHeadersParsed() throws {
        let broadcast = try check(headers: headers(extra: [("apns-request-id", requestID)])).get()
        XCTAssertEqual(
            broadcast,
            ValidatedBroadcast(
                bundleID: app, channelID: stored, policy: .mostRecentMessageStored, priority: 10, expiration: 0,
                requestID: requestID))
        XCTAssertEqual(
            try check(headers: headers(replacing: ["apns-expiration": "1900000000"])).get().expiration,
            1_900_000_000)
        XCTAssertNoThrow(try check(headers: headers(channel: unstored)).get())
        for pushType in ["LiveActivity", "Liveactivity", "LIVEACTIVITY"] {
            XCTAssertNoThrow(try check(headers: headers(replacing: ["apns-push-type": pushType])).get(), pushType)
        }
        for priority in ["1", "5"] {
            XCTAssertEqual(
                try check(headers: headers(replacing: ["apns-priority": priority])).get().priority,
                Int(priority))
        }
        let end = #"{"aps":{"timestamp":1,"event":"end","dismissal-date":2,"content-state":{}}}"#
        XCTAssertNoThrow(try check(body: end).get())
    }

    func testRoutingPrefix() {
        XCTAssertTrue(BroadcastRequestValidator.isBroadcastPath("/4/broadcasts/apps/com.acme.app"))
        XCTAssertTrue(BroadcastRequestValidator.isBroadcastPath("/4/"))
        XCTAssertFalse(BroadcastRequestValidator.isBroadcastPath("/3/device/abc"))
        XCTAssertFalse(BroadcastRequestValidator.isBroadcastPath("/4"))
        XCTAssertFalse(BroadcastRequestValidator.isBroadcastPath(""))
    }

    func testMethodAndPath() {
        assertRejected(check(method: "GET"), 405, "MethodNotAllowed")
        assertRejected(check(path: "/4/broadcasts/apps/"), 404, "BadPath")
        assertRejected(check(path: "/4/broadcasts/apps/com.acme.app/x"), 404, "BadPath")
        assertRejected(check(path: "/4/broadcast/apps/com.acme.app"), 404, "BadPath")
        assertRejected(check(path: "4/broadcasts/apps/com.acme.app"), 404, "BadPath")
        assertRejected(check(path: "/4/broadcasts/apps/com.acme.app.push-type.liveactivity"), 400, "TopicDisallowed")
    }

    func testTopicHeaderIsDisallowed() {
        assertRejected(check(headers: headers(extra: [("apns-topic", app)])), 400, "TopicDisallowed")
    }

    func testDuplicateHeader() {
        assertRejected(check(headers: headers(extra: [("apns-priority", "5")])), 400, "DuplicateHeaders")
    }

    func testRequestAndMessageIDs() {
        assertRejected(
            check(headers: headers(extra: [("apns-request-id", requestID.uppercased())])), 400, "BadMessageId")
        assertRejected(check(headers: headers(extra: [("apns-request-id", "nope")])), 400, "BadMessageId")
        assertRejected(check(headers: headers(extra: [("apns-id", "nope")])), 400, "BadMessageId")
        XCTAssertTrue(BroadcastRules.isValidRequestID(requestID))
        XCTAssertFalse(BroadcastRules.isValidRequestID(requestID.uppercased()))
        XCTAssertEqual(BroadcastRules.echoedRequestID(in: [("apns-request-id", requestID)]), requestID)
        XCTAssertNil(BroadcastRules.echoedRequestID(in: [("apns-request-id", "x")]))
    }

    func testChannelID() {
        assertRejected(check(headers: headers(replacing: ["apns-channel-id": nil])), 400, "MissingChannelId")
        assertRejected(check(headers: headers(channel: "")), 400, "MissingChannelId")
        for bad in [
            "abc", "a b=", "ab==cd==", "a===", "@@@@", "dW5zdG9yZWQtY2hhbm5lbA-_", String(repeating: "A", count: 132),
        ] {
            assertRejected(check(headers: headers(channel: bad)), 400, "BadChannelId")
        }
        assertRejected(check(headers: headers(channel: "AAAAAAAAAAAAAAAAAAAAAA==")), 400, "ChannelNotRegistered")
        assertRejected(check(path: "/4/broadcasts/apps/com.other.app"), 400, "ChannelNotRegistered")
    }

    func testChannelIDForm() {
        XCTAssertTrue(ChannelID.isWellFormed("NaLKXfOo8gsfrgdW7XvftA=="))
        XCTAssertTrue(ChannelID.isWellFormed("ab+/"))
        XCTAssertTrue(ChannelID.isWellFormed("abc="))
        XCTAssertTrue(ChannelID.isWellFormed(String(repeating: "A", count: ChannelID.maximumLength)))
        XCTAssertFalse(ChannelID.isWellFormed(String(repeating: "A", count: ChannelID.maximumLength + 4)))
        XCTAssertFalse(ChannelID.isWellFormed("===="))
        XCTAssertFalse(ChannelID.isWellFormed(""))
    }

    func testPushType() {
        assertRejected(check(headers: headers(replacing: ["apns-push-type": nil])), 400, "MissingPushType")
        assertRejected(check(headers: headers(replacing: ["apns-push-type": ""])), 400, "MissingPushType")
        assertRejected(check(headers: headers(replacing: ["apns-push-type": "alert"])), 400, "InvalidPushType")
        assertRejected(check(headers: headers(replacing: ["apns-push-type": "live-activity"])), 400, "InvalidPushType")
    }

    func testPriority() {
        for bad in [nil, "", "0", "2", "11", "10 ", "high"] as [String?] {
            assertRejected(check(headers: headers(replacing: ["apns-priority": bad])), 400, "BadPriority")
        }
    }

    func testExpiration() {
        for bad in [nil, "", "-1", "soon", "1.5", "99999999999999999999"] as [String?] {
            assertRejected(check(headers: headers(replacing: ["apns-expiration": bad])), 400, "BadExpirationDate")
        }
        assertRejected(
            check(headers: headers(channel: unstored, replacing: ["apns-expiration": "1900000000"])), 400,
            "BadExpirationDate")
    }

    func testPayload() {
        assertRejected(check(body: ""), 400, "PayloadEmpty")
        let big = #"{"aps":{"timestamp":1,"event":"update","content-state":{"x":""#
        let padded = big + String(repeating: "x", count: 5121 - big.utf8.count - 4) + #""}}}"#
        XCTAssertEqual(padded.utf8.count, 5121)
        assertRejected(check(body: padded), 413, "PayloadTooLarge")
        let exact = big + String(repeating: "x", count: 5120 - big.utf8.count - 4) + #""}}}"#
        XCTAssertNoThrow(try check(body: exact).get())
        for bad in [
            "{", "[]", #"{"aps":1}"#, #"{"x":{}}"#,
            #"{"aps":{"timestamp":1,"event":"start","content-state":{}}}"#,
            #"{"aps":{"timestamp":1,"event":"stop"}}"#, #"{"aps":{"timestamp":1,"event":5}}"#,
            #"{"aps":{"timestamp":1}}"#, #"{"aps":{"event":"update"}}"#, #"{"aps":{"event":"update","timestamp":1.5}}"#,
            #"{"aps":{"event":"update","timestamp":1,"attributes-type":"A","attributes":{}}}"#,
        ] {
            assertRejected(check(body: bad), 400, "BadRequestPayload")
        }
    }

    /// The first failing rule wins, in the table's order.
    func testOrder() {
        let everythingWrong = headers(channel: "", replacing: ["apns-push-type": nil, "apns-priority": "3"])
        assertRejected(check(headers: everythingWrong + [("apns-topic", app)], body: ""), 400, "TopicDisallowed")
        assertRejected(check(headers: everythingWrong, body: ""), 400, "MissingChannelId")
        assertRejected(
            check(headers: headers(channel: "AAAAAAAAAAAAAAAAAAAAAA=="), body: ""), 400, "ChannelNotRegistered")
    }
}

/// The pure rules of channel management (`ChannelRequestValidator`).
final class ChannelValidatorTests: XCTestCase {
    let validator = ChannelRequestValidator()
    let path = "/1/apps/com.acme.app/channels"
    let listPath = "/1/apps/com.acme.app/all-channels"
    let channel = "NaLKXfOo8gsfrgdW7XvftA=="
    let createBody = #"{"message-storage-policy": 1, "push-type": "LiveActivity"}"#

    func check(
        _ method: String, _ path: String, headers: [(name: String, value: String)] = [], body: String = ""
    ) -> Result<ChannelRequest, APNsRejection> {
        validator.check(method: method, path: path, headers: headers, body: Array(body.utf8))
    }

    func assertRejected(
        _ result: Result<ChannelRequest, APNsRejection>, _ status: Int, _ reason: String,
        file: StaticString = #filePath, line: UInt = #line
    ) {
        switch result {
        case .success(let request): XCTFail("accepted \(request); expected \(reason)", file: file, line: line)
        case .failure(let rejection):
            XCTAssertEqual(rejection.status, status, file: file, line: line)
            XCTAssertEqual(rejection.reason.rawValue, reason, file: file, line: line)
        }
    }

    func testOperations() throws {
        let id = "0b3a6f5e-9f2a-4c61-8a55-1f0d7c1c2e3f"
        XCTAssertEqual(
            try check("POST", path, headers: [("apns-request-id", id)], body: createBody).get(),
            ChannelRequest(bundleID: "com.acme.app", operation: .create(.mostRecentMessageStored), requestID: id))
        XCTAssertEqual(
            try check("POST", path, body: #"{"push-type":"liveactivity","message-storage-policy":0}"#).get().operation,
            .create(.noMessageStored))
        XCTAssertEqual(
            try check("GET", path, headers: [("apns-channel-id", channel)]).get().operation, .read(channelID: channel))
        XCTAssertEqual(
            try check("DELETE", path, headers: [("apns-channel-id", channel)]).get().operation,
            .delete(channelID: channel))
        XCTAssertEqual(try check("GET", listPath).get().operation, .list)
    }

    func testPathsAndMethods() {
        for bad in [
            "/1/apps/com.acme.app", "/1/apps//channels", "/1/apps/com.acme.app/channel", "/2/apps/a/channels",
            "/1/apps/a/b/channels", "/1/apps/com.acme.app/channels/x",
        ] {
            assertRejected(check("GET", bad, headers: [("apns-channel-id", channel)]), 404, "BadPath")
        }
        assertRejected(
            check("POST", "/1/apps/com.acme.app.push-type.liveactivity/channels", body: createBody), 400,
            "TopicDisallowed")
        assertRejected(check("PUT", path, body: createBody), 405, "MethodNotAllowed")
        assertRejected(check("POST", listPath, body: createBody), 405, "MethodNotAllowed")
        assertRejected(check("DELETE", listPath), 405, "MethodNotAllowed")
    }

    func testChannelHeader() {
        assertRejected(check("GET", path), 400, "MissingChannelId")
        assertRejected(check("DELETE", path, headers: [("apns-channel-id", "")]), 400, "MissingChannelId")
        assertRejected(check("GET", path, headers: [("apns-channel-id", "not base64!")]), 400, "BadChannelId")
        assertRejected(check("DELETE", path, headers: [("apns-channel-id", "abc")]), 400, "BadChannelId")
        assertRejected(
            check("GET", path, headers: [("apns-channel-id", channel), ("apns-channel-id", channel)]), 400,
            "DuplicateHeaders")
        assertRejected(check("GET", listPath, headers: [("apns-request-id", "NOT-A-UUID")]), 400, "BadMessageId")
    }

    func testCreateBody() {
        for bad in [
            "", "{", "[]", "1", #"{"push-type":"LiveActivity","push-type":"LiveActivity","message-storage-policy":1}"#,
        ] {
            assertRejected(check("POST", path, body: bad), 400, "BadRequestPayload")
        }
        assertRejected(
            check("POST", path, body: #"{"message-storage-policy":1,"push-type":"LiveActivity","ttl":5}"#), 400,
            "BadRequestParams")
        assertRejected(check("POST", path, body: #"{"message-storage-policy":1}"#), 400, "MissingPushType")
        assertRejected(
            check("POST", path, body: #"{"message-storage-policy":1,"push-type":"alert"}"#), 400,
            "InvalidPushType")
        assertRejected(
            check("POST", path, body: #"{"message-storage-policy":1,"push-type":7}"#), 400, "InvalidPushType")
        for policy in ["2", "-1", "1.0", #""1""#, "null", "true"] {
            assertRejected(
                check("POST", path, body: #"{"message-storage-policy":\#(policy),"push-type":"LiveActivity"}"#), 400,
                "BadRequestParams")
        }
        assertRejected(check("POST", path, body: #"{"push-type":"LiveActivity"}"#), 400, "BadRequestParams")
    }
}

/// `MockChannels`: ids, limits, deletion, per-app lists.
final class MockChannelsTests: XCTestCase {
    func testCreateReadListDeleteAndLimit() throws {
        let stats = MockStats()
        let channels = MockChannels(environment: .production, maxPerApp: 3, stats: stats)
        let a = try XCTUnwrap(channels.create(app: "com.a", policy: .noMessageStored))
        XCTAssertTrue(ChannelID.isWellFormed(a))
        XCTAssertEqual(a.utf8.count, 24)
        let b = try XCTUnwrap(channels.create(app: "com.a"))
        let c = try XCTUnwrap(channels.create(app: "com.a"))
        XCTAssertNil(channels.create(app: "com.a"), "the 4th channel of an app over maxPerApp 3")
        XCTAssertNotNil(channels.create(app: "com.b"), "the limit is per app")
        XCTAssertEqual(channels.list(app: "com.a"), [a, b, c].sorted())
        XCTAssertEqual(channels.policy(app: "com.a", channel: a), .noMessageStored)
        XCTAssertEqual(channels.policy(app: "com.a", channel: b), .mostRecentMessageStored)
        XCTAssertFalse(channels.exists(app: "com.b", channel: a), "channels belong to their app")
        XCTAssertEqual(channels.count, 4)
        XCTAssertEqual(stats.channelCount, 4)
        XCTAssertTrue(channels.delete(app: "com.a", channel: a))
        XCTAssertFalse(channels.delete(app: "com.a", channel: a))
        XCTAssertFalse(channels.exists(app: "com.a", channel: a))
        XCTAssertEqual(stats.channelCount, 3)
        XCTAssertNotNil(channels.create(app: "com.a"), "deleting frees a slot")
        XCTAssertEqual(stats.snapshot()["channels"] as? Int, 4)
    }
}
