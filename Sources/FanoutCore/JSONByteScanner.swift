/// A strict, validating JSON reader over UTF-8 bytes that materialises only what its caller asks for.
///
/// mock-apns checks every request body (more than 100k a second) and Fanout parses every error body; both need a
/// few keys of a small document, not a tree of `Any`. This reader walks the bytes once, rejects anything RFC 8259
/// rejects (including invalid UTF-8, control characters in strings and trailing garbage), and lets the caller read
/// or skip each member. Nesting is capped so a hostile body cannot exhaust the stack.
package struct JSONByteScanner {
    package struct Malformed: Error {}

    package enum ValueKind: Equatable {
        case object, array, string, number, bool, null
    }

    /// A string token: where its contents (between the quotes) are, and whether they contain escapes, in which case
    /// the raw bytes are not the value and `decodedBytes` must be used.
    package struct StringToken {
        let range: Range<Int>
        let hasEscapes: Bool
    }

    package static let maximumDepth = 64

    package let bytes: UnsafeBufferPointer<UInt8>
    private(set) var position = 0
    private var depth = 0

    package init(_ bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
    }

    /// Runs `body` with a scanner over any byte collection, copying only when it has no contiguous storage.
    package static func withScanner<C: Collection<UInt8>, R>(
        over bytes: C, _ body: (inout JSONByteScanner) throws -> R
    ) rethrows -> R {
        if let result = try bytes.withContiguousStorageIfAvailable({ buffer -> R in
            var scanner = JSONByteScanner(buffer)
            return try body(&scanner)
        }) {
            return result
        }
        return try Array(bytes).withUnsafeBufferPointer { buffer in
            var scanner = JSONByteScanner(buffer)
            return try body(&scanner)
        }
    }

    // MARK: Structure

    /// The kind of the next value, without consuming it.
    package mutating func peekKind() throws -> ValueKind {
        skipWhitespace()
        guard position < bytes.count else { throw Malformed() }
        switch bytes[position] {
        case UInt8(ascii: "{"): return .object
        case UInt8(ascii: "["): return .array
        case UInt8(ascii: "\""): return .string
        case UInt8(ascii: "t"), UInt8(ascii: "f"): return .bool
        case UInt8(ascii: "n"): return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number
        default: throw Malformed()
        }
    }

    /// Reads an object, calling `member` once per key with the scanner positioned at the value. `member` must consume
    /// the value (read it or call `skipValue`).
    package mutating func readObject(_ member: (StringToken, inout JSONByteScanner) throws -> Void) throws {
        skipWhitespace()
        try expect(UInt8(ascii: "{"))
        try enterContainer()
        skipWhitespace()
        if try consumeIf(UInt8(ascii: "}")) {
            depth -= 1
            return
        }
        while true {
            skipWhitespace()
            let key = try readString()
            skipWhitespace()
            try expect(UInt8(ascii: ":"))
            let before = position
            try member(key, &self)
            precondition(position > before, "JSONByteScanner.readObject: member closure did not consume the value")
            skipWhitespace()
            if try consumeIf(UInt8(ascii: "}")) { break }
            try expect(UInt8(ascii: ","))
        }
        depth -= 1
    }

    /// Validates and skips one value of any kind, returning its kind.
    @discardableResult
    package mutating func skipValue() throws -> ValueKind {
        let kind = try peekKind()
        switch kind {
        case .object:
            try readObject { _, scanner in try scanner.skipValue() }
        case .array:
            try skipArray()
        case .string:
            _ = try readString()
        case .number:
            _ = try readNumber()
        case .bool:
            if !(try consumeLiteral("true")) {
                guard try consumeLiteral("false") else { throw Malformed() }
            }
        case .null:
            guard try consumeLiteral("null") else { throw Malformed() }
        }
        return kind
    }

    /// Checks that only whitespace follows the top-level value.
    package mutating func finish() throws {
        skipWhitespace()
        guard position == bytes.count else { throw Malformed() }
    }

    // MARK: Scalars

    /// Reads a number, returning its value when it is an integer literal (no fraction, no exponent) that fits in
    /// `Int64`, and nil for any other valid number.
    package mutating func readNumber() throws -> Int64? {
        skipWhitespace()
        let start = position
        let negative = try consumeIf(UInt8(ascii: "-"))
        guard position < bytes.count else { throw Malformed() }
        var isInteger = true
        if bytes[position] == UInt8(ascii: "0") {
            position += 1
        } else {
            guard isDigit(at: position) else { throw Malformed() }
            while isDigit(at: position) { position += 1 }
        }
        let integerEnd = position
        if position < bytes.count, bytes[position] == UInt8(ascii: ".") {
            position += 1
            guard isDigit(at: position) else { throw Malformed() }
            while isDigit(at: position) { position += 1 }
            isInteger = false
        }
        if position < bytes.count, bytes[position] | 0x20 == UInt8(ascii: "e") {
            position += 1
            if position < bytes.count, bytes[position] == UInt8(ascii: "+") || bytes[position] == UInt8(ascii: "-") {
                position += 1
            }
            guard isDigit(at: position) else { throw Malformed() }
            while isDigit(at: position) { position += 1 }
            isInteger = false
        }
        guard isInteger else { return nil }
        let digitsStart = negative ? start + 1 : start
        let digits = UnsafeBufferPointer(rebasing: bytes[digitsStart..<integerEnd])
        guard let magnitude = ASCIIBytes.parseNonNegativeInt64(digits) else { return nil }
        return negative ? -magnitude : magnitude
    }

    /// Reads a string token, validating escapes and UTF-8.
    package mutating func readString() throws -> StringToken {
        skipWhitespace()
        try expect(UInt8(ascii: "\""))
        let start = position
        var hasEscapes = false
        while true {
            guard position < bytes.count else { throw Malformed() }
            let byte = bytes[position]
            switch byte {
            case UInt8(ascii: "\""):
                position += 1
                return StringToken(range: start..<(position - 1), hasEscapes: hasEscapes)
            case UInt8(ascii: "\\"):
                hasEscapes = true
                position += 1
                guard position < bytes.count else { throw Malformed() }
                switch bytes[position] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
                    UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    position += 1
                case UInt8(ascii: "u"):
                    guard position + 4 < bytes.count else { throw Malformed() }
                    for offset in 1...4 where !ASCIIBytes.isHexDigit(bytes[position + offset]) { throw Malformed() }
                    position += 5
                default:
                    throw Malformed()
                }
            case 0..<0x20:
                throw Malformed()
            case 0x20..<0x80:
                position += 1
            default:
                position += try UTF8SequenceValidation.sequenceLength(in: bytes, at: position)
            }
        }
    }

    /// Reads a string and returns it as a Swift `String`.
    package mutating func readStringValue() throws -> String {
        let token = try readString()
        return String(decoding: decodedBytes(of: token), as: UTF8.self)
    }

    /// The value of a string token as UTF-8 bytes, with escapes resolved. Lone surrogates become U+FFFD.
    package func decodedBytes(of token: StringToken) -> [UInt8] {
        let raw = UnsafeBufferPointer(rebasing: bytes[token.range])
        guard token.hasEscapes else { return Array(raw) }
        return JSONStringEscaping.unescape(raw)
    }

    /// Whether a string token's value equals `literal` (an ASCII key such as `aps`).
    package func string(_ token: StringToken, equals literal: StaticString) -> Bool {
        let expected = UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount)
        if token.hasEscapes {
            return decodedBytes(of: token).elementsEqual(expected)
        }
        return token.range.count == expected.count
            && UnsafeBufferPointer(rebasing: bytes[token.range]).elementsEqual(expected)
    }

    // MARK: Helpers

    private mutating func skipArray() throws {
        try expect(UInt8(ascii: "["))
        try enterContainer()
        skipWhitespace()
        if try consumeIf(UInt8(ascii: "]")) {
            depth -= 1
            return
        }
        while true {
            try skipValue()
            skipWhitespace()
            if try consumeIf(UInt8(ascii: "]")) { break }
            try expect(UInt8(ascii: ","))
        }
        depth -= 1
    }

    private mutating func enterContainer() throws {
        depth += 1
        guard depth <= JSONByteScanner.maximumDepth else { throw Malformed() }
    }

    @inline(__always)
    private mutating func skipWhitespace() {
        while position < bytes.count {
            switch bytes[position] {
            case UInt8(ascii: " "), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\t"): position += 1
            default: return
            }
        }
    }

    @inline(__always)
    private func isDigit(at index: Int) -> Bool {
        index < bytes.count && bytes[index] >= UInt8(ascii: "0") && bytes[index] <= UInt8(ascii: "9")
    }

    private mutating func expect(_ byte: UInt8) throws {
        guard position < bytes.count, bytes[position] == byte else { throw Malformed() }
        position += 1
    }

    private mutating func consumeIf(_ byte: UInt8) throws -> Bool {
        guard position < bytes.count else { throw Malformed() }
        guard bytes[position] == byte else { return false }
        position += 1
        return true
    }

    private mutating func consumeLiteral(_ literal: StaticString) throws -> Bool {
        let count = literal.utf8CodeUnitCount
        guard position + count <= bytes.count else { return false }
        for offset in 0..<count where bytes[position + offset] != literal.utf8Start[offset] { return false }
        position += count
        return true
    }
}

