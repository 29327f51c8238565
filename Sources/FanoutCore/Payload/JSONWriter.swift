/// Writes compact JSON straight into one byte array: no whitespace, commas placed by the writer.
///
/// Payloads are written once per job, but a job may fan out to millions of tokens, so the writer stays simple and
/// allocation-light: one reserved array, static keys copied from their literals, numbers formatted in place.
struct JSONWriter {
    private(set) var bytes: [UInt8]
    /// Whether the next key or value must be preceded by a comma.
    private var needsComma = false

    init(capacity: Int) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    /// A writer that appends to `output`, which it takes over (call sites hand the bytes back afterwards).
    init(taking output: inout [UInt8]) {
        bytes = []
        swap(&bytes, &output)
    }

    // MARK: Containers

    mutating func beginObject() {
        separate()
        bytes.append(UInt8(ascii: "{"))
        needsComma = false
    }

    mutating func endObject() {
        bytes.append(UInt8(ascii: "}"))
        needsComma = true
    }

    mutating func beginArray() {
        separate()
        bytes.append(UInt8(ascii: "["))
        needsComma = false
    }

    mutating func endArray() {
        bytes.append(UInt8(ascii: "]"))
        needsComma = true
    }

    /// A key that needs no escaping (the APNs keys), copied from its literal.
    mutating func key(_ key: StaticString) {
        separate()
        bytes.append(UInt8(ascii: "\""))
        bytes.append(contentsOf: UnsafeBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
        bytes.append(UInt8(ascii: "\""))
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    /// Any key, escaped.
    mutating func key(_ key: String) {
        separate()
        JSONStringEscaping.appendString(key, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    // MARK: Values

    mutating func string(_ value: String) {
        separate()
        JSONStringEscaping.appendString(value, to: &bytes)
        needsComma = true
    }

    mutating func integer(_ value: Int64) {
        separate()
        JSONNumberFormatting.appendInteger(value, to: &bytes)
        needsComma = true
    }

    /// A finite double (callers validate first), in its shortest exact form.
    mutating func double(_ value: Double) {
        separate()
        JSONNumberFormatting.appendDouble(value, to: &bytes)
        needsComma = true
    }

    /// The `1` APNs uses for its flags (`content-available`, `mutable-content`, `input-push-token`).
    mutating func one() {
        separate()
        bytes.append(UInt8(ascii: "1"))
        needsComma = true
    }

    /// Validated JSON text, byte for byte.
    mutating func raw(_ value: RawJSON) {
        separate()
        bytes.append(contentsOf: value.bytes)
        needsComma = true
    }

    mutating func value(_ value: JSONValue) {
        switch value {
        case .null:
            separate()
            bytes.append(contentsOf: "null".utf8)
            needsComma = true
        case .bool(let flag):
            separate()
            bytes.append(contentsOf: flag ? "true".utf8 : "false".utf8)
            needsComma = true
        case .number(let number):
            separate()
            bytes.append(contentsOf: number.literal.utf8)
            needsComma = true
        case .string(let string):
            self.string(string)
        case .array(let elements):
            beginArray()
            for element in elements { self.value(element) }
            endArray()
        case .object(let object):
            beginObject()
            for member in object.members {
                key(member.key)
                self.value(member.value)
            }
            endObject()
        }
    }

    @inline(__always)
    private mutating func separate() {
        if needsComma { bytes.append(UInt8(ascii: ",")) }
    }
}

/// Number formatting without loss and without a `String` round trip for integers.
enum JSONNumberFormatting {
    /// Appends the decimal digits of `value`.
    static func appendInteger(_ value: Int64, to output: inout [UInt8]) {
        if value < 0 { output.append(UInt8(ascii: "-")) }
        var magnitude = value.magnitude
        var divisor: UInt64 = 1
        while magnitude / divisor >= 10 { divisor *= 10 }
        while divisor > 0 {
            output.append(UInt8(truncatingIfNeeded: magnitude / divisor) &+ UInt8(ascii: "0"))
            magnitude %= divisor
            divisor /= 10
        }
    }

    /// Appends a finite double: integral values below 2^53 as integers (`50`, not `50.0`), anything else in Swift's
    /// shortest representation that reads back to the same double (`0.5`, `1e-07`, `1.5e+300`), which is valid JSON.
    static func appendDouble(_ value: Double, to output: inout [UInt8]) {
        precondition(value.isFinite, "JSON has no literal for \(value)")
        if value.rounded(.towardZero) == value, value.magnitude < 9_007_199_254_740_992 {
            appendInteger(Int64(value), to: &output)
            return
        }
        output.append(contentsOf: value.description.utf8)
    }
}
