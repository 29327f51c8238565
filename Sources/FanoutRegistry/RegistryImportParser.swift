import FanoutCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Why one import line was refused: its line number, the field at fault, and what is wrong.
package struct RegistryImportError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The 1-based line number in the file (the CSV header is line 1).
    package let lineNumber: Int
    /// The field as the file names it (`token`, `activity_id`, ...); nil when the line as a whole is wrong.
    package let field: String?
    /// What is wrong.
    package let message: String

    package init(lineNumber: Int, field: String?, message: String) {
        self.lineNumber = lineNumber
        self.field = field
        self.message = message
    }

    /// `line 7: token: "abc" is not a device token (…)`.
    package var description: String {
        "line \(lineNumber): " + (field.map { "\($0): " } ?? "") + message
    }
}

/// The two import formats.
package enum RegistryImportFormat: String, Sendable, Hashable {
    /// One JSON object per line (`fanout registry import`, docs/REGISTRY.md).
    case jsonLines = "jsonl"
    /// Comma-separated values with a header row naming the same fields as the JSON lines.
    case csv

    /// JSON lines when the first non-blank byte of `firstLine` is `{`, CSV otherwise.
    package static func detect(firstLine: some Collection<UInt8>) -> RegistryImportFormat {
        let first = firstLine.first { !RegistryImportParser.isBlank($0) }
        return first == UInt8(ascii: "{") ? .jsonLines : .csv
    }
}

/// Turns import lines into typed registrations, validated (tokens lowercase, ids within limits) but not checked
/// against the registry (whether the app is defined is the importer's business).
///
/// JSON lines, one of three shapes (docs/REGISTRY.md); null means absent, unknown keys are refused:
/// ```json
/// {"app": "com.acme.app", "activity_id": "match-7", "token": "<hex>", "device": "d1", "user": "u1"}
/// {"app": "com.acme.app", "push_to_start_token": "<hex>", "attributes_type": "MatchAttributes", "device": "d1"}
/// {"app": "com.acme.app", "device": "d1", "user": "u1", "push_token": "<hex>"}
/// ```
/// Each may carry `"registered_at"` (Unix seconds) for back-filling. An empty `token` stops the device's token for the
/// activity; an empty `push_to_start_token` or `push_token` removes it.
///
/// CSV: a header row naming some of the same fields, then one registration per row; an empty cell is absent. Fields
/// may be quoted (`"a,b"`, `""` for a quote inside); a quoted field cannot span lines.
package struct RegistryImportParser: Sendable {
    /// The fields of an import line.
    package static let knownFields = [
        "app", "activity_id", "token", "device", "user", "push_to_start_token", "attributes_type", "push_token",
        "registered_at",
    ]

    package let format: RegistryImportFormat
    /// The CSV columns, once the header has been read.
    private var columns: [Field]?

    package init(format: RegistryImportFormat) {
        self.format = format
    }

    /// Parses one line. Nil for a blank line and for the CSV header (which it remembers).
    package mutating func parse(line: some Collection<UInt8>, lineNumber: Int) throws(RegistryImportError)
        -> Registration?
    {
        guard line.contains(where: { !RegistryImportParser.isBlank($0) }) else { return nil }
        var fields = Fields()
        do throws(LineFailure) {
            switch format {
            case .jsonLines:
                try fields.readJSON(line)
            case .csv:
                guard let columns else {
                    columns = try RegistryImportParser.header(line)
                    return nil
                }
                try fields.readCSV(line, columns: columns)
            }
            return try fields.registration()
        } catch {
            throw RegistryImportError(lineNumber: lineNumber, field: error.field, message: error.message)
        }
    }

    static func isBlank(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") || byte == UInt8(ascii: "\r")
    }

    private static func header(_ line: some Collection<UInt8>) throws(LineFailure) -> [Field] {
        var columns: [Field] = []
        for name in try CSV.split(line) {
            let trimmed = name.trimmingBlanks()
            guard let field = Field(rawValue: trimmed) else {
                throw LineFailure(
                    nil,
                    "unknown column \(JSONStringEscaping.quoted(trimmed)) in the CSV header (known: "
                        + "\(knownFields.joined(separator: ", ")))")
            }
            guard !columns.contains(field) else {
                throw LineFailure(nil, "column \(field.rawValue) appears twice in the CSV header")
            }
            columns.append(field)
        }
        guard columns.contains(.app) else { throw LineFailure(nil, "the CSV header has no app column") }
        return columns
    }
}

/// A field of an import line.
private enum Field: String, CaseIterable {
    case app, activityID = "activity_id", token, device, user, pushToStartToken = "push_to_start_token"
    case attributesType = "attributes_type", pushToken = "push_token", registeredAt = "registered_at"
}

/// A refusal before the line number is attached.
private struct LineFailure: Error {
    let field: String?
    let message: String

