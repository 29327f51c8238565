/// The `apns-id` request header: a canonical UUID (8-4-4-4-12 hex digits) that APNs echoes back, so that a response,
/// a retry and the mock's record can all be matched to one notification.
///
/// Fanout gives every notification its own id, so generation is on the hot path: the engine keeps ids as two random
/// 64-bit words (`APNsIdentifier`) and spells them only where they are written, with no `UUID` or Foundation round
/// trip.
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
        APNsIdentifier.random(using: &generator).string
    }

    /// Whether `text` is a canonical UUID: 36 characters, dashes at offsets 8, 13, 18 and 23, hex digits elsewhere.
    /// Either case is accepted, as UUID parsers accept both, and the version and variant bits are not checked.
    package static func isValid(_ text: some StringProtocol) -> Bool {
        isValid(utf8: text.utf8)
    }

    /// `isValid(utf8:)` over contiguous bytes, non-generic so that a caller in another module (mock-apns checks the
    /// apns-id of every request) runs it directly, four bytes at a time: the generic one would run there unspecialised
    /// (a witness call per byte), and even a byte-at-a-time loop would be 2% of the mock's CPU under Fanout.
    package static func isValid(utf8 bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        guard bytes.count == length else { return false }
        let dash = UInt8(ascii: "-")
        guard bytes[8] == dash, bytes[13] == dash, bytes[18] == dash, bytes[23] == dash else { return false }
        let raw = UnsafeRawBufferPointer(bytes)
        func hex(_ offset: Int) -> Bool {
            APNsIdentifier.areHexDigits(raw.loadUnaligned(fromByteOffset: offset, as: UInt32.self))
        }
        return hex(0) && hex(4) && hex(9) && hex(14) && hex(19) && hex(24) && hex(28) && hex(32)
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
