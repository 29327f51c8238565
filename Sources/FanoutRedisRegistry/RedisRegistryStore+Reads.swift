import FanoutCore
import FanoutRedis
package import FanoutRegistry

/// Paged reads: each page is one script call on one activity's or one app's keys. Cursors: a position for an
/// activity's tokens (the order set's, see `RedisRegistryScripts.activity`), `index:number` for lists of users or devices (the list position and
/// the last record's creation number), an activity id after `a:` for a device's update tokens, a sequence number for
/// the event log.
extension RedisRegistryStore {
    package func liveUpdateTokens(app: String, activityID: String, after: RegistryCursor?, limit: Int, now: Int64)
        async throws(RegistryError) -> RegistryPage<UpdateTokenRecord>
    {
        // A position; or, from a Fanout that paged by (expiry, slot), `expiry:slot`: its slot's number, the position
        // the order set is rebuilt with.
        var cursor: Int64 = 0
        if let after {
            if let position = Int64(after.rawValue), position >= 0 {
                cursor = position
            } else if let (_, slot) = Self.pair(after) {
                cursor = slot
            } else {
                throw .invalid("cursor", "\(after.rawValue) is not a cursor of this registry")
            }
        }
        let limit = try Self.limit(limit)
        let activityID = try RegistryValidation.identifier(activityID, field: "activity_id")
        try await requireApp(app)
        let keys = keys.activity(ActivityReference(app: app, activityID: activityID))
        var items: [UpdateTokenRecord] = []
        items.reserveCapacity(limit)
        // The script returns the slots after the cursor with their records; the expired ones the sweep has not
        // removed yet are skipped here, and read on until the page is full or the activity has no more.
        var more = true
        while more && items.count < limit {
            let wanted = limit - items.count
            let reply = try await send(
                Self.eval(
                    RedisRegistryScripts.activity, keys: keys,
                    ["page", RedisArgument(String(now)), RedisArgument(String(cursor)), RedisArgument(wanted)]))
            let values = reply.array ?? []
            for index in stride(from: 0, to: values.count - 1, by: 2) {
                cursor = Self.number(values[index])
                guard case .bytes(let json) = values[index + 1],
                    let record = Self.updateTokenRecord(json, activityID: activityID), record.expiresAt > now
                else { continue }
                items.append(record)
            }
            more = values.count / 2 == wanted
        }
        return RegistryPage(items: items, next: more ? RegistryCursor(rawValue: String(cursor)) : nil)
    }

    /// An activity slot's record as the scripts store it (JSON, `t` token, `d` device or "", `r` registered and `e`
    /// expiry in Unix ms as strings); nil when it cannot be read.
    static func updateTokenRecord(_ json: [UInt8], activityID: String) -> UpdateTokenRecord? {
        var token = ""
        var device = ""
        var registered: Int64 = 0
        var expires: Int64 = 0
        do throws(JSONParseError) {
            try JSONParser.withParser(over: json, rules: .rfc8259) { parser throws(JSONParseError) in
                try parser.readObject { key, parser throws(JSONParseError) in
                    if parser.string(key, equals: "t") {
                        token = try parser.readStringValue()
                    } else if parser.string(key, equals: "d") {
                        device = try parser.readStringValue()
                    } else if parser.string(key, equals: "r") {
                        registered = try Self.millisecondsValue(&parser)
                    } else if parser.string(key, equals: "e") {
                        expires = try Self.millisecondsValue(&parser)
                    } else {
                        try parser.skipValue()
                    }
                }
            }
        } catch {
            return nil
        }
        guard !token.isEmpty else { return nil }
        return UpdateTokenRecord(
            activityID: activityID, deviceID: device.isEmpty ? nil : device, token: token, registeredAt: registered,
            expiresAt: expires)
    }

