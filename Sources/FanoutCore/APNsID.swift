/// The `apns-id` request header: a canonical UUID (8-4-4-4-12 hex digits) that APNs echoes back, so that a response,
/// a retry and the mock's record can all be matched to one notification.
///
/// Fanout gives every notification its own id, so generation is on the hot path: two random 64-bit words are written
/// as hex straight into a 36-byte string, with no `UUID` or Foundation round trip.
package enum APNsID {
    /// The length of a canonical UUID string.
    package static let length = 36

    /// A random version 4 UUID in lowercase, from the system's cryptographic generator.
    package static func generate() -> String {
        var generator = SystemRandomNumberGenerator()
        return generate(using: &generator)
    }

    /// A random version 4 UUID in lowercase from `generator` (a seeded generator gives reproducible ids in tests).
    package static func generate(using generator: inout some RandomNumberGenerator) -> String {
        // Version 4 in the high nibble of byte 6, variant 0b10 in the top bits of byte 8 (RFC 9562).
        let high = (generator.next() as UInt64) & ~0xF000 | 0x4000
        let low = (generator.next() as UInt64) & 0x3FFF_FFFF_FFFF_FFFF | 0x8000_0000_0000_0000
        return String(unsafeUninitializedCapacity: length) { buffer in
            let digits = ASCIIBytes.lowercaseHexDigits
            var index = 0
            for nibble in 0..<32 {
                if nibble == 8 || nibble == 12 || nibble == 16 || nibble == 20 {
                    buffer[index] = UInt8(ascii: "-")
                    index += 1
                }
                let word = nibble < 16 ? high : low
                let shift = UInt64(60 - (nibble % 16) * 4)
                buffer[index] = digits[Int((word >> shift) & 0xF)]
                index += 1
            }
            return index
        }
    }

    /// Whether `text` is a canonical UUID: 36 characters, dashes at offsets 8, 13, 18 and 23, hex digits elsewhere.
    /// Either case is accepted, as UUID parsers accept both, and the version and variant bits are not checked.
    package static func isValid(_ text: some StringProtocol) -> Bool {
        isValid(utf8: text.utf8)
    }

    /// Whether `bytes` spell a canonical UUID.
    package static func isValid(utf8 bytes: some Collection<UInt8>) -> Bool {
        guard bytes.count == length else { return false }
        var offset = 0
        for byte in bytes {
            if offset == 8 || offset == 13 || offset == 18 || offset == 23 {
                guard byte == UInt8(ascii: "-") else { return false }
            } else {
                guard ASCIIBytes.isHexDigit(byte) else { return false }
            }
            offset += 1
        }
        return true
    }
}
