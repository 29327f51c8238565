import FanoutCore

/// A random version 4 UUID in lowercase, as `APNsID.generate` makes, for an answer's `apns-id` and
/// `apns-unique-id`: written straight into the new string's storage (or the answer's header bytes) by
/// `APNsIdentifier.write(into:)`, eight hex digits at a time, computed rather than looked up in a shared table (whose
/// access showed, with its retain and bounds checks, in mock-apns's profile). Appending pieces to a reused string
/// instead, to avoid the allocation, cost more than the allocation.
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
        // Drawn here rather than by `APNsIdentifier.random`, which is generic over the generator and would run
        // unspecialised from this module. Version 4 in the high nibble of byte 6, variant 0b10 in the top bits of
        // byte 8 (RFC 9562).
        let high = (generator.next() as UInt64) & ~0xF000 | 0x4000
        let low = (generator.next() as UInt64) & 0x3FFF_FFFF_FFFF_FFFF | 0x8000_0000_0000_0000
        APNsIdentifier.uuid(high: high, low: low).write(into: UnsafeMutableRawBufferPointer(buffer))
    }
}
