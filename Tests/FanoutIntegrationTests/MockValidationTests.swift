import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation
import XCTest

/// mock-apns's request validation, end to end over HTTP/2 and TLS: one test per row of the rejection
/// table in RequestValidator.swift (docs/reference/apns.md, "Request headers", "Status codes and reasons" and
/// "Live Activity payloads"), each with a valid provider token, checking the status and the JSON `reason`.
final class MockValidationTests: XCTestCase {
    private var mock: MockHarness!
    private var client: RawClient!
    private var bearer = ""

    static let alertBody = Array(#"{"aps":{"alert":"hi"}}"#.utf8)
    static let topic = "com.example.app"
    static let liveActivityTopic = "com.example.app.push-type.liveactivity"

    override func setUpWithError() throws {
        mock = try MockHarness()
        client = try mock.makeClient()
        bearer = "bearer \(try mock.providerToken())"
    }

    override func tearDown() {
        client?.close()
        mock?.stop()
        client = nil
        mock = nil
    }

    // MARK: Helpers

    /// Sends a request with the provider token plus `headers`, and returns the parsed APNs response.
    private func send(
        method: String = "POST", path: String? = nil, headers: [(String, String)], body: [UInt8] = alertBody,
        file: StaticString = #filePath, line: UInt = #line
    ) -> APNsResponse? {
        let outcome = client.send(
            method: method, path: path ?? "/3/device/\(testDeviceToken())",
            headers: [("authorization", bearer)] + headers, body: body)
        return apnsResponse(outcome, file: file, line: line)
    }

    /// Headers of a valid alert push, with `extra` appended.
    private func alert(_ extra: [(String, String)] = []) -> [(String, String)] {
        [("apns-topic", Self.topic), ("apns-push-type", "alert")] + extra
    }

    private func liveActivity(_ extra: [(String, String)] = []) -> [(String, String)] {
        [("apns-topic", Self.liveActivityTopic), ("apns-push-type", "liveactivity")] + extra
    }

    private func assertRejected(
        _ response: APNsResponse?, _ status: Int, _ reason: String, file: StaticString = #filePath, line: UInt = #line
    ) {
        guard let response else { return }
        XCTAssertEqual(response.status, status, "status", file: file, line: line)
        XCTAssertEqual(response.reason?.rawValue, reason, "reason", file: file, line: line)
        XCTAssertNil(response.timestamp, "only 410 carries a timestamp", file: file, line: line)
        XCTAssertTrue(
            response.apnsID.map { APNsID.isValid($0) } ?? false, "error responses carry an apns-id too",
            file: file, line: line)
    }

    private func assertAccepted(_ response: APNsResponse?, file: StaticString = #filePath, line: UInt = #line) {
        guard let response else { return }
        XCTAssertEqual(
            response.status, 200, "status (reason: \(response.reason?.rawValue ?? "none"))", file: file, line: line)
        XCTAssertNil(response.reason, file: file, line: line)
    }

    // MARK: Method and path

    func testGetIsMethodNotAllowed() {
        assertRejected(send(method: "GET", headers: alert()), 405, "MethodNotAllowed")
    }

    func testUnknownPathIsBadPath() {
        assertRejected(send(path: "/3/devices/\(testDeviceToken())", headers: alert()), 404, "BadPath")
        assertRejected(send(path: "/2/device/\(testDeviceToken())", headers: alert()), 404, "BadPath")
        assertRejected(send(path: "/", headers: alert()), 404, "BadPath")
    }

    func testEmptyDeviceTokenIsMissingDeviceToken() {
        assertRejected(send(path: "/3/device/", headers: alert()), 400, "MissingDeviceToken")
        assertRejected(send(path: "/3/device", headers: alert()), 400, "MissingDeviceToken")
    }

    func testNonHexDeviceTokenIsBadDeviceToken() {
        let token = String(repeating: "g", count: 64)
        assertRejected(send(path: "/3/device/\(token)", headers: alert()), 400, "BadDeviceToken")
    }

    func testDeviceTokenOfWrongLengthIsBadDeviceToken() {
        for count in [62, 63, 65, 202] {
            let token = String(repeating: "a", count: count)
            assertRejected(send(path: "/3/device/\(token)", headers: alert()), 400, "BadDeviceToken")
        }
        // Longer tokens of even length up to 200 digits are accepted (Apple never promised 64).
        assertAccepted(send(path: "/3/device/\(String(repeating: "ab", count: 50))", headers: alert()))
    }

    // MARK: Headers

    func testDuplicateHeadersAreRejected() {
        assertRejected(send(headers: alert([("apns-topic", Self.topic)])), 400, "DuplicateHeaders")
        assertRejected(
            send(headers: alert([("apns-priority", "10"), ("apns-priority", "5")])), 400, "DuplicateHeaders")
    }

    func testUnknownPushTypeIsInvalidPushType() {
        assertRejected(
            send(headers: [("apns-topic", Self.topic), ("apns-push-type", "carrier-pigeon")]), 400, "InvalidPushType")
    }

    func testMissingTopicIsMissingTopic() {
        assertRejected(send(headers: [("apns-push-type", "alert")]), 400, "MissingTopic")
        assertRejected(send(headers: [("apns-push-type", "alert"), ("apns-topic", "")]), 400, "MissingTopic")
    }

    func testLiveActivityTopicWithoutSuffixIsBadTopic() {
        let body = Array(#"{"aps":{"event":"update","timestamp":1764460800,"content-state":{}}}"#.utf8)
        assertRejected(
            send(headers: [("apns-topic", Self.topic), ("apns-push-type", "liveactivity")], body: body), 400, "BadTopic"
        )
    }

    func testBadPriorityIsRejected() {
        for priority in ["7", "0", "high", "-5"] {
            assertRejected(send(headers: alert([("apns-priority", priority)])), 400, "BadPriority")
        }
        for priority in ["1", "5", "10"] {
            assertAccepted(send(headers: alert([("apns-priority", priority)])))
        }
    }

    func testBackgroundPushWithPriority10IsBadPriority() {
        let body = Array(#"{"aps":{"content-available":1}}"#.utf8)
        let background = [("apns-topic", Self.topic), ("apns-push-type", "background")]
        assertRejected(send(headers: background + [("apns-priority", "10")], body: body), 400, "BadPriority")
        assertAccepted(send(headers: background + [("apns-priority", "5")], body: body))
        assertAccepted(send(headers: background, body: body))
    }

    func testBadExpirationIsBadExpirationDate() {
        for expiration in ["soon", "-1", "1.5", ""] {
            assertRejected(send(headers: alert([("apns-expiration", expiration)])), 400, "BadExpirationDate")
        }
        assertAccepted(send(headers: alert([("apns-expiration", "0")])))
        assertAccepted(send(headers: alert([("apns-expiration", String(Int(Date().timeIntervalSince1970) + 3600))])))
    }

    func testCollapseIDOver64BytesIsBadCollapseId() {
        assertRejected(
            send(headers: alert([("apns-collapse-id", String(repeating: "c", count: 65))])), 400, "BadCollapseId")
        assertAccepted(send(headers: alert([("apns-collapse-id", String(repeating: "c", count: 64))])))
    }

    func testMalformedAPNsIDIsBadMessageId() {
        for id in ["not-a-uuid", "123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400"] {
            let response = send(headers: alert([("apns-id", id)]))
            XCTAssertEqual(response?.status, 400, id)
            XCTAssertEqual(response?.reason?.rawValue, "BadMessageId", id)
        }
    }

    // MARK: Body

    func testEmptyBodyIsPayloadEmpty() {
        assertRejected(send(headers: alert(), body: []), 400, "PayloadEmpty")
    }

    func testBodyOver4096BytesIsPayloadTooLarge() {
        assertAccepted(send(headers: alert(), body: paddedAlertPayload(size: 4096)))
        assertRejected(send(headers: alert(), body: paddedAlertPayload(size: 4097)), 413, "PayloadTooLarge")
    }

    func testBodyBeyondTheServerBufferIsPayloadTooLargeWithAPNsID() {
        // 70,000 bytes: past HTTP2ServerConnection.maxRequestBody (64 KiB), which answers on its own.
        let id = APNsID.generate()
        let response = send(headers: alert([("apns-id", id)]), body: paddedAlertPayload(size: 70_000))
        assertRejected(response, 413, "PayloadTooLarge")
        XCTAssertEqual(response?.apnsID, id)
        XCTAssertEqual(mock.stats.count(reason: "PayloadTooLarge"), 1, "counted like any other rejection")
    }

    func testVoIPAllows5120Bytes() {
        let voip = [("apns-topic", "\(Self.topic).voip"), ("apns-push-type", "voip")]
        assertAccepted(send(headers: voip, body: paddedAlertPayload(size: 5120)))
        assertRejected(send(headers: voip, body: paddedAlertPayload(size: 5121)), 413, "PayloadTooLarge")
    }

    func testBodyThatIsNotJSONIsBadPayload() {
        for body in ["hello", "{\"aps\":", "[1,2]", "{\"aps\":{}} trailing"] {
            let response = send(headers: alert(), body: Array(body.utf8))
            XCTAssertEqual(response?.status, 400, body)
            XCTAssertEqual(response?.reason?.rawValue, "BadPayload", body)
        }
    }

    func testBodyWithoutAPSIsBadPayload() {
        assertRejected(send(headers: alert(), body: Array(#"{"alert":"hi"}"#.utf8)), 400, "BadPayload")
        assertRejected(send(headers: alert(), body: Array(#"{"aps":"hi"}"#.utf8)), 400, "BadPayload")
    }

    func testLiveActivityWithUnknownEventIsBadPayload() {
        let body = Array(#"{"aps":{"event":"pause","timestamp":1764460800,"content-state":{}}}"#.utf8)
        assertRejected(send(headers: liveActivity(), body: body), 400, "BadPayload")
        let noEvent = Array(#"{"aps":{"timestamp":1764460800,"content-state":{}}}"#.utf8)
        assertRejected(send(headers: liveActivity(), body: noEvent), 400, "BadPayload")
    }

    func testLiveActivityWithoutTimestampIsBadPayload() {
        let body = Array(#"{"aps":{"event":"update","content-state":{}}}"#.utf8)
        assertRejected(send(headers: liveActivity(), body: body), 400, "BadPayload")
        let fractional = Array(#"{"aps":{"event":"update","timestamp":1.5,"content-state":{}}}"#.utf8)
        assertRejected(send(headers: liveActivity(), body: fractional), 400, "BadPayload")
    }

    func testLiveActivityAttributesOnUpdateAreBadPayload() {
        let body = Array(
            #"{"aps":{"event":"update","timestamp":1764460800,"content-state":{},"attributes-type":"A","attributes":{}}}"#
                .utf8)
        assertRejected(send(headers: liveActivity(), body: body), 400, "BadPayload")
    }

    // MARK: Accepted requests

    func testValidAlertIsAcceptedAndEchoesAPNsID() {
        let id = APNsID.generate()
        let response = send(headers: alert([("apns-id", id), ("apns-priority", "10"), ("apns-expiration", "0")]))
        assertAccepted(response)
        XCTAssertEqual(response?.apnsID, id)
        XCTAssertTrue(response?.apnsUniqueID.map { APNsID.isValid($0) } ?? false, "apns-unique-id on success")
        XCTAssertEqual(mock.stats.accepted, 1)
    }

    func testValidAlertWithoutAPNsIDGetsAGeneratedOne() {
        let first = send(headers: alert())
        let second = send(headers: alert())
        assertAccepted(first)
        assertAccepted(second)
        XCTAssertTrue(first?.apnsID.map { APNsID.isValid($0) } ?? false)
        XCTAssertNotEqual(first?.apnsID, second?.apnsID)
    }

    func testValidLiveActivityEventsAreAccepted() {
        let id = APNsID.generate()
        let update = Array(
            #"{"aps":{"timestamp":1764460800,"event":"update","content-state":{"home":2,"away":1},"stale-date":1764464400,"relevance-score":50,"alert":{"title":"Goal!","body":"2-1","sound":"default"}}}"#
                .utf8)
        let response = send(headers: liveActivity([("apns-id", id), ("apns-priority", "5")]), body: update)
        assertAccepted(response)
        XCTAssertEqual(response?.apnsID, id)

        let start = Array(
            #"{"aps":{"timestamp":1764460801,"event":"start","content-state":{},"attributes-type":"MatchAttributes","attributes":{"home":"A"},"input-push-token":1}}"#
                .utf8)
        assertAccepted(send(headers: liveActivity(), body: start))
        let end = Array(#"{"aps":{"timestamp":1764460802,"event":"end","content-state":{},"dismissal-date":0}}"#.utf8)
        assertAccepted(send(headers: liveActivity(), body: end))
    }

    func testErrorResponsesEchoTheRequestAPNsID() {
        let id = APNsID.generate()
        let response = send(headers: [("apns-push-type", "alert"), ("apns-id", id)])
        assertRejected(response, 400, "MissingTopic")
        XCTAssertEqual(response?.apnsID, id)
    }

    func testRejectionsAreCountedInStats() {
        assertRejected(send(headers: [("apns-push-type", "alert")]), 400, "MissingTopic")
        assertRejected(send(method: "GET", headers: alert()), 405, "MethodNotAllowed")
        assertAccepted(send(headers: alert()))
        XCTAssertEqual(mock.stats.requests, 3)
        XCTAssertEqual(mock.stats.accepted, 1)
        XCTAssertEqual(mock.stats.count(status: 400), 1)
        XCTAssertEqual(mock.stats.count(reason: "MethodNotAllowed"), 1)
    }
}
