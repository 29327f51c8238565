import FanoutCore

/// An id header value (`apns-id`, `apns-unique-id`) rewritten in place for each answer: a new random version 4 UUID
/// in lowercase, as `APNsID.generate` makes, written into the storage of the previous one when nothing else holds
/// it, so that an answer allocates no string for its ids. Confined to one loop.
struct ReusedID {
    private(set) var value = String(repeating: "0", count: APNsID.length)

    /// Replaces `value` with a new id from `generator`.
    mutating func regenerate(using generator: inout some RandomNumberGenerator) {
        // Version 4 in the high nibble of byte 6, variant 0b10 in the top bits of byte 8 (RFC 9562).
        let high = (generator.next() as UInt64) & ~0xF000 | 0x4000
        let low = (generator.next() as UInt64) & 0x3FFF_FFFF_FFFF_FFFF | 0x8000_0000_0000_0000
        // Three pieces of at most 15 bytes are small strings (no allocation); appended to storage that already has
        // room for 36 bytes, they are copied in place.
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: APNsID.length) { buffer in
            var index = 0
            for nibble in 0..<32 {
                if nibble == 8 || nibble == 12 || nibble == 16 || nibble == 20 {
                    buffer[index] = UInt8(ascii: "-")
                    index += 1
                }
                let word = nibble < 16 ? high : low
                let digit = UInt8(truncatingIfNeeded: (word >> UInt64(60 - (nibble % 16) * 4)) & 0xF)
                buffer[index] = digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10
                index += 1
            }
            value.removeAll(keepingCapacity: true)
            for start in stride(from: 0, to: APNsID.length, by: 12) {
                value.append(
                    String(decoding: UnsafeBufferPointer(rebasing: buffer[start..<start + 12]), as: UTF8.self))
            }
        }
    }
}
