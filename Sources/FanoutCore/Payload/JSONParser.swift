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

/// A strict RFC 8259 parser over UTF-8 bytes whose errors name the offset and the problem.
///
/// `JSONByteScanner` answers only "malformed", which is all mock-apns needs. Job files are written by people, so this
/// one says where and why. It is stricter than the RFC in two ways that matter for payloads: an object may not name
/// a key twice (devices decode with `Codable`, which would keep one silently), and `\u` escapes must not leave a
/// lone surrogate (it has no UTF-8 form, so the device could not decode the text).
struct JSONParser {
    static let maximumDepth = 64

    let bytes: UnsafeBufferPointer<UInt8>
    private(set) var position = 0
    private var depth = 0

    init(_ bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
    }

    /// Runs `body` with a parser over any byte collection, copying only when it has no contiguous storage.
    static func withParser<R>(
        over bytes: some Collection<UInt8>, _ body: (inout JSONParser) throws(JSONParseError) -> R
    ) throws(JSONParseError) -> R {
        let run = { (buffer: UnsafeBufferPointer<UInt8>) -> Result<R, JSONParseError> in
            var parser = JSONParser(buffer)
            do throws(JSONParseError) {
                return .success(try body(&parser))
            } catch {
                return .failure(error)
            }
        }
        if let result = bytes.withContiguousStorageIfAvailable(run) {
            return try result.get()
        }
        return try Array(bytes).withUnsafeBufferPointer(run).get()
    }

    // MARK: Documents

    /// The range of the one value in the text, without the whitespace around it, and its kind.
    mutating func validateDocument() throws(JSONParseError) -> (range: Range<Int>, kind: JSONValue.Kind) {
        skipWhitespace()
        let start = position
        let kind = try skipValue()
        let end = position
        try finish()
        return (start..<end, kind)
    }

    /// Checks that only whitespace follows the value.
    mutating func finish() throws(JSONParseError) {
        skipWhitespace()
        guard position == bytes.count else {
            throw error("unexpected \(describeByte(at: position)) after the JSON value")
        }
    }

    // MARK: Values

    /// The kind of the next value, without consuming it (whitespace before it is skipped).
    mutating func peekKind() throws(JSONParseError) -> JSONValue.Kind {
        skipWhitespace()
        guard position < bytes.count else { throw error("unexpected end of input, expected a value") }
        switch bytes[position] {
        case UInt8(ascii: "{"): return .object
        case UInt8(ascii: "["): return .array
        case UInt8(ascii: "\""): return .string
        case UInt8(ascii: "t"), UInt8(ascii: "f"): return .bool
        case UInt8(ascii: "n"): return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number
        default: throw error("unexpected \(describeByte(at: position)), expected a value")
        }
    }

