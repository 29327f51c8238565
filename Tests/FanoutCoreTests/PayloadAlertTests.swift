import Foundation
import XCTest

@testable import FanoutCore

final class PayloadAlertTests: XCTestCase {
    func text(_ bytes: [UInt8]) -> String {
        String(decoding: bytes, as: UTF8.self)
    }

    func error(_ body: () throws -> Void) -> String? {
        do {
            try body()
            return nil
        } catch {
            return (error as? PayloadError)?.description ?? "not a PayloadError: \(error)"
        }
    }

    func testFullAlertIsByteExactAndRoundTrips() throws {
        let payload = AlertPayload(
            title: "Goal!", subtitle: .localized(key: "SUB", arguments: ["7"]),
            body: .localized(key: "BODY", arguments: ["Lyon", "2-1"]), sound: "default", badge: 3,
            threadID: "match-7", category: "GOAL", mutableContent: true, contentAvailable: true,
            interruptionLevel: .timeSensitive, relevanceScore: 0.75,
            customKeys: [
                PayloadCustomKey(key: "match", value: try RawJSON(validating: #"{ "id" : 7 }"#)),
                PayloadCustomKey(key: "tag\"", value: ["x": nil]),
            ])
        let bytes = try payload.encode()
        XCTAssertEqual(
            text(bytes),
            #"{"aps":{"alert":{"title":"Goal!","subtitle-loc-key":"SUB","subtitle-loc-args":["7"],"loc-key":"BODY","loc-args":["Lyon","2-1"]},"badge":3,"sound":"default","thread-id":"match-7","category":"GOAL","content-available":1,"mutable-content":1,"interruption-level":"time-sensitive","relevance-score":0.75},"match":{ "id" : 7 },"tag\"":{"x":null}}"#
        )
        let expected: NSDictionary = [
            "aps": [
                "alert": [
                    "title": "Goal!", "subtitle-loc-key": "SUB", "subtitle-loc-args": ["7"], "loc-key": "BODY",
                    "loc-args": ["Lyon", "2-1"],
                ],
                "badge": 3, "sound": "default", "thread-id": "match-7", "category": "GOAL", "content-available": 1,
                "mutable-content": 1, "interruption-level": "time-sensitive", "relevance-score": 0.75,
            ],
            "match": ["id": 7], "tag\"": ["x": NSNull()],
        ]
        XCTAssertEqual(try JSONSerialization.jsonObject(with: Data(bytes)) as? NSDictionary, expected)
    }

    func testSmallAlertsAndEscaping() throws {
        XCTAssertEqual(
            text(try AlertPayload(body: "a \"b\" \\ c\u{8}\u{C}\u{1B}").encode()),
            #"{"aps":{"alert":{"body":"a \"b\" \\ c\u0008\u000c\u001b"}}}"#)
        XCTAssertEqual(
            text(try AlertPayload(title: .localized(key: "T", arguments: []), badge: 0).encode()),
            #"{"aps":{"alert":{"title-loc-key":"T"},"badge":0}}"#)
        XCTAssertEqual(
            text(try AlertPayload(sound: .critical(name: "alarm.caf", volume: 1)).encode()),
            #"{"aps":{"sound":{"critical":1,"name":"alarm.caf","volume":1}}}"#)
    }

    func testBackgroundPayload() throws {
        XCTAssertEqual(text(try BackgroundPayload().encode()), #"{"aps":{"content-available":1}}"#)
        XCTAssertEqual(
            text(try BackgroundPayload(customKeys: [PayloadCustomKey(key: "sync", value: ["since": 12])]).encode()),
            #"{"aps":{"content-available":1},"sync":{"since":12}}"#)
    }

    func testValidationErrors() {
        XCTAssertEqual(
            error { _ = try AlertPayload().encode() },
            "aps: empty: give an alert text, a sound, a badge or content-available")
        XCTAssertEqual(error { try AlertPayload(badge: -1).validate() }, "aps.badge: must not be negative")
        XCTAssertEqual(
            error { try AlertPayload(title: .localized(key: "", arguments: [])).validate() },
            "aps.alert.title.loc_key: must not be empty")
        XCTAssertEqual(
            error { try AlertPayload(body: "b", relevanceScore: 2).validate() },
            "aps.relevance-score: must be between 0 and 1")
        XCTAssertEqual(
            error { try AlertPayload(body: "b", interruptionLevel: .init(rawValue: "loud")).validate() },
            #"aps.interruption-level: must be passive, active, time-sensitive or critical, not "loud""#)
        XCTAssertEqual(
            error { try BackgroundPayload(customKeys: [PayloadCustomKey(key: "aps", value: [:])]).validate() },
            "aps: reserved; it cannot be a custom key")
        XCTAssertEqual(
            error {
                try AlertPayload(
                    body: "b", customKeys: [PayloadCustomKey(key: "k", value: 1), PayloadCustomKey(key: "k", value: 2)]
                ).validate()
            }, "k: custom key given twice")
    }

    func testSizeLimits() throws {
        XCTAssertEqual(PayloadLimits.limit(for: .voip), 5120)
        XCTAssertEqual(PayloadLimits.limit(for: .liveactivity), 4096)
        XCTAssertNoThrow(try PayloadLimits.check([UInt8](repeating: 0x20, count: 4096), pushType: .alert))
        XCTAssertNoThrow(try PayloadLimits.check([UInt8](repeating: 0x20, count: 5120), pushType: .voip))
        XCTAssertEqual(
            error { try PayloadLimits.check([UInt8](repeating: 0x20, count: 4200), pushType: .liveactivity) },
            "payload: 4200 bytes, over the 4096-byte limit for liveactivity")
        XCTAssertEqual(
            error { try PayloadLimits.check([UInt8](repeating: 0x20, count: 5121), pushType: .voip) },
            "payload: 5121 bytes, over the 5120-byte limit for voip")
        XCTAssertEqual(error { try PayloadLimits.check([UInt8](), pushType: .alert) }, "payload: empty")
        let big = PayloadCustomKey(key: "blob", value: .string(String(repeating: "z", count: 4096)))
        XCTAssertEqual(
            error { _ = try BackgroundPayload(customKeys: [big]).encode() },
            "payload: 4137 bytes, over the 4096-byte limit for background")
    }
}
