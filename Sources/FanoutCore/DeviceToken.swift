/// A validated APNs device token, held in the lowercase hex form that goes into `/3/device/<token>`.
///
/// Tokens arrive by the million from job files, so validation is a single pass over UTF-8 bytes, and a token that is
/// already lowercase is stored without copying. Today's tokens are 32 bytes (64 hex characters), but Apple has never
/// promised a length and has said tokens may grow, so anything from 64 to 200 hex characters of even length passes.
public struct DeviceToken: Hashable, Sendable, CustomStringConvertible {
    /// The accepted number of hex characters.
    public static let hexLengthRange: ClosedRange<Int> = 64...200

    /// The token as lowercase hex.
    public let hex: String

    public var description: String { hex }

    /// Validates and normalises `text`. Nil unless it is 64...200 hex digits of even length; surrounding whitespace is
    /// not trimmed, because silently accepting it would hide a broken token source.
    public init?(_ text: some StringProtocol) {
        guard let hasUppercase = DeviceToken.scan(text.utf8) else { return nil }
        if !hasUppercase, let string = text as? String {
            hex = string
        } else if hasUppercase {
            hex = DeviceToken.lowercasedHex(text.utf8)
        } else {
            hex = String(text)
        }
    }

    /// Validates and normalises a `String` (the common case, specialised: the generic initialiser
    /// runs unspecialised when called from another module, several times slower per token).
    public init?(_ text: String) {
        var text = text
        // Tokens are almost always lowercase already: checked eight bytes at a time, and kept as they are.
        if text.withUTF8({ DeviceToken.isLowercaseHex($0) }) {
            hex = text
            return
        }
        guard let hasUppercase = text.withUTF8({ DeviceToken.scan($0) }) else { return nil }
        hex = hasUppercase ? text.withUTF8 { DeviceToken.lowercasedHex($0) } : text
    }

    /// Whether `bytes` are a valid token in lowercase (an even count in `hexLengthRange`, every byte 0-9 or a-f),
    /// eight bytes at a time; false says only "not that", and `scan` then decides (the feeding task checks every
    /// token of a job, and a byte-at-a-time check would be 1.5% of a fan-out's CPU).
    static func isLowercaseHex(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let count = bytes.count
        guard hexLengthRange.contains(count), count % 8 == 0, let base = bytes.baseAddress else { return false }
        let raw = UnsafeRawPointer(base)
        let ones: UInt64 = 0x0101_0101_0101_0101
        let high = 0x80 &* ones
        var offset = 0
        while offset < count {
            let word = raw.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
            // For bytes below 0x80 (checked first) no sum carries into the next byte, and bit 7 of each says on
            // which side of a bound the byte is: at least "0", below ":", at least "a", below "g".
            guard word & high == 0 else { return false }
            let digit = (word &+ 0x50 &* ones) & ~(word &+ 0x46 &* ones)
            let letter = (word &+ 0x1F &* ones) & ~(word &+ 0x19 &* ones)
            guard (digit | letter) & high == high else { return false }
            offset += 8
        }
        return true
    }

    /// Validates and normalises a token given as UTF-8 bytes, for readers that never build a `String` per line.
    public init?(utf8 bytes: some Collection<UInt8>) {
        guard DeviceToken.scan(bytes) != nil else { return nil }
        hex = DeviceToken.lowercasedHex(bytes)
    }

    /// `init?(utf8:)` over contiguous bytes, specialised here: the generic one runs unspecialised from another module
    /// (mock-apns checks the token of every request it receives).
    public init?(utf8 bytes: UnsafeBufferPointer<UInt8>) {
        guard DeviceToken.scan(bytes) != nil else { return nil }
        hex = DeviceToken.lowercasedHex(bytes)
    }

    /// `isValid(utf8:)` over contiguous bytes, specialised here (see `init?(utf8:)`): the same rule as `scan`, with
    /// two comparisons per byte instead of three ranges (mock-apns checks the token of every request).
    public static func isValid(utf8 bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        guard hexLengthRange.contains(bytes.count), bytes.count % 2 == 0 else { return false }
        for byte in bytes {
            // A digit, or a letter a-f in either case: setting bit 0x20 lowercases A-F and maps nothing else there.
            guard byte &- UInt8(ascii: "0") < 10 || (byte | 0x20) &- UInt8(ascii: "a") < 6 else { return false }
        }
        return true
    }

    /// Whether `text` would make a valid token.
    public static func isValid(_ text: some StringProtocol) -> Bool {
        scan(text.utf8) != nil
    }

    /// Whether `bytes` would make a valid token.
    public static func isValid(utf8 bytes: some Collection<UInt8>) -> Bool {
        scan(bytes) != nil
    }

    /// The one validation pass: nil when invalid, otherwise whether any hex digit is uppercase.
    @inline(__always)
    static func scan(_ bytes: some Collection<UInt8>) -> Bool? {
        let count = bytes.count
        guard hexLengthRange.contains(count), count % 2 == 0 else { return nil }
        var hasUppercase = false
        for byte in bytes {
            guard ASCIIBytes.isHexDigit(byte) else { return nil }
            hasUppercase = hasUppercase || ASCIIBytes.isUppercaseLetter(byte)
        }
        return hasUppercase
    }

    /// Builds the lowercase string from bytes already known to be hex digits.
    static func lowercasedHex(_ bytes: some Collection<UInt8>) -> String {
        String(unsafeUninitializedCapacity: bytes.count) { buffer in
            var index = 0
            for byte in bytes {
                buffer[index] = ASCIIBytes.lowercased(byte)
                index += 1
            }
            return index
        }
    }
}
