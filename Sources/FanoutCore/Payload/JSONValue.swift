/// A JSON value whose objects keep their keys in order and whose numbers keep their exact literal.
///
/// Payloads are built from it (or from `RawJSON`) and encoded compactly in the order the keys were given, so what
/// a job file says is what the device receives, key order included.
public enum JSONValue: Sendable, Hashable {
    case null
    case bool(Bool)
    case number(JSONNumber)
    case string(String)
    case array([JSONValue])
    case object(JSONObject)

    /// The six JSON kinds, for checks and messages (`must be a JSON object, not an array`).
    public enum Kind: Sendable, Hashable, CustomStringConvertible {
        case null, bool, number, string, array, object

        public var description: String {
            switch self {
            case .null: return "null"
            case .bool: return "a boolean"
            case .number: return "a number"
            case .string: return "a string"
            case .array: return "an array"
            case .object: return "an object"
            }
        }
    }

    public var kind: Kind {
        switch self {
        case .null: return .null
        case .bool: return .bool
        case .number: return .number
        case .string: return .string
        case .array: return .array
        case .object: return .object
        }
    }

    /// A number value from an integer.
    public static func integer(_ value: Int64) -> JSONValue { .number(JSONNumber(value)) }

    /// A number value from a double; nil for infinities and NaN, which JSON cannot express.
    public static func double(_ value: Double) -> JSONValue? { JSONNumber(value).map(JSONValue.number) }

    public var isNull: Bool { self == .null }

    public var boolValue: Bool? {
        if case .bool(let value) = self { return value }
        return nil
    }

    public var numberValue: JSONNumber? {
        if case .number(let value) = self { return value }
        return nil
    }

    /// The value of an integer literal that fits in `Int64` (no fraction, no exponent).
    public var int64Value: Int64? { numberValue?.int64Value }

    public var doubleValue: Double? { numberValue?.doubleValue }

    public var stringValue: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    public var arrayValue: [JSONValue]? {
        if case .array(let value) = self { return value }
        return nil
    }

    public var objectValue: JSONObject? {
        if case .object(let value) = self { return value }
        return nil
    }

    /// The member named `key` when this is an object.
    public subscript(key: String) -> JSONValue? { objectValue?[key] }

    /// Parses one JSON document strictly (see `JSONParseError` for what is refused and how it is reported).
    public static func parse(_ bytes: some Collection<UInt8>) throws(JSONParseError) -> JSONValue {
        try JSONParser.withParser(over: bytes) { parser throws(JSONParseError) in
            let value = try parser.parseValue()
            try parser.finish()
            return value
        }
    }

    public static func parse(_ text: String) throws(JSONParseError) -> JSONValue {
        try parse(text.utf8)
    }

    /// The compact encoding: no whitespace, keys in order, strings escaped as RFC 8259 requires.
    public func encoded() -> [UInt8] {
        var writer = JSONWriter(capacity: 64)
        writer.value(self)
        return writer.bytes
    }

    /// Appends the compact encoding to `output`.
    public func append(to output: inout [UInt8]) {
        var writer = JSONWriter(taking: &output)
        writer.value(self)
        output = writer.bytes
    }
}

extension JSONValue: CustomStringConvertible {
    /// The compact JSON text.
    public var description: String { String(decoding: encoded(), as: UTF8.self) }
}

extension JSONValue: ExpressibleByNilLiteral, ExpressibleByBooleanLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByFloatLiteral, ExpressibleByStringLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral
{
    public init(nilLiteral: ()) { self = .null }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(integerLiteral value: Int64) { self = .number(JSONNumber(value)) }
    public init(floatLiteral value: Double) {
        guard let number = JSONNumber(value) else { preconditionFailure("JSON has no literal for \(value)") }
        self = .number(number)
    }
    public init(stringLiteral value: String) { self = .string(value) }
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        var object = JSONObject()
        for (key, value) in elements { object[key] = value }
        self = .object(object)
    }
}

