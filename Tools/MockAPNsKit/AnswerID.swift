import FanoutCore

/// A random version 4 UUID in lowercase, as `APNsID.generate` makes, for an answer's `apns-id` and
/// `apns-unique-id`: written straight into the new string's storage, with the hex digits computed rather than looked
/// up in a shared table (whose access showed, with its retain and bounds checks, in mock-apns's profile). Appending
/// pieces to a reused string instead, to avoid the allocation, cost more than the allocation.
package enum AnswerID {
    package static func generate(using generator: inout some RandomNumberGenerator) -> String {
        String(unsafeUninitializedCapacity: APNsID.length) { buffer in
            write(using: &generator, into: buffer)
            return APNsID.length
        }
    }

    /// Writes a new id into the first `APNsID.length` bytes of `buffer` (an accepted answer's headers, with no
    /// string made).
    @inline(__always)
    package static func write(
        using generator: inout some RandomNumberGenerator, into buffer: UnsafeMutableRawBufferPointer
    ) {
        write(using: &generator, into: buffer.bindMemory(to: UInt8.self))
    }

    @inline(__always)
    private static func write(
        using generator: inout some RandomNumberGenerator, into buffer: UnsafeMutableBufferPointer<UInt8>
    ) {
        precondition(buffer.count >= APNsID.length)
        // Version 4 in the high nibble of byte 6, variant 0b10 in the top bits of byte 8 (RFC 9562).
        let high = (generator.next() as UInt64) & ~0xF000 | 0x4000
        let low = (generator.next() as UInt64) & 0x3FFF_FFFF_FFFF_FFFF | 0x8000_0000_0000_0000
        // 8-4-4-4-12 digits: bits 63...32, 31...16 and 15...0 of `high`, then 63...48 and 47...0 of `low`.
        write(high >> 32, digits: 8, at: 0, into: buffer)
        write(high >> 16, digits: 4, at: 9, into: buffer)
        write(high, digits: 4, at: 14, into: buffer)
        write(low >> 48, digits: 4, at: 19, into: buffer)
        write(low, digits: 12, at: 24, into: buffer)
        buffer[8] = UInt8(ascii: "-")
        buffer[13] = UInt8(ascii: "-")
        buffer[18] = UInt8(ascii: "-")
        buffer[23] = UInt8(ascii: "-")
    }

    /// The low `digits` nibbles of `word` as lowercase hex, most significant first, at `offset`.
    @inline(__always)
    private static func write(
        _ word: UInt64, digits: Int, at offset: Int, into buffer: UnsafeMutableBufferPointer<UInt8>
    ) {
        for index in 0..<digits {
            let digit = UInt8(truncatingIfNeeded: word >> UInt64(4 * (digits - 1 - index))) & 0xF
            buffer[offset + index] = digit &+ (digit < 10 ? UInt8(ascii: "0") : UInt8(ascii: "a") &- 10)
        }
    }
}
