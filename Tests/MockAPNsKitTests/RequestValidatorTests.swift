import FanoutCore
import MockAPNsKit
import XCTest

final class RequestValidatorTests: XCTestCase {
    typealias Headers = [(name: String, value: String)]

    let validator = APNsRequestValidator()
    let token = String(repeating: "0123456789ABCDEF", count: 4)
    let apnsID = "eabeae54-14a8-11e5-b60b-1697f925ec7b"
    let alertBody = #"{"aps":{"alert":{"title":"Hi","body":"There"},"sound":"default"}}"#
    let updateBody =
        #"{"aps":{"timestamp":1685952000,"event":"update","content-state":{"score":"2-1"},"stale-date":1685955600,"#
        + #""relevance-score":50,"alert":{"title":"Goal!","body":"2-1","sound":"default"}}}"#

    // MARK: Helpers

    func alertHeaders(extra: Headers = []) -> Headers {
        [
            (":method", "POST"), (":scheme", "https"), (":path", "/3/device/" + token), (":authority", "localhost"),
            ("authorization", "bearer eyJhbGciOiJFUzI1NiJ9.eyJpc3MiOiJUIn0.c2ln"), ("apns-push-type", "alert"),
            ("apns-topic", "com.acme.app"),
        ] + extra
    }

    func headers(pushType: String, topic: String, extra: Headers = []) -> Headers {
        [("apns-push-type", pushType), ("apns-topic", topic)] + extra
    }

    func liveActivityHeaders(extra: Headers = []) -> Headers {
        headers(pushType: "liveactivity", topic: "com.acme.app.push-type.liveactivity", extra: extra)
    }

    func check(
        method: String = "POST", path: String? = nil, headers: Headers? = nil, body: String? = nil
    ) -> APNsRejection? {
        validator.validate(
            method: method, path: path ?? "/3/device/" + token, headers: headers ?? alertHeaders(),
            body: Array((body ?? alertBody).utf8))
    }

    func assertRejected(
        _ rejection: APNsRejection?, _ status: Int, _ reason: String, file: StaticString = #filePath,
        line: UInt = #line
    ) {
        XCTAssertEqual(rejection?.status, status, file: file, line: line)
        XCTAssertEqual(rejection?.reason.rawValue, reason, file: file, line: line)
    }

    /// A liveactivity body with the given `aps` members.
    func liveActivityBody(_ aps: String) -> String {
        #"{"aps":{"# + aps + "}}"
    }

    // MARK: Valid requests

    func testValidAlertRequestPassesAndIsParsed() throws {
        XCTAssertNil(check())
        let result = validator.check(
            method: "POST", path: "/3/device/" + token,
            headers: alertHeaders(extra: [
                ("apns-id", apnsID), ("apns-expiration", "0"), ("apns-collapse-id", "c"), ("apns-priority", "5"),
                ("user-agent", "fanout"),
            ]),
            body: Array(alertBody.utf8))
        let request = try result.get()
        XCTAssertEqual(request.deviceToken.hex, token.lowercased())
        XCTAssertEqual(request.pushType, .alert)
        XCTAssertEqual(request.topic, "com.acme.app")
        XCTAssertEqual(request.priority, 5)
        XCTAssertEqual(request.expiration, 0)
        XCTAssertEqual(request.collapseID, "c")
        XCTAssertEqual(request.apnsID, apnsID)
        XCTAssertEqual(request.bearerToken, "eyJhbGciOiJFUzI1NiJ9.eyJpc3MiOiJUIn0.c2ln")
    }

    func testValidLiveActivityUpdatePasses() throws {
        XCTAssertNil(check(headers: liveActivityHeaders(extra: [("apns-priority", "10")]), body: updateBody))
        let request = try validator.check(
            method: "POST", path: "/3/device/" + token, headers: liveActivityHeaders(), body: Array(updateBody.utf8)
        ).get()
        XCTAssertEqual(request.pushType, .liveactivity)
        XCTAssertEqual(request.priority, 10)
        XCTAssertNil(request.apnsID)
        XCTAssertNil(request.bearerToken)
    }

