import FanoutCore
import MockAPNsKit
import XCTest

/// The pieces mock-apns's per-request path uses in place of slower general ones give the same answers.
final class MockHotPathTests: XCTestCase {
    func testAnswerIDIsAPNsIDGenerateFaster() {
        var first = FastRandomGenerator(seed: 42)
        var second = FastRandomGenerator(seed: 42)
        for _ in 0..<1000 {
            let id = AnswerID.generate(using: &first)
            XCTAssertEqual(id, APNsID.generate(using: &second))
            XCTAssertTrue(APNsID.isValid(id))
        }
    }

    func testContiguousTokenCheckAgreesWithTheGenericOne() {
        let valid = Array(String(repeating: "0a1B", count: 16).utf8)
        var cases = [valid, Array(valid.dropLast()), Array(valid.dropLast(2)), [], valid + valid + valid + valid]
        for byte in UInt8.min...UInt8.max {
            var token = valid
            token[17] = byte
            cases.append(token)
        }
        for token in cases {
            let contiguous = token.withUnsafeBufferPointer { DeviceToken.isValid(utf8: $0) }
            XCTAssertEqual(contiguous, DeviceToken.isValid(utf8: token[...]), "\(token)")
            XCTAssertEqual(contiguous, DeviceToken(utf8: token[...]) != nil)
        }
    }

    func testDigestSetCountsDistinctDigestsAsSetDoes() {
        var generator = FastRandomGenerator(seed: 7)
        var digests = DigestSet()
        var reference = Set<UInt64>()
        for index in 0..<20_000 {
            // Repeats, zero and values that share their low bits.
            let value = index % 3 == 0 ? UInt64(index % 50) << 40 : generator.next() % 5_000
            XCTAssertEqual(digests.insert(value), reference.insert(value).inserted)
        }
        XCTAssertEqual(digests.count, reference.count)
    }

    func testHexDigestFoldsCase() {
        func digest(_ text: String) -> UInt64 {
            var text = text
            return text.withUTF8 { MockStats.digest(hex: $0) }
        }
        let token = String(repeating: "ab12CD", count: 11)
        XCTAssertEqual(digest(token), digest(token.lowercased()))
        XCTAssertNotEqual(digest(token), digest(String(token.dropLast()) + "0"))
        let id = "8E6C4A2F-0D8B-4E4C-8A0F-8D6B4E2C0A8F"
        XCTAssertEqual(digest(id), digest(id.lowercased()))
        XCTAssertNotEqual(digest(id), digest("8e6c4a2f-0d8b-4e4c-8a0f-8d6b4e2c0a8e"))
    }
}