    /// Parses one value into a tree.
    mutating func parseValue() throws(JSONParseError) -> JSONValue {
        switch try peekKind() {
        case .object:
            var object = JSONObject()
            var keys = KeySet()
            try readObject { key, keyOffset, parser throws(JSONParseError) in
                guard keys.insert(key) else {
                    throw JSONParseError(offset: keyOffset, message: "duplicate key \(quoted(key))")
                }
                object.appendUnchecked(key: key, value: try parser.parseValue())
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
            try readLiteral("null")
            return .null
        }
    }

    /// Validates and skips one value, returning its kind. Object keys are still checked for duplicates.
    @discardableResult
    mutating func skipValue() throws(JSONParseError) -> JSONValue.Kind {
        let kind = try peekKind()
        switch kind {
        case .object:
            var keys = KeySet()
            try readObject { key, keyOffset, parser throws(JSONParseError) in
                guard keys.insert(key) else {
                    throw JSONParseError(offset: keyOffset, message: "duplicate key \(quoted(key))")
                }
                try parser.skipValue()
            }
        case .array:
            try readArray { parser throws(JSONParseError) in try parser.skipValue() }
        case .string:
            _ = try scanString()
        case .number:
            _ = try scanNumber()
        case .bool:
            _ = try readBool()
        case .null:
            try readLiteral("null")
        }
        return kind
    }

    /// Reads an object, calling `member` with each key, the key's offset, and the parser positioned at the value
    /// (whitespace skipped). `member` must consume the value.
    mutating func readObject(
        _ member: (String, Int, inout JSONParser) throws(JSONParseError) -> Void
    ) throws(JSONParseError) {
        try expect(UInt8(ascii: "{"), "'{'")
        try enterContainer()
        skipWhitespace()
        if consumeIf(UInt8(ascii: "}")) {
            depth -= 1
            return
        }
        while true {
            skipWhitespace()
            guard position < bytes.count, bytes[position] == UInt8(ascii: "\"") else {
                throw expected("a string key")
            }
            let keyOffset = position
            let key = try readStringValue()
            skipWhitespace()
            try expect(UInt8(ascii: ":"), "':' after an object key")
            skipWhitespace()
            try member(key, keyOffset, &self)
            skipWhitespace()
            if consumeIf(UInt8(ascii: "}")) { break }
            try expect(UInt8(ascii: ","), "',' or '}' in an object")
        }
        depth -= 1
    }

    /// Reads an array, calling `element` with the parser positioned at each element.
    mutating func readArray(_ element: (inout JSONParser) throws(JSONParseError) -> Void) throws(JSONParseError) {
        try expect(UInt8(ascii: "["), "'['")
        try enterContainer()
        skipWhitespace()
        if consumeIf(UInt8(ascii: "]")) {
            depth -= 1
            return
        }
        while true {
            skipWhitespace()
            try element(&self)
            skipWhitespace()
            if consumeIf(UInt8(ascii: "]")) { break }
            try expect(UInt8(ascii: ","), "',' or ']' in an array")
        }
        depth -= 1
    }

    // MARK: Scalars

    mutating func readBool() throws(JSONParseError) -> Bool {
        if position < bytes.count, bytes[position] == UInt8(ascii: "t") {
            try readLiteral("true")
            return true
        }
        try readLiteral("false")
        return false
    }

    /// Validates a number and returns the range of its literal.
    mutating func scanNumber() throws(JSONParseError) -> Range<Int> {
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

    /// Validates a string (escapes, UTF-8, no raw control characters, no lone surrogates) and returns the range of
    /// its contents between the quotes.
    mutating func scanString() throws(JSONParseError) -> (range: Range<Int>, hasEscapes: Bool) {
        try expect(UInt8(ascii: "\""), "'\"'")
        let start = position
        var hasEscapes = false
        while true {
            guard position < bytes.count else { throw error("unexpected end of input inside a string") }
            let byte = bytes[position]
            switch byte {
            case UInt8(ascii: "\""):
                position += 1
                return (start..<(position - 1), hasEscapes)
            case UInt8(ascii: "\\"):
                hasEscapes = true
                try scanEscape()
            case 0..<0x20:
                throw error("control character \(describeByte(at: position)) in a string must be escaped")
            case 0x20..<0x80:
                position += 1
            default:
                do {
                    position += try UTF8SequenceValidation.sequenceLength(in: bytes, at: position)
                } catch {
                    throw self.error("invalid UTF-8 in a string")
                }
            }
        }
    }

    /// Reads a string and returns its value.
    mutating func readStringValue() throws(JSONParseError) -> String {
        let (range, hasEscapes) = try scanString()
        guard hasEscapes else { return String(decoding: slice(range), as: UTF8.self) }
        return String(decoding: JSONParser.unescape(slice(range)), as: UTF8.self)
    }

    // MARK: Helpers

    func slice(_ range: Range<Int>) -> UnsafeBufferPointer<UInt8> {
        UnsafeBufferPointer(rebasing: bytes[range])
    }

    mutating func skipWhitespace() {
        while position < bytes.count {
            switch bytes[position] {
            case UInt8(ascii: " "), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\t"): position += 1
            default: return
            }
        }
    }

    /// Checks one escape sequence at `position` (the backslash) and moves past it. A high surrogate must be followed
    /// by a low one, and a low one may not stand alone.
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
            if (0xDC00..<0xE000).contains(unit) {
                throw JSONParseError(offset: escapeStart, message: "lone low surrogate in a \\u escape")
            }
            if (0xD800..<0xDC00).contains(unit) {
                guard position + 1 < bytes.count, bytes[position] == UInt8(ascii: "\\"),
                    bytes[position + 1] == UInt8(ascii: "u")
                else {
                    throw JSONParseError(offset: escapeStart, message: "high surrogate not followed by a low one")
                }
                position += 2
                let low = try scanHex4()
                guard (0xDC00..<0xE000).contains(low) else {
                    throw JSONParseError(offset: escapeStart, message: "high surrogate not followed by a low one")
                }
            }
        default:
            throw error("invalid escape \\\(describeByte(at: position))")
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

    /// The UTF-8 value of validated string contents that hold escapes.
    static func unescape(_ raw: UnsafeBufferPointer<UInt8>) -> [UInt8] {
        JSONStringEscaping.unescape(raw)
    }

    private mutating func readLiteral(_ literal: StaticString) throws(JSONParseError) {
        let count = literal.utf8CodeUnitCount
        for offset in 0..<count {
            guard position + offset < bytes.count, bytes[position + offset] == literal.utf8Start[offset] else {
                position += offset
                throw expected("'\(literal)'")
            }
        }
        position += count
    }

    private mutating func enterContainer() throws(JSONParseError) {
        depth += 1
        guard depth <= JSONParser.maximumDepth else {
            throw JSONParseError(
                offset: position - 1, message: "nested deeper than \(JSONParser.maximumDepth) arrays and objects")
        }
    }

    @inline(__always)
    private func isDigit(at index: Int) -> Bool {
        index < bytes.count && bytes[index] >= UInt8(ascii: "0") && bytes[index] <= UInt8(ascii: "9")
    }

    private mutating func expect(_ byte: UInt8, _ what: String) throws(JSONParseError) {
        guard position < bytes.count, bytes[position] == byte else { throw expected(what) }
        position += 1
    }

    private mutating func consumeIf(_ byte: UInt8) -> Bool {
        guard position < bytes.count, bytes[position] == byte else { return false }
        position += 1
        return true
    }

    private func error(_ message: String) -> JSONParseError {
        JSONParseError(offset: position, message: message)
    }

    private func expected(_ what: String) -> JSONParseError {
        if position >= bytes.count { return error("unexpected end of input, expected \(what)") }
        return error("expected \(what), found \(describeByte(at: position))")
    }

    private func describeByte(at index: Int) -> String {
        guard index < bytes.count else { return "end of input" }
        let byte = bytes[index]
        if byte > 0x20, byte < 0x7F { return "'\(Character(Unicode.Scalar(byte)))'" }
        return "byte 0x" + String(byte, radix: 16, uppercase: true).leftPadded(to: 2)
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

/// A key quoted for an error message, with the escapes a reader expects.
func quoted(_ key: String) -> String {
    var bytes: [UInt8] = []
    JSONStringEscaping.appendString(key, to: &bytes)
    return String(decoding: bytes, as: UTF8.self)
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