/// Validation of a single UTF-8 sequence, per the Unicode table of well-formed byte sequences (no overlong forms,
/// no surrogates, nothing above U+10FFFF).
package enum UTF8SequenceValidation {
    /// The length of the well-formed multi-byte sequence starting at `index`; throws when it is not well formed.
    package static func sequenceLength(in bytes: UnsafeBufferPointer<UInt8>, at index: Int) throws -> Int {
        let lead = bytes[index]
        let length: Int
        var secondRange: ClosedRange<UInt8> = 0x80...0xBF
        switch lead {
        case 0xC2...0xDF: length = 2
        case 0xE0: length = 3; secondRange = 0xA0...0xBF
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED: length = 3; secondRange = 0x80...0x9F
        case 0xF0: length = 4; secondRange = 0x90...0xBF
        case 0xF1...0xF3: length = 4
        case 0xF4: length = 4; secondRange = 0x80...0x8F
        default: throw JSONByteScanner.Malformed()
        }
        guard index + length <= bytes.count, secondRange.contains(bytes[index + 1]) else {
            throw JSONByteScanner.Malformed()
        }
        for offset in 2..<length where !(0x80...0xBF).contains(bytes[index + offset]) {
            throw JSONByteScanner.Malformed()
        }
        return length
    }
}
