/// A top-level key beside `aps`, for the app's own data (`{"aps":{…},"match":{"id":7}}`).
public struct PayloadCustomKey: Sendable, Hashable {
    public var key: String
    public var value: RawJSON

    public init(key: String, value: RawJSON) {
        self.key = key
        self.value = value
    }

    public init(key: String, value: JSONValue) {
        self.init(key: key, value: RawJSON(value))
    }

    /// Custom keys may not be `aps` (the payload builds it) or repeat.
    static func validate(_ keys: [PayloadCustomKey]) throws(PayloadError) {
        for (index, custom) in keys.enumerated() {
            if custom.key == "aps" {
                throw PayloadError(field: "aps", message: "reserved; it cannot be a custom key")
            }
            if keys[..<index].contains(where: { $0.key == custom.key }) {
                throw PayloadError(field: custom.key, message: "custom key given twice")
            }
        }
    }

    static func write(_ keys: [PayloadCustomKey], to writer: inout JSONWriter) {
        for custom in keys {
            writer.key(custom.key)
            writer.raw(custom.value)
        }
    }

    static func byteCount(_ keys: [PayloadCustomKey]) -> Int {
        keys.reduce(0) { $0 + $1.key.utf8.count + $1.value.bytes.count + 4 }
    }
}

/// A regular (`alert` push type) notification: `{"aps":{"alert":{…},"badge":…,"sound":…,…},<custom keys>}`.
///
/// Keys are written in a fixed order: in `alert`, `title`/`title-loc-key`/`title-loc-args`, then the subtitle's and
/// the body's (`body`/`loc-key`/`loc-args`); then `badge`, `sound`, `thread-id`, `category`, `content-available`,
/// `mutable-content`, `interruption-level`, `relevance-score`; then the custom keys in their order.
public struct AlertPayload: Sendable, Hashable {
    /// `interruption-level`: `passive`, `active`, `time-sensitive` or `critical`.
    public struct InterruptionLevel: Sendable, Hashable, CustomStringConvertible {
        public let rawValue: String

        public init(rawValue: String) {
            self.rawValue = rawValue
        }

        public static let passive = InterruptionLevel(rawValue: "passive")
        public static let active = InterruptionLevel(rawValue: "active")
        public static let timeSensitive = InterruptionLevel(rawValue: "time-sensitive")
        public static let critical = InterruptionLevel(rawValue: "critical")

        public var description: String { rawValue }
    }

    public var title: AlertText?
    public var subtitle: AlertText?
    public var body: AlertText?
    public var sound: AlertSound?
    /// The app icon's badge; 0 clears it.
    public var badge: Int?
    public var threadID: String?
    public var category: String?
    /// `"mutable-content":1`: lets the notification service extension change the content.
    public var mutableContent: Bool
    /// `"content-available":1`: also wakes the app in the background.
    public var contentAvailable: Bool
    public var interruptionLevel: InterruptionLevel?
    /// 0...1: how the system ranks the notification in the summary.
    public var relevanceScore: Double?
    public var customKeys: [PayloadCustomKey]

    public init(
        title: AlertText? = nil, subtitle: AlertText? = nil, body: AlertText? = nil, sound: AlertSound? = nil,
        badge: Int? = nil, threadID: String? = nil, category: String? = nil, mutableContent: Bool = false,
        contentAvailable: Bool = false, interruptionLevel: InterruptionLevel? = nil, relevanceScore: Double? = nil,
        customKeys: [PayloadCustomKey] = []
    ) {
        self.title = title
        self.subtitle = subtitle
        self.body = body
        self.sound = sound
        self.badge = badge
        self.threadID = threadID
        self.category = category
        self.mutableContent = mutableContent
        self.contentAvailable = contentAvailable
        self.interruptionLevel = interruptionLevel
        self.relevanceScore = relevanceScore
        self.customKeys = customKeys
    }

    private var hasAlert: Bool { title != nil || subtitle != nil || body != nil }

