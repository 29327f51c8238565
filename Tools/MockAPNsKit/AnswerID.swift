import FanoutCore

/// A random version 4 UUID in lowercase, as `APNsID.generate` makes, for an answer's `apns-id` and
/// `apns-unique-id`: written straight into the new string's storage (or the answer's header bytes), eight hex digits
/// at a time, computed rather than looked up in a shared table (whose access showed, with its retain and bounds checks, in mock-apns's profile). Appending
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
        let raw = UnsafeMutableRawPointer(buffer.baseAddress!)
        raw.storeBytes(of: hexDigits(UInt32(truncatingIfNeeded: high >> 32)), as: UInt64.self)
        raw.storeBytes(of: UInt8(ascii: "-"), toByteOffset: 8, as: UInt8.self)
        let middle = hexDigits(UInt32(truncatingIfNeeded: high))
        raw.storeBytes(of: UInt32(truncatingIfNeeded: middle), toByteOffset: 9, as: UInt32.self)
        raw.storeBytes(of: UInt8(ascii: "-"), toByteOffset: 13, as: UInt8.self)
        raw.storeBytes(of: UInt32(truncatingIfNeeded: middle >> 32), toByteOffset: 14, as: UInt32.self)
        raw.storeBytes(of: UInt8(ascii: "-"), toByteOffset: 18, as: UInt8.self)
        let first = hexDigits(UInt32(truncatingIfNeeded: low >> 32))
        raw.storeBytes(of: UInt32(truncatingIfNeeded: first), toByteOffset: 19, as: UInt32.self)
        raw.storeBytes(of: UInt8(ascii: "-"), toByteOffset: 23, as: UInt8.self)
        raw.storeBytes(of: UInt32(truncatingIfNeeded: first >> 32), toByteOffset: 24, as: UInt32.self)
        raw.storeBytes(of: hexDigits(UInt32(truncatingIfNeeded: low)), toByteOffset: 28, as: UInt64.self)
    }

    /// The 8 lowercase hex digits of `value`, most significant first in memory (a little-endian word): the nibbles
    /// spread one to a byte, then turned into ASCII all at once, with no table and no loop.
    @inline(__always)
    private static func hexDigits(_ value: UInt32) -> UInt64 {
        var nibbles = UInt64(value)
        nibbles = (nibbles | nibbles << 16) & 0x0000_FFFF_0000_FFFF
        nibbles = (nibbles | nibbles << 8) & 0x00FF_00FF_00FF_00FF
        nibbles = (nibbles | nibbles << 4) & 0x0F0F_0F0F_0F0F_0F0F
        // Byte k now holds nibble k (the least significant first); swapped, the most significant comes first.
        nibbles = nibbles.byteSwapped
        // 0x01 in each byte whose nibble is 10 or more, which then needs "a" - "0" - 10 = 0x27 more.
        let letters = ((nibbles &+ 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101
        return (nibbles &+ 0x3030_3030_3030_3030 &+ letters &* 0x27).littleEndian
    }
}