    func testValidLiveActivityStartWithAttributesPasses() {
        let body = liveActivityBody(
            #""timestamp":1,"event":"start","content-state":{},"attributes-type":"MatchAttributes","#
                + #""attributes":{"home":"A"},"input-push-token":1,"alert":{"title":{"loc-key":"K"}}"#)
        XCTAssertNil(check(headers: liveActivityHeaders(), body: body))
    }

    func testValidLiveActivityEndPasses() {
        let body = liveActivityBody(#""timestamp":2,"event":"end","dismissal-date":0,"content-state":{"a":1}"#)
        XCTAssertNil(check(headers: liveActivityHeaders(), body: body))
    }

    func testBackgroundWithPriorityFiveOrNoPriorityPasses() {
        let body = #"{"aps":{"content-available":1}}"#
        XCTAssertNil(check(headers: headers(pushType: "background", topic: "com.acme.app"), body: body))
        XCTAssertNil(
            check(
                headers: headers(pushType: "background", topic: "com.acme.app", extra: [("apns-priority", "5")]),
                body: body))
    }

    func testPushKitTypesNeedOnlyAJSONObject() {
        XCTAssertNil(check(headers: headers(pushType: "voip", topic: "com.acme.app.voip"), body: #"{"call":"x"}"#))
        XCTAssertNil(check(headers: headers(pushType: "mdm", topic: "com.apple.mgmt.X"), body: #"{"mdm":"magic"}"#))
    }

    func testWidgetsPayloadPasses() {
        let widgets = headers(pushType: "widgets", topic: "com.acme.app.push-type.widgets")
        XCTAssertNil(check(headers: widgets, body: #"{"aps":{"content-changed":true}}"#))
    }

    func testUnknownHeadersAndTheirDuplicatesAreIgnored() {
        XCTAssertNil(check(headers: alertHeaders(extra: [("x-trace", "1"), ("x-trace", "2")])))
    }

    func testUppercaseApnsIDIsAccepted() {
        XCTAssertNil(check(headers: alertHeaders(extra: [("apns-id", apnsID.uppercased())])))
    }

    // MARK: Rejection table, one row at a time

    func testMethodMustBePost() {
        assertRejected(check(method: "GET"), 405, "MethodNotAllowed")
        assertRejected(check(method: "PUT"), 405, "MethodNotAllowed")
    }

    func testPathMustBeDevicePath() {
        assertRejected(check(path: "/3/devices/" + token), 404, "BadPath")
        assertRejected(check(path: "/4/broadcasts/apps/com.acme.app"), 404, "BadPath")
        assertRejected(check(path: "/"), 404, "BadPath")
    }

    func testEmptyTokenIsMissingDeviceToken() {
        assertRejected(check(path: "/3/device/"), 400, "MissingDeviceToken")
        assertRejected(check(path: "/3/device"), 400, "MissingDeviceToken")
    }

    func testMalformedTokenIsBadDeviceToken() {
        assertRejected(check(path: "/3/device/" + String(token.dropLast()) + "g"), 400, "BadDeviceToken")
        assertRejected(check(path: "/3/device/" + String(token.dropLast())), 400, "BadDeviceToken")
        assertRejected(check(path: "/3/device/" + String(token.dropLast(2))), 400, "BadDeviceToken")
        assertRejected(check(path: "/3/device/" + token + "/x"), 400, "BadDeviceToken")
        XCTAssertNil(check(path: "/3/device/" + token + token))
    }

    func testDuplicateHeaders() {
        assertRejected(check(headers: alertHeaders(extra: [("apns-topic", "com.acme.app")])), 400, "DuplicateHeaders")
        assertRejected(
            check(headers: alertHeaders(extra: [("apns-id", apnsID), ("apns-id", apnsID)])), 400,
            "DuplicateHeaders")
        assertRejected(check(headers: alertHeaders(extra: [("authorization", "bearer x")])), 400, "DuplicateHeaders")
    }

    func testUnknownPushType() {
        assertRejected(check(headers: headers(pushType: "banner", topic: "com.acme.app")), 400, "InvalidPushType")
        assertRejected(check(headers: headers(pushType: "", topic: "com.acme.app")), 400, "InvalidPushType")
    }

    func testMissingTopic() {
        assertRejected(check(headers: [("apns-push-type", "alert")]), 400, "MissingTopic")
        assertRejected(check(headers: headers(pushType: "alert", topic: "")), 400, "MissingTopic")
    }

    func testTopicWithoutThePushTypesSuffixIsBadTopic() {
        assertRejected(
            check(headers: headers(pushType: "liveactivity", topic: "com.acme.app"), body: updateBody), 400, "BadTopic")
        assertRejected(check(headers: headers(pushType: "voip", topic: "com.acme.app")), 400, "BadTopic")
        assertRejected(
            check(headers: headers(pushType: "widgets", topic: "com.acme.app.push-type.liveactivity")), 400, "BadTopic")
    }

    func testPriorityMustBeOneFiveOrTen() {
        for value in ["7", "0", "", "05", "10 ", "high"] {
            assertRejected(check(headers: alertHeaders(extra: [("apns-priority", value)])), 400, "BadPriority")
        }
        for value in ["1", "5", "10"] {
            XCTAssertNil(check(headers: alertHeaders(extra: [("apns-priority", value)])), value)
        }
    }

    func testBackgroundWithPriorityTenIsBadPriority() {
        let background = headers(pushType: "background", topic: "com.acme.app", extra: [("apns-priority", "10")])
        assertRejected(check(headers: background, body: #"{"aps":{"content-available":1}}"#), 400, "BadPriority")
    }

    func testExpirationMustBeANonNegativeInteger() {
        for value in ["-1", "abc", "", "1.5", "99999999999999999999"] {
            assertRejected(
                check(headers: alertHeaders(extra: [("apns-expiration", value)])), 400, "BadExpirationDate")
        }
        XCTAssertNil(check(headers: alertHeaders(extra: [("apns-expiration", "0")])))
        XCTAssertNil(check(headers: alertHeaders(extra: [("apns-expiration", "1764460800")])))
    }

    func testCollapseIDOver64BytesIsBadCollapseId() {
        let long = String(repeating: "c", count: 65)
        assertRejected(check(headers: alertHeaders(extra: [("apns-collapse-id", long)])), 400, "BadCollapseId")
        XCTAssertNil(check(headers: alertHeaders(extra: [("apns-collapse-id", String(long.dropLast()))])))
    }

    func testMalformedApnsIDIsBadMessageId() {
        for value in ["not-a-uuid", "", String(apnsID.dropLast()), apnsID.replacingOccurrences(of: "-", with: "_")] {
            assertRejected(check(headers: alertHeaders(extra: [("apns-id", value)])), 400, "BadMessageId")
        }
    }

    func testEmptyBodyIsPayloadEmpty() {
        assertRejected(check(body: ""), 400, "PayloadEmpty")
    }

    func testBodyOverTheLimitIsPayloadTooLarge() {
        assertRejected(check(body: padded(alertBody, to: 4097)), 413, "PayloadTooLarge")
        XCTAssertNil(check(body: padded(alertBody, to: 4096)))
        let voip = headers(pushType: "voip", topic: "com.acme.app.voip")
        XCTAssertNil(check(headers: voip, body: padded(#"{"call":"x"}"#, to: 5120)))
        assertRejected(check(headers: voip, body: padded(#"{"call":"x"}"#, to: 5121)), 413, "PayloadTooLarge")
        let liveActivity = liveActivityHeaders()
        assertRejected(check(headers: liveActivity, body: padded(updateBody, to: 4097)), 413, "PayloadTooLarge")
    }

    func testBodyThatIsNotAJSONObjectWithApsIsBadPayload() {
        for body in [
            "not json", "[1,2]", #"{"aps":{}"#, #"{"aps":{}} x"#, #"{"foo":1}"#, #"{"aps":1}"#, #"{"aps":[]}"#,
        ] {
            assertRejected(check(body: body), 400, "BadPayload")
        }
        assertRejected(
            check(headers: headers(pushType: "voip", topic: "com.acme.app.voip"), body: "[]"), 400,
            "BadPayload")
    }

    func testLiveActivityEventMustBeStartUpdateOrEnd() {
        for aps in [#""timestamp":1"#, #""timestamp":1,"event":"pause""#, #""timestamp":1,"event":1"#] {
            assertRejected(check(headers: liveActivityHeaders(), body: liveActivityBody(aps)), 400, "BadPayload")
        }
    }

    func testLiveActivityTimestampMustBeAnInteger() {
        for aps in [
            #""event":"update""#, #""event":"update","timestamp":"1685952000""#,
            #""event":"update","timestamp":1685952000.5"#, #""event":"update","timestamp":-1"#,
            #""event":"update","timestamp":null"#,
        ] {
            assertRejected(check(headers: liveActivityHeaders(), body: liveActivityBody(aps)), 400, "BadPayload")
        }
    }

    func testLiveActivityAttributesOnlyOnStart() {
        for aps in [
            #""timestamp":1,"event":"update","attributes-type":"T""#,
            #""timestamp":1,"event":"end","attributes":{}"#,
        ] {
            assertRejected(check(headers: liveActivityHeaders(), body: liveActivityBody(aps)), 400, "BadPayload")
        }
    }

    func testLiveActivityInputPushTokenAndChannelAreExclusive() {
        let aps =
            #""timestamp":1,"event":"start","attributes-type":"T","attributes":{},"#
            + #""input-push-token":1,"input-push-channel":"dHJ1ZQ==""#
        assertRejected(check(headers: liveActivityHeaders(), body: liveActivityBody(aps)), 400, "BadPayload")
    }

    func testFirstFailureWinsInDocumentedOrder() {
        // Wrong method and wrong path: the method is checked first.
        assertRejected(check(method: "GET", path: "/nope"), 405, "MethodNotAllowed")
        // Bad token and missing topic: the path is checked before headers.
        assertRejected(check(path: "/3/device/zz", headers: []), 400, "BadDeviceToken")
        // Bad priority and empty body: headers before the body.
        assertRejected(check(headers: alertHeaders(extra: [("apns-priority", "3")]), body: ""), 400, "BadPriority")
    }

    func testRejectionStatusesMatchTheReasonTable() {
        for reason: APNsReason in [
            .methodNotAllowed, .badPath, .missingDeviceToken, .badDeviceToken, .payloadTooLarge, .badPayload,
        ] {
            XCTAssertEqual(APNsRejection(reason).status, APNsReason.statusFor(reason))
        }
        XCTAssertEqual(APNsRejection(APNsReason("Unheard")).status, 400)
    }

    // MARK: Bearer token helper

    func testBearerTokenExtraction() {
        XCTAssertEqual(APNsRequestValidator.bearerToken(in: [("authorization", "bearer abc.def.ghi")]), "abc.def.ghi")
        XCTAssertEqual(APNsRequestValidator.bearerToken(in: [("authorization", "Bearer abc")]), "abc")
        XCTAssertEqual(APNsRequestValidator.bearerToken(in: [("authorization", "BEARER   abc")]), "abc")
        XCTAssertNil(APNsRequestValidator.bearerToken(in: [("authorization", "basic abc")]))
        XCTAssertNil(APNsRequestValidator.bearerToken(in: [("authorization", "bearer ")]))
        XCTAssertNil(APNsRequestValidator.bearerToken(in: [("authorization", "bearerabc")]))
        XCTAssertNil(APNsRequestValidator.bearerToken(in: [("apns-topic", "x")]))
        XCTAssertNil(APNsRequestValidator.bearerToken(in: []))
    }

    func testDeviceTokenInPath() {
        XCTAssertEqual(try APNsRequestValidator.deviceToken(inPath: "/3/device/" + token).get().hex, token.lowercased())
        XCTAssertEqual(
            APNsRequestValidator.deviceToken(inPath: "/3/device/"), .failure(APNsRejection(.missingDeviceToken)))
    }

    /// Pads a JSON object body with a trailing `"pad"` member so that it is exactly `size` bytes.
    func padded(_ body: String, to size: Int) -> String {
        let open = String(body.dropLast())
        let overhead = #","pad":"""#.utf8.count + 1
        let fill = size - open.utf8.count - overhead
        precondition(fill >= 0)
        let result = open + #","pad":""# + String(repeating: "x", count: fill) + #""}"#
        precondition(result.utf8.count == size)
        return result
    }
}
