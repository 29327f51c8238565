import FanoutCore
import XCTest

final class DeviceTokenTests: XCTestCase {
    let lowercase64 = String(repeating: "0123456789abcdef", count: 4)

    func testAcceptsTypicalLowercaseTokenUnchanged() {
        let token = DeviceToken(lowercase64)
        XCTAssertEqual(token?.hex, lowercase64)
        XCTAssertEqual(token?.description, lowercase64)
    }

    /// The eight-bytes-at-a-time check for lowercase tokens agrees with the byte-by-byte one on every byte in every
    /// position, for a token whose length is a multiple of eight and one whose length is not.
    func testFastLowercaseCheckAgreesWithTheByteScan() {
        for length in [64, 66, 72] {
            let valid = Array(String(repeating: "0123456789abcdef", count: 5).utf8.prefix(length))
            for position in valid.indices {
                for byte in UInt8.min...UInt8.max {
                    var candidate = valid
                    candidate[position] = byte
                    let text = String(decoding: candidate, as: UTF8.self)
                    guard text.utf8.count == length else { continue }  // a lone byte past 0x7F is repaired
                    XCTAssertEqual(
                        DeviceToken(text)?.hex, DeviceToken(utf8: candidate[...])?.hex, "byte \(byte) at \(position)")
                }
            }
        }
    }

    func testNormalisesUppercaseToLowercase() {
        let token = DeviceToken(lowercase64.uppercased())
        XCTAssertEqual(token?.hex, lowercase64)
        XCTAssertEqual(DeviceToken(lowercase64.uppercased()), DeviceToken(lowercase64))
    }

    func testLengthBounds() {
        XCTAssertNil(DeviceToken(String(repeating: "a", count: 62)))
        XCTAssertNil(DeviceToken(String(repeating: "a", count: 63)))
        XCTAssertNotNil(DeviceToken(String(repeating: "a", count: 64)))
        XCTAssertNil(DeviceToken(String(repeating: "a", count: 65)), "odd length")
        XCTAssertNotNil(DeviceToken(String(repeating: "a", count: 66)))
        XCTAssertNotNil(DeviceToken(String(repeating: "a", count: 200)))
        XCTAssertNil(DeviceToken(String(repeating: "a", count: 202)))
        XCTAssertNil(DeviceToken(""))
    }

    func testRejectsNonHexAndWhitespace() {
        var bad = Array(lowercase64)
        bad[10] = "g"
        XCTAssertNil(DeviceToken(String(bad)))
        XCTAssertNil(DeviceToken(" " + lowercase64.dropFirst()))
        XCTAssertNil(DeviceToken(lowercase64.dropLast(2) + "\r\n"))
        XCTAssertNil(DeviceToken(String(repeating: "é", count: 32)))
        XCTAssertFalse(DeviceToken.isValid(String(bad)))
        XCTAssertTrue(DeviceToken.isValid(lowercase64))
    }

    func testSubstringAndBytesInputs() {
        let line = "  " + lowercase64.uppercased() + "  "
        let trimmed = line.dropFirst(2).dropLast(2)
        XCTAssertEqual(DeviceToken(trimmed)?.hex, lowercase64)
        XCTAssertEqual(DeviceToken(utf8: Array(lowercase64.uppercased().utf8))?.hex, lowercase64)
        XCTAssertTrue(DeviceToken.isValid(utf8: Array(lowercase64.utf8)))
        XCTAssertFalse(DeviceToken.isValid(utf8: Array(lowercase64.utf8).dropLast()))
    }
}
