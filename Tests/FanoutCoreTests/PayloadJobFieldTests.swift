import Foundation
import XCTest

@testable import FanoutCore

final class PayloadJobFieldTests: XCTestCase {
    /// The example job line of docs/SEND.md, on one line as in a JSON Lines file.
    static let productJob = #"""
        {"id": "match-7-update-12", "workspace": "acme", "topic": "com.acme.app.push-type.liveactivity", "push_type": "liveactivity", "priority": 10, "expiration": 0, "collapse_id": null, "live_activity": {"event": "update", "timestamp": 1764460800, "content_state": {"home": 2, "away": 1}, "stale_date": null, "dismissal_date": null, "relevance_score": 50, "alert": {"title": "Goal!", "body": "2-1", "sound": "default"}, "attributes_type": null, "attributes": null, "input_push_token": false}, "payload": null, "tokens": ["<hex token>", "..."], "tokens_file": null}
        """#

    func text(_ bytes: [UInt8]) -> String {
        String(decoding: bytes, as: UTF8.self)
    }

    func parseError(_ liveActivity: String, defaultTimestamp: Int64 = 99) -> String? {
        do {
            _ = try LiveActivityContent(jobFieldBytes: Array(liveActivity.utf8), defaultTimestamp: defaultTimestamp)
            return nil
        } catch {
            return error.description
        }
    }

    func testProductExampleFromBytesIsByteExactWithContentStateAsWritten() throws {
        let job = try RawJSON(validating: Self.productJob)
        let field = try XCTUnwrap(job.member("live_activity"))
        let content = try LiveActivityContent(jobField: field, defaultTimestamp: 1)
        XCTAssertEqual(
            text(try content.encode()),
            #"{"aps":{"timestamp":1764460800,"event":"update","content-state":{"home": 2, "away": 1},"relevance-score":50,"alert":{"title":"Goal!","body":"2-1","sound":"default"}}}"#
        )
        XCTAssertEqual(job.member("payload")?.kind, .null)
    }

    func testProductExampleFromAParsedValueIsCompact() throws {
        let job = try JSONValue.parse(Self.productJob)
        let content = try LiveActivityContent(jobField: try XCTUnwrap(job["live_activity"]), defaultTimestamp: 1)
        XCTAssertEqual(
            text(try content.encode()),
            #"{"aps":{"timestamp":1764460800,"event":"update","content-state":{"home":2,"away":1},"relevance-score":50,"alert":{"title":"Goal!","body":"2-1","sound":"default"}}}"#
        )
        XCTAssertEqual(content.alert, LiveActivityAlert(title: "Goal!", body: "2-1", sound: "default"))
        XCTAssertFalse(content.inputPushToken)
        XCTAssertNil(content.staleDate)
    }

    func testTimestampDefaultsAndNullMeansAbsent() throws {
        let content = try LiveActivityContent(
            jobFieldBytes: Array(#"{"event":"end","timestamp":null,"content_state":null,"alert":null}"#.utf8),
            defaultTimestamp: 1_764_460_801)
        XCTAssertEqual(content, LiveActivityContent(event: .end, timestamp: 1_764_460_801))
    }

    func testStartWithEverything() throws {
        let field = #"""
            {"event":"start","timestamp":5,"content_state":{"s" :1},"stale_date":6,"relevance_score":0.25,
             "alert":{"title":{"loc_key":"T","loc_args":["a","b"]},"loc_key":"B","loc_args":["c"],
                      "sound":{"name":"x.caf","volume":0.5,"critical":true}},
             "attributes_type":"MatchAttributes","attributes":{"id": "7"},"input_push_channel":"YWJjZA=="}
            """#
        let content = try LiveActivityContent(jobFieldBytes: Array(field.utf8), defaultTimestamp: 0)
        XCTAssertEqual(content.alert?.title, .localized(key: "T", arguments: ["a", "b"]))
        XCTAssertEqual(content.alert?.body, .localized(key: "B", arguments: ["c"]))
        XCTAssertEqual(content.alert?.sound, .critical(name: "x.caf", volume: 0.5))
        XCTAssertEqual(
            text(try content.encode()),
            #"{"aps":{"timestamp":5,"event":"start","content-state":{"s" :1},"stale-date":6,"relevance-score":0.25,"alert":{"title":{"loc-key":"T","loc-args":["a","b"]},"body":{"loc-key":"B","loc-args":["c"]},"sound":{"critical":1,"name":"x.caf","volume":0.5}},"attributes-type":"MatchAttributes","attributes":{"id": "7"},"input-push-channel":"YWJjZA=="}}"#
        )
        let flatTitle = try LiveActivityContent(
            jobField: [
                "event": "update", "content_state": [:], "alert": ["title_loc_key": "K", "body": "b"],
            ], defaultTimestamp: 0)
        XCTAssertEqual(flatTitle.alert, LiveActivityAlert(title: .localized(key: "K", arguments: []), body: "b"))
    }

    func testErrorsNameTheFieldPath() {
        let update = #""event":"update","content_state":{}"#
        let cases: [(String, String)] = [
            ("[]", "live_activity: must be a JSON object, not an array"),
            (
                #"{"event":"update",}"#,
                "live_activity: not valid JSON: at byte offset 18: expected a string key, found '}'"
            ),
            ("{}", "live_activity.event: required"),
            (#"{"event":"Update"}"#, #"live_activity.event: must be "start", "update" or "end", not "Update""#),
            (#"{"event":1}"#, "live_activity.event: must be a string, not a number"),
            (
                "{\(update),\"colour\":null}",
                "live_activity.colour: unknown key (known: event, timestamp, content_state, stale_date, dismissal_date, relevance_score, alert, attributes_type, attributes, input_push_token, input_push_channel)"
            ),
            (
                "{\(update),\"timestamp\":1.5}",
                "live_activity.timestamp: must be a non-negative integer (seconds since 1970)"
            ),
            (
                "{\(update),\"timestamp\":-1}",
                "live_activity.timestamp: must be a non-negative integer (seconds since 1970)"
            ),
            (
                "{\(update),\"stale_date\":\"soon\"}",
                "live_activity.stale_date: must be a non-negative integer (seconds since 1970)"
            ),
            (
                #"{"event":"update","content_state":"x"}"#,
                "live_activity.content_state: must be a JSON object, not a string"
            ),
            (#"{"event":"update"}"#, "live_activity.content_state: required for start and update"),
            (
                "{\(update),\"relevance_score\":\"high\"}",
                "live_activity.relevance_score: must be a number, not a string"
            ),
            ("{\(update),\"relevance_score\":1e999}", "live_activity.relevance_score: must be a finite number"),
            (
                "{\(update),\"input_push_token\":1}",
                "live_activity.input_push_token: must be true or false, not a number"
            ),
            (
                "{\(update),\"input_push_token\":true}",
                #"live_activity.input_push_token: only allowed with event "start""#
            ),
            ("{\(update),\"attributes\":{}}", #"live_activity.attributes: only allowed with event "start""#),
            (
                "{\(update),\"attributes_type\":\"T\"}",
                #"live_activity.attributes_type: only allowed with event "start""#
            ),
            (
                #"{"event":"start","content_state":{},"attributes_type":"T"}"#,
                "live_activity.attributes: required for start"
            ),
            ("{\(update),\"alert\":\"hi\"}", "live_activity.alert: must be a JSON object, not a string"),
            (
                "{\(update),\"alert\":{\"subtitle\":\"s\"}}",
                "live_activity.alert.subtitle: unknown key (known: title, body, sound, title_loc_key, title_loc_args, loc_key, loc_args)"
            ),
            (
                "{\(update),\"alert\":{\"title\":7}}",
                "live_activity.alert.title: must be a string or an object with loc_key and loc_args, not a number"
            ),
            ("{\(update),\"alert\":{\"title\":{\"loc_args\":[]}}}", "live_activity.alert.title.loc_key: required"),
            (
                "{\(update),\"alert\":{\"title\":{\"loc_key\":\"k\",\"loc_args\":[\"a\",2]}}}",
                "live_activity.alert.title.loc_args[1]: must be a string, not a number"
            ),
            (
                "{\(update),\"alert\":{\"title\":{\"loc-key\":\"k\"}}}",
                "live_activity.alert.title.loc-key: unknown key (known: loc_key, loc_args)"
            ),
            (
                "{\(update),\"alert\":{\"title\":\"t\",\"title_loc_key\":\"k\"}}",
                "live_activity.alert.title_loc_key: not allowed together with title"
            ),
            (
                "{\(update),\"alert\":{\"title\":\"t\",\"loc_args\":[\"x\"]}}",
                "live_activity.alert.loc_args: needs loc_key"
            ),
            ("{\(update),\"alert\":{\"sound\":\"default\"}}", "live_activity.alert: needs a title or a body"),
            (
                "{\(update),\"alert\":{\"body\":\"b\",\"sound\":{\"volume\":0.5}}}",
                "live_activity.alert.sound.name: required"
            ),
            (
                "{\(update),\"alert\":{\"body\":\"b\",\"sound\":{\"name\":\"n\",\"critical\":false}}}",
                "live_activity.alert.sound.critical: must be true (use a string for a sound that is not critical)"
            ),
            (
                #"{"event":"start","content_state":{},"attributes_type":"T","attributes":{},"input_push_token":true,"input_push_channel":"YWJj"}"#,
                "live_activity.input_push_channel: not allowed together with input_push_token"
            ),
            (
                #"{"event":"end","dismissal_date":1,"dismissal_date":2}"#,
                #"live_activity: not valid JSON: at byte offset 34: duplicate key "dismissal_date""#
            ),
            // Dates past year 9999 (in milliseconds, the registry's unit, Int64.max seconds overflowed and crashed
            // the process that recorded the end).
            (
                #"{"event":"end","dismissal_date":9223372036854775807}"#,
                "live_activity.dismissal_date: 9223372036854775807 is past 9999-12-31 (253402300799 seconds since 1970)"
            ),
            (
                "{\(update),\"timestamp\":253402300800}",
                "live_activity.timestamp: 253402300800 is past 9999-12-31 (253402300799 seconds since 1970)"
            ),
            (
                "{\(update),\"stale_date\":9223372036854775807}",
                "live_activity.stale_date: 9223372036854775807 is past 9999-12-31 (253402300799 seconds since 1970)"
            ),
        ]
        for (field, expected) in cases {
            XCTAssertEqual(parseError(field), expected, field)
        }
    }

    func testTheSameErrorsFromAParsedValue() throws {
        let value = try JSONValue.parse(
            #"{"event":"update","content_state":{},"alert":{"title":{"loc_key":"k","loc_args":[1]}}}"#)
        XCTAssertThrowsError(try LiveActivityContent(jobField: value, defaultTimestamp: 0)) { error in
            XCTAssertEqual((error as? PayloadError)?.field, "live_activity.alert.title.loc_args[0]")
        }
    }
}