/// A JSON object's members in order, each key once.
///
/// Setting a key that is present replaces its value in place; setting nil removes it. Equality is ordered: two
/// objects with the same members in another order encode differently, so they are different here too.
public struct JSONObject: Sendable, Hashable, RandomAccessCollection, ExpressibleByDictionaryLiteral {
    public struct Member: Sendable, Hashable {
        public var key: String
        public var value: JSONValue

        public init(key: String, value: JSONValue) {
            self.key = key
            self.value = value
        }
    }

    public private(set) var members: [Member]

    public init() {
        members = []
    }

    /// An object from members in order; a key given twice keeps its first position and its last value.
    public init(_ members: some Sequence<Member>) {
        self.members = []
        for member in members { self[member.key] = member.value }
    }

    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        self.init(elements.lazy.map { Member(key: $0.0, value: $0.1) })
    }

    public var startIndex: Int { members.startIndex }
    public var endIndex: Int { members.endIndex }
    public subscript(position: Int) -> Member { members[position] }

    public var keys: [String] { members.map(\.key) }

    public subscript(key: String) -> JSONValue? {
        get { members.first { $0.key == key }?.value }
        set {
            let index = members.firstIndex { $0.key == key }
            switch (index, newValue) {
            case (let index?, let value?): members[index].value = value
            case (let index?, nil): members.remove(at: index)
            case (nil, let value?): members.append(Member(key: key, value: value))
            case (nil, nil): break
            }
        }
    }

    /// Appends a member whose key the caller knows is new (the parser checks with its own key set).
    mutating func appendUnchecked(key: String, value: JSONValue) {
        members.append(Member(key: key, value: value))
    }
}

/// A JSON number kept as its literal, so nothing is lost: `12345678901234567890`, `0.1` and `1e400` all round-trip
/// exactly. Integers made from `Int64` print as integers; doubles print in their shortest exact form (`50.0` as `50`,
/// `0.5` as `0.5`).
///
/// Equality compares literals: `1` and `1.0` are different numbers here, as they are different texts on the wire.
public struct JSONNumber: Sendable, Hashable, CustomStringConvertible {
    /// The JSON literal, for example `-12`, `0.5` or `1e-07`.
    public let literal: String

    public init(_ value: Int64) {
        var bytes: [UInt8] = []
        JSONNumberFormatting.appendInteger(value, to: &bytes)
        literal = String(decoding: bytes, as: UTF8.self)
    }

    public init(_ value: Int) {
        self.init(Int64(value))
    }

    /// Nil for infinities and NaN, which JSON cannot express.
    public init?(_ value: Double) {
        guard value.isFinite else { return nil }
        var bytes: [UInt8] = []
        JSONNumberFormatting.appendDouble(value, to: &bytes)
        literal = String(decoding: bytes, as: UTF8.self)
    }

    /// Nil unless `literal` is exactly one JSON number (no spaces, no `+`, no leading zeros).
    public init?(literal: String) {
        let valid: Bool
        do {
            valid = try JSONParser.withParser(over: literal.utf8) { parser throws(JSONParseError) in
                guard try parser.peekKind() == .number else { return false }
                return try parser.scanNumber() == 0..<parser.bytes.count
            }
        } catch {
            valid = false
        }
        guard valid else { return nil }
        self.literal = literal
    }

    init(uncheckedLiteral: String) {
        literal = uncheckedLiteral
    }

    /// Whether the literal has neither a fraction nor an exponent.
    public var isInteger: Bool {
        !literal.utf8.contains { $0 == UInt8(ascii: ".") || $0 | 0x20 == UInt8(ascii: "e") }
    }

    /// The value when the literal is an integer (no fraction, no exponent) that fits in `Int64`.
    public var int64Value: Int64? {
        var literal = literal
        return literal.withUTF8 { JSONParser.int64(integerLiteral: $0) }
    }

    /// The nearest `Double`; infinite when the exponent is out of range (`1e400`).
    public var doubleValue: Double {
        Double(literal) ?? (literal.hasPrefix("-") ? -.infinity : .infinity)
    }

    public var description: String { literal }
}
