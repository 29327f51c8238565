import FanoutCore

/// One change of a token in the registry, as the change feed reports it.
///
/// Every change is both published to the store's `subscribe()` streams and stored in its event log, which
/// `fanout registry events` prints one JSON line per event (see `jsonLine`).
public struct RegistryEvent: Sendable, Hashable {
    /// What happened to the token.
    public enum Change: String, Sendable, Hashable, CaseIterable {
        case added, rotated, removed
    }

    /// Why a token was removed.
    public enum Reason: String, Sendable, Hashable, CaseIterable {
        /// The app stopped it (an empty token, `stop`).
        case stopped
        /// An update token passed its lifetime (8 hours after registration by default).
        case expired
        /// Its activity ended and the dismissal date passed.
        case ended
        /// APNs said the token is dead (410, `BadDeviceToken`, `DeviceTokenNotForTopic`).
        case unregistered
    }

    /// Which kind of token changed.
    public enum TokenKind: String, Sendable, Hashable, CaseIterable {
        /// A Live Activity update token (`activityID` is set).
        case update
        /// A push-to-start token.
        case pushToStart = "push_to_start"
        /// A device's regular push token.
        case push
    }

    /// The event's position in the store's log: increasing, never reused. A cursor for `events(after:limit:)`.
    public var sequence: Int64
    /// When it happened (Unix milliseconds).
    public var at: Int64
    /// The app's bundle id.
    public var app: String
    /// The activity of an update token; nil for the other kinds.
    public var activityID: String?
    /// The device, when known.
    public var deviceID: String?
    /// The token (lowercase hex); for `rotated`, the new one.
    public var token: String
    public var kind: TokenKind
    public var change: Change
    /// Set exactly when `change` is `removed`.
    public var reason: Reason?

    public init(
        sequence: Int64, at: Int64, app: String, activityID: String?, deviceID: String?, token: String,
        kind: TokenKind, change: Change, reason: Reason?
    ) {
        self.sequence = sequence
        self.at = at
        self.app = app
        self.activityID = activityID
        self.deviceID = deviceID
        self.token = token
        self.kind = kind
        self.change = change
        self.reason = reason
    }

    /// The event as the JSON line of docs/REGISTRY.md (without the newline), plus the token kind:
    /// `{"at":1764460800000,"app":"com.acme.app","activity_id":"match-7","token":"…","change":"removed",
    /// "reason":"unregistered","kind":"update"}`.
    package var jsonLine: String {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(160 + token.utf8.count)
        appendJSONLine(to: &bytes)
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Appends `jsonLine` to `output`, then a newline when `newline` is true (for JSON Lines output).
    package func appendJSONLine(to output: inout [UInt8], newline: Bool = false) {
        func literal(_ text: StaticString) {
            output.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
        }
        func string(_ value: String?) {
            if let value { JSONStringEscaping.appendString(value, to: &output) } else { literal("null") }
        }
        literal("{\"at\":")
        output.append(contentsOf: String(at).utf8)
        literal(",\"app\":")
        string(app)
        literal(",\"activity_id\":")
        string(activityID)
        literal(",\"token\":")
        string(token)
        literal(",\"change\":")
        string(change.rawValue)
        literal(",\"reason\":")
        string(reason?.rawValue)
        literal(",\"kind\":")
        string(kind.rawValue)
        literal("}")
        if newline { output.append(UInt8(ascii: "\n")) }
    }
}
