/// What a Live Activity push says, before it becomes `{"aps":{…}}`: the job file's `live_activity` object.
///
/// `validate()` applies the rules of docs/reference/apns.md, "Live Activity payloads", and names the job-file field
/// at fault; `encode()` validates and writes the compact payload, once per job, with the keys in a fixed order:
/// `timestamp`, `event`, `content-state`, `stale-date`, `dismissal-date`, `relevance-score`, `alert`,
/// `attributes-type`, `attributes`, `input-push-token`, `input-push-channel`.
public struct LiveActivityContent: Sendable, Hashable {
    /// `start`, `update` or `end`. A struct over an internal enum, so an event Apple adds later is not a breaking
    /// change for callers that switch over these.
    public struct Event: Sendable, Hashable, CustomStringConvertible {
        enum Kind: String, Sendable {
            case start, update, end
        }

        let kind: Kind

        public static let start = Event(kind: .start)
        public static let update = Event(kind: .update)
        public static let end = Event(kind: .end)

        /// `start`, `update` or `end` exactly (APNs compares case-sensitively); nil for anything else.
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }

        init(kind: Kind) {
            self.kind = kind
        }

        public var rawValue: String { kind.rawValue }
        public var description: String { kind.rawValue }
    }

    /// The latest date any of the fields takes: 9999-12-31T23:59:59Z, in seconds since 1970. Later ones are
    /// refused: no device clock reaches them, and in milliseconds (the registry's unit) they would overflow.
    public static let latestDate: Int64 = 253_402_300_799

    public var event: Event
    /// Seconds since 1970. Required by APNs; keep it increasing per activity.
    public var timestamp: Int64
    /// `content-state`: a JSON object, embedded byte for byte. Required for start and update; on end, the final
    /// state. Build one from a value with `RawJSON(JSONValue)`.
    public var contentState: RawJSON?
    /// Seconds since 1970 when the activity becomes stale.
    public var staleDate: Int64?
    /// End only: seconds since 1970 when the ended activity is removed (now or past: at once).
    public var dismissalDate: Int64?
    /// Ordering among the app's concurrent activities.
    public var relevanceScore: Double?
    public var alert: LiveActivityAlert?
    /// Start only, required there: the Swift `ActivityAttributes` type name.
    public var attributesType: String?
    /// Start only, required there: the static attributes, a JSON object.
    public var attributes: RawJSON?
    /// Start only: ask the system for an update token for the started activity (`"input-push-token":1`).
    public var inputPushToken: Bool
    /// Start only: the base64 broadcast channel ID to subscribe the started activity to. Not with `inputPushToken`.
    public var inputPushChannel: String?

    public init(
        event: Event, timestamp: Int64, contentState: RawJSON? = nil, staleDate: Int64? = nil,
        dismissalDate: Int64? = nil, relevanceScore: Double? = nil, alert: LiveActivityAlert? = nil,
        attributesType: String? = nil, attributes: RawJSON? = nil, inputPushToken: Bool = false,
        inputPushChannel: String? = nil
    ) {
        self.event = event
        self.timestamp = timestamp
        self.contentState = contentState
        self.staleDate = staleDate
        self.dismissalDate = dismissalDate
        self.relevanceScore = relevanceScore
        self.alert = alert
        self.attributesType = attributesType
        self.attributes = attributes
        self.inputPushToken = inputPushToken
        self.inputPushChannel = inputPushChannel
    }

    /// Checks the rules of docs/reference/apns.md, "Live Activity payloads", in the order of the encoded keys; the
    /// first failure is thrown, naming the job-file field, for example
    /// `live_activity.attributes: only allowed with event "start"`.
    public func validate() throws(PayloadError) {
        let isStart = event == .start
        try Self.checkDate(timestamp, "timestamp")
        if let contentState {
            guard contentState.kind == .object else {
                throw Self.error("content_state", "must be a JSON object, not \(contentState.kind)")
            }
        } else if event != .end {
            throw Self.error("content_state", "required for start and update")
        }
        if let staleDate { try Self.checkDate(staleDate, "stale_date") }
        if let dismissalDate {
            guard event == .end else { throw Self.error("dismissal_date", #"only allowed with event "end""#) }
            try Self.checkDate(dismissalDate, "dismissal_date")
        }
        if let relevanceScore, !relevanceScore.isFinite {
            throw Self.error("relevance_score", "must be a finite number")
        }
        try alert?.validate(field: "live_activity.alert")
        if let attributesType {
            guard isStart else { throw Self.error("attributes_type", #"only allowed with event "start""#) }
            guard !attributesType.isEmpty else { throw Self.error("attributes_type", "must not be empty") }
        } else if isStart {
            throw Self.error("attributes_type", "required for start")
        }
        if let attributes {
            guard isStart else { throw Self.error("attributes", #"only allowed with event "start""#) }
            guard attributes.kind == .object else {
                throw Self.error("attributes", "must be a JSON object, not \(attributes.kind)")
            }
        } else if isStart {
            throw Self.error("attributes", "required for start")
        }
        if inputPushToken, !isStart {
            throw Self.error("input_push_token", #"only allowed with event "start""#)
        }
        if let inputPushChannel {
            guard isStart else { throw Self.error("input_push_channel", #"only allowed with event "start""#) }
            guard !inputPushToken else {
                throw Self.error("input_push_channel", "not allowed together with input_push_token")
            }
            guard Self.isBase64(inputPushChannel) else {
                throw Self.error("input_push_channel", "must be a base64 channel ID")
            }
        }
    }

    /// Validates, then writes the payload and checks it against the 4096-byte liveactivity limit.
    /// A date field in seconds since 1970: from 0 to `latestDate`.
    private static func checkDate(_ seconds: Int64, _ field: String) throws(PayloadError) {
        guard seconds >= 0 else { throw Self.error(field, "must not be negative (seconds since 1970)") }
        guard seconds <= latestDate else {
            throw Self.error(field, "\(seconds) is past 9999-12-31 (\(latestDate) seconds since 1970)")
        }
    }

    /// `dismissalDate` in milliseconds, as the registry keeps dates (a date past `latestDate` counts as that date).
    public var dismissalDateMilliseconds: Int64? {
        dismissalDate.map { min($0, Self.latestDate) * 1000 }
    }

    public func encode() throws(PayloadError) -> [UInt8] {
        try validate()
        var writer = JSONWriter(
            capacity: 192 + (contentState?.bytes.count ?? 0) + (attributes?.bytes.count ?? 0))
        writer.beginObject()
        writer.key("aps")
        writer.beginObject()
        writer.key("timestamp")
        writer.integer(timestamp)
        writer.key("event")
        writer.string(event.rawValue)
        if let contentState {
            writer.key("content-state")
            writer.raw(contentState)
        }
        if let staleDate {
            writer.key("stale-date")
            writer.integer(staleDate)
        }
        if let dismissalDate {
            writer.key("dismissal-date")
            writer.integer(dismissalDate)
        }
        if let relevanceScore {
            writer.key("relevance-score")
            writer.double(relevanceScore)
        }
        alert?.write(to: &writer)
        if let attributesType {
            writer.key("attributes-type")
            writer.string(attributesType)
        }
        if let attributes {
            writer.key("attributes")
            writer.raw(attributes)
        }
        if inputPushToken {
            writer.key("input-push-token")
            writer.one()
        }
        if let inputPushChannel {
            writer.key("input-push-channel")
            writer.string(inputPushChannel)
        }
        writer.endObject()
        writer.endObject()
        try PayloadLimits.check(writer.bytes, pushType: .liveactivity)
        return writer.bytes
    }

    static func error(_ field: String, _ message: String) -> PayloadError {
        PayloadError(field: "live_activity." + field, message: message)
    }

    /// Standard base64 (RFC 4648 section 4), as APNs shows channel IDs: padded, or unpadded of a possible length.
    static func isBase64(_ text: String) -> Bool {
        let bytes = text.utf8
        guard !bytes.isEmpty, bytes.count % 4 != 1 else { return false }
        var padding = 0
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "="):
                padding += 1
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "+"), UInt8(ascii: "/"):
                if padding > 0 { return false }
            default:
                return false
            }
        }
        return padding == 0 || (padding <= 2 && bytes.count % 4 == 0)
    }
}