    /// A time in a record: a string of digits as the scripts write it, or a JSON number.
    private static func millisecondsValue(_ parser: inout JSONParser) throws(JSONParseError) -> Int64 {
        switch try parser.peekKind() {
        case .string: return Int64(Double(try parser.readStringValue()) ?? 0)
        case .number: return Int64(Double(String(decoding: parser.slice(try parser.scanNumber()), as: UTF8.self)) ?? 0)
        default:
            try parser.skipValue()
            return 0
        }
    }

    package func liveUpdateTokenCount(app: String, activityID: String, now: Int64) async throws(RegistryError) -> Int {
        let activityID = try RegistryValidation.identifier(activityID, field: "activity_id")
        try await requireApp(app)
        let reply = try await send(
            Self.eval(
                RedisRegistryScripts.activity, keys: keys.activity(ActivityReference(app: app, activityID: activityID)),
                ["count", RedisArgument(String(now))]))
        return Int(reply.integer ?? 0)
    }

    package func endedChannels(now: Int64, limit: Int, skipping: Int) async throws(RegistryError) -> [EndedChannel] {
        let limit = try Self.limit(limit)
        var channels: [EndedChannel] = []
        var toSkip = max(0, skipping)
        var offset = 0
        let chunk = 512
        while channels.count < limit {
            let members =
                try await send([
                    "ZRANGEBYSCORE", keys.ended, "-inf", RedisArgument(String(now)), "LIMIT", RedisArgument(offset),
                    RedisArgument(chunk),
                ]).array ?? []
            if members.isEmpty { break }
            offset += members.count
            let references = members.compactMap { $0.string.flatMap(ActivityReference.init(member:)) }
            let replies = try await send(
                references.map {
                    Self.eval(
                        RedisRegistryScripts.activity, keys: keys.activity($0), ["get", RedisArgument(String(now))])
                })
            for (reference, reply) in zip(references, replies) {
                guard let record = Self.activityRecord(reference.activityID, reply), record.state == .ended,
                    let dismissal = record.dismissalDate, dismissal <= now, let channel = record.channelID
                else { continue }
                if toSkip > 0 {
                    toSkip -= 1
                    continue
                }
                channels.append(
                    EndedChannel(
                        app: reference.app, activityID: reference.activityID, channelID: channel,
                        environment: record.channelEnvironment))
                if channels.count == limit { break }
            }
        }
        return channels
    }

    package func updateTokens(app: String, deviceID: String, after: RegistryCursor?, limit: Int, now: Int64)
        async throws(RegistryError) -> RegistryPage<UpdateTokenRecord>
    {
        var position = ""
        if let after {
            guard after.rawValue.hasPrefix("a:") else {
                throw .invalid("cursor", "\(after.rawValue) is not a cursor of this registry")
            }
            position = String(after.rawValue.dropFirst(2))
        }
        let limit = try Self.limit(limit)
        let deviceID = try RegistryValidation.identifier(deviceID, field: "device")
        try await requireApp(app)
        var items: [UpdateTokenRecord] = []
        var lastActivity = position
        while items.count < limit {
            let activities =
                try await send(
                    Self.eval(
                        RedisRegistryScripts.app, keys: keys.app(app),
                        [
                            "device_activities", RedisArgument(String(now)), RedisArgument(deviceID),
                            RedisArgument(position), RedisArgument(limit - items.count),
                        ])
                ).array?.compactMap(\.string) ?? []
            if activities.isEmpty { break }
            position = activities.last!
            let replies = try await send(
                activities.map {
                    Self.eval(
                        RedisRegistryScripts.activity, keys: keys.activity(ActivityReference(app: app, activityID: $0)),
                        ["devslot", RedisArgument(String(now)), RedisArgument(deviceID)])
                })
            for (activityID, reply) in zip(activities, replies) {
                guard let values = reply.array, values.count == 3 else { continue }
                items.append(
                    UpdateTokenRecord(
                        activityID: activityID, deviceID: deviceID, token: values[1].string ?? "",
                        registeredAt: Self.number(values[0]), expiresAt: Self.number(values[2])))
                lastActivity = activityID
            }
        }
        return RegistryPage(
            items: items, next: items.count == limit ? RegistryCursor(rawValue: "a:" + lastActivity) : nil)
    }

