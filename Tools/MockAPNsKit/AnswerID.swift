import FanoutCore

/// A random version 4 UUID in lowercase, as `APNsID.generate` makes, for an answer's `apns-id` and
/// `apns-unique-id`: written straight into the new string's storage (or the answer's header bytes) by
/// `APNsIdentifier.write(into:)`, eight hex digits at a time, computed rather than looked up in a shared table (whose
/// access showed, with its retain and bounds checks, in mock-apns's profile). Appending pieces to a reused string
/// instead, to avoid the allocation, would cost more than the allocation.
package enum AnswerID {
    package static func generate(using generator: inout some RandomNumberGenerator) -> String {
        String(unsafeUninitializedCapacity: APNsID.length) { buffer in
            write(using: &generator, into: UnsafeMutableRawBufferPointer(buffer))
            return APNsID.length
        }
    }

    /// Writes a new id into the first `APNsID.length` bytes of `buffer` (an accepted answer's headers, with no
    /// string made).
    @inline(__always)
    package static func write(
        using generator: inout some RandomNumberGenerator, into buffer: UnsafeMutableRawBufferPointer
    ) {
        APNsIdentifier.version4(randomHigh: generator.next(), randomLow: generator.next()).write(into: buffer)
    }
}
