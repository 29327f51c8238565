import FanoutRedis
import FanoutRegistry

/// Where the Redis registry keeps what, under one prefix (`fanout:registry:` by default; it must hold no `{` or `}`).
///
/// App and activity ids are escaped in key names (`%`, `/`, `{`, `}` as `%25`, `%2F`, `%7B`, `%7D`), so that a hash
/// tag always covers the whole id and no two ids share a key.
///
/// | Key | Type | What |
/// |---|---|---|
/// | `P{global}:apps` | hash | bundle id → workspace |
/// | `P{global}:activities` | set | every activity (`app/activity`, escaped) |
/// | `P{global}:schedule` | sorted set | activity → when the sweep should next visit it (the earliest expiry, dismissal or idle time; lowered by writes with `ZADD LT`) |
/// | `P{global}:ended` | sorted set | ended activity → dismissal date (for `endedChannels`; checked against the activity) |
/// | `P{global}:events` | stream | the event log, entry ids `0-N` (N the sequence number) |
/// | `P{global}:counters` | hash | `expired_swept` |
/// | `Ptoken:T` | set | where token T is registered: length-prefixed (kind, app, activity or device[, type]) |
/// | `P{app}:meta` | hash | device and push-to-start counts and creation counters |
/// | `P{app}:devices` | hash | device → JSON (number, user, push token, its time) |
/// | `P{app}:device-order`, `:user-devices` | sorted sets | devices by creation number; by user |
/// | `P{app}:pts`, `:pts-order`, `:pts-users`, `:pts-devices` | hash, sorted sets | push-to-start tokens by (device, type), their order, by user, by device |
/// | `P{app}:device-activities` | sorted set | `len:device` + activity id, for a device's update tokens |
/// | `P{app/activity}:meta` | hash | state, attributes type, content timestamp, ended, dismissal, channel, created, updated, next slot (and position) |
/// | `P{app/activity}:tokens` | sorted set | slot → expiry (Unix ms) |
/// | `P{app/activity}:slots` | hash | slot → JSON (token, device, registered, expiry) |
/// | `P{app/activity}:devices`, `:bytoken` | hashes | device → slot; token → its slots (space-separated) |
/// | `P{app/activity}:order` | sorted set | slot → position, the order pages read the tokens in (from the `next` counter: a new slot's own number, a new one at a rotation) |
struct RedisRegistryKeys: Sendable {
    let prefix: String

    init(prefix: String) {
        self.prefix = prefix
    }

    var apps: RedisArgument { RedisArgument(prefix + "{global}:apps") }
    var activities: RedisArgument { RedisArgument(prefix + "{global}:activities") }
    var schedule: RedisArgument { RedisArgument(prefix + "{global}:schedule") }
    var ended: RedisArgument { RedisArgument(prefix + "{global}:ended") }
    var events: RedisArgument { RedisArgument(prefix + "{global}:events") }
    var counters: RedisArgument { RedisArgument(prefix + "{global}:counters") }

    func token(_ token: String) -> RedisArgument { RedisArgument(prefix + "token:" + token) }

    /// The app script's KEYS.
    func app(_ app: String) -> [RedisArgument] {
        let base = prefix + "{" + Self.escape(app) + "}:"
        return [
            "meta", "devices", "device-order", "user-devices", "pts", "pts-order", "pts-users", "pts-devices",
            "device-activities",
        ].map { RedisArgument(base + $0) }
    }

    /// The activity script's KEYS.
    func activity(_ reference: ActivityReference) -> [RedisArgument] {
        let base = prefix + "{" + reference.member + "}:"
        return ["meta", "tokens", "slots", "devices", "bytoken", "order"].map { RedisArgument(base + $0) }
    }

    /// The activity's metadata hash alone (the first of `activity(_:)`'s keys).
    func activityMeta(_ reference: ActivityReference) -> RedisArgument {
        RedisArgument(prefix + "{" + reference.member + "}:meta")
    }

