/// Byte-level ASCII helpers shared by the validators and encoders.
///
/// Device tokens, apns-ids, header values and JSON are checked once per notification (and once per request in the
/// mock), so these work on UTF-8 bytes with plain comparisons instead of `Character` or Foundation APIs.
package enum ASCIIBytes {
    /// The lowercase hex digits, indexed by nibble value.
    package static let lowercaseHexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    /// The eight lowercase hex digits of `value`, most significant first, as the eight bytes of a little-endian
    /// word (store it with `storeBytes(of: digits.littleEndian, ...)`), all at once: the nibbles spread one per
    /// byte, then "0" added to each and 39 more ("a" - "0" - 10) to those of 10 and above. Ids and tokens are
    /// spelled into every request and results line, and a nibble-at-a-time loop would be 2% of `fanout send`'s CPU.
    @inline(__always)
    package static func lowercaseHexWord(of value: UInt32) -> UInt64 {
        let ones: UInt64 = 0x0101_0101_0101_0101
        // The value's bytes, most significant first, one per 16-bit lane, then each byte's two nibbles one per byte
        // (the high nibble first, in the lower byte).
        var lanes = UInt64(value.byteSwapped)
        lanes = (lanes | lanes << 16) & 0x0000_FFFF_0000_FFFF
        lanes = (lanes | lanes << 8) & 0x00FF_00FF_00FF_00FF
        let nibbles = (lanes >> 4) & 0x000F_000F_000F_000F | (lanes & 0x000F_000F_000F_000F) << 8
        let letters = ((nibbles &+ 0x06 &* ones) >> 4) & ones
        return nibbles &+ 0x30 &* ones &+ letters &* 39
    }

    /// The value of a hex digit (either case), or nil for any other byte.
    @inline(__always)
    package static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte &- UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte &- UInt8(ascii: "a") &+ 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte &- UInt8(ascii: "A") &+ 10
        default: return nil
        }
    }

    @inline(__always)
    package static func isHexDigit(_ byte: UInt8) -> Bool {
        hexValue(byte) != nil
    }

    @inlinable @inline(__always)
    package static func isUppercaseLetter(_ byte: UInt8) -> Bool {
        byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z")
    }

    /// Lowercases an ASCII letter and leaves every other byte alone.
    @inlinable @inline(__always)
    package static func lowercased(_ byte: UInt8) -> UInt8 {
        isUppercaseLetter(byte) ? byte | 0x20 : byte
    }

    /// Whether a byte may not appear in an HTTP header value (controls other than tab, and DEL): nghttp2 refuses such
    /// values, so senders catch them before building a request.
    @inline(__always)
    package static func isForbiddenInHeaderValue(_ byte: UInt8) -> Bool {
        (byte < 0x20 && byte != UInt8(ascii: "\t")) || byte == 0x7F
    }

    /// Parses a non-negative decimal integer made only of digits (no sign, no spaces), as APNs expects in
    /// `apns-expiration` and `apns-priority`. Nil when empty, when any byte is not a digit, or on overflow.
    package static func parseNonNegativeInt64(_ bytes: some Sequence<UInt8>) -> Int64? {
        guard let value = parseDigits(bytes), value <= UInt64(Int64.max) else { return nil }
        return Int64(value)
    }

    /// The value of one or more decimal digits (nothing else); nil when empty, for any other byte, or on overflow.
    package static func parseDigits(_ bytes: some Sequence<UInt8>) -> UInt64? {
        var value: UInt64 = 0
        var sawDigit = false
        for byte in bytes {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            let (shifted, overflowA) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflowB) = shifted.addingReportingOverflow(UInt64(byte &- UInt8(ascii: "0")))
            guard !overflowA, !overflowB else { return nil }
            value = sum
            sawDigit = true
        }
        return sawDigit ? value : nil
    }

    /// Whether two byte sequences are equal, ignoring ASCII case (HTTP scheme names such as `bearer`).
    /// `@inlinable` so that callers in other modules (mock-apns checks every request's `authorization`) get a
    /// specialised copy instead of generic code that looks up type metadata at run time.
    @inlinable
    package static func equalsIgnoringCase(_ lhs: some Collection<UInt8>, _ rhs: some Collection<UInt8>) -> Bool {
        guard lhs.count == rhs.count else { return false }
        var right = rhs.makeIterator()
        for byte in lhs {
            guard let other = right.next(), lowercased(byte) == lowercased(other) else { return false }
        }
        return true
    }
}
