/// An `apns-id` or `apns-unique-id` on its way through the engine. A lowercase canonical UUID (what Fanout makes
/// and what APNs answers) is kept as its two 64-bit halves, so making an id, sending it, reading the answer's ids
/// and handing them to the results makes no String: two allocations per notification fewer than keeping them as
/// text. Anything else (an id a caller chose in uppercase, an answer's id in another form) is kept as given, so
/// every id is reported exactly as it was sent or received. Spelled out (`string`, `withUTF8`) where it is written.
package enum APNsIdentifier: Sendable, Hashable, CustomStringConvertible {
    case uuid(high: UInt64, low: UInt64)
    case text(String)

    /// A random version 4 UUID from `generator`.
    package static func random(using generator: inout some RandomNumberGenerator) -> APNsIdentifier {
        version4(randomHigh: generator.next(), randomLow: generator.next())
    }

    /// The version 4 UUID made of two random words: version 4 in the high nibble of byte 6, variant 0b10 in the top
    /// bits of byte 8 (RFC 9562). For callers in other modules that draw the words themselves (`random` is generic
    /// over the generator, and runs unspecialised from there).
    package static func version4(randomHigh: UInt64, randomLow: UInt64) -> APNsIdentifier {
        .uuid(high: randomHigh & ~0xF000 | 0x4000, low: randomLow & 0x3FFF_FFFF_FFFF_FFFF | 0x8000_0000_0000_0000)
    }

    /// `text` as an identifier: its halves when it is a lowercase canonical UUID, the text itself otherwise.
    package init(_ text: String) {
        var utf8 = text
        if let halves = utf8.withUTF8({ Self.parse(UnsafeRawBufferPointer($0)) }) {
            self = .uuid(high: halves.high, low: halves.low)
        } else {
            self = .text(text)
        }
    }

    /// The bytes of a header value as an identifier, as `init(_:)` reads text.
    package init(utf8 bytes: UnsafeRawBufferPointer) {
        if let halves = Self.parse(bytes) {
            self = .uuid(high: halves.high, low: halves.low)
        } else {
            self = .text(String(decoding: bytes, as: UTF8.self))
        }
    }

    package var string: String {
        switch self {
        case .text(let text):
            return text
        case .uuid(let high, let low):
            return String(unsafeUninitializedCapacity: APNsID.length) { buffer in
                Self.spell(high: high, low: low, into: UnsafeMutableRawBufferPointer(buffer))
                return APNsID.length
            }
        }
    }

    package var description: String { string }

    package var storedText: String? {
        if case .text(let text) = self { return text }
        return nil
    }

    /// Lends `body` the identifier's UTF-8 bytes (a UUID is spelled on the stack), valid only inside `body`.
    ///
    /// Not generic over a result: a generic method called from another module runs unspecialized, and this one is
    /// called for every result and every `apns-id` sent; each call then looked up its temporary allocation's generic
    /// metadata under the runtime's lock (a third of `fanout serve`'s results writer). A caller keeps what it needs.
    package func withUTF8(_ body: (UnsafeRawBufferPointer) -> Void) {
        switch self {
        case .text(var text):
            text.withUTF8 { body(UnsafeRawBufferPointer($0)) }
        case .uuid(let high, let low):
            withUnsafeTemporaryAllocation(byteCount: APNsID.length, alignment: 1) { buffer in
                Self.spell(high: high, low: low, into: buffer)
                body(UnsafeRawBufferPointer(buffer))
            }
        }
    }

    /// Writes the identifier's UTF-8 bytes at the start of `buffer`, which holds at least as many (36 for a UUID).
    package func write(into buffer: UnsafeMutableRawBufferPointer) {
        switch self {
        case .text(var text):
            text.withUTF8 { buffer.copyMemory(from: UnsafeRawBufferPointer($0)) }
        case .uuid(let high, let low):
            Self.spell(high: high, low: low, into: buffer)
        }
    }

    /// Writes the 36 characters of the UUID with these halves, in lowercase, into the first 36 bytes of `buffer`:
    /// eight digits at a time (`ASCIIBytes.lowercaseHexWord(of:)`), the dashes written over where they go.
    private static func spell(high: UInt64, low: UInt64, into buffer: UnsafeMutableRawBufferPointer) {
        precondition(buffer.count >= APNsID.length, "a UUID spells 36 bytes")
        func eight(_ value: UInt64) -> UInt64 {
            ASCIIBytes.lowercaseHexWord(of: UInt32(truncatingIfNeeded: value)).littleEndian
        }
        func four(_ digits: UInt64) -> UInt32 { UInt32(truncatingIfNeeded: digits) }
        // 8-4-4-4-12: digits 0-7 | 8-11 - 12-15 | 16-19 - 20-23 | 24-31.
        let middleHigh = eight(high)
        let middleLow = eight(low >> 32)
        buffer.storeBytes(of: eight(high >> 32), toByteOffset: 0, as: UInt64.self)
        buffer[8] = UInt8(ascii: "-")
        buffer.storeBytes(of: four(middleHigh), toByteOffset: 9, as: UInt32.self)
        buffer[13] = UInt8(ascii: "-")
        buffer.storeBytes(of: four(middleHigh >> 32), toByteOffset: 14, as: UInt32.self)
        buffer[18] = UInt8(ascii: "-")
        buffer.storeBytes(of: four(middleLow), toByteOffset: 19, as: UInt32.self)
        buffer[23] = UInt8(ascii: "-")
        buffer.storeBytes(of: four(middleLow >> 32), toByteOffset: 24, as: UInt32.self)
        buffer.storeBytes(of: eight(low), toByteOffset: 28, as: UInt64.self)
    }

    /// The halves of a lowercase canonical UUID; nil for anything else (uppercase too: it must read back as sent).
    /// Four characters at a time (`fourDigits`): a byte-at-a-time loop would be 5% of a fan-out's CPU, for the two ids
    /// of every answer.
    private static func parse(_ bytes: UnsafeRawBufferPointer) -> (high: UInt64, low: UInt64)? {
        guard bytes.count == APNsID.length, bytes[8] == UInt8(ascii: "-"), bytes[13] == UInt8(ascii: "-"),
            bytes[18] == UInt8(ascii: "-"), bytes[23] == UInt8(ascii: "-"),
            let c0 = fourDigits(bytes, 0), let c1 = fourDigits(bytes, 4), let c2 = fourDigits(bytes, 9),
            let c3 = fourDigits(bytes, 14), let c4 = fourDigits(bytes, 19), let c5 = fourDigits(bytes, 24),
            let c6 = fourDigits(bytes, 28), let c7 = fourDigits(bytes, 32)
        else { return nil }
        return (c0 << 48 | c1 << 32 | c2 << 16 | c3, c4 << 48 | c5 << 32 | c6 << 16 | c7)
    }

    /// The 16-bit value of the four lowercase hex digits at `offset`, nil if any is not one; all four bytes at once.
    @inline(__always)
    static func fourDigits(_ bytes: UnsafeRawBufferPointer, _ offset: Int) -> UInt64? {
        let word = bytes.loadUnaligned(fromByteOffset: offset, as: UInt32.self)
        guard areLowercaseHexDigits(word) else { return nil }
        let ones: UInt32 = 0x0101_0101
        // Each byte's value: its low nibble, plus 9 for a letter (bit 6 set).
        let nibbles = (word & (0x0F &* ones)) &+ ((word >> 6) & ones) &* 9
        // The first character is the lowest byte and the most significant digit: swap, then pack pairs and halves.
        let swapped = nibbles.bigEndian
        let pairs = (swapped | swapped >> 4) & 0x00FF_00FF
        return UInt64((pairs | pairs >> 8) & 0xFFFF)
    }

    /// Whether the four bytes of `word` are all 0-9 or a-f.
    @inline(__always)
    static func areLowercaseHexDigits(_ word: UInt32) -> Bool {
        let ones: UInt32 = 0x0101_0101
        // For bytes below 0x80 (checked first) each sum stays below 0x100, so no byte carries into the next; bit 7
        // of each byte then says on which side of a bound the byte is: at least "0", below ":", at least "a",
        // below "g".
        guard word & (0x80 &* ones) == 0 else { return false }
        let atLeastZero = (word &+ 0x50 &* ones)
        let belowColon = ~(word &+ 0x46 &* ones)
        let atLeastA = (word &+ 0x1F &* ones)
        let belowG = ~(word &+ 0x19 &* ones)
        return (atLeastZero & belowColon | atLeastA & belowG) & (0x80 &* ones) == 0x80 &* ones
    }

    /// Whether the four bytes of `word` are all hex digits, in either case: setting bit 0x20 lowercases A-F, and
    /// maps nothing else onto a hex digit but the control bytes 0x10-0x19, which are refused first.
    @inline(__always)
    static func areHexDigits(_ word: UInt32) -> Bool {
        let ones: UInt32 = 0x0101_0101
        // Bit 7 of each byte after adding 0x60 (no carry for bytes below 0x80): set for bytes from 0x20 up.
        guard word & (0x80 &* ones) == 0, (word &+ 0x60 &* ones) & (0x80 &* ones) == 0x80 &* ones else { return false }
        return areLowercaseHexDigits(word | 0x20 &* ones)
    }
}
