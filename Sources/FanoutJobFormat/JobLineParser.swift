import FanoutCore

/// A job line that parsed and validated: the job, ready for the engine, and where it came from.
package struct ParsedJobLine: Sendable {
    package var job: ParsedJob
    /// The 1-based line number in the job file.
    package var lineNumber: Int
    /// Whether the line's `live_activity` gives no `timestamp`, so it took the parse's `now`.
    package var usesDefaultTimestamp: Bool

    package init(job: ParsedJob, lineNumber: Int, usesDefaultTimestamp: Bool = false) {
        self.job = job
        self.lineNumber = lineNumber
        self.usesDefaultTimestamp = usesDefaultTimestamp
    }
}

/// Turns one line of a job file (the format in docs/SEND.md) into a validated `ParsedJob`.
///
/// ```json
/// {"id": "match-7-update-12", "workspace": "acme", "topic": "com.acme.app.push-type.liveactivity",
///  "push_type": "liveactivity", "priority": 10, "expiration": 0, "collapse_id": null,
///  "live_activity": {…}, "payload": null, "tokens": ["<hex token>"], "tokens_file": null}
/// ```
///
/// Null means absent. Unknown keys are refused, so a misspelt key is reported instead of silently ignored. Everything
/// APNs would reject for the job as a whole is caught here, once, before any token is sent: the headers' rules, the
/// Live Activity's rules, the payload size, each inline token, and whether `tokens_file` can be opened. A failure is a
/// `JobLineError` whose message starts with the job-file field at fault.
package struct JobLineParser: Sendable {
    /// The keys of a job line.
    package static let knownKeys = [
        "id", "workspace", "topic", "push_type", "priority", "expiration", "collapse_id", "live_activity", "payload",
        "tokens", "tokens_file", "app", "activity_id", "push_to_start", "users", "devices", "channel_id",
        "channel_storage_policy",
    ]

    /// The longest activity id, in UTF-8 bytes.
    package static let maximumActivityIDBytes = 256

    /// The workspace of a job that names none.
    package static let defaultWorkspace = "default"

    package init() {}

    /// Parses and validates one line.
    ///
    /// - Parameters:
    ///   - line: the line's bytes, without its line ending (whitespace around the object is allowed).
    ///   - lineNumber: the 1-based line number, for the error.
    ///   - jobFileDirectory: the directory a relative `tokens_file` is resolved against (`JobFileReader.directory`).
    ///   - now: seconds since 1970; the Live Activity `timestamp` when the line gives none. One value for the whole
    ///     job, so that its payload is encoded once.
    /// - returns: the job, or why the line was refused.
    package func parse(
        line: some Collection<UInt8>, lineNumber: Int, jobFileDirectory: String, now: Int64
    ) -> Result<ParsedJobLine, JobLineError> {
        var reader = LineReader()
        do throws(LineFailure) {
            let job = try reader.read(line, jobFileDirectory: jobFileDirectory, now: now)
            return .success(
                ParsedJobLine(job: job, lineNumber: lineNumber, usesDefaultTimestamp: reader.usesDefaultTimestamp))
        } catch {
            return .failure(
                JobLineError(lineNumber: lineNumber, jobID: reader.jobID, field: error.field, message: error.message))
        }
    }

    /// The id that `parse` reports for `line` (the job's, or the error's `jobID`), without the rest of the parse: a
    /// resumed `fanout send` skips the lines it finished, and still needs their ids (`JobFileIDs`).
    package static func jobID(of line: some Collection<UInt8>) -> String? {
        guard let root = try? RawJSON(validating: line), root.kind == .object else { return nil }
        // The parser refuses repeated keys, so `id` is here at most once. Null means absent.
        guard let id = root.members().first(where: { $0.key == "id" && $0.value.kind != .null }) else { return nil }
        guard let text = id.value.value.stringValue, !text.isEmpty else { return nil }
        return text
    }

    /// `path` resolved against the job file's directory: unchanged when absolute, or when the directory is `.` or
    /// empty (the current directory).
    package static func resolve(tokensFile path: String, jobFileDirectory: String) -> String {
        if path.hasPrefix("/") || jobFileDirectory.isEmpty || jobFileDirectory == "." { return path }
        return jobFileDirectory.hasSuffix("/") ? jobFileDirectory + path : jobFileDirectory + "/" + path
    }
}

/// A refusal inside the parser, before the line number and id are attached.
private struct LineFailure: Error {
    let field: String?
    let message: String

    init(_ field: String?, _ message: String) {
        self.field = field
        self.message = message
    }
}

/// The state of parsing one line: the id, once known, goes into every error after it.
private struct LineReader {
    var jobID: String?
    private var members: [String: RawJSON] = [:]
    /// `push_to_start.activity_id_attribute`, once read.
    private var activityIDAttribute: [String]?

