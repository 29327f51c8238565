import FanoutSQLite

/// A change after validation, its app resolved to its row.
typealias ValidChange = ValidatedChange<AppRef>

/// The state of one write transaction.
struct WriteContext {
    let now: Int64
    var result = RegistryApplyResult()
    /// Expired update tokens removed in this transaction, for the `expired_swept` counter.
    var expiredSwept = 0
    /// Activity row ids by (app, activity id), valid for this transaction only (we hold the write lock).
    var activityRows: [ActivityKey: Int64] = [:]
    /// Activity ids and apps by row id, for events about tokens found by token alone.
    var activityNames: [Int64: (app: AppRef, activityID: String)] = [:]
    /// Events not yet written (see `RegistryConnection.recordEvent`).
    var pendingEvents: [PendingEvent] = []
    /// The activity of the previous lookup.
    var lastActivity: (app: Int64, activityID: String, row: Int64)?
    /// When each activity this transaction registered a token for ended (nil: it is live), read once per activity.
    var activityEnds: [Int64: Int64?] = [:]
    /// The highest update token row id handed out (`RegistryConnection.nextUpdateTokenRow`), and what `counters`
    /// held at the start; nil until the transaction makes its first row.
    var lastTokenRow: Int64?
    var storedLastTokenRow: Int64?

    init(now: Int64) {
        self.now = now
    }
}

/// An update token row about to be written.
struct UpdateTokenRow {
    var activity: Int64
    var deviceID: String?
    var token: String
    var key: Int64
    var registeredAt: Int64
    var expiresAt: Int64
}

struct PendingEvent {
    var appID: Int64
    var event: RegistryEvent
}

struct ActivityKey: Hashable {
    var app: Int64
    var activityID: String
}

extension RegistryConnection {
    // MARK: Validation

    /// Checks one change and resolves its app; throws `invalidInput` naming the field. `trusted`: the change was
    /// built from a registration the import parser validated, so only the app is resolved.
    func validate(_ change: RegistryChange, trusted: Bool = false) throws(RegistryError) -> ValidChange {
        if trusted, case .updateToken(let registration) = change {
            return .updateToken(
                app: try requireApp(registration.app), activityID: registration.activityID,
                deviceID: registration.deviceID, userID: registration.userID, token: registration.token,
                registeredAt: registration.registeredAt)
        }
        return try RegistryValidation.validate(change).resolvingApp { (app) throws(RegistryError) in try requireApp(app)
        }
    }

    // MARK: Applying

    /// Applies validated changes in one transaction and returns what changed.
    func apply(_ changes: [ValidChange], now: Int64) throws(SQLiteError) -> RegistryApplyResult {
        try database.transaction { () throws(SQLiteError) in
            var context = WriteContext(now: now)
            for change in changes {
                try apply(change, in: &context)
            }
            try flushEvents(in: &context)
            try addExpiredSwept(context.expiredSwept)
            try storeLastTokenRow(context)
            return context.result
        }
    }

