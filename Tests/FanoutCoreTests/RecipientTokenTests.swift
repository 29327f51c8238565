import XCTest

@testable import FanoutCore

final class RecipientTokenTests: XCTestCase {
    private let lowercase = "0123456789abcdef" + "fedcba9876543210" + "00ff00ff00ff00ff" + "a1b2c3d4e5f60789"

    /// 64 lowercase hex digits are packed into four words in reading order, and spelled back the same.
    func testALowercaseTokenIsPackedInOrderAndSpelledBack() throws {
        let token = RecipientToken(lowercase)
        XCTAssertEqual(
            token, .hex64(0x0123_4567_89AB_CDEF, 0xFEDC_BA98_7654_3210, 0x00FF_00FF_00FF_00FF, 0xA1B2_C3D4_E5F6_0789))
        XCTAssertEqual(token.string, lowercase)
        XCTAssertEqual(token.utf8Count, 64)
        var buffer = [UInt8](repeating: 0, count: 70)
        let written = buffer.withUnsafeMutableBytes { token.write(into: $0) }
        XCTAssertEqual(written, 64)
        XCTAssertEqual(String(decoding: buffer.prefix(64), as: UTF8.self), lowercase)
        XCTAssertEqual(buffer.suffix(6), [0, 0, 0, 0, 0, 0], "nothing written past the token")
        let fromBytes = Array(lowercase.utf8).withUnsafeBytes { RecipientToken(utf8: $0) }
        XCTAssertEqual(fromBytes, token)
    }

    /// Anything but 64 lowercase hex digits stays text, spelled exactly as given.
    func testAnythingElseIsKeptAsGiven() {
        for text in [
            lowercase.uppercased(), String(lowercase.dropLast()), lowercase + "00", "", "not-a-token",
            "Y2hhbm5lbC0x+/=", " " + lowercase.dropFirst(),
        ] {
            let token = RecipientToken(text)
            XCTAssertEqual(token, .text(text))
            XCTAssertEqual(token.string, text)
            XCTAssertEqual(token.utf8Count, text.utf8.count)
            XCTAssertEqual(Array(text.utf8).withUnsafeBytes { RecipientToken(utf8: $0) }, token)
            var buffer = [UInt8](repeating: 0, count: text.utf8.count)
            XCTAssertEqual(buffer.withUnsafeMutableBytes { token.write(into: $0) }, text.utf8.count)
            XCTAssertEqual(String(decoding: buffer, as: UTF8.self), text)
        }
    }

    /// Every byte in every position: packed exactly when the text is still 64 lowercase hex digits, and always
    /// spelled back as it was.
    func testEveryByteInEveryPosition() {
        let valid = Array(lowercase.utf8)
        let hexDigits = Set("0123456789abcdef".utf8)
        for position in valid.indices {
            for byte in UInt8.min...UInt8.max {
                var candidate = valid
                candidate[position] = byte
                let parsed = candidate.withUnsafeBytes { RecipientToken(utf8: $0) }
                if case .hex64 = parsed {
                    XCTAssertTrue(hexDigits.contains(byte), "byte \(byte) at \(position)")
                } else {
                    XCTAssertFalse(hexDigits.contains(byte), "byte \(byte) at \(position)")
                }
                XCTAssertEqual(parsed.string, String(decoding: candidate, as: UTF8.self))
            }
        }
    }

    /// Random tokens round-trip through both forms, and equal text makes equal (and equally hashed) values.
    func testRandomTokensRoundTrip() {
        var generator = SplitMix64(seed: 11)
        for _ in 0..<1000 {
            let text = (0..<4).map { _ in
                let hex = String(generator.next(), radix: 16)
                return String(repeating: "0", count: 16 - hex.count) + hex
            }.joined()
            let token = RecipientToken(text)
            guard case .hex64 = token else { return XCTFail("\(text) was not packed") }
            XCTAssertEqual(token.string, text)
            XCTAssertEqual(RecipientToken(token.string), token)
            XCTAssertEqual(Set([token, RecipientToken(String(text))]).count, 1)
        }
    }

    /// The eight-digits-at-once speller both ids and tokens use agrees with `String(_:radix:)`.
    func testEightDigitsAtOnceMatchRadix16() {
        var generator = SplitMix64(seed: 5)
        let values: [UInt32] = [0, 1, 9, 10, 15, 16, 0xABCD_EF01, 0x0F0F_0F0F, 0xF0F0_F0F0, .max]
        for value in values + (0..<10_000).map({ _ in UInt32(truncatingIfNeeded: generator.next()) }) {
            let digits = ASCIIBytes.lowercaseHexWord(of: value).littleEndian
            let text = withUnsafeBytes(of: digits) { String(decoding: $0, as: UTF8.self) }
            let expected = String(value, radix: 16)
            XCTAssertEqual(text, String(repeating: "0", count: 8 - expected.count) + expected)
        }
    }
}