    package func pushToStartTokens(
        app: String, attributesType: String?, selection: RecipientSelection, after: RegistryCursor?, limit: Int
    ) async throws(RegistryError) -> RegistryPage<PushToStartRecord> {
        let cursor = try Self.listCursor(after)
        let limit = try Self.limit(limit)
        let attributesType = try RegistryValidation.optionalIdentifier(attributesType, field: "attributes_type")
        try await requireApp(app)
        let (values, next) = try await list(
            "pts_read", app: app, selection: selection, cursor: cursor, limit: limit, filter: attributesType)
        var items: [PushToStartRecord] = []
        for index in stride(from: 0, to: values.count - 5, by: 6) {
            let user = values[index + 2].string ?? ""
            let type = values[index + 3].string ?? ""
            items.append(
                PushToStartRecord(
                    deviceID: values[index + 1].string ?? "", userID: user.isEmpty ? nil : user,
                    attributesType: type.isEmpty ? nil : type, token: values[index + 4].string ?? "",
                    updatedAt: Self.number(values[index + 5])))
        }
        return RegistryPage(items: items, next: next)
    }

    package func devices(app: String, selection: RecipientSelection, after: RegistryCursor?, limit: Int)
        async throws(RegistryError) -> RegistryPage<DeviceRecord>
    {
        let cursor = try Self.listCursor(after)
        let limit = try Self.limit(limit)
        try await requireApp(app)
        let (values, next) = try await list(
            "devices", app: app, selection: selection, cursor: cursor, limit: limit, filter: nil)
        var items: [DeviceRecord] = []
        for index in stride(from: 0, to: values.count - 4, by: 5) {
            let user = values[index + 2].string ?? ""
            let token = values[index + 3].string ?? ""
            let at = values[index + 4].string ?? ""
            items.append(
                DeviceRecord(
                    deviceID: values[index + 1].string ?? "", userID: user.isEmpty ? nil : user,
                    pushToken: token.isEmpty ? nil : token, pushTokenRegisteredAt: token.isEmpty ? nil : Int64(at)))
        }
        return RegistryPage(items: items, next: next)
    }

    /// Through the global token index (`Ptoken:T`, one `SMEMBERS` per token in one pipeline), then the devices
    /// themselves, read back so that a stale index entry (a token the device has rotated away from) finds nothing.
    package func devices(app: String, pushTokens: [String]) async throws(RegistryError) -> [DeviceRecord] {
        var tokens: [String] = []
        for token in pushTokens {
            tokens.append(try RegistryValidation.token(token, field: "push_token", allowEmpty: false))
        }
        tokens = Self.unique(tokens)
        try await requireApp(app)
        guard !tokens.isEmpty else { return [] }
        let replies = try await send(tokens.map { ["SMEMBERS", keys.token($0)] })
        var candidates: [(token: String, deviceID: String)] = []
        for (token, reply) in zip(tokens, replies) {
            if case .error(let message) = reply { throw RegistryError(.storage, "Redis: \(message)") }
            for member in reply.array ?? [] {
                guard case .bytes(let bytes) = member,
                    case .push(let owner, let deviceID)? = TokenLocation(encoded: bytes),
                    owner == app
                else { continue }
                candidates.append((token, deviceID))
            }
        }
        guard !candidates.isEmpty else { return [] }
        var current: [String: DeviceRecord] = [:]
        var cursor: RegistryCursor?
        repeat {
            let page = try await devices(
                app: app, selection: .devices(Self.unique(candidates.map(\.deviceID))), after: cursor, limit: 1_000)
            for record in page.items { current[record.deviceID] = record }
            cursor = page.next
        } while cursor != nil
        var records: [DeviceRecord] = []
        var seen = Set<String>()
        for (token, deviceID) in candidates {
            guard let record = current[deviceID], record.pushToken == token, seen.insert(deviceID).inserted else {
                continue
            }
            records.append(record)
        }
        return records
    }

