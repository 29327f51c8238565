import FanoutCore
import Foundation

/// A JSON object from a request body, read field by field; every refusal names the field (with its path, such as
/// `notifications[0].live_activity.content-state`).
struct RequestBody {
    let object: JSONObject
    let path: String

    init(object: JSONObject, path: String = "") {
        self.object = object
        self.path = path
    }

    /// The body of `request` as a JSON object.
    static func parse(_ bytes: [UInt8]) throws(APIError) -> RequestBody {
        guard !bytes.isEmpty else { throw APIError(400, "the request has no body; a JSON object was expected") }
        let value: JSONValue
        do { value = try JSONValue.parse(bytes) } catch {
            throw APIError(400, "the body is not valid JSON: \(error)")
        }
        guard let object = value.objectValue else { throw APIError(400, "the body must be a JSON object") }
        return RequestBody(object: object)
    }

    func field(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    /// The value, nil when absent or null.
    func value(_ key: String) -> JSONValue? {
        guard let value = object[key], !value.isNull else { return nil }
        return value
    }

    func string(_ key: String) throws(APIError) -> String? {
        guard let value = value(key) else { return nil }
        guard let text = value.stringValue else { throw .badField(field(key), "\(field(key)) must be a string") }
        return text
    }

    func requiredString(_ key: String) throws(APIError) -> String {
        guard let text = try string(key), !text.isEmpty else {
            throw .badField(field(key), "\(field(key)) is required (a non-empty string)")
        }
        return text
    }

    /// An id (activity, device, user, attributes type, collapse id): a string without control characters
    /// (`APIIdentifier`).
    func identifier(_ key: String) throws(APIError) -> String? {
        guard let text = try string(key) else { return nil }
        try APIIdentifier.check(text, field: field(key))
        return text
    }

    func requiredIdentifier(_ key: String) throws(APIError) -> String {
        let text = try requiredString(key)
        try APIIdentifier.check(text, field: field(key))
        return text
    }

    /// A list of ids (`users`, `devices`), each as `identifier`.
    func identifiers(_ key: String) throws(APIError) -> [String]? {
        guard let strings = try strings(key) else { return nil }
        for (index, text) in strings.enumerated() {
            try APIIdentifier.check(text, field: "\(field(key))[\(index)]")
        }
        return strings
    }

    func integer(_ key: String) throws(APIError) -> Int64? {
        guard let value = value(key) else { return nil }
        guard let number = value.int64Value else { throw .badField(field(key), "\(field(key)) must be a whole number") }
        return number
    }

    /// A finite number: a literal past Double's range (`1e309`) is refused, not read as infinity (which has no
    /// JSON form, so the field would leave the payload unnoticed).
    func number(_ key: String) throws(APIError) -> Double? {
        guard let value = value(key) else { return nil }
        guard let number = value.doubleValue else { throw .badField(field(key), "\(field(key)) must be a number") }
        guard number.isFinite else {
            throw .badField(field(key), "\(field(key)) must be a finite number (\(value) is out of range)")
        }
        return number
    }

    func bool(_ key: String) throws(APIError) -> Bool? {
        guard let value = value(key) else { return nil }
        guard let flag = value.boolValue else { throw .badField(field(key), "\(field(key)) must be true or false") }
        return flag
    }

    func object(_ key: String) throws(APIError) -> RequestBody? {
        guard let value = value(key) else { return nil }
        guard let object = value.objectValue else { throw .badField(field(key), "\(field(key)) must be an object") }
        return RequestBody(object: object, path: field(key))
    }

    func requiredObject(_ key: String) throws(APIError) -> RequestBody {
        guard let object = try object(key) else { throw .badField(field(key), "\(field(key)) is required (an object)") }
        return object
    }

    func strings(_ key: String) throws(APIError) -> [String]? {
        guard let value = value(key) else { return nil }
        guard let array = value.arrayValue else {
            throw .badField(field(key), "\(field(key)) must be an array of strings")
        }
        var strings: [String] = []
        for (index, element) in array.enumerated() {
            guard let text = element.stringValue, !text.isEmpty else {
                throw .badField("\(field(key))[\(index)]", "\(field(key))[\(index)] must be a non-empty string")
            }
            strings.append(text)
        }
        return strings
    }

    /// A date as Unix seconds: a whole number, or an ISO-8601 string (`2024-01-22T00:00:00+0000`, `...Z`,
    /// `...+00:00`, with or without fractional seconds).
    func date(_ key: String) throws(APIError) -> Int64? {
        guard let value = value(key) else { return nil }
        if let seconds = value.int64Value { return seconds }
        if let text = value.stringValue, let seconds = ISO8601Date.parse(text) { return seconds }
        throw .badField(
            field(key), "\(field(key)) must be Unix seconds or an ISO-8601 date such as 2024-01-22T16:55:49Z")
    }

    /// Refuses keys this endpoint does not know, so that a typo is not silently ignored.
    func rejectUnknown(_ known: Set<String>) throws(APIError) {
        for member in object where !known.contains(member.key) {
            throw .badField(
                field(member.key),
                "unknown field \(field(member.key)) (known: \(known.sorted().joined(separator: ", ")))")
        }
    }
}

/// The rule for ids a request names (activity, dispatch, device, user ids, attributes types, idempotency keys): no
/// control character (Unicode's `Cc`: U+0000 to U+001F, U+007F to U+009F). Such an id would be stored and then
/// printed into logs, results lines and headers, where a NUL cuts a C string and a line break forges a line.
enum APIIdentifier {
    static func check(_ text: String, field: String) throws(APIError) {
        guard let scalar = text.unicodeScalars.first(where: { $0.properties.generalCategory == .control }) else {
            return
        }
        let code = String(scalar.value, radix: 16, uppercase: true)
        throw .badField(
            field,
            "\(field) must not contain control characters (it has U+\(String(repeating: "0", count: 4 - code.count))\(code))"
        )
    }
}

/// ISO-8601 date-times as Braze writes them, to Unix seconds. A date that does not exist (February 30th, an offset
/// of +99:00) is nil, not normalised into another one.
enum ISO8601Date {
    static func parse(_ text: String) -> Int64? {
        let bytes = Array(text.utf8)
        var index = 0
        func digits(_ count: Int) -> Int? {
            guard index + count <= bytes.count else { return nil }
            var value = 0
            for byte in bytes[index..<index + count] {
                guard byte >= 0x30 && byte <= 0x39 else { return nil }
                value = value * 10 + Int(byte - 0x30)
            }
            index += count
            return value
        }
        func expect(_ character: Character) -> Bool {
            guard index < bytes.count, bytes[index] == character.asciiValue! else { return false }
            index += 1
            return true
        }
        guard let year = digits(4), expect("-"), let month = digits(2), expect("-"), let day = digits(2),
            index < bytes.count, bytes[index] == UInt8(ascii: "T") || bytes[index] == UInt8(ascii: " ")
        else { return nil }
        index += 1
        guard let hour = digits(2), expect(":"), let minute = digits(2), expect(":"), let second = digits(2),
            (1...12).contains(month), (1...daysIn(month: month, year: year)).contains(day), hour < 24, minute < 60,
            second < 61
        else { return nil }
        if expect(".") {
            let start = index
            while index < bytes.count, bytes[index] >= 0x30 && bytes[index] <= 0x39 { index += 1 }
            guard index > start else { return nil }
        }
        var offset = 0
        if expect("Z") || expect("z") {
            offset = 0
        } else if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
            let sign = bytes[index] == UInt8(ascii: "-") ? -1 : 1
            index += 1
            // ±hh:mm, ±hhmm or ±hh; a colon must be followed by the minutes.
            guard let offsetHours = digits(2) else { return nil }
            let offsetMinutes = expect(":") ? digits(2) : (index < bytes.count ? digits(2) : 0)
            guard let offsetMinutes, offsetHours < 24, offsetMinutes < 60 else { return nil }
            offset = sign * (offsetHours * 3600 + offsetMinutes * 60)
        } else {
            return nil
        }
        guard index == bytes.count else { return nil }
        var parts = tm()
        parts.tm_year = Int32(year - 1900)
        parts.tm_mon = Int32(month - 1)
        parts.tm_mday = Int32(day)
        parts.tm_hour = Int32(hour)
        parts.tm_min = Int32(minute)
        parts.tm_sec = Int32(second)
        return Int64(timegm(&parts)) - Int64(offset)
    }

    /// The days of a month (1 to 12) of the proleptic Gregorian calendar.
    static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: return year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }
}
