/// Why a JSON text was refused, and where: the byte offset (from 0) of the first byte that does not fit.
public struct JSONParseError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The offset of the offending byte from the start of the text; the text's length when it ended too early.
    public let offset: Int
    /// What is wrong, in words, for example `expected ':' after an object key`.
    public let message: String

    public init(offset: Int, message: String) {
        self.offset = offset
        self.message = message
    }

    public var description: String { "at byte offset \(offset): \(message)" }
}

/// FanoutCore's one JSON reader: a strict RFC 8259 tokenizer over UTF-8 bytes whose errors name the offset and the
/// problem. It is used in two ways.
///
/// - **Scanning**, which allocates nothing: `readObject` hands each key over as a `StringToken` (a range of the
///   input), a value is read only when the caller asks (`string(_:equals:)`, `readInteger()`), and everything else is
///   validated and skipped. The APNs response parser (every error answer) and mock-apns's request check (every
///   request, more than 100k a second) walk bodies this way, under `Rules.rfc8259`.
/// - **Parsing**: `parseValue()` builds a `JSONValue` tree, `validateDocument()` checks a document whose bytes
///   `RawJSON` keeps. Job files and payloads are read this way, under `Rules.strict`.
///
/// Under both rules it refuses what RFC 8259 refuses, including invalid UTF-8 (overlong forms, encoded surrogates,
/// anything above U+10FFFF), raw control characters in strings and trailing garbage, and nesting is capped at
/// `maximumDepth` so that a hostile body cannot exhaust the stack.
package struct JSONParser {
    /// What is refused beyond RFC 8259.
    package enum Rules: Sendable {
        /// RFC 8259 alone. An object may name a key twice (`readObject` reports each occurrence; `parseValue` keeps
        /// the first position and the last value) and a `\u` escape may name a lone surrogate (decoded as U+FFFD).
        /// Scanning under these rules never allocates.
        case rfc8259
        /// Two more rules that matter for payloads: an object may not name a key twice (devices decode with
        /// `Codable`, which would keep one silently; keys are compared as Swift strings, so two spellings of the
        /// same canonical text are the same key), and a `\u` escape must not leave a lone surrogate (it has no UTF-8
        /// form, so the device could not decode the text).
        case strict
    }

    /// A string in the input: where its contents (between the quotes) are, and whether they contain escapes, in
    /// which case the raw bytes are not the value and `decodedBytes(of:)` must be used.
    package struct StringToken {
        package let range: Range<Int>
        package let hasEscapes: Bool
    }

    package static let maximumDepth = 64

    package let bytes: UnsafeBufferPointer<UInt8>
    package let rules: Rules
    package private(set) var position = 0
    private var depth = 0

    package init(_ bytes: UnsafeBufferPointer<UInt8>, rules: Rules = .strict) {
        self.bytes = bytes
        self.rules = rules
    }

    /// Runs `body` with a parser over any byte collection, copying only when it has no contiguous storage.
    package static func withParser<R>(
        over bytes: some Collection<UInt8>, rules: Rules = .strict,
        _ body: (inout JSONParser) throws(JSONParseError) -> R
    ) throws(JSONParseError) -> R {
        // Closures passed straight to the call, not kept in a variable, so that nothing is allocated for them.
        if let result = bytes.withContiguousStorageIfAvailable({ run(body, over: $0, rules: rules) }) {
            return try result.get()
        }
        return try Array(bytes).withUnsafeBufferPointer { run(body, over: $0, rules: rules) }.get()
    }

    private static func run<R>(
        _ body: (inout JSONParser) throws(JSONParseError) -> R, over buffer: UnsafeBufferPointer<UInt8>, rules: Rules
    ) -> Result<R, JSONParseError> {
        var parser = JSONParser(buffer, rules: rules)
        do throws(JSONParseError) {
            return .success(try body(&parser))
        } catch {
            return .failure(error)
        }
    }

    // MARK: Documents

    /// The range of the one value in the text, without the whitespace around it, and its kind.
    package mutating func validateDocument() throws(JSONParseError) -> (range: Range<Int>, kind: JSONValue.Kind) {
        skipWhitespace()
        let start = position
        let kind = try skipValue()
        let end = position
        try finish()
        return (start..<end, kind)
    }

    /// Checks that only whitespace follows the value.
    package mutating func finish() throws(JSONParseError) {
        skipWhitespace()
        guard position == bytes.count else {
            throw error("unexpected ", byte: position, " after the JSON value")
        }
    }

    // MARK: Values

    /// The kind of the next value, without consuming it (whitespace before it is skipped).
    package mutating func peekKind() throws(JSONParseError) -> JSONValue.Kind {
        skipWhitespace()
        guard position < bytes.count else { throw error("unexpected end of input, expected a value") }
        switch bytes[position] {
        case UInt8(ascii: "{"): return .object
        case UInt8(ascii: "["): return .array
        case UInt8(ascii: "\""): return .string
        case UInt8(ascii: "t"), UInt8(ascii: "f"): return .bool
        case UInt8(ascii: "n"): return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number
        default: throw error("unexpected ", byte: position, ", expected a value")
        }
    }

    /// Parses one value into a tree.
    package mutating func parseValue() throws(JSONParseError) -> JSONValue {
        switch try peekKind() {
        case .object:
            var object = JSONObject()
            try readMembers { token, checkedKey, parser throws(JSONParseError) in
                let key = checkedKey ?? parser.string(of: token)
                let value = try parser.parseValue()
                // Under the strict rules the key is new; under RFC 8259 a repeated key keeps its place.
                if checkedKey != nil { object.appendUnchecked(key: key, value: value) } else { object[key] = value }
            }
            return .object(object)
        case .array:
            var elements: [JSONValue] = []
            try readArray { parser throws(JSONParseError) in elements.append(try parser.parseValue()) }
            return .array(elements)
        case .string:
            return .string(try readStringValue())
        case .number:
            let range = try scanNumber()
            return .number(JSONNumber(uncheckedLiteral: String(decoding: slice(range), as: UTF8.self)))
        case .bool:
            return .bool(try readBool())
        case .null:
            try readNull()
            return .null
        }
    }

    /// Validates and skips one value, returning its kind.
    @discardableResult
    package mutating func skipValue() throws(JSONParseError) -> JSONValue.Kind {
        let kind = try peekKind()
        switch kind {
        case .object: try readObject { _, parser throws(JSONParseError) in try parser.skipValue() }
        case .array: try readArray { parser throws(JSONParseError) in try parser.skipValue() }
        case .string: _ = try readString()
        case .number: _ = try scanNumber()
        case .bool: _ = try readBool()
        case .null: try readNull()
        }
        return kind
    }

    /// Reads an object, calling `member` with each key and the parser positioned at the value (whitespace skipped).
    /// `member` must consume the value (read it or call `skipValue`). The key's opening quote is at
    /// `key.range.lowerBound - 1`. Under the strict rules a repeated key is refused before `member` sees it.
    package mutating func readObject(
        _ member: (_ key: StringToken, inout JSONParser) throws(JSONParseError) -> Void
    ) throws(JSONParseError) {
        try readMembers { token, _, parser throws(JSONParseError) in try member(token, &parser) }
    }

    /// Reads an array, calling `element` with the parser positioned at each element, which it must consume.
    package mutating func readArray(
        _ element: (inout JSONParser) throws(JSONParseError) -> Void
    ) throws(JSONParseError) {
        try readContainer(open: UInt8(ascii: "["), close: UInt8(ascii: "]"), "'['", "',' or ']' in an array", element)
    }

    // MARK: Scalars

    package mutating func readBool() throws(JSONParseError) -> Bool {
        skipWhitespace()
        if position < bytes.count, bytes[position] == UInt8(ascii: "t") {
            try readLiteral("true")
            return true
        }
        try readLiteral("false")
        return false
    }

    package mutating func readNull() throws(JSONParseError) {
        skipWhitespace()
        try readLiteral("null")
    }

    /// Validates a number and returns the range of its literal.
    package mutating func scanNumber() throws(JSONParseError) -> Range<Int> {
        skipWhitespace()
        let start = position
        _ = consumeIf(UInt8(ascii: "-"))
        guard isDigit(at: position) else { throw expected("a digit") }
        if bytes[position] == UInt8(ascii: "0") {
            position += 1
            if isDigit(at: position) { throw error("a number may not have a leading zero") }
        } else {
            while isDigit(at: position) { position += 1 }
        }
        if consumeIf(UInt8(ascii: ".")) {
            guard isDigit(at: position) else { throw expected("a digit after '.'") }
            while isDigit(at: position) { position += 1 }
        }
        if position < bytes.count, bytes[position] | 0x20 == UInt8(ascii: "e") {
            position += 1
            if !consumeIf(UInt8(ascii: "+")) { _ = consumeIf(UInt8(ascii: "-")) }
            guard isDigit(at: position) else { throw expected("a digit in the exponent") }
            while isDigit(at: position) { position += 1 }
        }
        return start..<position
    }

    /// Reads a number and returns its value when it is an integer literal (no fraction, no exponent) that fits in
    /// `Int64`; nil for any other valid number.
    package mutating func readInteger() throws(JSONParseError) -> Int64? {
        JSONParser.int64(integerLiteral: slice(try scanNumber()))
    }

    /// Reads a string, validating its escapes and UTF-8, and returns where it is.
    package mutating func readString() throws(JSONParseError) -> StringToken {
        skipWhitespace()
        try expect(UInt8(ascii: "\""), "'\"'")
        let start = position
        var hasEscapes = false
        while true {
            // The common run, printable ASCII other than the quote and the backslash, in a tight loop.
            let bytes = self.bytes
            var index = position
            while index < bytes.count {
                let byte = bytes[index]
                // 0x20 to 0x7F in one unsigned comparison.
                guard byte &- 0x20 < 0x60, byte != UInt8(ascii: "\""), byte != UInt8(ascii: "\\") else { break }
                index += 1
            }
            position = index
            guard position < bytes.count else { throw error("unexpected end of input inside a string") }
            let byte = bytes[position]
            switch byte {
            case UInt8(ascii: "\""):
                position += 1
                return StringToken(range: start..<(position - 1), hasEscapes: hasEscapes)
            case UInt8(ascii: "\\"):
                hasEscapes = true
                try scanEscape()
            case 0..<0x20:
                throw error("control character ", byte: position, " in a string must be escaped")
            default:
                guard let length = UTF8SequenceValidation.sequenceLength(in: bytes, at: position) else {
                    throw error("invalid UTF-8 in a string")
                }
                position += length
            }
        }
    }

    /// Reads a string and returns its value.
    package mutating func readStringValue() throws(JSONParseError) -> String {
        string(of: try readString())
    }

    // MARK: String tokens

    /// The value of a string token.
    package func string(of token: StringToken) -> String {
        guard token.hasEscapes else { return String(decoding: slice(token.range), as: UTF8.self) }
        return String(decoding: decodedBytes(of: token), as: UTF8.self)
    }

    /// The value of a string token as UTF-8 bytes, with escapes resolved. A lone surrogate (only the RFC 8259 rules
    /// let one through) becomes U+FFFD.
    package func decodedBytes(of token: StringToken) -> [UInt8] {
        let raw = slice(token.range)
        guard token.hasEscapes else { return Array(raw) }
        var output = [UInt8]()
        output.reserveCapacity(raw.count)
        var index = 0
        while index < raw.count {
            let byte = raw[index]
            guard byte == UInt8(ascii: "\\") else {
                output.append(byte)
                index += 1
                continue
            }
            let escape = raw[index + 1]
            index += 2
            switch escape {
            case UInt8(ascii: "b"): output.append(0x08)
            case UInt8(ascii: "f"): output.append(0x0C)
            case UInt8(ascii: "n"): output.append(0x0A)
            case UInt8(ascii: "r"): output.append(0x0D)
            case UInt8(ascii: "t"): output.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = Self.hex4(raw, at: index)
                index += 4
                if (0xD800..<0xDC00).contains(scalar), index + 5 < raw.count, raw[index] == UInt8(ascii: "\\"),
                    raw[index + 1] == UInt8(ascii: "u")
                {
                    let low = Self.hex4(raw, at: index + 2)
                    if (0xDC00..<0xE000).contains(low) {
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                        index += 6
                    }
                }
                output.append(contentsOf: UTF8.encode(Unicode.Scalar(scalar) ?? "\u{FFFD}")!)
            default: output.append(escape)  // \" \\ \/
            }
        }
        return output
    }

    /// Whether a string token's value equals `literal` (an ASCII key such as `aps`), without allocating unless the
    /// token holds escapes.
    package func string(_ token: StringToken, equals literal: StaticString) -> Bool {
        let expected = UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount)
        if token.hasEscapes { return decodedBytes(of: token).elementsEqual(expected) }
        return token.range.count == expected.count && slice(token.range).elementsEqual(expected)
    }

    package func slice(_ range: Range<Int>) -> UnsafeBufferPointer<UInt8> {
        UnsafeBufferPointer(rebasing: bytes[range])
    }

    /// The value of an integer literal (an optional `-` and digits) that fits in `Int64`; nil otherwise.
    package static func int64(integerLiteral literal: UnsafeBufferPointer<UInt8>) -> Int64? {
        let negative = literal.first == UInt8(ascii: "-")
        let digits = UnsafeBufferPointer(rebasing: literal[(negative ? 1 : 0)...])
        guard let magnitude = ASCIIBytes.parseDigits(digits) else { return nil }
        if negative {
            guard magnitude <= UInt64(Int64.max) + 1 else { return nil }
            return magnitude == UInt64(Int64.max) + 1 ? Int64.min : -Int64(magnitude)
        }
        return magnitude <= UInt64(Int64.max) ? Int64(magnitude) : nil
    }

    // MARK: Helpers

    /// `readObject`, also telling `member` the key as a string when the strict rules decoded it to check for
    /// repeats (so that `parseValue` does not decode it twice).
    @inline(__always)
    private mutating func readMembers(
        _ member: (StringToken, String?, inout JSONParser) throws(JSONParseError) -> Void
    ) throws(JSONParseError) {
        var keys: KeySet?  // made at the first key, under the strict rules only
        try readContainer(open: UInt8(ascii: "{"), close: UInt8(ascii: "}"), "'{'", "',' or '}' in an object") {
            parser throws(JSONParseError) in
            guard parser.position < parser.bytes.count, parser.bytes[parser.position] == UInt8(ascii: "\"") else {
                throw parser.expected("a string key")
            }
            let key = try parser.readString()
            parser.skipWhitespace()
            try parser.expect(UInt8(ascii: ":"), "':' after an object key")
            parser.skipWhitespace()
            var checkedKey: String?
            if parser.rules == .strict {
                let text = parser.string(of: key)
                if keys == nil { keys = KeySet() }
                guard keys!.insert(text) else {
                    throw JSONParseError(
                        offset: key.range.lowerBound - 1, message: "duplicate key \(JSONStringEscaping.quoted(text))")
                }
                checkedKey = text
            }
            let before = parser.position
            try member(key, checkedKey, &parser)
            precondition(
                parser.position > before, "JSONParser.readObject: the member closure did not consume the value")
        }
    }

    /// What arrays and objects share: the opening byte, `item` once per element or member (whitespace skipped before
    /// it), commas between them, and the closing byte.
    @inline(__always)
    private mutating func readContainer(
        open: UInt8, close: UInt8, _ openName: StaticString, _ separatorName: StaticString,
        _ item: (inout JSONParser) throws(JSONParseError) -> Void
    ) throws(JSONParseError) {
        skipWhitespace()
        try expect(open, openName)
        try enterContainer()
        skipWhitespace()
        if consumeIf(close) {
            depth -= 1
            return
        }
        while true {
            skipWhitespace()
            try item(&self)
            skipWhitespace()
            if consumeIf(close) { break }
            try expect(UInt8(ascii: ","), separatorName)
        }
        depth -= 1
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

    /// Checks one escape sequence at `position` (the backslash) and moves past it. Under the strict rules a high
    /// surrogate must be followed by a low one, and a low one may not stand alone.
    private mutating func scanEscape() throws(JSONParseError) {
        let escapeStart = position
        position += 1
        guard position < bytes.count else { throw error("unexpected end of input inside a string") }
        switch bytes[position] {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
            UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
            position += 1
        case UInt8(ascii: "u"):
            position += 1
            let unit = try scanHex4()
            guard rules == .strict else { return }
            if (0xDC00..<0xE000).contains(unit) {
                throw error("lone low surrogate in a \\u escape", at: escapeStart)
            }
            if (0xD800..<0xDC00).contains(unit) {
                guard position + 1 < bytes.count, bytes[position] == UInt8(ascii: "\\"),
                    bytes[position + 1] == UInt8(ascii: "u")
                else {
                    throw error("high surrogate not followed by a low one", at: escapeStart)
                }
                position += 2
                let low = try scanHex4()
                guard (0xDC00..<0xE000).contains(low) else {
                    throw error("high surrogate not followed by a low one", at: escapeStart)
                }
            }
        default:
            throw error("invalid escape \\", byte: position, "")
        }
    }

    private mutating func scanHex4() throws(JSONParseError) -> UInt32 {
        var value: UInt32 = 0
        for _ in 0..<4 {
            guard position < bytes.count, let digit = ASCIIBytes.hexValue(bytes[position]) else {
                throw expected("four hex digits after \\u")
            }
            value = value << 4 | UInt32(digit)
            position += 1
        }
        return value
    }

    /// The value of four hex digits already validated.
    private static func hex4(_ raw: UnsafeBufferPointer<UInt8>, at index: Int) -> UInt32 {
        var value: UInt32 = 0
        for offset in 0..<4 {
            value = value << 4 | UInt32(ASCIIBytes.hexValue(raw[index + offset]) ?? 0)
        }
        return value
    }

    private mutating func readLiteral(_ literal: StaticString) throws(JSONParseError) {
        let count = literal.utf8CodeUnitCount
        for offset in 0..<count {
            guard position + offset < bytes.count, bytes[position + offset] == literal.utf8Start[offset] else {
                position += offset
                throw expected(literal, quoted: true)
            }
        }
        position += count
    }

    private mutating func enterContainer() throws(JSONParseError) {
        depth += 1
        guard depth <= JSONParser.maximumDepth else { throw tooDeep() }
    }

    @inline(__always)
    private func isDigit(at index: Int) -> Bool {
        index < bytes.count && bytes[index] >= UInt8(ascii: "0") && bytes[index] <= UInt8(ascii: "9")
    }

    /// Consumes `byte`, or throws `expected <what>`. The message is a `StaticString` so that the hot path passes no
    /// `String` around.
    @inline(__always)
    private mutating func expect(_ byte: UInt8, _ what: StaticString) throws(JSONParseError) {
        guard position < bytes.count, bytes[position] == byte else { throw expected(what) }
        position += 1
    }

    @inline(__always)
    private mutating func consumeIf(_ byte: UInt8) -> Bool {
        guard position < bytes.count, bytes[position] == byte else { return false }
        position += 1
        return true
    }

    // The errors are built out of line, from static parts, so that the paths that do not fail carry no string work.

    @inline(never)
    private func error(_ message: StaticString, at offset: Int? = nil) -> JSONParseError {
        JSONParseError(offset: offset ?? position, message: "\(message)")
    }

    /// `<prefix><the byte at index><suffix>`, for example `unexpected 'x' after the JSON value`.
    @inline(never)
    private func error(_ prefix: StaticString, byte index: Int, _ suffix: StaticString) -> JSONParseError {
        JSONParseError(offset: position, message: "\(prefix)\(describeByte(at: index))\(suffix)")
    }

    @inline(never)
    private func tooDeep() -> JSONParseError {
        JSONParseError(
            offset: position - 1, message: "nested deeper than \(JSONParser.maximumDepth) arrays and objects")
    }

    /// `expected <what>, found <the byte>`, or `unexpected end of input, expected <what>`; `what` in single quotes
    /// when `quoted`.
    @inline(never)
    private func expected(_ what: StaticString, quoted: Bool = false) -> JSONParseError {
        let what = quoted ? "'\(what)'" : "\(what)"
        if position >= bytes.count {
            return JSONParseError(offset: position, message: "unexpected end of input, expected \(what)")
        }
        return JSONParseError(offset: position, message: "expected \(what), found \(describeByte(at: position))")
    }

    private func describeByte(at index: Int) -> String {
        guard index < bytes.count else { return "end of input" }
        let byte = bytes[index]
        if byte > 0x20, byte < 0x7F { return "'\(Character(Unicode.Scalar(byte)))'" }
        let hex = String(byte, radix: 16, uppercase: true)
        return "byte 0x" + (hex.count < 2 ? "0" + hex : hex)
    }
}

