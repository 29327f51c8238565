/// A recipient on its way through the engine: a device token, or a broadcast's channel id. A token of 64 lowercase
/// hex digits (what nearly every tokens-file line and registry row holds) is kept as its 32 bytes, so reading a
/// tokens file, sending to the token and reporting its result makes no String: one allocation per notification
/// fewer than keeping it as text. Anything else (a longer token, an uppercase one before it is checked, a channel
/// id) is kept as given, so every recipient is reported exactly as it was read. Spelled out (`string`,
/// `write(into:)`) where it is written, as `APNsIdentifier` is.
package enum RecipientToken: Sendable, Hashable, CustomStringConvertible {
    /// The 64 digits as four words of 16 digits each, in order; the first digit of each word is its highest nibble.
    case hex64(UInt64, UInt64, UInt64, UInt64)
    case text(String)

    /// The number of hex digits `hex64` holds.
    static let packedLength = 64

    /// `text` as a recipient: its 32 bytes when it is 64 lowercase hex digits, the text itself otherwise. Always the
    /// packed form when there is one, so that two equal recipients compare equal.
    package init(_ text: String) {
        var utf8 = text
        self = utf8.withUTF8 { Self.packed(UnsafeRawBufferPointer($0)) } ?? .text(text)
    }

    /// The bytes of a line or a header value as a recipient, as `init(_:)` reads text.
    package init(utf8 bytes: UnsafeRawBufferPointer) {
        self = Self.packed(bytes) ?? .text(String(decoding: bytes, as: UTF8.self))
    }

    package var string: String {
        switch self {
        case .text(let text):
            return text
        case .hex64:
            return String(unsafeUninitializedCapacity: Self.packedLength) { buffer in
                write(into: UnsafeMutableRawBufferPointer(buffer))
            }
        }
    }

    package var description: String { string }

    package var storedText: String? {
        if case .text(let text) = self { return text }
        return nil
    }

    /// How many UTF-8 bytes `write(into:)` writes.
    package var utf8Count: Int {
        switch self {
        case .text(let text): text.utf8.count
        case .hex64: Self.packedLength
        }
    }

    /// Lends `body` the recipient's UTF-8 bytes (a packed token is spelled on the stack), valid only inside `body`.
    /// Not generic over a result, for the reason `APNsIdentifier.withUTF8` gives.
    package func withUTF8(_ body: (UnsafeRawBufferPointer) -> Void) {
        switch self {
        case .text(var text):
            text.withUTF8 { body(UnsafeRawBufferPointer($0)) }
        case .hex64:
            withUnsafeTemporaryAllocation(byteCount: Self.packedLength, alignment: 1) { buffer in
                write(into: buffer)
                body(UnsafeRawBufferPointer(buffer))
            }
        }
    }

    /// Writes the recipient's UTF-8 bytes at the start of `buffer`, which holds at least `utf8Count` bytes, and
    /// returns how many it wrote.
    @discardableResult
    package func write(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        switch self {
        case .text(var text):
            return text.withUTF8 { bytes in
                buffer.copyMemory(from: UnsafeRawBufferPointer(bytes))
                return bytes.count
            }
        case .hex64(let first, let second, let third, let fourth):
            precondition(buffer.count >= Self.packedLength, "a packed token spells 64 bytes")
            Self.spell(first, into: buffer, at: 0)
            Self.spell(second, into: buffer, at: 16)
            Self.spell(third, into: buffer, at: 32)
            Self.spell(fourth, into: buffer, at: 48)
            return Self.packedLength
        }
    }

    /// The packed form of 64 lowercase hex digits; nil for anything else (uppercase too: it must read back as read).
    private static func packed(_ bytes: UnsafeRawBufferPointer) -> RecipientToken? {
        guard bytes.count == packedLength, let first = sixteenDigits(bytes, 0), let second = sixteenDigits(bytes, 16),
            let third = sixteenDigits(bytes, 32), let fourth = sixteenDigits(bytes, 48)
        else { return nil }
        return .hex64(first, second, third, fourth)
    }

    /// The value of the 16 lowercase hex digits at `offset`, four at a time (`APNsIdentifier.fourDigits`).
    @inline(__always)
    private static func sixteenDigits(_ bytes: UnsafeRawBufferPointer, _ offset: Int) -> UInt64? {
        guard let a = APNsIdentifier.fourDigits(bytes, offset), let b = APNsIdentifier.fourDigits(bytes, offset + 4),
            let c = APNsIdentifier.fourDigits(bytes, offset + 8), let d = APNsIdentifier.fourDigits(bytes, offset + 12)
        else { return nil }
        return a << 48 | b << 32 | c << 16 | d
    }

    /// Writes `word`'s 16 digits in lowercase at `offset`.
    @inline(__always)
    private static func spell(_ word: UInt64, into buffer: UnsafeMutableRawBufferPointer, at offset: Int) {
        let high = ASCIIBytes.lowercaseHexWord(of: UInt32(truncatingIfNeeded: word >> 32))
        let low = ASCIIBytes.lowercaseHexWord(of: UInt32(truncatingIfNeeded: word))
        buffer.storeBytes(of: high.littleEndian, toByteOffset: offset, as: UInt64.self)
        buffer.storeBytes(of: low.littleEndian, toByteOffset: offset + 8, as: UInt64.self)
    }
}
