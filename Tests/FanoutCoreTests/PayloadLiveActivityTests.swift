import Foundation
import XCTest

@testable import FanoutCore

final class PayloadLiveActivityTests: XCTestCase {
    static let token = String(repeating: "ab", count: 32)

    func text(_ bytes: [UInt8]) -> String {
        String(decoding: bytes, as: UTF8.self)
    }

    func foundationObject(_ bytes: [UInt8]) throws -> NSDictionary {
        let object = try JSONSerialization.jsonObject(with: Data(bytes))
        return try XCTUnwrap(object as? NSDictionary)
    }

    func validationError(_ content: LiveActivityContent) -> PayloadError? {
        do {
            try content.validate()
            return nil
        } catch {
            return error
        }
    }

    func encodeError(_ content: LiveActivityContent) -> PayloadError? {
        do {
            _ = try content.encode()
            return nil
        } catch {
            return error
        }
    }

    func update(_ state: String = #"{"score":"2-1"}"#) throws -> LiveActivityContent {
        LiveActivityContent(event: .update, timestamp: 1_685_952_000, contentState: try RawJSON(validating: state))
    }

    func testReferenceUpdateExampleIsByteExact() throws {
        var content = try update()
        content.staleDate = 1_685_955_600
        content.relevanceScore = 50
        content.alert = LiveActivityAlert(title: "Goal!", body: "2-1", sound: .default)
        XCTAssertEqual(
            text(try content.encode()),
            #"{"aps":{"timestamp":1685952000,"event":"update","content-state":{"score":"2-1"},"stale-date":1685955600,"relevance-score":50,"alert":{"title":"Goal!","body":"2-1","sound":"default"}}}"#
        )
    }

    func testEveryKeyInItsFixedOrderAndRoundTripsThroughFoundation() throws {
        let content = LiveActivityContent(
            event: .start, timestamp: 1_764_460_800, contentState: RawJSON(["home": 0, "away": 0]),
            staleDate: 1_764_464_400, relevanceScore: 0.5,
            alert: LiveActivityAlert(
                title: .localized(key: "MATCH_START", arguments: ["Lyon", "Nice"]),
                body: .localized(key: "KICKOFF", arguments: []), sound: .critical(name: "whistle.caf", volume: 0.75)),
            attributesType: "MatchAttributes", attributes: RawJSON(["match": "7"]), inputPushToken: true)
        let bytes = try content.encode()
        XCTAssertEqual(
            text(bytes),
            #"{"aps":{"timestamp":1764460800,"event":"start","content-state":{"home":0,"away":0},"stale-date":1764464400,"relevance-score":0.5,"alert":{"title":{"loc-key":"MATCH_START","loc-args":["Lyon","Nice"]},"body":{"loc-key":"KICKOFF"},"sound":{"critical":1,"name":"whistle.caf","volume":0.75}},"attributes-type":"MatchAttributes","attributes":{"match":"7"},"input-push-token":1}}"#
        )
        let expected: NSDictionary = [
            "aps": [
                "timestamp": 1_764_460_800, "event": "start", "content-state": ["home": 0, "away": 0],
                "stale-date": 1_764_464_400, "relevance-score": 0.5,
                "alert": [
                    "title": ["loc-key": "MATCH_START", "loc-args": ["Lyon", "Nice"]], "body": ["loc-key": "KICKOFF"],
                    "sound": ["critical": 1, "name": "whistle.caf", "volume": 0.75],
                ],
                "attributes-type": "MatchAttributes", "attributes": ["match": "7"], "input-push-token": 1,
            ]
        ]
        XCTAssertEqual(try foundationObject(bytes), expected)
    }

