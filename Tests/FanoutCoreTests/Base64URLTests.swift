import FanoutCore
import XCTest

final class Base64URLTests: XCTestCase {
    func testRFC7515AppendixCExample() {
        XCTAssertEqual(Base64URL.encode([3, 236, 255, 224, 193]), "A-z_4ME")
        XCTAssertEqual(Base64URL.decode("A-z_4ME"), [3, 236, 255, 224, 193])
    }

    func testRFC7515JWSHeaderAndPayloadExamples() {
        let header: [UInt8] = [
            123, 34, 116, 121, 112, 34, 58, 34, 74, 87, 84, 34, 44, 13, 10, 32, 34, 97, 108, 103, 34, 58, 34, 72, 83,
            50, 53, 54, 34, 125,
        ]
        XCTAssertEqual(Base64URL.encode(header), "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9")
        XCTAssertEqual(Base64URL.decode("eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9"), header)

        let payload = "{\"iss\":\"joe\",\r\n \"exp\":1300819380,\r\n \"http://example.com/is_root\":true}"
        let encoded = "eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ"
        XCTAssertEqual(Base64URL.encode(payload), encoded)
        XCTAssertEqual(Base64URL.decode(encoded), Array(payload.utf8))
    }

    func testRFC4648TestVectorsWithoutPadding() {
        let vectors = [
            ("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg"), ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ]
        for (plain, encoded) in vectors {
            XCTAssertEqual(Base64URL.encode(plain), encoded)
            XCTAssertEqual(Base64URL.decode(encoded), Array(plain.utf8))
        }
    }

    func testRoundTripsEveryLengthAndByteValue() {
        var generator = SplitMix64(seed: 7)
        for length in 0...100 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let encoded = Base64URL.encode(bytes)
            XCTAssertFalse(encoded.contains("="))
            XCTAssertFalse(encoded.contains("+"))
            XCTAssertFalse(encoded.contains("/"))
            XCTAssertEqual(Base64URL.decode(encoded), bytes, "length \(length)")
        }
        let allBytes = (0...255).map { UInt8($0) }
        XCTAssertEqual(Base64URL.decode(Base64URL.encode(allBytes)), allBytes)
    }

    func testRejectsPaddingStandardAlphabetAndDanglingCharacter() {
        XCTAssertNil(Base64URL.decode("Zg=="))
        XCTAssertNil(Base64URL.decode("A+z/4ME"))
        XCTAssertNil(Base64URL.decode("Zm9vY"))
        XCTAssertNil(Base64URL.decode("Zm9v Yg"))
        XCTAssertNil(Base64URL.decode("Zm9vYé"))
    }

    func testRejectsNonCanonicalTrailingBits() {
        XCTAssertEqual(Base64URL.decode("Zg"), [0x66])
        XCTAssertNil(Base64URL.decode("Zh"), "the low 4 bits of 'h' would be discarded")
        XCTAssertEqual(Base64URL.decode("Zm8"), [0x66, 0x6F])
        XCTAssertNil(Base64URL.decode("Zm9"), "the low 2 bits of '9' would be discarded")
    }

    func testDecodesUTF8Bytes() {
        let jwt = Array("eyJhbGciOiJFUzI1NiJ9.e30.A-z_4ME".utf8)
        let parts = jwt.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        XCTAssertEqual(
            Base64URL.decode(utf8: parts[0]).map { String(decoding: $0, as: UTF8.self) }, #"{"alg":"ES256"}"#)
        XCTAssertEqual(Base64URL.decode(utf8: parts[1]), Array("{}".utf8))
        XCTAssertEqual(Base64URL.decode(utf8: parts[2]), [3, 236, 255, 224, 193])
    }
}