    /// Whether the line has a `live_activity` without a `timestamp` (after `read`).
    var usesDefaultTimestamp: Bool {
        guard let live = members["live_activity"], live.kind == .object else { return false }
        return !live.members().contains { key, value in key == "timestamp" && value.kind != .null }
    }

    mutating func read(
        _ line: some Collection<UInt8>, jobFileDirectory: String, now: Int64
    ) throws(LineFailure) -> ParsedJob {
        let root: RawJSON
        do {
            root = try RawJSON(validating: line)
        } catch {
            throw LineFailure(nil, "not valid JSON: \(error)")
        }
        guard root.kind == .object else { throw LineFailure(nil, "a job must be a JSON object, not \(root.kind)") }
        // Duplicate keys were refused by the parser, so each key is here once. Null means absent.
        var unknownKey: String?
        for (key, value) in root.members() {
            if !JobLineParser.knownKeys.contains(key) {
                if unknownKey == nil { unknownKey = key }
            } else if value.kind != .null {
                members[key] = value
            }
        }
        if let id = members["id"]?.value.stringValue, !id.isEmpty { jobID = id }
        if let unknownKey {
            throw LineFailure(
                unknownKey,
                "unknown key \(Self.quoted(unknownKey)) (known: \(JobLineParser.knownKeys.joined(separator: ", ")))")
        }

        guard let id = try string("id"), !id.isEmpty else { throw LineFailure("id", "id is required") }
        let workspace = try string("workspace") ?? JobLineParser.defaultWorkspace
        guard !workspace.isEmpty else { throw LineFailure("workspace", "workspace must not be empty") }
        let headers = try readHeaders()
        let payload = try readPayload(pushType: headers.pushType, now: now)
        let recipients = try readRecipients(jobFileDirectory: jobFileDirectory, headers: headers)
        var job = ParsedJob(id: id, workspace: workspace, headers: headers, payload: payload, recipients: recipients)
        job.activityIDAttribute = activityIDAttribute
        return job
    }

    // MARK: Headers

    private func readHeaders() throws(LineFailure) -> NotificationHeaders {
        guard let pushTypeName = try string("push_type") else {
            throw LineFailure("push_type", "push_type is required")
        }
        guard let pushType = PushType(rawValue: pushTypeName) else {
            let known = PushType.allKnown.map(\.rawValue).joined(separator: ", ")
            throw LineFailure(
                "push_type", "push_type \(Self.quoted(pushTypeName)) is not an APNs push type (known: \(known))")
        }
        guard let topic = try string("topic") else { throw LineFailure("topic", "topic is required") }
        let priority = try integer("priority", "an integer (1, 5 or 10)")
        let expiration = try integer("expiration", "an integer (0, or UNIX seconds)")
        let collapseID = try string("collapse_id")
        let headers = NotificationHeaders(
            pushType: pushType, topic: topic, priority: priority.map { Int($0) }, expiration: expiration,
            collapseID: collapseID)
        do {
            try headers.validate()
        } catch {
            let field = Self.jobFieldNames[error.field] ?? error.field
            throw LineFailure(field, "\(field) \(error.message)")
        }
        return headers
    }

    /// The job-file names of the headers `NotificationHeaders.validate()` can complain about.
    private static let jobFieldNames = [
        APNsHeaderName.topic: "topic", APNsHeaderName.priority: "priority", APNsHeaderName.expiration: "expiration",
        APNsHeaderName.collapseID: "collapse_id", APNsHeaderName.pushType: "push_type",
    ]

    // MARK: Payload

