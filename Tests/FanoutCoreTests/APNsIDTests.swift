import FanoutCore
import XCTest

final class APNsIDTests: XCTestCase {
    func testGeneratedIDsAreCanonicalLowercaseVersion4() {
        for _ in 0..<1000 {
            let id = APNsID.generate()
            XCTAssertEqual(id.utf8.count, 36)
            XCTAssertTrue(APNsID.isValid(id), id)
            XCTAssertEqual(id, id.lowercased())
            let characters = Array(id)
            XCTAssertEqual([characters[8], characters[13], characters[18], characters[23]], ["-", "-", "-", "-"])
            XCTAssertEqual(characters[14], "4", "version nibble in \(id)")
            XCTAssertTrue("89ab".contains(characters[19]), "variant nibble in \(id)")
        }
    }

    func testTenThousandGeneratedIDsAreUnique() {
        var seen = Set<String>()
        for _ in 0..<10_000 {
            seen.insert(APNsID.generate())
        }
        XCTAssertEqual(seen.count, 10_000)
    }

    func testSeededGeneratorIsReproducible() {
        var first = SplitMix64(seed: 42)
        var second = SplitMix64(seed: 42)
        let a = APNsID.generate(using: &first)
        XCTAssertEqual(a, APNsID.generate(using: &second))
        XCTAssertNotEqual(a, APNsID.generate(using: &first))
    }

    func testKnownWordsProduceTheExpectedText() {
        var generator = FixedWords(words: [0x0123_4567_89AB_CDEF, 0xFEDC_BA98_7654_3210])
        // Version nibble forced to 4 (byte 6) and variant to 0b10 (byte 8: 0xFE -> 0xBE).
        XCTAssertEqual(APNsID.generate(using: &generator), "01234567-89ab-4def-bedc-ba9876543210")
    }

    func testValidation() {
        XCTAssertTrue(APNsID.isValid("eabeae54-14a8-11e5-b60b-1697f925ec7b"))
        XCTAssertTrue(APNsID.isValid("EABEAE54-14A8-11E5-B60B-1697F925EC7B"))
        XCTAssertTrue(APNsID.isValid(utf8: Array("00000000-0000-0000-0000-000000000000".utf8)))
        XCTAssertFalse(APNsID.isValid(""))
        XCTAssertFalse(APNsID.isValid("eabeae5414a811e5b60b1697f925ec7b"))
        XCTAssertFalse(APNsID.isValid("eabeae54-14a8-11e5-b60b-1697f925ec7"))
        XCTAssertFalse(APNsID.isValid("eabeae54-14a8-11e5-b60b-1697f925ec7bb"))
        XCTAssertFalse(APNsID.isValid("eabeae5-414a8-11e5-b60b-1697f925ec7b"))
        XCTAssertFalse(APNsID.isValid("gabeae54-14a8-11e5-b60b-1697f925ec7b"))
        XCTAssertFalse(APNsID.isValid("{abeae54-14a8-11e5-b60b-1697f925ec7}"))
    }

    /// An id the engine keeps as two words reads back exactly as it was given: lowercase UUIDs as words, anything
    /// else (uppercase, not a UUID) as the text itself.
    func testIdentifierKeepsWhatItWasGiven() {
        let lowercase = "eabeae54-14a8-11e5-b60b-1697f925ec7b"
        XCTAssertEqual(APNsIdentifier(lowercase), .uuid(high: 0xEABE_AE54_14A8_11E5, low: 0xB60B_1697_F925_EC7B))
        XCTAssertEqual(APNsIdentifier(lowercase).string, lowercase)
        for text in ["EABEAE54-14A8-11E5-B60B-1697F925EC7B", "id-7", "", "eabeae54-14a8-11e5-b60b-1697f925ec7", "u-1"] {
            XCTAssertEqual(APNsIdentifier(text), .text(text))
            XCTAssertEqual(APNsIdentifier(text).string, text)
        }
        for text in [lowercase, "EABEAE54-14A8-11E5-B60B-1697F925EC7B", "u-1"] {
            let fromBytes = Array(text.utf8).withUnsafeBytes { APNsIdentifier(utf8: $0) }
            XCTAssertEqual(fromBytes, APNsIdentifier(text))
            var spelled = ""
            fromBytes.withUTF8 { spelled = String(decoding: $0, as: UTF8.self) }
            XCTAssertEqual(spelled, text)
        }
        // Every byte in every position of a lowercase id: words exactly when the text is still a lowercase id.
        let valid = Array(lowercase.utf8)
        let hexDigits = Set("0123456789abcdef".utf8)
        for position in valid.indices {
            for byte in UInt8.min...UInt8.max {
                var candidate = valid
                candidate[position] = byte
                let text = String(decoding: candidate, as: UTF8.self)
                let expectWords =
                    [8, 13, 18, 23].contains(position) ? byte == UInt8(ascii: "-") : hexDigits.contains(byte)
                let parsed = candidate.withUnsafeBytes { APNsIdentifier(utf8: $0) }
                if case .uuid = parsed {
                    XCTAssertTrue(expectWords, "byte \(byte) at \(position)")
                } else {
                    XCTAssertFalse(expectWords, "byte \(byte) at \(position)")
                }
                XCTAssertEqual(parsed.string, text)
            }
        }
        var generator = SplitMix64(seed: 7)
        for _ in 0..<100 {
            let id = APNsIdentifier.random(using: &generator)
            XCTAssertTrue(APNsID.isValid(id.string))
            XCTAssertEqual(APNsIdentifier(id.string), id, "a generated id parses back to the same words")
        }
    }

    /// The contiguous-bytes check (mock-apns's) agrees with the generic one on every byte in every position of a
    /// valid id, and on the lengths around 36.
    func testContiguousValidationAgreesWithGeneric() {
        let valid = Array("eabeae54-14a8-11e5-b60b-1697f925ec7b".utf8)
        for position in valid.indices {
            for byte in UInt8.min...UInt8.max {
                var candidate = valid
                candidate[position] = byte
                let contiguous = candidate.withUnsafeBufferPointer { APNsID.isValid(utf8: $0) }
                XCTAssertEqual(contiguous, APNsID.isValid(utf8: candidate[...]), "byte \(byte) at \(position)")
            }
        }
        for length in [0, 35, 37] {
            let candidate = Array(repeating: UInt8(ascii: "a"), count: length)
            XCTAssertFalse(candidate.withUnsafeBufferPointer { APNsID.isValid(utf8: $0) })
        }
    }
}

/// A small deterministic generator for reproducibility tests.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64

    init(seed: UInt64) {
        state = seed
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Returns the given words in order, to pin the generator's output.
struct FixedWords: RandomNumberGenerator {
    var words: [UInt64]

    mutating func next() -> UInt64 {
        words.removeFirst()
    }
}
