import FanoutSQLite

/// Paged reads. Cursors are keys of the last row returned, as text: a row id (`"1234"`, also for an activity's
/// tokens), or for a list of users or devices the position in the list and a row id (`"3:1234"`). Pages are keyset
/// reads (`key > cursor ORDER BY key`), so each costs the same however deep it is, and a row present for the whole
/// paging is returned exactly once.
extension RegistryConnection {
    // MARK: Update tokens

    /// Pages in row id order (`update_tokens_in_order`), skipping the expired rows a sweep has not removed yet. A
    /// row keeps its id while its token stays (registered again, or taken over by a device), so a send reads each
    /// token once; a new registration gets a new id, after every other, so a send that is still paging reaches it,
    /// and so does a token rotated mid-paging (its new value, at a new id). Not by expiry: a token registered again
    /// moves its expiry forward, which would put it behind the send's cursor and read it twice.
    func liveUpdateTokens(app: AppRef, activityID: String, after: Int64, limit: Int, now: Int64)
        throws(SQLiteError) -> RegistryPage<UpdateTokenRecord>
    {
        let activity = try database.withStatement(
            "SELECT id, state, dismissal_at FROM activities WHERE app = ?1 AND activity_id = ?2"
        ) { statement throws(SQLiteError) -> (row: Int64, ended: Bool, dismissal: Int64?)? in
            try statement.bind(app.id, at: 1)
            try statement.bind(activityID, at: 2)
            guard try statement.step() else { return nil }
            return (statement.int64(at: 0), statement.int64(at: 1) == 1, statement.optionalInt64(at: 2))
        }
        guard let activity else { return RegistryPage(items: [], next: nil) }
        if activity.ended, let dismissal = activity.dismissal, dismissal <= now {
            return RegistryPage(items: [], next: nil)
        }
        var items: [UpdateTokenRecord] = []
        items.reserveCapacity(min(limit, 65_536))
        var last = after
        try database.withStatement(ReadSQL.liveTokensAfterRow) { statement throws(SQLiteError) in
            try statement.bind(activity.row, at: 1)
            try statement.bind(after, at: 2)
            try statement.bind(now, at: 3)
            try statement.bind(Int64(limit), at: 4)
            while try statement.step() {
                last = statement.int64(at: 0)
                items.append(
                    UpdateTokenRecord(
                        activityID: activityID, deviceID: statement.optionalString(at: 1),
                        token: statement.string(at: 2), registeredAt: statement.int64(at: 3),
                        expiresAt: statement.int64(at: 4)))
            }
        }
        return RegistryPage(items: items, next: items.count == limit ? RegistryCursor(row: last) : nil)
    }

    /// How many update tokens of an activity are live at `now`: a count over the activity's range of
    /// `update_tokens_by_activity`, in SQLite, without reading the rows out.
    func liveUpdateTokenCount(app: AppRef, activityID: String, now: Int64) throws(SQLiteError) -> Int {
        try database.withStatement(
            """
            SELECT count(*) FROM update_tokens INDEXED BY update_tokens_by_activity
            WHERE activity = (SELECT id FROM activities WHERE app = ?1 AND activity_id = ?2
                              AND NOT (state = 1 AND dismissal_at <= ?3))
              AND expires_at > ?3
            """
        ) { statement throws(SQLiteError) -> Int in
            try statement.bind(app.id, at: 1)
            try statement.bind(activityID, at: 2)
            try statement.bind(now, at: 3)
            guard try statement.step() else { return 0 }
            return Int(statement.int64(at: 0))
        }
    }

    /// Ended activities past their dismissal date that are still bound to a broadcast channel.
    func endedChannels(now: Int64, limit: Int, skipping: Int) throws(SQLiteError) -> [(
        app: Int64, activityID: String, channelID: String, environment: String?
    )] {
        try database.withStatement(
            """
            SELECT app, activity_id, channel_id, channel_environment FROM activities INDEXED BY activities_by_dismissal
            WHERE state = 1 AND dismissal_at <= ?1 AND channel_id IS NOT NULL ORDER BY dismissal_at, id
            LIMIT ?2 OFFSET ?3
            """
        ) { statement throws(SQLiteError) in
            try statement.bind(now, at: 1)
            try statement.bind(Int64(limit), at: 2)
            try statement.bind(Int64(skipping), at: 3)
            var rows: [(app: Int64, activityID: String, channelID: String, environment: String?)] = []
            while try statement.step() {
                rows.append(
                    (
                        statement.int64(at: 0), statement.string(at: 1), statement.string(at: 2),
                        statement.optionalString(at: 3)
                    ))
            }
            return rows
        }
    }