    private func readPayload(pushType: PushType, now: Int64) throws(LineFailure) -> ParsedJob.Payload {
        switch (members["payload"], members["live_activity"]) {
        case (nil, nil):
            throw LineFailure("payload", "one of payload and live_activity is required")
        case (.some, .some):
            throw LineFailure("payload", "payload and live_activity are both given; a job has exactly one")
        case (let payload?, nil):
            guard payload.kind == .object else {
                throw LineFailure("payload", "payload must be a JSON object, not \(payload.kind)")
            }
            do {
                try PayloadLimits.check(payload.bytes, pushType: pushType)
            } catch {
                throw LineFailure("payload", error.description)
            }
            return .raw(payload.bytes)
        case (nil, let field?):
            guard pushType == .liveactivity else {
                throw LineFailure(
                    "live_activity",
                    #"live_activity needs push_type "liveactivity", not \#(Self.quoted(pushType.rawValue))"#)
            }
            let content: LiveActivityContent
            do {
                content = try LiveActivityContent(jobField: field, defaultTimestamp: now)
                // Encoded once here only to check the size; the engine encodes it again when the job is sent.
                _ = try content.encode()
            } catch {
                // The size check names the whole payload; here that is the live_activity the line gave.
                guard error.field != "payload" else {
                    throw LineFailure("live_activity", "live_activity: the encoded payload is \(error.message)")
                }
                throw LineFailure(error.field, error.description)
            }
            return .liveActivity(content)
        }
    }

    // MARK: Recipients

    private mutating func readRecipients(jobFileDirectory: String, headers: NotificationHeaders) throws(LineFailure)
        -> ParsedJob.Recipients
    {
        // Exactly one way of naming recipients; `activity_id` beside `push_to_start` names the activity to start.
        // (An empty `tokens` array counts as no tokens, as it always has.)
        let ways = ["tokens", "tokens_file", "activity_id", "push_to_start", "users", "devices", "channel_id"].filter {
            key in
            guard let value = members[key] else { return false }
            if key == "tokens", case .array(let elements) = value.value, elements.isEmpty { return false }
            return true
        }
        let addressing = ways.filter { !($0 == "activity_id" && ways.contains("push_to_start")) }
        if addressing.count > 1 {
            throw LineFailure(
                addressing[1],
                "\(addressing.joined(separator: " and ")) are both given; a job names its recipients one way")
        }
        let activityID = try readActivityID()
        if members["channel_storage_policy"] != nil && addressing.first != "channel_id" {
            throw LineFailure("channel_storage_policy", "channel_storage_policy goes with channel_id")
        }
        if addressing.first == "channel_id" {
            guard let channel = try string("channel_id"), BroadcastRequest.isValidChannelID(channel) else {
                throw LineFailure("channel_id", "channel_id must be a base64 channel id")
            }
            let policy = try integer("channel_storage_policy", "0 or 1")
            guard policy == nil || policy == 0 || policy == 1 else {
                throw LineFailure("channel_storage_policy", "channel_storage_policy must be 0 or 1")
            }
            let app = try string("app") ?? Self.bundleID(of: headers)
            guard !app.isEmpty else { throw LineFailure("app", "app must not be empty") }
            return .channel(app: app, id: channel, storagePolicy: policy.map(Int.init))
        }
        if let way = addressing.first, way != "tokens", way != "tokens_file" {
            let app = try string("app") ?? Self.bundleID(of: headers)
            guard !app.isEmpty else { throw LineFailure("app", "app must not be empty") }
            switch way {
            case "activity_id":
                return .activity(app: app, id: activityID!)
            case "push_to_start":
                let (attributesType, selection, attribute) = try readPushToStart()
                if attribute != nil && activityID == nil {
                    throw LineFailure(
                        "push_to_start.activity_id_attribute",
                        "push_to_start.activity_id_attribute goes with activity_id (the id it writes)")
                }
                activityIDAttribute = attribute
                return .pushToStart(
                    app: app, attributesType: attributesType, selection: selection, activityID: activityID)
            case "users":
                return .devices(app: app, selection: .users(try strings("users")))
            default:
                return .devices(app: app, selection: .devices(try strings("devices")))
            }
        }
        if members["app"] != nil {
            throw LineFailure("app", "app goes with activity_id, push_to_start, users or devices, not with tokens")
        }
        let tokens = try readTokens()
        let tokensFile = try string("tokens_file")
        switch (tokens.isEmpty, tokensFile) {
        case (true, nil):
            throw LineFailure("tokens", "no recipients: tokens is empty or absent and tokens_file is absent")
        case (false, .some):
            throw LineFailure("tokens_file", "tokens and tokens_file are both given; a job has one of them")
        case (false, nil):
            return .tokens(tokens)
        case (true, let path?):
            guard !path.isEmpty else { throw LineFailure("tokens_file", "tokens_file must not be empty") }
            let resolved = JobLineParser.resolve(tokensFile: path, jobFileDirectory: jobFileDirectory)
            if let failure = ReadableFile.checkReadable(resolved) {
                let problem = failure.kind == .missing ? "does not exist" : "cannot be read: \(failure.reason)"
                throw LineFailure("tokens_file", "tokens_file \(Self.quoted(resolved)) \(problem)")
            }
            return .file(path: resolved)
        }
    }

    /// The bundle id a topic is for: the topic less its push type's suffix.
    private static func bundleID(of headers: NotificationHeaders) -> String {
        guard let suffix = headers.pushType.requiredTopicSuffix, !suffix.isEmpty, headers.topic.hasSuffix(suffix)
        else { return headers.topic }
        return String(headers.topic.dropLast(suffix.count))
    }

    private func readActivityID() throws(LineFailure) -> String? {
        guard let id = try string("activity_id") else { return nil }
        guard !id.isEmpty else { throw LineFailure("activity_id", "activity_id must not be empty") }
        guard id.utf8.count <= JobLineParser.maximumActivityIDBytes else {
            throw LineFailure(
                "activity_id",
                "activity_id is \(id.utf8.count) bytes, over the \(JobLineParser.maximumActivityIDBytes)-byte limit")
        }
        return id
    }

    /// `push_to_start`: `{"attributes_type": "...", "users": [...]}`, or `"devices": [...]`, or `"all": true`, and
    /// optionally `"activity_id_attribute": ["key", ...]`.
    private func readPushToStart() throws(LineFailure) -> (String?, ParsedJob.Selection, [String]?) {
        guard let raw = members["push_to_start"], case .object(let object) = raw.value else {
            throw LineFailure("push_to_start", "push_to_start must be an object")
        }
        var attributesType: String?
        var attribute: [String]?
        var selections: [ParsedJob.Selection] = []
        for member in object {
            let field = "push_to_start.\(member.key)"
            switch (member.key, member.value) {
            case ("attributes_type", .string(let text)) where !text.isEmpty: attributesType = text
            case ("attributes_type", .null): break
            case ("users", let value): selections.append(.users(try Self.strings(value, field: field)))
            case ("devices", let value): selections.append(.devices(try Self.strings(value, field: field)))
            case ("all", .bool(true)): selections.append(.all)
            case ("activity_id_attribute", .null): break
            case ("activity_id_attribute", let value): attribute = try Self.strings(value, field: field)
            case ("attributes_type", _), ("all", _):
                throw LineFailure(
                    field, member.key == "all" ? "\(field) must be true" : "\(field) must be a non-empty string")
            default:
                throw LineFailure(
                    field,
                    "unknown key \(Self.quoted(member.key)) (known: attributes_type, users, devices, all, "
                        + "activity_id_attribute)")
            }
        }
        guard selections.count == 1 else {
            throw LineFailure("push_to_start", "push_to_start needs exactly one of users, devices or all: true")
        }
        return (attributesType, selections[0], attribute)
    }

    private func strings(_ key: String) throws(LineFailure) -> [String] {
        try Self.strings(members[key]!.value, field: key)
    }

    /// A non-empty array of non-empty strings.
    private static func strings(_ value: JSONValue, field: String) throws(LineFailure) -> [String] {
        guard case .array(let elements) = value, !elements.isEmpty else {
            throw LineFailure(field, "\(field) must be a non-empty array of strings")
        }
        var result: [String] = []
        for (index, element) in elements.enumerated() {
            guard case .string(let text) = element, !text.isEmpty else {
                throw LineFailure("\(field)[\(index)]", "\(field)[\(index)] must be a non-empty string")
            }
            result.append(text)
        }
        return result
    }

    /// The inline tokens, validated, in lowercase hex and each once (a repeat, in either case, is dropped: a job
    /// has one result per token); empty when absent.
    private func readTokens() throws(LineFailure) -> [String] {
        guard let raw = members["tokens"] else { return [] }
        guard case .array(let elements) = raw.value else {
            throw LineFailure("tokens", "tokens must be an array of hex token strings, not \(raw.kind)")
        }
        var tokens: [String] = []
        tokens.reserveCapacity(elements.count)
        var seen = Set<String>(minimumCapacity: elements.count)
        for (index, element) in elements.enumerated() {
            let field = "tokens[\(index)]"
            guard case .string(let text) = element else {
                throw LineFailure(field, "\(field) must be a string, not \(element.kind)")
            }
            guard let token = DeviceToken(text) else {
                throw LineFailure(
                    field, "\(field): \(Self.quoted(text, limit: 80)) is not a device token (64 to 200 hex digits)")
            }
            if seen.insert(token.hex).inserted { tokens.append(token.hex) }
        }
        return tokens
    }

    // MARK: Typed members

    private func string(_ key: String) throws(LineFailure) -> String? {
        guard let raw = members[key] else { return nil }
        guard case .string(let text) = raw.value else {
            throw LineFailure(key, "\(key) must be a string, not \(raw.kind)")
        }
        return text
    }

    private func integer(_ key: String, _ expected: String) throws(LineFailure) -> Int64? {
        guard let raw = members[key] else { return nil }
        let value = raw.value
        guard let integer = value.int64Value else {
            let found = value.kind == .number ? raw.description : value.kind.description
            throw LineFailure(key, "\(key) must be \(expected), not \(found)")
        }
        return integer
    }

    /// `text` as a JSON string literal, cut to `limit` characters so a huge bad value does not flood the report.
    static func quoted(_ text: String, limit: Int = 200) -> String {
        let shown = text.count > limit ? String(text.prefix(limit)) + "…" : text
        return JSONValue.string(shown).description
    }
}