    init(_ field: String?, _ message: String) {
        self.field = field
        self.message = message
    }

    init(_ error: RegistryError) {
        self.init(error.field, error.message)
    }
}

/// The values of one line, whatever its format.
private struct Fields {
    /// The string fields, one stored property each (no dictionary to hash into for every line of a million).
    private var app, activityID, token, device, user, pushToStartToken, attributesType, pushToken: String?
    /// `registered_at` in Unix milliseconds.
    var registeredAt: Int64?

    /// A string field; `registered_at` is not one (it is always nil here).
    subscript(_ field: Field) -> String? {
        get {
            switch field {
            case .app: return app
            case .activityID: return activityID
            case .token: return token
            case .device: return device
            case .user: return user
            case .pushToStartToken: return pushToStartToken
            case .attributesType: return attributesType
            case .pushToken: return pushToken
            case .registeredAt: return nil
            }
        }
        set {
            switch field {
            case .app: app = newValue
            case .activityID: activityID = newValue
            case .token: token = newValue
            case .device: device = newValue
            case .user: user = newValue
            case .pushToStartToken: pushToStartToken = newValue
            case .attributesType: attributesType = newValue
            case .pushToken: pushToken = newValue
            case .registeredAt: break
            }
        }
    }

    mutating func readJSON(_ line: some Collection<UInt8>) throws(LineFailure) {
        let value: JSONValue
        do {
            value = try JSONValue.parse(line)
        } catch {
            throw LineFailure(nil, "not valid JSON (\(error))")
        }
        guard let object = value.objectValue else {
            throw LineFailure(nil, "must be a JSON object, not \(value.kind)")
        }
        for member in object {
            guard let field = Field(rawValue: member.key) else {
                throw LineFailure(
                    member.key,
                    "unknown field (known: \(RegistryImportParser.knownFields.joined(separator: ", ")))")
            }
            switch (field, member.value) {
            case (_, .null):
                continue
            case (.registeredAt, .number(let number)):
                registeredAt = try Fields.milliseconds(number, text: number.literal)
            case (.registeredAt, let other):
                throw LineFailure(field.rawValue, "must be a number (Unix seconds), not \(other.kind)")
            case (_, .string(let text)):
                self[field] = text
            case (_, let other):
                throw LineFailure(field.rawValue, "must be a string, not \(other.kind)")
            }
        }
    }

    mutating func readCSV(_ line: some Collection<UInt8>, columns: [Field]) throws(LineFailure) {
        let cells = try CSV.split(line)
        guard cells.count <= columns.count else {
            throw LineFailure(nil, "\(cells.count) cells, but the header names \(columns.count) columns")
        }
        for (field, cell) in zip(columns, cells) where !cell.isEmpty {
            if field == .registeredAt {
                let text = cell.trimmingBlanks()
                guard let number = JSONNumber(literal: text) else {
                    throw LineFailure(
                        field.rawValue, "\(JSONStringEscaping.quoted(text)) is not a number (Unix seconds)")
                }
                registeredAt = try Fields.milliseconds(number, text: text)
            } else {
                self[field] = cell
            }
        }
    }

    /// Unix seconds (integer or fraction) as milliseconds.
    static func milliseconds(_ number: JSONNumber, text: String) throws(LineFailure) -> Int64 {
        if let seconds = number.int64Value {
            let (milliseconds, overflow) = seconds.multipliedReportingOverflow(by: 1000)
            guard !overflow, seconds >= 0 else { throw LineFailure("registered_at", "\(text) is out of range") }
            return milliseconds
        }
        let milliseconds = (number.doubleValue * 1000).rounded()
        guard milliseconds >= 0, milliseconds < 9.2e18 else {
            throw LineFailure("registered_at", "\(text) is out of range")
        }
        return Int64(milliseconds)
    }

    /// The registration the fields describe, validated.
    func registration() throws(LineFailure) -> Registration {
        do {
            return try build()
        } catch {
            throw LineFailure(error)
        }
    }

