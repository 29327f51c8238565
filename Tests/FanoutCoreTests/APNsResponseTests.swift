import FanoutCore
import XCTest

final class APNsResponseTests: XCTestCase {
    let apnsID = "eabeae54-14a8-11e5-b60b-1697f925ec7b"

    func testSuccessWithEmptyBody() {
        let response = APNsResponse.parse(status: 200, apnsID: apnsID, apnsUniqueID: nil, body: [UInt8]())
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.apnsID, apnsID)
        XCTAssertNil(response.apnsUniqueID)
        XCTAssertNil(response.reason)
        XCTAssertNil(response.timestamp)
        XCTAssertTrue(response.isSuccess)
        XCTAssertNil(response.reasonClass)
        XCTAssertFalse(response.invalidatesToken)
    }

    func testBadRequestWithReason() {
        let body = Array(#"{"reason":"BadDeviceToken"}"#.utf8)
        let response = APNsResponse.parse(status: 400, apnsID: apnsID, apnsUniqueID: nil, body: body)
        XCTAssertEqual(response.reason, .badDeviceToken)
        XCTAssertNil(response.timestamp)
        XCTAssertFalse(response.isSuccess)
        XCTAssertEqual(response.reasonClass, .permanent)
        XCTAssertTrue(response.invalidatesToken)
    }

    func testUnregisteredKeepsTheTimestampInMilliseconds() {
        let body = Array(#"{"reason":"Unregistered","timestamp":1508249865488}"#.utf8)
        let response = APNsResponse.parse(status: 410, apnsID: apnsID, apnsUniqueID: "u-1", body: body)
        XCTAssertEqual(response.reason, .unregistered)
        XCTAssertEqual(response.timestamp, 1_508_249_865_488)
        XCTAssertEqual(response.apnsUniqueID, "u-1")
        XCTAssertEqual(response.reasonClass, .permanent)
        XCTAssertTrue(response.invalidatesToken)
    }

    func testWhitespaceMemberOrderAndExtraMembersAreTolerated() {
        let body = Array(
            " {\n \"timestamp\" : 12 , \"extra\": {\"a\": [1, true, null]}, \"reason\": \"Shutdown\" }\n".utf8)
        let response = APNsResponse.parse(status: 503, apnsID: nil, apnsUniqueID: nil, body: body)
        XCTAssertEqual(response.reason, .shutdown)
        XCTAssertEqual(response.timestamp, 12)
        XCTAssertEqual(response.reasonClass, .transient)
    }

    func testEscapedReasonIsDecoded() {
        let body = Array(#"{"reason":"Bad\u0054opic"}"#.utf8)
        XCTAssertEqual(APNsResponse.parse(status: 400, apnsID: nil, apnsUniqueID: nil, body: body).reason, .badTopic)
    }

    func testMalformedBodiesGiveNoReasonAndDoNotCrash() {
        let bodies: [[UInt8]] = [
            Array(#"{"reason":"BadTopic""#.utf8),
            Array(#"{"reason":"BadTopic"} trailing"#.utf8),
            Array("not json".utf8),
            Array("[\"BadTopic\"]".utf8),
            Array(#"{"reason":5}"#.utf8),
            Array(#"{"reason":"Bad"#.utf8) + [0xFF, 0xFE] + Array(#""}"#.utf8),
            Array(#"{"reason":"BadTopic",}"#.utf8),
            [0],
            Array(repeating: UInt8(ascii: "["), count: 10_000),
        ]
        for body in bodies {
            let response = APNsResponse.parse(status: 400, apnsID: nil, apnsUniqueID: nil, body: body)
            XCTAssertNil(response.reason, String(decoding: body.prefix(40), as: UTF8.self))
            XCTAssertNil(response.timestamp)
            XCTAssertEqual(response.reasonClass, .configuration, "unknown 400 classifies by status")
        }
    }

    func testMalformedBodyOnServerErrorIsTransientByStatus() {
        let response = APNsResponse.parse(status: 500, apnsID: nil, apnsUniqueID: nil, body: Array("<html>".utf8))
        XCTAssertNil(response.reason)
        XCTAssertEqual(response.reasonClass, .transient)
    }

    func testTimestampOfTheWrongTypeIsIgnored() {
        let body = Array(#"{"reason":"Unregistered","timestamp":"1508249865488"}"#.utf8)
        let response = APNsResponse.parse(status: 410, apnsID: nil, apnsUniqueID: nil, body: body)
        XCTAssertEqual(response.reason, .unregistered)
        XCTAssertNil(response.timestamp)
    }

    func testParseFromHeaderList() {
        let headers: [(name: String, value: String)] = [
            (":status", "410"), ("apns-id", apnsID), ("APNS-Unique-ID", "a1b2"), ("apns-id", "second"),
        ]
        let body = Array(#"{"reason":"ExpiredToken"}"#.utf8)
        let response = APNsResponse.parse(status: 410, headers: headers, body: body)
        XCTAssertEqual(response.apnsID, apnsID)
        XCTAssertEqual(response.apnsUniqueID, "a1b2")
        XCTAssertEqual(response.reason, .expiredToken)
    }

    func testBodyWithoutContiguousStorage() {
        let body = Array(#"{"reason":"TooManyRequests"}"#.utf8).lazy.map { $0 }
        let response = APNsResponse.parse(status: 429, apnsID: nil, apnsUniqueID: nil, body: body)
        XCTAssertEqual(response.reason, .tooManyRequests)
    }

    func testErrorBodyEncoding() {
        XCTAssertEqual(
            String(decoding: APNsResponse.errorBody(reason: .badTopic), as: UTF8.self), #"{"reason":"BadTopic"}"#)
        let gone = APNsResponse.errorBody(reason: .unregistered, timestamp: 1_508_249_865_488)
        XCTAssertEqual(String(decoding: gone, as: UTF8.self), #"{"reason":"Unregistered","timestamp":1508249865488}"#)
        let parsed = APNsResponse.parseErrorBody(gone)
        XCTAssertEqual(parsed.reason, .unregistered)
        XCTAssertEqual(parsed.timestamp, 1_508_249_865_488)
    }

    func testErrorBodyEscapesOddReasons() {
        let reason = APNsReason("Odd \"quoted\" \\ reason\n")
        let body = APNsResponse.errorBody(reason: reason)
        XCTAssertEqual(String(decoding: body, as: UTF8.self), #"{"reason":"Odd \"quoted\" \\ reason\n"}"#)
        XCTAssertEqual(APNsResponse.parseErrorBody(body).reason, reason)
    }
}