    static func escape(_ text: String) -> String {
        guard
            text.utf8.contains(where: { $0 == UInt8(ascii: "%") || $0 == UInt8(ascii: "/") || $0 == 0x7B || $0 == 0x7D }
            )
        else { return text }
        var escaped = ""
        for character in text.unicodeScalars {
            switch character {
            case "%": escaped += "%25"
            case "/": escaped += "%2F"
            case "{": escaped += "%7B"
            case "}": escaped += "%7D"
            default: escaped.unicodeScalars.append(character)
            }
        }
        return escaped
    }

    static func unescape(_ text: Substring) -> String {
        guard text.contains("%") else { return String(text) }
        return String(text).replacingEscapes()
    }
}

extension String {
    fileprivate func replacingEscapes() -> String {
        var result = ""
        var rest = self[...]
        while let range = rest.firstIndex(of: "%") {
            result += rest[..<range]
            let code = rest[range...].prefix(3)
            switch code {
            case "%25": result += "%"
            case "%2F": result += "/"
            case "%7B": result += "{"
            case "%7D": result += "}"
            default: result += code
            }
            rest = rest[range...].dropFirst(code.count)
        }
        return result + rest
    }
}

/// An activity as the global keys name it: `app/activity`, both escaped.
struct ActivityReference: Hashable, Sendable {
    let app: String
    let activityID: String

    var member: String { RedisRegistryKeys.escape(app) + "/" + RedisRegistryKeys.escape(activityID) }

    init(app: String, activityID: String) {
        self.app = app
        self.activityID = activityID
    }

    /// From a member of the global sets; nil for anything else.
    init?(member: String) {
        guard let slash = member.firstIndex(of: "/") else { return nil }
        app = RedisRegistryKeys.unescape(member[..<slash])
        activityID = RedisRegistryKeys.unescape(member[member.index(after: slash)...])
    }
}

/// Where a token is registered, as the global token index keeps it: length-prefixed fields, so any id goes through.
enum TokenLocation: Hashable, Sendable {
    case update(app: String, activityID: String)
    case push(app: String, deviceID: String)
    case pushToStart(app: String, deviceID: String, attributesType: String)

    /// Whether a removal for `scope` reaches this registration: its app, and its kind.
    func isReached(by scope: RemovalScope) -> Bool {
        switch self {
        case .update(let app, _), .pushToStart(let app, _, _): return scope.kind == .liveActivity && app == scope.app
        case .push(let app, _): return scope.kind == .devicePush && app == scope.app
        }
    }

    var encoded: String {
        func field(_ text: String) -> String { "\(text.utf8.count):\(text)" }
        switch self {
        case .update(let app, let activityID): return "u" + field(app) + field(activityID)
        case .push(let app, let deviceID): return "p" + field(app) + field(deviceID)
        case .pushToStart(let app, let deviceID, let type): return "s" + field(app) + field(deviceID) + field(type)
        }
    }

    init?(encoded: [UInt8]) {
        guard let kind = encoded.first else { return nil }
        var fields: [String] = []
        var index = 1
        while index < encoded.count {
            guard let colon = encoded[index...].firstIndex(of: UInt8(ascii: ":")),
                let length = Int(String(decoding: encoded[index..<colon], as: UTF8.self)),
                colon + 1 + length <= encoded.count
            else { return nil }
            fields.append(String(decoding: encoded[(colon + 1)..<(colon + 1 + length)], as: UTF8.self))
            index = colon + 1 + length
        }
        switch (kind, fields.count) {
        case (UInt8(ascii: "u"), 2): self = .update(app: fields[0], activityID: fields[1])
        case (UInt8(ascii: "p"), 2): self = .push(app: fields[0], deviceID: fields[1])
        case (UInt8(ascii: "s"), 3): self = .pushToStart(app: fields[0], deviceID: fields[1], attributesType: fields[2])
        default: return nil
        }
    }
}
