import FanoutSQLite

/// Sweeping, one batch per transaction so that registrations and sends interleave with a long sweep.
extension RegistryConnection {
    /// Does one batch of the first kind of sweeping that has work, in this order: tokens of dismissed activities,
    /// expired tokens, idle activities, old events. `more` is false once nothing was left to do.
    func sweepBatch(now: Int64, batchSize: Int) throws(SQLiteError) -> (
        result: RegistrySweepResult, events: [RegistryEvent], more: Bool
    ) {
        try database.transaction { () throws(SQLiteError) in
            var context = WriteContext(now: now)
            var result = RegistrySweepResult()
            var worked = try sweepDismissed(batchSize: batchSize, result: &result, in: &context)
            if !worked { worked = try sweepExpired(batchSize: batchSize, result: &result, in: &context) }
            if !worked { worked = try sweepIdleActivities(batchSize: batchSize, result: &result, now: now) }
            if !worked { worked = try pruneEvents(batchSize: batchSize, result: &result, now: now) }
            try flushEvents(in: &context)
            try addExpiredSwept(context.expiredSwept)
            return (result, context.result.events, worked)
        }
    }

    /// Removes up to a batch of tokens of one activity whose dismissal date has passed (reason `ended`, or `expired`
    /// for a token whose lifetime ended first), and the activity once it has none left.
    private func sweepDismissed(batchSize: Int, result: inout RegistrySweepResult, in context: inout WriteContext)
        throws(SQLiteError) -> Bool
    {
        let dismissed = try database.withStatement(
            """
            SELECT a.id, a.app, a.activity_id, a.dismissal_at FROM activities a INDEXED BY activities_by_dismissal
            WHERE a.state = 1 AND a.dismissal_at <= ?1
                AND (a.channel_id IS NULL OR EXISTS (
                    SELECT 1 FROM update_tokens t INDEXED BY update_tokens_by_activity WHERE t.activity = a.id))
            LIMIT 1
            """
        ) { statement throws(SQLiteError) -> (row: Int64, app: Int64, activityID: String, dismissal: Int64)? in
            try statement.bind(context.now, at: 1)
            guard try statement.step() else { return nil }
            return (statement.int64(at: 0), statement.int64(at: 1), statement.string(at: 2), statement.int64(at: 3))
        }
        guard let dismissed else { return false }
        let app = AppRef(id: dismissed.app, bundleID: try bundleID(dismissed.app))
        let removed = try database.withStatement(
            """
            DELETE FROM update_tokens WHERE id IN (
                SELECT id FROM update_tokens INDEXED BY update_tokens_by_activity WHERE activity = ?1 LIMIT ?2)
            RETURNING device_id, token, expires_at
            """
        ) { statement throws(SQLiteError) in
            try statement.bind(dismissed.row, at: 1)
            try statement.bind(Int64(batchSize), at: 2)
            var rows: [(String?, String, Int64)] = []
            while try statement.step() {
                rows.append((statement.optionalString(at: 0), statement.string(at: 1), statement.int64(at: 2)))
            }
            return rows
        }
        for (deviceID, token, expiresAt) in removed {
            let expiredFirst = expiresAt <= dismissed.dismissal
            if expiredFirst {
                result.expired += 1
                context.expiredSwept += 1
            } else {
                result.ended += 1
            }
            try recordEvent(
                app: app, activityID: dismissed.activityID, deviceID: deviceID, token: token, kind: .update,
                change: .removed, reason: expiredFirst ? .expired : .ended, in: &context)
        }
        // An activity bound to a broadcast channel stays (without tokens) until the channel is deleted at APNs and
        // unbound (`endedChannels`), so the channel's id is never lost while the channel still counts against the
        // app's 10,000.
        if removed.count < batchSize {
            try database.withStatement("DELETE FROM activities WHERE id = ?1 AND channel_id IS NULL") {
                statement throws(SQLiteError) in
                try statement.bind(dismissed.row, at: 1)
                try statement.run()
            }
            result.activitiesRemoved += 1
        }
        return true
    }