    /// One probe of `update_tokens_by_device` per activity of the app.
    func updateTokens(app: AppRef, deviceID: String, after: Int64, limit: Int, now: Int64)
        throws(SQLiteError) -> RegistryPage<UpdateTokenRecord>
    {
        try database.withStatement(
            """
            SELECT t.id, a.activity_id, t.device_id, t.token, t.registered_at, t.expires_at
            FROM update_tokens t JOIN activities a ON a.id = t.activity
            WHERE t.device_id = ?1 AND a.app = ?2 AND t.id > ?3 AND t.expires_at > ?4
                AND NOT (a.state = 1 AND a.dismissal_at <= ?4)
            ORDER BY t.id LIMIT ?5
            """
        ) { statement throws(SQLiteError) in
            try statement.bind(deviceID, at: 1)
            try statement.bind(app.id, at: 2)
            try statement.bind(after, at: 3)
            try statement.bind(now, at: 4)
            try statement.bind(Int64(limit), at: 5)
            var items: [UpdateTokenRecord] = []
            var last = after
            while try statement.step() {
                last = statement.int64(at: 0)
                items.append(
                    UpdateTokenRecord(
                        activityID: statement.string(at: 1), deviceID: statement.optionalString(at: 2),
                        token: statement.string(at: 3), registeredAt: statement.int64(at: 4),
                        expiresAt: statement.int64(at: 5)))
            }
            return RegistryPage(items: items, next: items.count == limit ? RegistryCursor(row: last) : nil)
        }
    }

    // MARK: Push-to-start tokens and devices

    func pushToStartTokens(
        app: AppRef, attributesType: String?, selection: RecipientSelection, after: ListCursor, limit: Int
    ) throws(SQLiteError) -> RegistryPage<PushToStartRecord> {
        let columns = "id, device_id, user_id, attributes_type, token, updated_at"
        let typeFilter = "(?3 IS NULL OR attributes_type = ?3 OR attributes_type = '')"
        return try pagedList(
            selection: selection, after: after, limit: limit,
            all: """
                SELECT \(columns) FROM push_to_start_tokens INDEXED BY push_to_start_by_app
                WHERE app = ?1 AND id > ?2 AND \(typeFilter) ORDER BY id LIMIT ?4
                """,
            byUser: """
                SELECT \(columns) FROM push_to_start_tokens INDEXED BY push_to_start_by_user
                WHERE app = ?1 AND user_id = ?5 AND id > ?2 AND \(typeFilter) ORDER BY id LIMIT ?4
                """,
            byDevice: """
                SELECT \(columns) FROM push_to_start_tokens
                WHERE app = ?1 AND device_id = ?5 AND id > ?2 AND \(typeFilter) ORDER BY id LIMIT ?4
                """,
            bind: { statement throws(SQLiteError) in
                try statement.bind(app.id, at: 1)
                try statement.bind(attributesType, at: 3)
            },
            read: { statement in
                let type = statement.string(at: 3)
                return PushToStartRecord(
                    deviceID: statement.string(at: 1), userID: statement.optionalString(at: 2),
                    attributesType: type.isEmpty ? nil : type, token: statement.string(at: 4),
                    updatedAt: statement.int64(at: 5))
            })
    }

    func devices(app: AppRef, selection: RecipientSelection, after: ListCursor, limit: Int)
        throws(SQLiteError) -> RegistryPage<DeviceRecord>
    {
        let columns = "id, device_id, user_id, push_token, push_token_at"
        return try pagedList(
            selection: selection, after: after, limit: limit,
            all:
                "SELECT \(columns) FROM devices INDEXED BY devices_by_app WHERE app = ?1 AND id > ?2 ORDER BY id LIMIT ?4",
            byUser: """
                SELECT \(columns) FROM devices INDEXED BY devices_by_user
                WHERE app = ?1 AND user_id = ?5 AND id > ?2 ORDER BY id LIMIT ?4
                """,
            byDevice:
                "SELECT \(columns) FROM devices WHERE app = ?1 AND device_id = ?5 AND id > ?2 ORDER BY id LIMIT ?4",
            bind: { statement throws(SQLiteError) in try statement.bind(app.id, at: 1) },
            read: { statement in
                DeviceRecord(
                    deviceID: statement.string(at: 1), userID: statement.optionalString(at: 2),
                    pushToken: statement.optionalString(at: 3), pushTokenRegisteredAt: statement.optionalInt64(at: 4))
            })
    }