    /// One page of devices or push-to-start tokens: the items' flat values and the next cursor.
    private func list(
        _ operation: String, app: String, selection: RecipientSelection, cursor: (index: Int, number: Int64),
        limit: Int, filter: String?
    ) async throws(RegistryError) -> ([RedisValue], RegistryCursor?) {
        let kind: String
        var names: [String] = []
        switch selection {
        case .all: kind = "all"
        case .users(let users): (kind, names) = ("users", Self.unique(users))
        case .devices(let devices): (kind, names) = ("devices", Self.unique(devices))
        }
        let reply = try await send(
            Self.eval(
                RedisRegistryScripts.app, keys: keys.app(app),
                [
                    RedisArgument(operation), "0", RedisArgument(kind), RedisArgument(cursor.index),
                    RedisArgument(String(cursor.number)), RedisArgument(limit), RedisArgument(filter ?? ""),
                    filter == nil ? "0" : "1",
                ] + names.map { RedisArgument($0) }))
        let values = reply.array ?? []
        guard values.count >= 2 else { throw RegistryError(.storage, "Redis: unexpected reply \(reply)") }
        let index = values[0].integer ?? 0
        let number = values[1].integer ?? -1
        return (Array(values.dropFirst(2)), number < 0 ? nil : RegistryCursor(rawValue: "\(index):\(number)"))
    }

    package func activity(app: String, activityID: String) async throws(RegistryError) -> ActivityRecord? {
        let activityID = try RegistryValidation.identifier(activityID, field: "activity_id")
        try await requireApp(app)
        let reply = try await send(
            Self.eval(
                RedisRegistryScripts.activity, keys: keys.activity(ActivityReference(app: app, activityID: activityID)),
                ["get", RedisArgument(String(clock.now()))]))
        return Self.activityRecord(activityID, reply)
    }

    package func events(after: RegistryCursor?, limit: Int) async throws(RegistryError) -> RegistryPage<RegistryEvent> {
        var start: Int64 = 0
        if let after {
            guard let number = Int64(after.rawValue), number >= 0 else {
                throw .invalid("cursor", "\(after.rawValue) is not a cursor of this registry")
            }
            start = number
        }
        let limit = try Self.limit(limit)
        let reply = try await send([
            "XRANGE", keys.events, RedisArgument("(0-\(start)"), "+", "COUNT", RedisArgument(limit),
        ])
        var events: [RegistryEvent] = []
        for entry in reply.array ?? [] {
            guard let parts = entry.array, parts.count == 2, let id = parts[0].string, let fields = parts[1].array
            else {
                continue
            }
            var values: [String: String] = [:]
            for index in stride(from: 0, to: fields.count - 1, by: 2) {
                values[fields[index].string ?? ""] = fields[index + 1].string ?? ""
            }
            func optional(_ name: String) -> String? {
                let value = values[name] ?? ""
                return value.isEmpty ? nil : value
            }
            events.append(
                RegistryEvent(
                    sequence: Int64(id.dropFirst(2)) ?? 0, at: Int64(values["at"] ?? "") ?? 0, app: values["app"] ?? "",
                    activityID: optional("activity"), deviceID: optional("device"), token: values["token"] ?? "",
                    kind: RegistryEvent.TokenKind(rawValue: values["kind"] ?? "") ?? .update,
                    change: RegistryEvent.Change(rawValue: values["change"] ?? "") ?? .removed,
                    reason: optional("reason").flatMap(RegistryEvent.Reason.init(rawValue:))))
        }
        return RegistryPage(items: events, next: RegistryCursor(rawValue: String(events.last?.sequence ?? start)))
    }

