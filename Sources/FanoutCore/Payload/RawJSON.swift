/// One validated JSON value kept as its exact bytes, so it can be embedded in a payload byte for byte.
///
/// A job's `content_state` or `payload` given in the job file is sent as written: spacing, key order and number
/// spelling inside it are kept. Only whitespace around the value is dropped. Validation is the strict parser's
/// (`JSONParseError`), so a `RawJSON` always parses.
public struct RawJSON: Sendable, Hashable, CustomStringConvertible {
    /// The value's UTF-8 bytes.
    public let bytes: [UInt8]
    /// The kind of the value (`object` for a `content_state`).
    public let kind: JSONValue.Kind

    /// Validates `bytes` as one JSON document and keeps the value's bytes.
    public init(validating bytes: some Collection<UInt8>) throws(JSONParseError) {
        let (slice, kind) = try JSONParser.withParser(over: bytes) { parser throws(JSONParseError) in
            let (range, kind) = try parser.validateDocument()
            return (Array(parser.slice(range)), kind)
        }
        self.bytes = slice
        self.kind = kind
    }

    public init(validating text: String) throws(JSONParseError) {
        try self.init(validating: text.utf8)
    }

    /// The compact encoding of `value`.
    public init(_ value: JSONValue) {
        bytes = value.encoded()
        kind = value.kind
    }

    init(unchecked bytes: [UInt8], kind: JSONValue.Kind) {
        self.bytes = bytes
        self.kind = kind
    }

    /// The parsed value.
    public var value: JSONValue {
        do {
            return try JSONValue.parse(bytes)
        } catch {
            preconditionFailure("RawJSON holds bytes that do not parse: \(error)")
        }
    }

    /// The JSON text.
    public var description: String { String(decoding: bytes, as: UTF8.self) }

    /// The members of an object, each value kept as its exact bytes; empty when this is not an object.
    ///
    /// A job reader uses it to take `live_activity` and `payload` out of a job line without re-encoding them.
    public func members() -> [(key: String, value: RawJSON)] {
        guard kind == .object else { return [] }
        var members: [(key: String, value: RawJSON)] = []
        do {
            // The bytes passed the strict rules when this value was made; the key check need not run again.
            try JSONParser.withParser(over: bytes, rules: .rfc8259) { parser throws(JSONParseError) in
                try parser.readObject { key, parser throws(JSONParseError) in
                    let start = parser.position
                    let kind = try parser.skipValue()
                    members.append(
                        (
                            parser.string(of: key),
                            RawJSON(unchecked: Array(parser.slice(start..<parser.position)), kind: kind)
                        ))
                }
            }
        } catch {
            preconditionFailure("RawJSON holds bytes that do not parse: \(error)")
        }
        return members
    }

    /// The member named `key`, as exact bytes; nil when absent or when this is not an object.
    public func member(_ key: String) -> RawJSON? {
        members().first { $0.key == key }?.value
    }
}