    /// Removes up to a batch of update tokens whose lifetime has ended (reason `expired`).
    private func sweepExpired(batchSize: Int, result: inout RegistrySweepResult, in context: inout WriteContext)
        throws(SQLiteError) -> Bool
    {
        let removed = try database.withStatement(
            """
            DELETE FROM update_tokens WHERE id IN (
                SELECT t.id FROM activities a CROSS JOIN
                update_tokens t INDEXED BY update_tokens_by_activity ON t.activity = a.id AND t.expires_at <= ?1
                LIMIT ?2)
            RETURNING activity, device_id, token
            """
        ) { statement throws(SQLiteError) in
            try statement.bind(context.now, at: 1)
            try statement.bind(Int64(batchSize), at: 2)
            var rows: [(Int64, String?, String)] = []
            while try statement.step() {
                rows.append((statement.int64(at: 0), statement.optionalString(at: 1), statement.string(at: 2)))
            }
            return rows
        }
        guard !removed.isEmpty else { return false }
        var names: [Int64: (app: AppRef, activityID: String)] = [:]
        for (row, deviceID, token) in removed {
            if names[row] == nil {
                names[row] = try database.withStatement("SELECT app, activity_id FROM activities WHERE id = ?1") {
                    statement throws(SQLiteError) -> (app: AppRef, activityID: String)? in
                    try statement.bind(row, at: 1)
                    guard try statement.step() else { return nil }
                    let appID = statement.int64(at: 0)
                    let activityID = statement.string(at: 1)
                    return (AppRef(id: appID, bundleID: try bundleID(appID)), activityID)
                }
            }
            guard let name = names[row] else { continue }
            try recordEvent(
                app: name.app, activityID: name.activityID, deviceID: deviceID, token: token, kind: .update,
                change: .removed, reason: .expired, in: &context)
        }
        result.expired += removed.count
        context.expiredSwept += removed.count
        return true
    }

    /// Removes activities that are not ended, have no tokens and no channel, and have not changed for a token
    /// lifetime: every token they could have had has expired.
    private func sweepIdleActivities(batchSize: Int, result: inout RegistrySweepResult, now: Int64)
        throws(SQLiteError) -> Bool
    {
        let removed = try database.withStatement(
            """
            DELETE FROM activities WHERE id IN (
                SELECT a.id FROM activities a WHERE a.state = 0 AND a.channel_id IS NULL AND a.updated_at <= ?1
                    AND NOT EXISTS (
                        SELECT 1 FROM update_tokens t INDEXED BY update_tokens_by_activity WHERE t.activity = a.id)
                LIMIT ?2)
            """
        ) { statement throws(SQLiteError) in
            try statement.bind(now - configuration.updateTokenLifetime, at: 1)
            try statement.bind(Int64(batchSize), at: 2)
            try statement.run()
            return database.changes
        }
        result.activitiesRemoved += removed
        return removed > 0
    }

    /// Drops up to a batch of the oldest events, those older than the retention. The log is in `seq` order and
    /// times only grow (give or take clock steps), so it walks from the head and stops at the first young event.
    /// The newest event always stays: SQLite gives a new row the largest rowid plus one, so keeping it keeps `seq`
    /// increasing forever (AUTOINCREMENT would too, at the cost of a write to sqlite_sequence per event).
    private func pruneEvents(batchSize: Int, result: inout RegistrySweepResult, now: Int64) throws(SQLiteError)
        -> Bool
    {
        let cutoff = now - configuration.eventRetention
        let last = try database.withStatement(
            "SELECT seq, at FROM events WHERE seq < (SELECT max(seq) FROM events) ORDER BY seq LIMIT ?1"
        ) { statement throws(SQLiteError) -> Int64? in
            try statement.bind(Int64(batchSize), at: 1)
            var last: Int64?
            while try statement.step() {
                guard statement.int64(at: 1) <= cutoff else { break }
                last = statement.int64(at: 0)
            }
            return last
        }
        guard let last else { return false }
        let removed = try database.withStatement("DELETE FROM events WHERE seq <= ?1") {
            statement throws(SQLiteError) in
            try statement.bind(last, at: 1)
            try statement.run()
            return database.changes
        }
        result.eventsPruned += removed
        return removed > 0
    }
}