    /// Counts for `fanout registry stats`: the apps' counters, and one script per activity (pipelined in chunks) for
    /// what is live at `now`.
    package func stats(now: Int64) async throws(RegistryError) -> RegistryStats {
        var stats = RegistryStats()
        let apps = try await loadApps().keys.sorted()
        stats.apps = apps.count
        let counts = try await send(
            apps.map {
                Self.eval(RedisRegistryScripts.app, keys: keys.app($0), ["counts", RedisArgument(String(now))])
            })
        for reply in counts {
            let values = reply.array ?? []
            stats.devices += Int(values.first?.integer ?? 0)
            stats.pushToStartTokens += Int(values.dropFirst().first?.integer ?? 0)
        }
        var cursor = "0"
        // SSCAN may return a member more than once: count each activity once.
        var counted = Set<ActivityReference>()
        repeat {
            let reply = try await send(["SSCAN", keys.activities, RedisArgument(cursor), "COUNT", "1000"]).array ?? []
            guard reply.count == 2 else { break }
            cursor = reply[0].string ?? "0"
            let references = (reply[1].array ?? []).compactMap { $0.string.flatMap(ActivityReference.init(member:)) }
                .filter { counted.insert($0).inserted }
            let replies = try await send(
                references.map {
                    Self.eval(
                        RedisRegistryScripts.activity, keys: keys.activity($0), ["stat", RedisArgument(String(now))])
                })
            for reply in replies {
                let values = (reply.array ?? []).map { $0.integer ?? 0 }
                guard values.count == 5, values[0] == 1 else { continue }
                stats.activities += 1
                if values[1] == 0, values[2] == 1 || values[4] > 0 { stats.liveActivities += 1 }
                stats.updateTokens += Int(values[4])
            }
        } while cursor != "0"
        stats.expiredSwept = Int(try await send(["HGET", keys.counters, "expired_swept"]).integer ?? 0)
        return stats
    }

    // MARK: Helpers

    static func activityRecord(_ activityID: String, _ reply: RedisValue) -> ActivityRecord? {
        guard let values = reply.array?.map({ $0.string ?? "" }), values.count == 9 else { return nil }
        func optional(_ index: Int) -> String? { values[index].isEmpty ? nil : values[index] }
        return ActivityRecord(
            activityID: activityID, attributesType: optional(0), state: values[1] == "ended" ? .ended : .active,
            lastContentTimestamp: optional(2).flatMap { Int64($0) }, endedAt: optional(3).flatMap { Int64($0) },
            dismissalDate: optional(4).flatMap { Int64($0) }, channelID: optional(5),
            channelStoragePolicy: optional(6).flatMap { Int($0) }, channelEnvironment: optional(7))
    }

    /// A number sent back as a bulk string (a record's field, a score).
    static func number(_ value: RedisValue) -> Int64 {
        if let integer = value.integer { return integer }
        return Int64(Double(value.string ?? "") ?? 0)
    }

    static func pair(_ cursor: RegistryCursor) -> (Int64, Int64)? {
        let parts = cursor.rawValue.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, let first = Int64(parts[0]), let second = Int64(parts[1]), second >= 0 else {
            return nil
        }
        return (first, second)
    }

    static func listCursor(_ cursor: RegistryCursor?) throws(RegistryError) -> (index: Int, number: Int64) {
        guard let cursor else { return (0, 0) }
        guard let (index, number) = pair(cursor), index >= 0, let position = Int(exactly: index) else {
            throw .invalid("cursor", "\(cursor.rawValue) is not a cursor of this registry")
        }
        return (position, number)
    }

    static func limit(_ limit: Int) throws(RegistryError) -> Int {
        guard limit > 0 else { throw .invalid("limit", "must be at least 1, not \(limit)") }
        return limit
    }

    /// `values` without repeats, in their first order (a user named twice gets one notification).
    static func unique(_ values: [String]) -> [String] {
        var seen = Set<String>()
        return values.filter { seen.insert($0).inserted }
    }
}
