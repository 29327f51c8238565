import FanoutCore
import XCTest

final class NotificationHeadersTests: XCTestCase {
    let token = DeviceToken(String(repeating: "ab", count: 32))!
    let apnsID = "eabeae54-14a8-11e5-b60b-1697f925ec7b"

    func testFullHeaderListOrderValuesAndIndexing() throws {
        let headers = NotificationHeaders(
            pushType: .liveactivity, topic: "com.acme.app.push-type.liveactivity", priority: 5, expiration: 0,
            collapseID: "match-7", apnsID: apnsID, bearerToken: "eyJ.eyJ.sig")
        let fields = try headers.headerFields(deviceToken: token, authority: "api.push.apple.com")
        XCTAssertEqual(
            fields.map(\.name),
            [
                ":method", ":scheme", ":path", ":authority", "authorization", "apns-push-type", "apns-topic",
                "apns-priority", "apns-expiration", "apns-collapse-id", "apns-id",
            ])
        XCTAssertEqual(
            fields.map(\.value),
            [
                "POST", "https", "/3/device/" + token.hex, "api.push.apple.com", "bearer eyJ.eyJ.sig", "liveactivity",
                "com.acme.app.push-type.liveactivity", "5", "0", "match-7", apnsID,
            ])
        XCTAssertEqual(Set(fields.filter(\.neverIndex).map(\.name)), [":path", "authorization", "apns-id"])
    }

    func testMinimalAlertOmitsOptionalHeaders() throws {
        let fields = try NotificationHeaders(pushType: .alert, topic: "com.acme.app")
            .headerFields(deviceToken: token, authority: "localhost:2197")
        XCTAssertEqual(
            fields.map(\.name), [":method", ":scheme", ":path", ":authority", "apns-push-type", "apns-topic"])
        XCTAssertEqual(fields.first { $0.name == ":authority" }?.value, "localhost:2197")
    }

    func testBackgroundWithoutPrioritySendsFive() throws {
        let headers = NotificationHeaders(pushType: .background, topic: "com.acme.app")
        XCTAssertEqual(headers.effectivePriority, 5)
        let fields = try headers.headerFields(deviceToken: token, authority: "h")
        XCTAssertEqual(fields.first { $0.name == "apns-priority" }?.value, "5")
    }

    func testCollapseIDOf64BytesPassesAnd65Fails() throws {
        XCTAssertNoThrow(
            try NotificationHeaders(pushType: .alert, topic: "t", collapseID: String(repeating: "x", count: 64))
                .validate())
        XCTAssertNoThrow(
            try NotificationHeaders(pushType: .alert, topic: "t", collapseID: String(repeating: "é", count: 32))
                .validate())
        assertRejected(
            NotificationHeaders(pushType: .alert, topic: "t", collapseID: String(repeating: "x", count: 65)),
            field: "apns-collapse-id", reason: .badCollapseId)
        assertRejected(
            NotificationHeaders(pushType: .alert, topic: "t", collapseID: String(repeating: "é", count: 33)),
            field: "apns-collapse-id", reason: .badCollapseId)
        assertRejected(
            NotificationHeaders(pushType: .alert, topic: "t", collapseID: "a\nb"),
            field: "apns-collapse-id", reason: .badCollapseId)
    }

    func testPriorityRules() throws {
        for priority in [1, 5, 10] {
            XCTAssertNoThrow(try NotificationHeaders(pushType: .alert, topic: "t", priority: priority).validate())
        }
        for priority in [0, 3, 9, 11, -5] {
            assertRejected(
                NotificationHeaders(pushType: .alert, topic: "t", priority: priority),
                field: "apns-priority", reason: .badPriority)
        }
        XCTAssertNoThrow(try NotificationHeaders(pushType: .background, topic: "t", priority: 5).validate())
        assertRejected(
            NotificationHeaders(pushType: .background, topic: "t", priority: 10),
            field: "apns-priority", reason: .badPriority)
    }

