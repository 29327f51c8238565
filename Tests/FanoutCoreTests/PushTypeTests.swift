import FanoutCore
import XCTest

final class PushTypeTests: XCTestCase {
    func testParsesEveryKnownValueAndRejectsOthers() {
        let names = [
            "alert", "background", "location", "voip", "complication", "fileprovider", "mdm", "liveactivity",
            "pushtotalk", "widgets",
        ]
        XCTAssertEqual(PushType.allKnown.map(\.rawValue), names)
        for name in names {
            XCTAssertEqual(PushType(rawValue: name)?.rawValue, name)
        }
        XCTAssertEqual(PushType(rawValue: "LiveActivity"), .liveactivity)
        XCTAssertEqual(PushType(rawValue: "ALERT"), .alert)
        XCTAssertNil(PushType(rawValue: ""))
        XCTAssertNil(PushType(rawValue: "alerts"))
        XCTAssertNil(PushType(rawValue: " alert"))
        XCTAssertNil(PushType(rawValue: "live-activity"))
    }

    /// The bytes parser (mock-apns's) agrees with the text one on every known value in three casings, and on
    /// near misses.
    func testBytesParseAsTextDoes() {
        var candidates = ["", "alerts", " alert", "live-activity", "alert\u{0}", "ålert", "liveactivityx", "widget"]
        for kind in PushType.allKnown {
            candidates += [
                kind.rawValue, kind.rawValue.uppercased(),
                kind.rawValue.prefix(1).uppercased() + kind.rawValue.dropFirst(),
            ]
        }
        for text in candidates {
            let fromBytes = Array(text.utf8).withUnsafeBufferPointer { PushType(utf8: $0) }
            XCTAssertEqual(fromBytes, PushType(rawValue: text), text)
        }
        XCTAssertEqual(Array("LiveActivity".utf8).withUnsafeBufferPointer { PushType(utf8: $0) }, .liveactivity)
    }

    func testRequiredTopicSuffixes() {
        XCTAssertEqual(PushType.alert.requiredTopicSuffix, "")
        XCTAssertEqual(PushType.background.requiredTopicSuffix, "")
        XCTAssertEqual(PushType.location.requiredTopicSuffix, ".location-query")
        XCTAssertEqual(PushType.voip.requiredTopicSuffix, ".voip")
        XCTAssertEqual(PushType.complication.requiredTopicSuffix, ".complication")
        XCTAssertEqual(PushType.fileprovider.requiredTopicSuffix, ".pushkit.fileprovider")
        XCTAssertNil(PushType.mdm.requiredTopicSuffix)
        XCTAssertEqual(PushType.liveactivity.requiredTopicSuffix, ".push-type.liveactivity")
        XCTAssertEqual(PushType.pushtotalk.requiredTopicSuffix, ".voip-ptt")
        XCTAssertEqual(PushType.widgets.requiredTopicSuffix, ".push-type.widgets")
    }

    func testPayloadLimitsAndDefaultPriorities() {
        for type in PushType.allKnown {
            XCTAssertEqual(type.payloadSizeLimit, type == .voip ? 5120 : 4096, "\(type)")
            XCTAssertEqual(type.defaultPriority, type == .background ? 5 : 10, "\(type)")
        }
    }

    func testAllowedPriorities() {
        XCTAssertTrue(PushType.alert.allowsPriority(1))
        XCTAssertTrue(PushType.alert.allowsPriority(5))
        XCTAssertTrue(PushType.alert.allowsPriority(10))
        XCTAssertFalse(PushType.alert.allowsPriority(0))
        XCTAssertFalse(PushType.alert.allowsPriority(9))
        XCTAssertTrue(PushType.background.allowsPriority(5))
        XCTAssertTrue(PushType.background.allowsPriority(1))
        XCTAssertFalse(PushType.background.allowsPriority(10))
    }

    func testAcceptsTopicNeedsBundleAndSuffix() {
        XCTAssertTrue(PushType.liveactivity.acceptsTopic("com.acme.app.push-type.liveactivity"))
        XCTAssertFalse(PushType.liveactivity.acceptsTopic("com.acme.app"))
        XCTAssertFalse(PushType.liveactivity.acceptsTopic(".push-type.liveactivity"))
        XCTAssertTrue(PushType.voip.acceptsTopic("com.acme.app.voip"))
        XCTAssertFalse(PushType.voip.acceptsTopic("com.acme.app.voip-ptt"))
        XCTAssertTrue(PushType.pushtotalk.acceptsTopic("com.acme.app.voip-ptt"))
        XCTAssertTrue(PushType.alert.acceptsTopic("com.acme.app"))
        XCTAssertFalse(PushType.alert.acceptsTopic(""))
        XCTAssertTrue(PushType.mdm.acceptsTopic("com.apple.mgmt.External.0f8b1e3c"))
        XCTAssertFalse(PushType.mdm.acceptsTopic(""))
    }
}