    private func apply(_ change: ValidChange, in context: inout WriteContext) throws(SQLiteError) {
        switch change {
        case .updateToken(let app, let activityID, let deviceID, let userID, let token, let registeredAt):
            if token.isEmpty {
                try stopUpdateTokens(app: app, activityID: activityID, deviceID: deviceID, in: &context)
            } else {
                try registerUpdateToken(
                    app: app, activityID: activityID, deviceID: deviceID, userID: userID, token: token,
                    registeredAt: registeredAt ?? context.now, in: &context)
            }
        case .stopUpdateTokens(let app, let activityID, let deviceID):
            try stopUpdateTokens(app: app, activityID: activityID, deviceID: deviceID, in: &context)
        case .pushToStart(let app, let deviceID, let userID, let attributesType, let token, let updatedAt):
            try registerPushToStart(
                app: app, deviceID: deviceID, userID: userID, attributesType: attributesType, token: token,
                updatedAt: updatedAt ?? context.now, in: &context)
        case .device(let app, let deviceID, let userID, let pushToken, let registeredAt):
            try registerDevice(
                app: app, deviceID: deviceID, userID: userID, pushToken: pushToken,
                registeredAt: registeredAt ?? context.now, in: &context)
        case .startActivity(let app, let activityID, let attributesType):
            let row = try activityRow(app: app, activityID: activityID, create: true, in: &context)!
            context.activityEnds[row] = .some(nil)
            try database.withStatement(
                """
                UPDATE activities SET state = 0, ended_at = NULL, dismissal_at = NULL,
                    attributes_type = coalesce(?2, attributes_type), updated_at = ?3 WHERE id = ?1
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(row, at: 1)
                try statement.bind(attributesType, at: 2)
                try statement.bind(context.now, at: 3)
                try statement.run()
            }
        case .endActivity(let app, let activityID, let dismissalDate):
            try endActivity(app: app, activityID: activityID, dismissalDate: dismissalDate, in: &context)
        case .contentSent(let app, let activityID, let timestamp):
            let row = try activityRow(app: app, activityID: activityID, create: true, in: &context)!
            try database.withStatement(
                """
                UPDATE activities SET last_content_timestamp = max(coalesce(last_content_timestamp, ?2), ?2),
                    updated_at = ?3 WHERE id = ?1
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(row, at: 1)
                try statement.bind(timestamp, at: 2)
                try statement.bind(context.now, at: 3)
                try statement.run()
            }
        case .channel(let app, let activityID, let channelID, let storagePolicy, let onlyIfUnbound, let environment):
            let row = try activityRow(app: app, activityID: activityID, create: true, in: &context)!
            // `?6` 1: bind only an activity that has no channel yet (the first binding wins).
            try database.withStatement(
                """
                UPDATE activities SET channel_id = ?2, channel_storage_policy = ?3, channel_environment = ?5,
                    updated_at = ?4
                WHERE id = ?1 AND (?6 = 0 OR channel_id IS NULL)
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(row, at: 1)
                try statement.bind(channelID, at: 2)
                try statement.bind(storagePolicy.map(Int64.init), at: 3)
                try statement.bind(context.now, at: 4)
                try statement.bind(environment, at: 5)
                try statement.bind(Int64(onlyIfUnbound ? 1 : 0), at: 6)
                try statement.run()
            }
        case .removeToken(let token, let before, let scope):
            try removeToken(token, registeredBefore: before ?? .max, scope: scope, in: &context)
        }
    }

    // MARK: Activities

    /// The row id of the activity, created (active) when `create` and missing; nil when missing and not `create`.
    func activityRow(app: AppRef, activityID: String, create: Bool, in context: inout WriteContext)
        throws(SQLiteError) -> Int64?
    {
        // Imports name one activity for many rows in a row: skip the hashing then.
        if let last = context.lastActivity, last.app == app.id, last.activityID == activityID { return last.row }
        let key = ActivityKey(app: app.id, activityID: activityID)
        if let row = context.activityRows[key] {
            context.lastActivity = (app.id, activityID, row)
            return row
        }
        var row = try database.withStatement(HotSQL.selectActivity) {
            statement throws(SQLiteError) -> Int64? in
            try statement.bind(app.id, at: 1)
            try statement.bind(activityID, at: 2)
            return try statement.step() ? statement.int64(at: 0) : nil
        }
        if row == nil, create {
            row = try database.withStatement(HotSQL.insertActivity) { statement throws(SQLiteError) in
                try statement.bind(app.id, at: 1)
                try statement.bind(activityID, at: 2)
                try statement.bind(context.now, at: 3)
                try statement.run()
                return database.lastInsertRowID
            }
        }
        if let row {
            context.activityRows[key] = row
            context.activityNames[row] = (app, activityID)
            context.lastActivity = (app.id, activityID, row)
        }
        return row
    }

    /// The app and activity id of an activity row (for tokens found by token alone).
    private func activityName(_ row: Int64, in context: inout WriteContext) throws(SQLiteError) -> (
        app: AppRef, activityID: String
    )? {
        if let name = context.activityNames[row] { return name }
        guard
            let (appID, activityID) = try database.withStatement(
                "SELECT app, activity_id FROM activities WHERE id = ?1",
                { statement throws(SQLiteError) -> (Int64, String)? in
                    try statement.bind(row, at: 1)
                    return try statement.step() ? (statement.int64(at: 0), statement.string(at: 1)) : nil
                })
        else { return nil }
        let name = (AppRef(id: appID, bundleID: try bundleID(appID)), activityID)
        context.activityNames[row] = name
        return name
    }

    private func endActivity(app: AppRef, activityID: String, dismissalDate: Int64?, in context: inout WriteContext)
        throws(SQLiteError)
    {
        guard let row = try activityRow(app: app, activityID: activityID, create: false, in: &context) else { return }
        context.activityEnds.removeValue(forKey: row)
        let dismissal = dismissalDate ?? context.now + configuration.defaultDismissalDelay
        try database.withStatement(
            """
            UPDATE activities SET state = 1, ended_at = coalesce(ended_at, ?2), dismissal_at = ?3, updated_at = ?2
            WHERE id = ?1
            """
        ) { statement throws(SQLiteError) in
            try statement.bind(row, at: 1)
            try statement.bind(context.now, at: 2)
            try statement.bind(dismissal, at: 3)
            try statement.run()
        }
        if dismissal <= context.now {
            // Dismissed already (Apple: a past or present dismissal date removes the activity at once).
            let removed = try deleteUpdateTokens(
                "DELETE FROM update_tokens WHERE activity = ?1 RETURNING device_id, token, expires_at", row: row)
            for (deviceID, token, _) in removed {
                try recordEvent(
                    app: app, activityID: activityID, deviceID: deviceID, token: token, kind: .update,
                    change: .removed, reason: .ended, in: &context)
            }
        }
    }

    // MARK: Update tokens

    private func registerUpdateToken(
        app: AppRef, activityID: String, deviceID: String?, userID: String?, token: String, registeredAt: Int64,
        in context: inout WriteContext
    ) throws(SQLiteError) {
        let expiresAt = registeredAt &+ configuration.updateTokenLifetime
        guard expiresAt > context.now else {
            context.result.alreadyExpired += 1
            return
        }
        if let deviceID { try recordDeviceUser(app: app, deviceID: deviceID, userID: userID, now: context.now) }
        let row = try activityRow(app: app, activityID: activityID, create: true, in: &context)!
        let key = RegistrySchema.tokenKey(token)
        // The registration slot: the device's, or, with no device, the token's own.
        let lookup = deviceID == nil ? HotSQL.selectTokenInActivity : HotSQL.selectDeviceSlot
        let existing = try database.withStatement(lookup) {
            statement throws(SQLiteError) -> (id: Int64, token: String, registeredAt: Int64, expiresAt: Int64)? in
            try statement.bind(row, at: 1)
            try statement.bind(deviceID ?? token, at: 2)
            if deviceID == nil { try statement.bind(key, at: 3) }
            guard try statement.step() else { return nil }
            return (statement.int64(at: 0), statement.string(at: 1), statement.int64(at: 2), statement.int64(at: 3))
        }
        let fresh = UpdateTokenRow(
            activity: row, deviceID: deviceID, token: token, key: key, registeredAt: registeredAt, expiresAt: expiresAt)
        guard var existing else {
            // A token the activity already held without a device: the device takes it over, with no event (it was
            // live all along).
            if deviceID != nil, let anonymous = try anonymousRegistration(of: fresh) {
                try takeOver(anonymous, by: fresh, in: &context)
                context.result.unchanged += 1
                return
            }
            try insertUpdateToken(fresh, in: &context)
            try reopenIfEnded(row, registeredAt: registeredAt, in: &context)
            try recordEvent(
                app: app, activityID: activityID, deviceID: deviceID, token: token, kind: .update, change: .added,
                reason: nil, in: &context)
            return
        }
        var change = RegistryEvent.Change.rotated
        let slotToken = existing.token
        if existing.expiresAt <= context.now {
            // Dead but not swept yet: report it expired, then the registration adds a token to an empty slot.
            try recordEvent(
                app: app, activityID: activityID, deviceID: deviceID, token: existing.token, kind: .update,
                change: .removed, reason: .expired, in: &context)
            context.expiredSwept += 1
            existing.registeredAt = .min
            existing.token = ""
            change = .added
        }
        // Latest registration wins: an older one (a re-import, a late retry) changes nothing. The same token again
        // moves its registration time forward only when strictly later, so importing a file twice writes nothing,
        // and the time held is always the latest registration's, which a 410's timestamp is compared with.
        let newer =
            token == existing.token
            ? registeredAt > existing.registeredAt
            : registeredAt >= existing.registeredAt
        guard newer else {
            context.result.unchanged += 1
            return
        }
        // Sends page an activity's tokens in row id order (see `liveUpdateTokens`). The same token registered again
        // keeps its row, so a send that read it does not read it again; a new token for the slot (a rotation, or a
        // dead slot filled) gets a new row id, the activity's last, so a send still paging reaches it.
        if token == existing.token {
            try rewriteUpdateToken(existing.id, at: existing.id, token: token, key: key, registeredAt, expiresAt)
        } else if deviceID != nil {
            // A rotation to a token the activity holds without a device takes that row over (its place too: a send
            // that read that token does not read it again).
            try deleteUpdateToken(existing.id)
            if let anonymous = try anonymousRegistration(of: fresh) {
                try takeOver(anonymous, by: fresh, in: &context)
            } else {
                try insertUpdateToken(fresh, in: &context)
            }
        } else {
            let moved = try nextUpdateTokenRow(in: &context)
            try rewriteUpdateToken(existing.id, at: moved, token: token, key: key, registeredAt, expiresAt)
        }
        if token != slotToken { try reopenIfEnded(row, registeredAt: registeredAt, in: &context) }
        if token == existing.token {
            // The device registered the same token again later: it lives longer, and a 410 older than this
            // registration no longer removes it. Not a token change, so no event.
            context.result.unchanged += 1
        } else {
            try recordEvent(
                app: app, activityID: activityID, deviceID: deviceID, token: token, kind: .update, change: change,
                reason: nil, in: &context)
        }
    }

    /// A new token for an activity that has ended, registered after the end, is a new session under the same id (an
    /// app that reuses `match-7` for the rematch): the activity is live again, as a `start` makes it. Otherwise the
    /// new session's tokens would sit in an ended activity, read as dismissed from its old dismissal date and then
    /// swept with reason `ended`, while updates to it reach no one. A token of the old session registered again
    /// (the same value) and a registration dated before the end change nothing.
    private func reopenIfEnded(_ row: Int64, registeredAt: Int64, in context: inout WriteContext) throws(SQLiteError) {
        let endedAt: Int64?
        if let known = context.activityEnds[row] {
            endedAt = known
        } else {
            endedAt = try database.withStatement("SELECT ended_at FROM activities WHERE id = ?1 AND state = 1") {
                statement throws(SQLiteError) -> Int64? in
                try statement.bind(row, at: 1)
                return try statement.step() ? statement.optionalInt64(at: 0) : nil
            }
            context.activityEnds[row] = .some(endedAt)
        }
        guard let endedAt, registeredAt > endedAt else { return }
        try database.withStatement(
            "UPDATE activities SET state = 0, ended_at = NULL, dismissal_at = NULL, updated_at = ?2 WHERE id = ?1"
        ) { statement throws(SQLiteError) in
            try statement.bind(row, at: 1)
            try statement.bind(context.now, at: 2)
            try statement.run()
        }
        context.activityEnds[row] = .some(nil)
    }

    /// The row of `registration`'s token in its activity without a device: its id and expiry.
    private func anonymousRegistration(of registration: UpdateTokenRow) throws(SQLiteError) -> (
        id: Int64, expiresAt: Int64
    )? {
        try database.withStatement(HotSQL.selectAnonymousToken) { statement throws(SQLiteError) in
            try statement.bind(registration.key, at: 1)
            try statement.bind(registration.token, at: 2)
            try statement.bind(registration.activity, at: 3)
            return try statement.step() ? (statement.int64(at: 0), statement.int64(at: 1)) : nil
        }
    }

    /// A device's registration takes over the same token registered without a device (an import without device ids,
    /// then the app's own registration): one token, one row, so a send reaches it once. A live row becomes the
    /// device's and keeps its id, so its place in a send's paging: a send that read it already does not read it
    /// again. An expired one goes, and the registration gets a new row (a send still paging reaches it).
    private func takeOver(
        _ anonymous: (id: Int64, expiresAt: Int64), by registration: UpdateTokenRow, in context: inout WriteContext
    ) throws(SQLiteError) {
        guard anonymous.expiresAt > context.now else {
            try deleteUpdateToken(anonymous.id)
            try insertUpdateToken(registration, in: &context)
            return
        }
        try database.withStatement(HotSQL.takeOverUpdateToken) { statement throws(SQLiteError) in
            try statement.bind(anonymous.id, at: 1)
            try statement.bind(registration.deviceID, at: 2)
            try statement.bind(registration.registeredAt, at: 3)
            try statement.bind(registration.expiresAt, at: 4)
            try statement.run()
        }
    }

    /// Writes a slot's token and times into row `id`, which becomes row `newID`: the same id keeps the row's place in
    /// the activity's paging order, a new one (the activity's last) moves it to the end.
    private func rewriteUpdateToken(
        _ id: Int64, at newID: Int64, token: String, key: Int64, _ registeredAt: Int64, _ expiresAt: Int64
    ) throws(SQLiteError) {
        try database.withStatement(HotSQL.rewriteUpdateToken) { statement throws(SQLiteError) in
            try statement.bind(id, at: 1)
            try statement.bind(token, at: 2)
            try statement.bind(key, at: 3)
            try statement.bind(registeredAt, at: 4)
            try statement.bind(expiresAt, at: 5)
            try statement.bind(newID, at: 6)
            try statement.run()
        }
    }

    private func deleteUpdateToken(_ id: Int64) throws(SQLiteError) {
        try database.withStatement(HotSQL.deleteUpdateToken) { statement throws(SQLiteError) in
            try statement.bind(id, at: 1)
            try statement.run()
        }
    }

    /// A new row for a token, with the next row id (`nextUpdateTokenRow`).
    private func insertUpdateToken(_ registration: UpdateTokenRow, in context: inout WriteContext) throws(SQLiteError) {
        let id = try nextUpdateTokenRow(in: &context)
        try database.withStatement(HotSQL.insertUpdateToken) { statement throws(SQLiteError) in
            try statement.bind(registration.activity, at: 1)
            try statement.bind(registration.deviceID, at: 2)
            try statement.bind(registration.token, at: 3)
            try statement.bind(registration.key, at: 4)
            try statement.bind(registration.registeredAt, at: 5)
            try statement.bind(registration.expiresAt, at: 6)
            try statement.bind(id, at: 7)
            try statement.run()
        }
    }

    /// The id of the next update token row: one more than any the table has held. SQLite alone would give a new row
    /// the largest id plus one, so a row inserted after the last one was deleted would get that one's id again, and
    /// a send whose cursor is that id would not read the new row. The highest id handed out is kept in `counters`
    /// (`update_token_rows`), read at the first new row of a transaction and written back at its end.
    func nextUpdateTokenRow(in context: inout WriteContext) throws(SQLiteError) -> Int64 {
        let last: Int64
        if let known = context.lastTokenRow {
            last = known
        } else {
            last = try database.withStatement(HotSQL.selectLastTokenRow) { statement throws(SQLiteError) in
                try statement.step() ? statement.int64(at: 0) : 0
            }
            context.storedLastTokenRow = last
        }
        context.lastTokenRow = last + 1
        return last + 1
    }

    /// Writes back the highest update token row id this transaction handed out.
    func storeLastTokenRow(_ context: WriteContext) throws(SQLiteError) {
        guard let last = context.lastTokenRow, last != context.storedLastTokenRow else { return }
        try database.withStatement(HotSQL.storeLastTokenRow) { statement throws(SQLiteError) in
            try statement.bind(last, at: 1)
            try statement.run()
        }
    }

    private func stopUpdateTokens(app: AppRef, activityID: String, deviceID: String?, in context: inout WriteContext)
        throws(SQLiteError)
    {
        guard let row = try activityRow(app: app, activityID: activityID, create: false, in: &context) else {
            context.result.unchanged += 1
            return
        }
        let removed =
            deviceID == nil
            ? try deleteUpdateTokens(
                "DELETE FROM update_tokens WHERE activity = ?1 RETURNING device_id, token, expires_at", row: row)
            : try deleteUpdateTokens(
                """
                DELETE FROM update_tokens WHERE activity = ?1 AND device_id = ?2
                RETURNING device_id, token, expires_at
                """, row: row, deviceID: deviceID)
        if removed.isEmpty { context.result.unchanged += 1 }
        for (deviceID, token, expiresAt) in removed {
            let expired = expiresAt <= context.now
            if expired { context.expiredSwept += 1 }
            try recordEvent(
                app: app, activityID: activityID, deviceID: deviceID, token: token, kind: .update, change: .removed,
                reason: expired ? .expired : .stopped, in: &context)
        }
    }

    /// Runs a DELETE … RETURNING device_id, token, expires_at and collects its rows (all of them are computed at the
    /// first step, so collecting first and writing events after is safe).
    private func deleteUpdateTokens(_ sql: String, row: Int64, deviceID: String? = nil) throws(SQLiteError)
        -> [(String?, String, Int64)]
    {
        try database.withStatement(sql) { statement throws(SQLiteError) in
            try statement.bind(row, at: 1)
            if let deviceID { try statement.bind(deviceID, at: 2) }
            var rows: [(String?, String, Int64)] = []
            while try statement.step() {
                rows.append((statement.optionalString(at: 0), statement.string(at: 1), statement.int64(at: 2)))
            }
            return rows
        }
    }

    // MARK: Push-to-start tokens and devices

    private func registerPushToStart(
        app: AppRef, deviceID: String, userID: String?, attributesType: String, token: String, updatedAt: Int64,
        in context: inout WriteContext
    ) throws(SQLiteError) {
        if token.isEmpty {
            let removed = try database.withStatement(
                """
                DELETE FROM push_to_start_tokens WHERE app = ?1 AND device_id = ?2 AND attributes_type = ?3
                RETURNING token
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(app.id, at: 1)
                try statement.bind(deviceID, at: 2)
                try statement.bind(attributesType, at: 3)
                return try statement.step() ? statement.string(at: 0) : nil
            }
            guard let removed else {
                context.result.unchanged += 1
                return
            }
            try recordEvent(
                app: app, activityID: nil, deviceID: deviceID, token: removed, kind: .pushToStart, change: .removed,
                reason: .stopped, in: &context)
            return
        }
        try recordDeviceUser(app: app, deviceID: deviceID, userID: userID, now: context.now)
        let existing = try database.withStatement(
            """
            SELECT id, token, updated_at, user_id FROM push_to_start_tokens
            WHERE app = ?1 AND device_id = ?2 AND attributes_type = ?3
            """
        ) { statement throws(SQLiteError) -> (id: Int64, token: String, updatedAt: Int64, userID: String?)? in
            try statement.bind(app.id, at: 1)
            try statement.bind(deviceID, at: 2)
            try statement.bind(attributesType, at: 3)
            guard try statement.step() else { return nil }
            return (
                statement.int64(at: 0), statement.string(at: 1), statement.int64(at: 2), statement.optionalString(at: 3)
            )
        }
        guard let existing else {
            try database.withStatement(
                """
                INSERT INTO push_to_start_tokens (app, device_id, user_id, attributes_type, token, token_key, updated_at)
                VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(app.id, at: 1)
                try statement.bind(deviceID, at: 2)
                try statement.bind(userID, at: 3)
                try statement.bind(attributesType, at: 4)
                try statement.bind(token, at: 5)
                try statement.bind(RegistrySchema.tokenKey(token), at: 6)
                try statement.bind(updatedAt, at: 7)
                try statement.run()
            }
            try recordEvent(
                app: app, activityID: nil, deviceID: deviceID, token: token, kind: .pushToStart, change: .added,
                reason: nil, in: &context)
            return
        }
        let newUser = userID ?? existing.userID
        let tokenChanges = token != existing.token && updatedAt >= existing.updatedAt
        let refreshed = updatedAt > existing.updatedAt
        guard tokenChanges || refreshed || newUser != existing.userID else {
            context.result.unchanged += 1
            return
        }
        try database.withStatement(
            "UPDATE push_to_start_tokens SET token = ?2, token_key = ?3, updated_at = ?4, user_id = ?5 WHERE id = ?1"
        ) { statement throws(SQLiteError) in
            let newToken = tokenChanges ? token : existing.token
            try statement.bind(existing.id, at: 1)
            try statement.bind(newToken, at: 2)
            try statement.bind(RegistrySchema.tokenKey(newToken), at: 3)
            try statement.bind(max(updatedAt, existing.updatedAt), at: 4)
            try statement.bind(newUser, at: 5)
            try statement.run()
        }
        if tokenChanges {
            try recordEvent(
                app: app, activityID: nil, deviceID: deviceID, token: token, kind: .pushToStart, change: .rotated,
                reason: nil, in: &context)
        } else {
            context.result.unchanged += 1
        }
    }

    /// Records that `deviceID` exists and (when given) belongs to `userID`; writes nothing when that is already so.
    private func recordDeviceUser(app: AppRef, deviceID: String, userID: String?, now: Int64) throws(SQLiteError) {
        try database.withStatement(HotSQL.upsertDeviceUser) { statement throws(SQLiteError) in
            try statement.bind(app.id, at: 1)
            try statement.bind(deviceID, at: 2)
            try statement.bind(userID, at: 3)
            try statement.bind(now, at: 4)
            try statement.run()
        }
    }

    private func registerDevice(
        app: AppRef, deviceID: String, userID: String?, pushToken: String?, registeredAt: Int64,
        in context: inout WriteContext
    ) throws(SQLiteError) {
        try recordDeviceUser(app: app, deviceID: deviceID, userID: userID, now: context.now)
        guard let pushToken else { return }
        let existing = try database.withStatement(
            "SELECT id, push_token, push_token_at FROM devices WHERE app = ?1 AND device_id = ?2"
        ) { statement throws(SQLiteError) -> (id: Int64, token: String?, at: Int64?) in
            try statement.bind(app.id, at: 1)
            try statement.bind(deviceID, at: 2)
            guard try statement.step() else { preconditionFailure("device row written above is missing") }
            return (statement.int64(at: 0), statement.optionalString(at: 1), statement.optionalInt64(at: 2))
        }
        let change: RegistryEvent.Change
        let reason: RegistryEvent.Reason?
        let eventToken: String
        switch (existing.token, pushToken.isEmpty) {
        case (nil, true):
            context.result.unchanged += 1
            return
        case (let old?, true):
            (change, reason, eventToken) = (.removed, .stopped, old)
        case (nil, false):
            (change, reason, eventToken) = (.added, nil, pushToken)
        case (let old?, false):
            let previous = existing.at ?? .min
            let newer =
                old == pushToken
                ? registeredAt > previous : registeredAt >= previous
            guard newer else {
                context.result.unchanged += 1
                return
            }
            if old == pushToken {
                try setDevicePushToken(row: existing.id, token: pushToken, at: registeredAt, now: context.now)
                context.result.unchanged += 1
                return
            }
            (change, reason, eventToken) = (.rotated, nil, pushToken)
        }
        try setDevicePushToken(
            row: existing.id, token: pushToken.isEmpty ? nil : pushToken, at: pushToken.isEmpty ? nil : registeredAt,
            now: context.now)
        try recordEvent(
            app: app, activityID: nil, deviceID: deviceID, token: eventToken, kind: .push, change: change,
            reason: reason, in: &context)
    }

    private func setDevicePushToken(row: Int64, token: String?, at: Int64?, now: Int64) throws(SQLiteError) {
        try database.withStatement(
            "UPDATE devices SET push_token = ?2, push_token_key = ?3, push_token_at = ?4, updated_at = ?5 WHERE id = ?1"
        ) { statement throws(SQLiteError) in
            try statement.bind(row, at: 1)
            try statement.bind(token, at: 2)
            try statement.bind(token.map(RegistrySchema.tokenKey), at: 3)
            try statement.bind(at, at: 4)
            try statement.bind(now, at: 5)
            try statement.run()
        }
    }

    // MARK: Tokens APNs refused

    /// Removes `token` from the tables `scope` reaches (nil: all), where its app registered it strictly before
    /// `before` (reason `unregistered`).
    private func removeToken(
        _ token: String, registeredBefore before: Int64, scope: RemovalScope?, in context: inout WriteContext
    ) throws(SQLiteError) {
        var removedAny = false
        let key = RegistrySchema.tokenKey(token)
        let app = scope?.app
        let liveActivity = scope.map { $0.kind == .liveActivity } ?? true
        let devicePush = scope.map { $0.kind == .devicePush } ?? true
        // ?5 is the app's bundle id, or NULL for every app; the token key's index finds the rows, the app is checked
        // on those few.
        let updateRows: [(Int64, String?)] =
            !liveActivity
            ? []
            : try database.withStatement(
                """
                DELETE FROM update_tokens WHERE token_key = ?3 AND token = ?1 AND registered_at < ?2
                  AND (?5 IS NULL OR activity IN
                    (SELECT activities.id FROM activities JOIN apps ON apps.id = activities.app WHERE apps.bundle_id = ?5))
                RETURNING activity, device_id
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(token, at: 1)
                try statement.bind(before, at: 2)
                try statement.bind(key, at: 3)
                try statement.bind(app, at: 5)
                var rows: [(Int64, String?)] = []
                while try statement.step() { rows.append((statement.int64(at: 0), statement.optionalString(at: 1))) }
                return rows
            }
        for (row, deviceID) in updateRows {
            guard let name = try activityName(row, in: &context) else { continue }
            removedAny = true
            try recordEvent(
                app: name.app, activityID: name.activityID, deviceID: deviceID, token: token, kind: .update,
                change: .removed, reason: .unregistered, in: &context)
        }
        for (sql, kind) in [
            (
                """
                DELETE FROM push_to_start_tokens WHERE token_key = ?3 AND token = ?1 AND updated_at < ?2
                  AND (?5 IS NULL OR app = (SELECT id FROM apps WHERE bundle_id = ?5))
                RETURNING app, device_id
                """,
                RegistryEvent.TokenKind.pushToStart
            ),
            (
                """
                UPDATE devices SET push_token = NULL, push_token_key = NULL, push_token_at = NULL, updated_at = ?4
                WHERE push_token_key = ?3 AND push_token = ?1 AND push_token_at < ?2
                  AND (?5 IS NULL OR app = (SELECT id FROM apps WHERE bundle_id = ?5))
                RETURNING app, device_id
                """, .push
            ),
        ] where kind == .push ? devicePush : liveActivity {
            let rows = try database.withStatement(sql) { statement throws(SQLiteError) in
                try statement.bind(token, at: 1)
                try statement.bind(before, at: 2)
                try statement.bind(key, at: 3)
                if kind == .push { try statement.bind(context.now, at: 4) }
                try statement.bind(app, at: 5)
                var rows: [(Int64, String)] = []
                while try statement.step() { rows.append((statement.int64(at: 0), statement.string(at: 1))) }
                return rows
            }
            for (appID, deviceID) in rows {
                removedAny = true
                try recordEvent(
                    app: AppRef(id: appID, bundleID: try bundleID(appID)), activityID: nil, deviceID: deviceID,
                    token: token, kind: kind, change: .removed, reason: .unregistered, in: &context)
            }
        }
        if !removedAny { context.result.unchanged += 1 }
    }

    // MARK: Events and counters

    /// Logs an event. Events are buffered and written `eventChunk` rows per INSERT (the statement overhead of a
    /// single-row INSERT per event would be a tenth of a bulk import's time); `flushEvents` writes the rest and gives
    /// them their sequence numbers before the transaction commits.
    func recordEvent(
        app: AppRef, activityID: String?, deviceID: String?, token: String, kind: RegistryEvent.TokenKind,
        change: RegistryEvent.Change, reason: RegistryEvent.Reason?, in context: inout WriteContext
    ) throws(SQLiteError) {
        context.pendingEvents.append(
            PendingEvent(
                appID: app.id,
                event: RegistryEvent(
                    sequence: 0, at: context.now, app: app.bundleID, activityID: activityID, deviceID: deviceID,
                    token: token, kind: kind, change: change, reason: reason)))
        if context.pendingEvents.count == RegistryConnection.eventChunk { try flushEvents(in: &context) }
    }

    static let eventChunk = 64

    /// Writes the buffered events: full chunks with one statement each, the rest one by one. SQLite gives the rows of
    /// an INSERT the rowids after the largest one, in order, so a chunk's sequence numbers end at the last rowid.
    func flushEvents(in context: inout WriteContext) throws(SQLiteError) {
        var start = 0
        let pending = context.pendingEvents
        while start < pending.count {
            let count = pending.count - start >= RegistryConnection.eventChunk ? RegistryConnection.eventChunk : 1
            let sql = count == 1 ? HotSQL.insertEvent : HotSQL.insertEventChunk
            let last = try database.withStatement(sql) {
                statement throws(SQLiteError) in
                for offset in 0..<count {
                    let pendingEvent = pending[start + offset]
                    let event = pendingEvent.event
                    let base = Int32(offset * 8)
                    try statement.bind(event.at, at: base + 1)
                    try statement.bind(pendingEvent.appID, at: base + 2)
                    try statement.bind(event.kind.code, at: base + 3)
                    try statement.bind(event.activityID, at: base + 4)
                    try statement.bind(event.deviceID, at: base + 5)
                    try statement.bind(event.token, at: base + 6)
                    try statement.bind(event.change.code, at: base + 7)
                    try statement.bind(event.reason?.code, at: base + 8)
                }
                try statement.run()
                return database.lastInsertRowID
            }
            for offset in 0..<count {
                var event = pending[start + offset].event
                event.sequence = last - Int64(count - 1 - offset)
                context.result.events.append(event)
            }
            start += count
        }
        context.pendingEvents.removeAll(keepingCapacity: true)
    }

    func addExpiredSwept(_ count: Int) throws(SQLiteError) {
        guard count > 0 else { return }
        try database.withStatement("UPDATE counters SET value = value + ?1 WHERE name = 'expired_swept'") {
            statement throws(SQLiteError) in
            try statement.bind(Int64(count), at: 1)
            try statement.run()
        }
    }
}

/// The statements a bulk import runs once per row (or per chunk of events), declared once so the statement cache finds
/// them by index.
enum HotSQL {
    static let selectActivity = SQLiteSQL("SELECT id FROM activities WHERE app = ?1 AND activity_id = ?2")
    static let insertActivity = SQLiteSQL(
        "INSERT INTO activities (app, activity_id, state, created_at, updated_at) VALUES (?1, ?2, 0, ?3, ?3)")
    /// The registration of a token in an activity, with or without a device: a registration without a device finds
    /// its slot (its own token) through the token index, and a token a device already holds is not registered twice.
    static let selectTokenInActivity = SQLiteSQL(
        """
        SELECT id, token, registered_at, expires_at FROM update_tokens INDEXED BY update_tokens_by_token
        WHERE token_key = ?3 AND token = ?2 AND activity = ?1 ORDER BY id LIMIT 1
        """)
    static let selectAnonymousToken = SQLiteSQL(
        """
        SELECT id, expires_at FROM update_tokens INDEXED BY update_tokens_by_token
        WHERE token_key = ?1 AND token = ?2 AND activity = ?3 AND device_id IS NULL
        """)
    static let selectDeviceSlot = SQLiteSQL(
        "SELECT id, token, registered_at, expires_at FROM update_tokens WHERE activity = ?1 AND device_id = ?2")
    static let insertUpdateToken = SQLiteSQL(
        """
        INSERT INTO update_tokens (id, activity, device_id, token, token_key, registered_at, expires_at)
        VALUES (?7, ?1, ?2, ?3, ?4, ?5, ?6)
        """)
    /// A slot's token and times, at row id `?6`: `?1` to keep its place in the activity's paging order, a new one
    /// for the end.
    static let rewriteUpdateToken = SQLiteSQL(
        """
        UPDATE update_tokens SET id = ?6, token = ?2, token_key = ?3, registered_at = ?4, expires_at = ?5
        WHERE id = ?1
        """)
    static let deleteUpdateToken = SQLiteSQL("DELETE FROM update_tokens WHERE id = ?1")
    static let takeOverUpdateToken = SQLiteSQL(
        "UPDATE update_tokens SET device_id = ?2, registered_at = ?3, expires_at = ?4 WHERE id = ?1")
    static let selectLastTokenRow = SQLiteSQL(
        """
        SELECT max(coalesce((SELECT value FROM counters WHERE name = 'update_token_rows'), 0),
                   coalesce((SELECT max(id) FROM update_tokens), 0))
        """)
    static let storeLastTokenRow = SQLiteSQL(
        """
        INSERT INTO counters (name, value) VALUES ('update_token_rows', ?1)
        ON CONFLICT (name) DO UPDATE SET value = excluded.value
        """)
    static let upsertDeviceUser = SQLiteSQL(
        """
        INSERT INTO devices (app, device_id, user_id, updated_at) VALUES (?1, ?2, ?3, ?4)
        ON CONFLICT (app, device_id) DO UPDATE SET user_id = excluded.user_id, updated_at = excluded.updated_at
        WHERE excluded.user_id IS NOT NULL AND user_id IS NOT excluded.user_id
        """)
    static let insertEvent = SQLiteSQL(insertEvents(1))
    static let insertEventChunk = SQLiteSQL(insertEvents(RegistryConnection.eventChunk))

    private static func insertEvents(_ count: Int) -> String {
        "INSERT INTO events (at, app, kind, activity_id, device_id, token, change, reason) VALUES "
            + (0..<count).map { row in
                "(" + (1...8).map { "?\(row * 8 + $0)" }.joined(separator: ", ") + ")"
            }.joined(separator: ", ")
    }
}