    /// The app's devices holding each of `pushTokens` (lowercase hex) as their push token, through the token index
    /// (`devices_by_push_token`): each device once, in the order of the tokens.
    func devices(app: AppRef, pushTokens: [String]) throws(SQLiteError) -> [DeviceRecord] {
        var records: [DeviceRecord] = []
        var seen = Set<String>()
        for token in RegistryConnection.unique(pushTokens).compactMap({ $0 }) {
            try database.withStatement(
                """
                SELECT device_id, user_id, push_token, push_token_at FROM devices INDEXED BY devices_by_push_token
                WHERE push_token_key = ?1 AND push_token = ?2 AND app = ?3 ORDER BY id
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(RegistrySchema.tokenKey(token), at: 1)
                try statement.bind(token, at: 2)
                try statement.bind(app.id, at: 3)
                while try statement.step() {
                    let record = DeviceRecord(
                        deviceID: statement.string(at: 0), userID: statement.optionalString(at: 1),
                        pushToken: statement.optionalString(at: 2),
                        pushTokenRegisteredAt: statement.optionalInt64(at: 3))
                    if seen.insert(record.deviceID).inserted { records.append(record) }
                }
            }
        }
        return records
    }

    /// Pages through `selection`: one keyset query for `.all`, or one per listed user or device, in list order. The
    /// queries bind ?1 and ?3 through `bind`, the row cursor as ?2, the limit as ?4 and the user or device as ?5, and
    /// return the row id as column 0.
    private func pagedList<Item>(
        selection: RecipientSelection, after: ListCursor, limit: Int, all: String, byUser: String, byDevice: String,
        bind: (SQLiteStatement) throws(SQLiteError) -> Void, read: (SQLiteStatement) -> Item
    ) throws(SQLiteError) -> RegistryPage<Item> {
        let sql: String
        let keys: [String?]
        switch selection {
        case .all: (sql, keys) = (all, [nil])
        case .users(let users): (sql, keys) = (byUser, RegistryConnection.unique(users))
        case .devices(let devices): (sql, keys) = (byDevice, RegistryConnection.unique(devices))
        }
        var items: [Item] = []
        var index = after.index
        var row = after.row
        while index < keys.count {
            let remaining = limit - items.count
            var last = row
            let count = try database.withStatement(sql) { statement throws(SQLiteError) in
                try bind(statement)
                try statement.bind(row, at: 2)
                try statement.bind(Int64(remaining), at: 4)
                if let key = keys[index] { try statement.bind(key, at: 5) }
                var count = 0
                while try statement.step() {
                    last = statement.int64(at: 0)
                    items.append(read(statement))
                    count += 1
                }
                return count
            }
            if count == remaining {
                return RegistryPage(items: items, next: ListCursor(index: index, row: last).cursor)
            }
            index += 1
            row = 0
        }
        return RegistryPage(items: items, next: nil)
    }

    /// `values` without repeats, in their first order (a user named twice gets one notification).
    private static func unique(_ values: [String]) -> [String?] {
        var seen = Set<String>()
        return values.filter { seen.insert($0).inserted }
    }

    // MARK: Activities, events, stats

    func activity(app: AppRef, activityID: String) throws(SQLiteError) -> ActivityRecord? {
        try database.withStatement(
            """
            SELECT attributes_type, state, last_content_timestamp, ended_at, dismissal_at, channel_id,
                channel_storage_policy, channel_environment
            FROM activities WHERE app = ?1 AND activity_id = ?2
            """
        ) { statement throws(SQLiteError) in
            try statement.bind(app.id, at: 1)
            try statement.bind(activityID, at: 2)
            guard try statement.step() else { return nil }
            return ActivityRecord(
                activityID: activityID, attributesType: statement.optionalString(at: 0),
                state: statement.int64(at: 1) == 1 ? .ended : .active,
                lastContentTimestamp: statement.optionalInt64(at: 2), endedAt: statement.optionalInt64(at: 3),
                dismissalDate: statement.optionalInt64(at: 4), channelID: statement.optionalString(at: 5),
                channelStoragePolicy: statement.optionalInt64(at: 6).map { Int($0) },
                channelEnvironment: statement.optionalString(at: 7))
        }
    }

    func events(after: Int64, limit: Int) throws(SQLiteError) -> RegistryPage<RegistryEvent> {
        let rows = try database.withStatement(
            """
            SELECT seq, at, app, kind, activity_id, device_id, token, change, reason FROM events
            WHERE seq > ?1 ORDER BY seq LIMIT ?2
            """
        ) { statement throws(SQLiteError) in
            try statement.bind(after, at: 1)
            try statement.bind(Int64(limit), at: 2)
            var rows: [(event: RegistryEvent, app: Int64)] = []
            while try statement.step() {
                let event = RegistryEvent(
                    sequence: statement.int64(at: 0), at: statement.int64(at: 1), app: "",
                    activityID: statement.optionalString(at: 4), deviceID: statement.optionalString(at: 5),
                    token: statement.string(at: 6), kind: .init(code: statement.int64(at: 3)) ?? .update,
                    change: .init(code: statement.int64(at: 7)) ?? .removed,
                    reason: statement.optionalInt64(at: 8).flatMap(RegistryEvent.Reason.init(code:)))
                rows.append((event, statement.int64(at: 2)))
            }
            return rows
        }
        var events: [RegistryEvent] = []
        events.reserveCapacity(rows.count)
        for (event, app) in rows {
            var event = event
            event.app = try bundleID(app)
            events.append(event)
        }
        return RegistryPage(items: events, next: RegistryCursor(row: events.last?.sequence ?? after))
    }

    func stats(now: Int64) throws(SQLiteError) -> RegistryStats {
        func count(_ sql: String) throws(SQLiteError) -> Int {
            try database.withStatement(sql) { statement throws(SQLiteError) in
                if sql.contains("?1") { try statement.bind(now, at: 1) }
                return try statement.step() ? Int(statement.int64(at: 0)) : 0
            }
        }
        var stats = RegistryStats()
        stats.apps = try count("SELECT count(*) FROM apps")
        stats.devices = try count("SELECT count(*) FROM devices")
        stats.activities = try count("SELECT count(*) FROM activities")
        stats.liveActivities = try count(
            """
            SELECT count(*) FROM activities a WHERE a.state = 0 AND (a.channel_id IS NOT NULL OR EXISTS (
                SELECT 1 FROM update_tokens t INDEXED BY update_tokens_by_activity
                WHERE t.activity = a.id AND t.expires_at > ?1))
            """)
        // Per activity, the live tokens are one range of update_tokens_by_activity: counted without reading the rest.
        stats.updateTokens = try count(
            """
            SELECT coalesce(sum((
                SELECT count(*) FROM update_tokens t INDEXED BY update_tokens_by_activity
                WHERE t.activity = a.id AND t.expires_at > ?1)), 0)
            FROM activities a WHERE NOT (a.state = 1 AND a.dismissal_at <= ?1)
            """)
        stats.pushToStartTokens = try count("SELECT count(*) FROM push_to_start_tokens")
        stats.expiredSwept = try count("SELECT value FROM counters WHERE name = 'expired_swept'")
        return stats
    }
}

extension RegistryCursor {
    /// The row id of a cursor over an activity's tokens (0 for nil); nil for a cursor this store did not make.
    /// Schema version 2 made `expiry:row` cursors: its row id is taken (a send paging across the upgrade goes on
    /// after that row, but may miss or repeat a token registered again while it paged, as version 2 did).
    static func tokenRow(_ cursor: RegistryCursor?) -> Int64? {
        guard let cursor else { return 0 }
        if let row = cursor.row { return row }
        guard let (_, row) = cursor.pair, row >= 0 else { return nil }
        return row
    }
}

/// A cursor over a list of users or devices: the list position and the last row id returned there.
struct ListCursor: Hashable {
    var index: Int
    var row: Int64

    static let start = ListCursor(index: 0, row: 0)

    var cursor: RegistryCursor { RegistryCursor(rawValue: "\(index):\(row)") }

    init(index: Int, row: Int64) {
        self.index = index
        self.row = row
    }

    /// Nil for a cursor this store did not make.
    init?(_ cursor: RegistryCursor?) {
        guard let cursor else {
            self = .start
            return
        }
        guard let (index, row) = cursor.pair, let index = Int(exactly: index), index >= 0, row >= 0 else { return nil }
        self.init(index: index, row: row)
    }
}

extension RegistryCursor {
    init(row: Int64) {
        self.init(rawValue: String(row))
    }

    /// The row id of a single-table cursor (0 for nil); nil for a cursor this store did not make.
    var row: Int64? {
        guard let row = Int64(rawValue), row >= 0 else { return nil }
        return row
    }
}

/// The paging statement of an activity's tokens.
enum ReadSQL {
    /// The live tokens after a row id: `?2` row id, `?3` now, `?4` limit.
    static let liveTokensAfterRow = SQLiteSQL(
        """
        SELECT id, device_id, token, registered_at, expires_at FROM update_tokens INDEXED BY update_tokens_in_order
        WHERE activity = ?1 AND id > ?2 AND expires_at > ?3 ORDER BY id LIMIT ?4
        """)
}

extension RegistryCursor {
    /// The two integers of a `first:second` cursor (both cursor kinds of this store), or nil.
    fileprivate var pair: (Int64, Int64)? {
        let parts = rawValue.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, let first = Int64(parts[0]), let second = Int64(parts[1]) else { return nil }
        return (first, second)
    }
}