/// Keys seen in one object: a linear scan while small, a set once it grows.
private struct KeySet {
    private var small: [String] = []
    private var large: Set<String>?

    mutating func insert(_ key: String) -> Bool {
        if large != nil { return large!.insert(key).inserted }
        if small.contains(key) { return false }
        small.append(key)
        if small.count > 16 {
            large = Set(small)
            small = []
        }
        return true
    }
}

/// Validation of a single UTF-8 sequence, per the Unicode table of well-formed byte sequences (no overlong forms, no
/// surrogates, nothing above U+10FFFF).
package enum UTF8SequenceValidation {
    /// The length of the well-formed multi-byte sequence starting at `index`; nil when it is not well formed.
    package static func sequenceLength(in bytes: UnsafeBufferPointer<UInt8>, at index: Int) -> Int? {
        let length: Int
        var secondRange: ClosedRange<UInt8> = 0x80...0xBF
        switch bytes[index] {
        case 0xC2...0xDF: length = 2
        case 0xE0: (length, secondRange) = (3, 0xA0...0xBF)
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED: (length, secondRange) = (3, 0x80...0x9F)
        case 0xF0: (length, secondRange) = (4, 0x90...0xBF)
        case 0xF1...0xF3: length = 4
        case 0xF4: (length, secondRange) = (4, 0x80...0x8F)
        default: return nil
        }
        guard index + length <= bytes.count, secondRange.contains(bytes[index + 1]) else { return nil }
        for offset in 2..<length where !(0x80...0xBF).contains(bytes[index + offset]) { return nil }
        return length
    }
}