    func testTopicRules() {
        assertRejected(NotificationHeaders(pushType: .alert, topic: ""), field: "apns-topic", reason: .missingTopic)
        assertRejected(
            NotificationHeaders(pushType: .liveactivity, topic: "com.acme.app"), field: "apns-topic", reason: .badTopic)
        assertRejected(
            NotificationHeaders(pushType: .liveactivity, topic: ".push-type.liveactivity"),
            field: "apns-topic", reason: .badTopic)
        assertRejected(
            NotificationHeaders(pushType: .voip, topic: "com.acme.app.push-type.liveactivity"),
            field: "apns-topic", reason: .badTopic)
        assertRejected(
            NotificationHeaders(pushType: .alert, topic: "com.acme.app\r\n"), field: "apns-topic", reason: .badTopic)
        XCTAssertNoThrow(try NotificationHeaders(pushType: .voip, topic: "com.acme.app.voip").validate())
        XCTAssertNoThrow(try NotificationHeaders(pushType: .mdm, topic: "com.apple.mgmt.External.x").validate())
    }

    /// A topic with CR, LF or another control byte is refused as such, without echoing it; it was explained as
    /// "is not a bundle ID followed by "", as push type alert requires", which sends one looking for a suffix.
    func testATopicWithControlCharactersIsRefusedAsSuch() {
        let topics = [
            (PushType.alert, "com.acme.app\r\n"), (.alert, "com.acme\napp"), (.background, "com.acme.app\u{7F}"),
            (.liveactivity, "com.acme.app\r\n.push-type.liveactivity"), (.mdm, "\u{0}"),
        ]
        for (pushType, topic) in topics {
            do {
                try NotificationHeaders(pushType: pushType, topic: topic).validate()
                XCTFail("\(topic.debugDescription) passed")
            } catch {
                XCTAssertEqual(error.reason, .badTopic)
                XCTAssertTrue(error.message.hasPrefix("contains control characters"), error.description)
                XCTAssertFalse(error.description.contains(topic), error.description)
            }
        }
        // A tab is allowed in a header value; the shape rule still applies.
        XCTAssertNoThrow(try NotificationHeaders(pushType: .alert, topic: "com.acme\tapp").validate())
    }

    func testExpirationApnsIDAndBearerRules() {
        assertRejected(
            NotificationHeaders(pushType: .alert, topic: "t", expiration: -1),
            field: "apns-expiration", reason: .badExpirationDate)
        assertRejected(
            NotificationHeaders(pushType: .alert, topic: "t", apnsID: "not-a-uuid"),
            field: "apns-id", reason: .badMessageId)
        assertRejected(
            NotificationHeaders(pushType: .alert, topic: "t", bearerToken: ""),
            field: "authorization", reason: .invalidProviderToken)
    }

    func testErrorMessageNamesTheField() {
        do {
            try NotificationHeaders(pushType: .alert, topic: "t", collapseID: String(repeating: "x", count: 65))
                .validate()
            XCTFail("expected a rejection")
        } catch {
            XCTAssertTrue(error.description.hasPrefix("apns-collapse-id:"), error.description)
            XCTAssertTrue(error.description.contains("65"), error.description)
        }
    }

    func testPathForToken() {
        XCTAssertEqual(NotificationHeaders.path(for: token), "/3/device/" + String(repeating: "ab", count: 32))
    }

    private func assertRejected(
        _ headers: NotificationHeaders, field: String, reason: APNsReason, file: StaticString = #filePath,
        line: UInt = #line
    ) {
        do {
            _ = try headers.headerFields(deviceToken: token, authority: "h")
            XCTFail("expected \(reason) for \(field)", file: file, line: line)
        } catch {
            XCTAssertEqual(error.field, field, file: file, line: line)
            XCTAssertEqual(error.reason, reason, file: file, line: line)
        }
    }
}