    /// Fields are named by their APNs key (`aps.badge`, `aps.alert.title`) or, for custom keys, by the key.
    public func validate() throws(PayloadError) {
        guard hasAlert || sound != nil || badge != nil || contentAvailable else {
            throw PayloadError(
                field: "aps", message: "empty: give an alert text, a sound, a badge or content-available")
        }
        try title?.validate(field: "aps.alert.title")
        try subtitle?.validate(field: "aps.alert.subtitle")
        try body?.validate(field: "aps.alert.body")
        if let badge, badge < 0 { throw PayloadError(field: "aps.badge", message: "must not be negative") }
        try sound?.validate(field: "aps.sound")
        if let interruptionLevel,
            ![InterruptionLevel.passive, .active, .timeSensitive, .critical].contains(interruptionLevel)
        {
            throw PayloadError(
                field: "aps.interruption-level",
                message:
                    "must be passive, active, time-sensitive or critical, not \(JSONStringEscaping.quoted(interruptionLevel.rawValue))"
            )
        }
        if let relevanceScore, !(relevanceScore.isFinite && (0...1).contains(relevanceScore)) {
            throw PayloadError(field: "aps.relevance-score", message: "must be between 0 and 1")
        }
        try PayloadCustomKey.validate(customKeys)
    }

    /// Validates, then writes the payload and checks it against the 4096-byte alert limit.
    public func encode() throws(PayloadError) -> [UInt8] {
        try validate()
        var writer = JSONWriter(capacity: 192 + PayloadCustomKey.byteCount(customKeys))
        writer.beginObject()
        writer.key("aps")
        writer.beginObject()
        if hasAlert {
            writer.key("alert")
            writer.beginObject()
            title?.writeFlat(plain: "title", locKey: "title-loc-key", locArgs: "title-loc-args", to: &writer)
            subtitle?.writeFlat(
                plain: "subtitle", locKey: "subtitle-loc-key", locArgs: "subtitle-loc-args", to: &writer)
            body?.writeFlat(plain: "body", locKey: "loc-key", locArgs: "loc-args", to: &writer)
            writer.endObject()
        }
        if let badge {
            writer.key("badge")
            writer.integer(Int64(badge))
        }
        sound?.write(to: &writer)
        if let threadID {
            writer.key("thread-id")
            writer.string(threadID)
        }
        if let category {
            writer.key("category")
            writer.string(category)
        }
        if contentAvailable {
            writer.key("content-available")
            writer.one()
        }
        if mutableContent {
            writer.key("mutable-content")
            writer.one()
        }
        if let interruptionLevel {
            writer.key("interruption-level")
            writer.string(interruptionLevel.rawValue)
        }
        if let relevanceScore {
            writer.key("relevance-score")
            writer.double(relevanceScore)
        }
        writer.endObject()
        PayloadCustomKey.write(customKeys, to: &writer)
        writer.endObject()
        try PayloadLimits.check(writer.bytes, pushType: .alert)
        return writer.bytes
    }
}

/// A silent (`background` push type) notification: `{"aps":{"content-available":1},<custom keys>}`.
public struct BackgroundPayload: Sendable, Hashable {
    public var customKeys: [PayloadCustomKey]

    public init(customKeys: [PayloadCustomKey] = []) {
        self.customKeys = customKeys
    }

    public func validate() throws(PayloadError) {
        try PayloadCustomKey.validate(customKeys)
    }

    /// Validates, then writes the payload and checks it against the 4096-byte background limit.
    public func encode() throws(PayloadError) -> [UInt8] {
        try validate()
        var writer = JSONWriter(capacity: 40 + PayloadCustomKey.byteCount(customKeys))
        writer.beginObject()
        writer.key("aps")
        writer.beginObject()
        writer.key("content-available")
        writer.one()
        writer.endObject()
        PayloadCustomKey.write(customKeys, to: &writer)
        writer.endObject()
        try PayloadLimits.check(writer.bytes, pushType: .background)
        return writer.bytes
    }
}
