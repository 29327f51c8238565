/// Reading the job file's `live_activity` object (docs/SEND.md):
///
/// ```json
/// {"event": "update", "timestamp": 1764460800, "content_state": {"home": 2, "away": 1},
///  "stale_date": null, "dismissal_date": null, "relevance_score": 50,
///  "alert": {"title": "Goal!", "body": "2-1", "sound": "default"},
///  "attributes_type": null, "attributes": null, "input_push_token": false, "input_push_channel": null}
/// ```
///
/// Null means absent. `timestamp` defaults to the caller's value (the moment the job starts sending). Unknown keys
/// are refused, so a misspelt key is reported instead of silently dropped. In `alert`, `title` and `body` are strings
/// or `{"loc_key": "…", "loc_args": ["…"]}`; the flat forms `title_loc_key`/`title_loc_args` and
/// `loc_key`/`loc_args` (the body's) are accepted too. `sound` is a string, or `{"name": "…", "volume": 0.5,
/// "critical": true}` for a critical alert sound. Errors name the field path, for example
/// `live_activity.alert.title.loc_args[1]: must be a string`. The result has passed `validate()`.
extension LiveActivityContent {
    /// The keys of the job file's `live_activity` object.
    public static let jobFieldKeys = [
        "event", "timestamp", "content_state", "stale_date", "dismissal_date", "relevance_score", "alert",
        "attributes_type", "attributes", "input_push_token", "input_push_channel",
    ]

    static let alertKeys = ["title", "body", "sound", "title_loc_key", "title_loc_args", "loc_key", "loc_args"]

    /// Reads a parsed `live_activity` object. `content_state` and `attributes` are re-encoded compactly, in their
    /// key order.
    public init(jobField: JSONValue, defaultTimestamp: Int64) throws(PayloadError) {
        try self.init(parsing: .value(jobField), defaultTimestamp: defaultTimestamp)
    }

    /// Reads a `live_activity` object kept as bytes (`RawJSON.member("live_activity")` of a job line):
    /// `content_state` and `attributes` are embedded byte for byte.
    public init(jobField: RawJSON, defaultTimestamp: Int64) throws(PayloadError) {
        try self.init(parsing: .raw(jobField), defaultTimestamp: defaultTimestamp)
    }

    /// Reads a `live_activity` object from its JSON text; like `init(jobField: RawJSON, …)`.
    public init(jobFieldBytes bytes: some Collection<UInt8>, defaultTimestamp: Int64) throws(PayloadError) {
        let raw: RawJSON
        do {
            raw = try RawJSON(validating: bytes)
        } catch {
            throw PayloadError(field: "live_activity", message: "not valid JSON: \(error)")
        }
        try self.init(jobField: raw, defaultTimestamp: defaultTimestamp)
    }