    func testEndWithDismissalDateAndChannelStart() throws {
        let end = LiveActivityContent(
            event: .end, timestamp: 10, contentState: RawJSON(["final": true]), dismissalDate: 0)
        XCTAssertEqual(
            text(try end.encode()),
            #"{"aps":{"timestamp":10,"event":"end","content-state":{"final":true},"dismissal-date":0}}"#)
        let bareEnd = LiveActivityContent(event: .end, timestamp: 11)
        XCTAssertEqual(text(try bareEnd.encode()), #"{"aps":{"timestamp":11,"event":"end"}}"#)
        let start = LiveActivityContent(
            event: .start, timestamp: 12, contentState: RawJSON([:]), attributesType: "A",
            attributes: RawJSON([:]), inputPushChannel: "dHN1L3BsYXllcg==")
        XCTAssertEqual(
            text(try start.encode()),
            #"{"aps":{"timestamp":12,"event":"start","content-state":{},"attributes-type":"A","attributes":{},"input-push-channel":"dHN1L3BsYXllcg=="}}"#
        )
    }

    func testRawContentStateIsEmbeddedByteForByte() throws {
        let state = "{ \"z\" : [1 ,2.50, 1e3],\n\t\"a\":{\"\\u00e9\":null} ,\"m\":\"\\/\"}"
        let bytes = try update(state).encode()
        XCTAssertEqual(
            text(bytes), #"{"aps":{"timestamp":1685952000,"event":"update","content-state":"# + state + "}}")
        let parsed = try foundationObject(bytes)
        let contentState = try XCTUnwrap((parsed["aps"] as? NSDictionary)?["content-state"] as? NSDictionary)
        XCTAssertEqual(contentState["m"] as? String, "/")
        XCTAssertEqual((contentState["a"] as? NSDictionary)?["é"] as? NSNull, NSNull())
    }

    func testStringsAreEscaped() throws {
        var content = try update()
        content.alert = LiveActivityAlert(title: "say \"hi\" \\ \u{1}", body: "line\nbreak é 😀")
        let bytes = try content.encode()
        XCTAssertTrue(
            text(bytes).contains(#""alert":{"title":"say \"hi\" \\ \u0001","body":"line\nbreak é 😀"}"#), text(bytes))
        let alert = (try foundationObject(bytes)["aps"] as? NSDictionary)?["alert"] as? NSDictionary
        XCTAssertEqual(alert?["title"] as? String, "say \"hi\" \\ \u{1}")
        XCTAssertEqual(alert?["body"] as? String, "line\nbreak é 😀")
    }

    func testValidationErrorsNameTheField() throws {
        let state = RawJSON(["s": 1])
        let start = LiveActivityContent(
            event: .start, timestamp: 1, contentState: state, attributesType: "T", attributes: RawJSON([:]))
        XCTAssertNil(validationError(start))
        var cases: [(LiveActivityContent, String)] = []
        func add(_ field: String, _ message: String, _ change: (inout LiveActivityContent) -> Void) {
            var content = start
            change(&content)
            cases.append((content, "live_activity.\(field): \(message)"))
        }
        add("timestamp", "must not be negative (seconds since 1970)") { $0.timestamp = -1 }
        add("content_state", "required for start and update") { $0.contentState = nil }
        add("content_state", "required for start and update") {
            $0 = LiveActivityContent(event: .update, timestamp: 1)
        }
        add("content_state", "must be a JSON object, not an array") { $0.contentState = RawJSON([1]) }
        add("stale_date", "must not be negative (seconds since 1970)") { $0.staleDate = -5 }
        add("dismissal_date", #"only allowed with event "end""#) { $0.dismissalDate = 5 }
        add("relevance_score", "must be a finite number") { $0.relevanceScore = .nan }
        add("alert", "needs a title or a body") { $0.alert = LiveActivityAlert(sound: "default") }
        add("alert.title.loc_key", "must not be empty") {
            $0.alert = LiveActivityAlert(title: .localized(key: "", arguments: []))
        }
        add("alert.sound", "must not be empty") { $0.alert = LiveActivityAlert(title: "t", sound: "") }
        add("alert.sound.volume", "must be between 0 and 1") {
            $0.alert = LiveActivityAlert(body: "b", sound: .critical(name: "x", volume: 2))
        }
        add("attributes_type", "required for start") { $0.attributesType = nil }
        add("attributes_type", "must not be empty") { $0.attributesType = "" }
        add("attributes", "required for start") { $0.attributes = nil }
        add("attributes", "must be a JSON object, not a string") { $0.attributes = RawJSON("x") }
        add("attributes_type", #"only allowed with event "start""#) {
            $0.event = .update
            $0.attributes = nil
        }
        add("attributes", #"only allowed with event "start""#) {
            $0.event = .update
            $0.attributesType = nil
        }
        add("input_push_token", #"only allowed with event "start""#) {
            $0 = LiveActivityContent(event: .update, timestamp: 1, contentState: state, inputPushToken: true)
        }
        add("input_push_channel", #"only allowed with event "start""#) {
            $0 = LiveActivityContent(event: .end, timestamp: 1, inputPushChannel: "YWJj")
        }
        add("input_push_channel", "not allowed together with input_push_token") {
            $0.inputPushToken = true
            $0.inputPushChannel = "YWJj"
        }
        add("input_push_channel", "must be a base64 channel ID") { $0.inputPushChannel = "not base64!" }
        add("input_push_channel", "must be a base64 channel ID") { $0.inputPushChannel = "" }
        for (content, expected) in cases {
            XCTAssertEqual(validationError(content)?.description, expected)
            XCTAssertEqual(encodeError(content)?.description, expected)
        }
        XCTAssertEqual(validationError(start)?.field, nil)
        XCTAssertEqual(
            validationError(LiveActivityContent(event: .update, timestamp: 1))?.field, "live_activity.content_state")
    }

    func testSizeLimit() throws {
        let filler = String(repeating: "x", count: 4096 - 74)
        let fits = try update(#"{"s":""# + filler + #""}"#)
        XCTAssertEqual(try fits.encode().count, 4096)
        let over = try update(#"{"s":""# + filler + #"yyyy"}"#)
        XCTAssertEqual(
            encodeError(over),
            PayloadError(field: "payload", message: "4100 bytes, over the 4096-byte limit for liveactivity"))
        XCTAssertEqual(encodeError(over)?.description, "payload: 4100 bytes, over the 4096-byte limit for liveactivity")
    }

    func testEventNames() {
        XCTAssertEqual(LiveActivityContent.Event(rawValue: "start"), .start)
        XCTAssertEqual(LiveActivityContent.Event(rawValue: "update")?.description, "update")
        XCTAssertNil(LiveActivityContent.Event(rawValue: "Start"))
    }
}
