// Payloads FanoutCore encodes are ones mock-apns (and so APNs, as far as the mock models it) accepts.
import FanoutCore
import MockAPNsKit
import XCTest

final class EncodedPayloadValidationTests: XCTestCase {
    static let token = String(repeating: "ab", count: 32)

    func accepts(_ body: [UInt8], topic: String, pushType: String) -> Bool {
        let headers = [(name: "apns-topic", value: topic), (name: "apns-push-type", value: pushType)]
        let rejection = APNsRequestValidator().validate(
            method: "POST", path: "/3/device/\(Self.token)", headers: headers, body: body)
        XCTAssertNil(rejection, String(decoding: body, as: UTF8.self))
        return rejection == nil
    }

    func testBackgroundPayload() throws {
        XCTAssertTrue(accepts(try BackgroundPayload().encode(), topic: "com.x", pushType: "background"))
    }

    func testLiveActivityPayloads() throws {
        let payloads = [
            try LiveActivityContent(
                event: .update, timestamp: 1_685_952_000, contentState: try RawJSON(validating: #"{"score":"2-1"}"#)
            ).encode(),
            try LiveActivityContent(
                event: .start, timestamp: 1, contentState: RawJSON(["a": 1]), alert: LiveActivityAlert(title: "t"),
                attributesType: "T", attributes: RawJSON(["b": "c"]), inputPushToken: true
            ).encode(),
            try LiveActivityContent(event: .end, timestamp: 2, dismissalDate: 3).encode(),
        ]
        for body in payloads {
            XCTAssertTrue(accepts(body, topic: "com.x.push-type.liveactivity", pushType: "liveactivity"))
        }
    }
}