    init(parsing field: JobField, defaultTimestamp: Int64) throws(PayloadError) {
        let root = JobFieldReader(path: "live_activity")
        let members = try root.members(of: field)
        var event: Event?
        var timestamp: Int64?
        var contentState: RawJSON?
        var staleDate: Int64?
        var dismissalDate: Int64?
        var relevanceScore: Double?
        var alert: LiveActivityAlert?
        var attributesType: String?
        var attributes: RawJSON?
        var inputPushToken = false
        var inputPushChannel: String?

        for (key, value) in members {
            let reader = root.child(key)
            guard LiveActivityContent.jobFieldKeys.contains(key) else {
                throw reader.error("unknown key (known: \(LiveActivityContent.jobFieldKeys.joined(separator: ", ")))")
            }
            if value.kind == .null { continue }
            switch key {
            case "event":
                let name = try reader.string(value)
                guard let known = Event(rawValue: name) else {
                    throw reader.error(#"must be "start", "update" or "end", not \#(JSONStringEscaping.quoted(name))"#)
                }
                event = known
            case "timestamp": timestamp = try reader.epochSeconds(value)
            case "content_state": contentState = try reader.object(value)
            case "stale_date": staleDate = try reader.epochSeconds(value)
            case "dismissal_date": dismissalDate = try reader.epochSeconds(value)
            case "relevance_score": relevanceScore = try reader.finiteNumber(value)
            case "alert": alert = try LiveActivityContent.parseAlert(value, reader)
            case "attributes_type": attributesType = try reader.string(value)
            case "attributes": attributes = try reader.object(value)
            case "input_push_token": inputPushToken = try reader.bool(value)
            default: inputPushChannel = try reader.string(value)  // "input_push_channel"
            }
        }
        guard let event else { throw root.child("event").error("required") }
        self.init(
            event: event, timestamp: timestamp ?? defaultTimestamp, contentState: contentState, staleDate: staleDate,
            dismissalDate: dismissalDate, relevanceScore: relevanceScore, alert: alert,
            attributesType: attributesType, attributes: attributes, inputPushToken: inputPushToken,
            inputPushChannel: inputPushChannel)
        try validate()
    }

    private static func parseAlert(_ field: JobField, _ reader: JobFieldReader) throws(PayloadError)
        -> LiveActivityAlert
    {
        var alert = LiveActivityAlert()
        var flat: [String: JobField] = [:]
        for (key, value) in try reader.members(of: field) {
            let child = reader.child(key)
            guard alertKeys.contains(key) else {
                throw child.error("unknown key (known: \(alertKeys.joined(separator: ", ")))")
            }
            if value.kind == .null { continue }
            switch key {
            case "title": alert.title = try parseAlertText(value, child)
            case "body": alert.body = try parseAlertText(value, child)
            case "sound": alert.sound = try parseSound(value, child)
            default: flat[key] = value
            }
        }
        for (textKey, locKey, locArgs) in [
            ("title", "title_loc_key", "title_loc_args"), ("body", "loc_key", "loc_args"),
        ] {
            let arguments = try flat[locArgs].map { args throws(PayloadError) in
                try reader.child(locArgs).strings(args)
            }
            guard let key = flat[locKey] else {
                if arguments != nil { throw reader.child(locArgs).error("needs \(locKey)") }
                continue
            }
            let hasText = textKey == "title" ? alert.title != nil : alert.body != nil
            if hasText { throw reader.child(locKey).error("not allowed together with \(textKey)") }
            let text = AlertText.localized(key: try reader.child(locKey).string(key), arguments: arguments ?? [])
            if textKey == "title" { alert.title = text } else { alert.body = text }
        }
        return alert
    }

    private static func parseAlertText(_ field: JobField, _ reader: JobFieldReader) throws(PayloadError) -> AlertText {
        if field.kind == .string { return .plain(try reader.string(field)) }
        guard field.kind == .object else {
            throw reader.error("must be a string or an object with loc_key and loc_args, not \(field.kind)")
        }
        var key: String?
        var arguments: [String] = []
        for (name, value) in try reader.members(of: field) {
            let child = reader.child(name)
            switch name {
            case "loc_key": key = value.kind == .null ? nil : try child.string(value)
            case "loc_args": arguments = value.kind == .null ? [] : try child.strings(value)
            default: throw child.error("unknown key (known: loc_key, loc_args)")
            }
        }
        guard let key else { throw reader.child("loc_key").error("required") }
        return .localized(key: key, arguments: arguments)
    }

    private static func parseSound(_ field: JobField, _ reader: JobFieldReader) throws(PayloadError) -> AlertSound {
        if field.kind == .string { return .named(try reader.string(field)) }
        guard field.kind == .object else {
            throw reader.error("must be a string, or an object with name and volume for a critical sound")
        }
        var name: String?
        var volume = 1.0
        for (key, value) in try reader.members(of: field) where value.kind != .null {
            let child = reader.child(key)
            switch key {
            case "name": name = try child.string(value)
            case "volume": volume = try child.finiteNumber(value)
            case "critical":
                guard value.kind == .bool ? try child.bool(value) : value.value.int64Value == 1 else {
                    throw child.error("must be true (use a string for a sound that is not critical)")
                }
            default: throw child.error("unknown key (known: name, volume, critical)")
            }
        }
        guard let name else { throw reader.child("name").error("required") }
        return .critical(name: name, volume: volume)
    }
}

/// A job-file value, either parsed or kept as exact bytes; objects taken from bytes hand out their members as bytes.
enum JobField {
    case value(JSONValue)
    case raw(RawJSON)

    var kind: JSONValue.Kind {
        switch self {
        case .value(let value): return value.kind
        case .raw(let raw): return raw.kind
        }
    }

    var value: JSONValue {
        switch self {
        case .value(let value): return value
        case .raw(let raw): return raw.value
        }
    }

    var raw: RawJSON {
        switch self {
        case .value(let value): return RawJSON(value)
        case .raw(let raw): return raw
        }
    }
}

/// Typed reads of job-file values, with errors that name the path (`live_activity.alert.title`).
struct JobFieldReader {
    let path: String

    func child(_ key: String) -> JobFieldReader {
        JobFieldReader(path: path + "." + key)
    }

    func error(_ message: String) -> PayloadError {
        PayloadError(field: path, message: message)
    }

    func members(of field: JobField) throws(PayloadError) -> [(key: String, value: JobField)] {
        switch field {
        case .value(.object(let object)): return object.members.map { ($0.key, .value($0.value)) }
        case .raw(let raw) where raw.kind == .object: return raw.members().map { ($0.key, .raw($0.value)) }
        default: throw error("must be a JSON object, not \(field.kind)")
        }
    }

    func string(_ field: JobField) throws(PayloadError) -> String {
        guard let string = field.value.stringValue else { throw error("must be a string, not \(field.kind)") }
        return string
    }

    func bool(_ field: JobField) throws(PayloadError) -> Bool {
        guard let flag = field.value.boolValue else { throw error("must be true or false, not \(field.kind)") }
        return flag
    }

    func epochSeconds(_ field: JobField) throws(PayloadError) -> Int64 {
        guard let seconds = field.value.int64Value, seconds >= 0 else {
            throw error("must be a non-negative integer (seconds since 1970)")
        }
        return seconds
    }

    func finiteNumber(_ field: JobField) throws(PayloadError) -> Double {
        guard let number = field.value.doubleValue else { throw error("must be a number, not \(field.kind)") }
        guard number.isFinite else { throw error("must be a finite number") }
        return number
    }

    func object(_ field: JobField) throws(PayloadError) -> RawJSON {
        guard field.kind == .object else { throw error("must be a JSON object, not \(field.kind)") }
        return field.raw
    }

    func strings(_ field: JobField) throws(PayloadError) -> [String] {
        guard let elements = field.value.arrayValue else { throw error("must be an array of strings") }
        var strings: [String] = []
        strings.reserveCapacity(elements.count)
        for (index, element) in elements.enumerated() {
            guard let string = element.stringValue else {
                throw PayloadError(field: "\(path)[\(index)]", message: "must be a string, not \(element.kind)")
            }
            strings.append(string)
        }
        return strings
    }
}