    private func build() throws(RegistryError) -> Registration {
        typealias V = RegistryValidation
        guard let app = self[.app] else { throw .invalid("app", "missing") }
        let bundleID = try V.identifier(app, field: "app")
        let kinds: [Field] = [.activityID, .pushToStartToken, .pushToken].filter { self[$0] != nil }
        if kinds.count > 1 {
            throw .invalid(kinds[1].rawValue, "cannot be combined with \(kinds[0].rawValue) on one line")
        }
        func forbid(_ field: Field, on kind: String) throws(RegistryError) {
            if self[field] != nil { throw .invalid(field.rawValue, "is not a field of \(kind) lines") }
        }
        let device = try V.optionalIdentifier(self[.device], field: "device")
        let user = try V.optionalIdentifier(self[.user], field: "user")
        switch kinds.first {
        case .activityID?:
            try forbid(.attributesType, on: "update-token (activity_id)")
            guard let token = self[.token] else { throw .invalid("token", "missing (an activity_id line needs one)") }
            return .updateToken(
                UpdateTokenRegistration(
                    app: bundleID, activityID: try V.identifier(self[.activityID]!, field: "activity_id"),
                    deviceID: device, userID: user, token: try V.token(token, field: "token", allowEmpty: true),
                    registeredAt: registeredAt))
        case .pushToStartToken?:
            try forbid(.token, on: "push_to_start_token")
            guard let device else { throw .invalid("device", "missing (a push_to_start_token line needs one)") }
            return .pushToStart(
                PushToStartRegistration(
                    app: bundleID, deviceID: device, userID: user,
                    attributesType: try V.optionalIdentifier(self[.attributesType], field: "attributes_type"),
                    token: try V.token(self[.pushToStartToken]!, field: "push_to_start_token", allowEmpty: true),
                    updatedAt: registeredAt))
        default:
            try forbid(.token, on: "device")
            try forbid(.attributesType, on: "device")
            guard let device else {
                throw .invalid(
                    "device", "missing (a line needs activity_id and token, push_to_start_token and device, or device)")
            }
            return .device(
                DeviceRegistration(
                    app: bundleID, deviceID: device, userID: user,
                    pushToken: try self[.pushToken].map { (token) throws(RegistryError) in
                        try V.token(token, field: "push_token", allowEmpty: true)
                    }, registeredAt: registeredAt))
        }
    }
}

/// RFC 4180 fields of one line.
private enum CSV {
    static func split(_ line: some Collection<UInt8>) throws(LineFailure) -> [String] {
        let run = { (bytes: UnsafeBufferPointer<UInt8>) -> Result<[String], LineFailure> in
            do throws(LineFailure) {
                return .success(try split(bytes))
            } catch {
                return .failure(error)
            }
        }
        if let result = line.withContiguousStorageIfAvailable(run) { return try result.get() }
        return try Array(line).withUnsafeBufferPointer(run).get()
    }

    private static func split(_ line: UnsafeBufferPointer<UInt8>) throws(LineFailure) -> [String] {
        var count = line.count
        while count > 0, line[count - 1] == UInt8(ascii: "\r") { count -= 1 }
        let bytes = UnsafeBufferPointer(rebasing: line[0..<count])
        guard let base = bytes.baseAddress, count > 0 else { return [""] }
        // Most lines have no quotes: cut at each comma with memchr.
        if memchr(base, Int32(UInt8(ascii: "\"")), count) == nil {
            var cells: [String] = []
            var start = 0
            while true {
                let rest = count - start
                guard let comma = memchr(base + start, Int32(UInt8(ascii: ",")), rest) else {
                    cells.append(String(decoding: UnsafeBufferPointer(start: base + start, count: rest), as: UTF8.self))
                    return cells
                }
                let end = UnsafeRawPointer(comma) - UnsafeRawPointer(base)
                cells.append(
                    String(decoding: UnsafeBufferPointer(start: base + start, count: end - start), as: UTF8.self))
                start = end + 1
            }
        }
        return try splitQuoted(bytes)
    }

    private static func splitQuoted(_ bytes: UnsafeBufferPointer<UInt8>) throws(LineFailure) -> [String] {
        var cells: [String] = []
        var cell: [UInt8] = []
        var index = 0
        let quote = UInt8(ascii: "\"")
        let comma = UInt8(ascii: ",")
        while true {
            cell.removeAll(keepingCapacity: true)
            if index < bytes.count, bytes[index] == quote {
                index += 1
                while true {
                    guard index < bytes.count else { throw LineFailure(nil, "a quoted CSV field is not closed") }
                    if bytes[index] == quote {
                        if index + 1 < bytes.count, bytes[index + 1] == quote {
                            cell.append(quote)
                            index += 2
                            continue
                        }
                        index += 1
                        break
                    }
                    cell.append(bytes[index])
                    index += 1
                }
                guard index == bytes.count || bytes[index] == comma else {
                    throw LineFailure(nil, "unexpected text after a quoted CSV field")
                }
            } else {
                while index < bytes.count, bytes[index] != comma {
                    cell.append(bytes[index])
                    index += 1
                }
            }
            cells.append(String(decoding: cell, as: UTF8.self))
            guard index < bytes.count else { return cells }
            index += 1  // the comma
        }
    }
}

extension String {
    fileprivate func trimmingBlanks() -> String {
        let bytes = Array(utf8)
        guard let first = bytes.firstIndex(where: { !RegistryImportParser.isBlank($0) }),
            let last = bytes.lastIndex(where: { !RegistryImportParser.isBlank($0) })
        else { return "" }
        return String(decoding: bytes[first...last], as: UTF8.self)
    }
}
