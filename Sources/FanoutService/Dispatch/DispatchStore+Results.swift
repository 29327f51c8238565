package import Fanout
import FanoutJobLines
import FanoutSQLite

extension DispatchStore {
    /// Inserts each result under (dispatch, position) — a position already recorded is ignored, so a notification
    /// resent after a crash never gets a second result — and adds the inserted ones to the dispatch's counts (outcome
    /// and retries) in the same transaction. Results with position < 0 (a job-level `invalid`) are keyed by a negative
    /// sequence (`DispatchSchema.jobLevelKeyBase` up), so each is stored once.
    ///
    /// One transaction, unless an accept waits for the writer: then the rows so far are committed with their counts
    /// (after at least `rowsBeforeGivingWay`), the accept goes first, and the rest follow in another transaction.
    package func appendResults(_ results: [NotificationResult], dispatch id: String) throws(DispatchStoreError) {
        var start = results.startIndex
        while start < results.endIndex {
            guard let next = try appendResults(results, from: start, dispatch: id) else { throw Self.notFound(id) }
            start = next
        }
    }

    /// Rows an interrupted results transaction commits at least, so that a stream of accepts cannot cut it to nothing.
    static let rowsBeforeGivingWay = 32
    /// Rows an interrupted walk of the done prefix moves it at least (a walk is one index step per row).
    static let prefixRowsBeforeGivingWay: Int64 = 256

    /// One transaction of `appendResults`, from `start`: where the next one starts (the end when all are in), or nil
    /// when the dispatch is gone.
    private func appendResults(_ results: [NotificationResult], from start: Int, dispatch id: String)
        throws(DispatchStoreError) -> Int?
    {
        try write { connection throws(SQLiteError) -> Int? in
            let database = connection.database
            guard let row = try Self.dispatchRow(id: id, in: database) else { return nil }
            var added = OutcomeCounts()
            var broadcasts = 0
            var jobID = row.jobID
            var prefix = row.donePrefix
            var nextJobLevelKey: Int64?
            var index = start
            while index < results.endIndex {
                if index - start >= Self.rowsBeforeGivingWay && acceptWaiting { break }
                let result = results[index]
                index += 1
                let key: Int64
                if result.position >= 0 {
                    key = Int64(result.position)
                } else {
                    if nextJobLevelKey == nil { nextJobLevelKey = try Self.nextJobLevelKey(row.seq, in: database) }
                    key = nextJobLevelKey!
                    nextJobLevelKey! += 1
                }
                if jobID == nil { jobID = result.jobID }
                let inserted = try database.withStatement(DispatchSchema.insertResult) {
                    statement throws(SQLiteError) in
                    try statement.bind(row.seq, at: 1)
                    try statement.bind(key, at: 2)
                    try statement.bind(result.tokenValue, at: 3)
                    try statement.bind(result.outcome.code, at: 4)
                    try statement.bind(result.status.map(Int64.init), at: 5)
                    try statement.bind(result.reason, at: 6)
                    try statement.bind(result.apnsIDValue, at: 7)
                    try statement.bind(result.apnsUniqueIDValue, at: 8)
                    try statement.bind(Int64(result.attempts), at: 9)
                    try statement.bind(result.latencyMilliseconds, at: 10)
                    try statement.bind(result.timestamp, at: 11)
                    try statement.bind(result.retryAfterSeconds, at: 12)
                    try statement.bind(result.jobID == jobID ? nil : result.jobID, at: 13)
                    try statement.bind(result.channel, at: 14)
                    try statement.run()
                    return database.changes == 1
                }
                guard inserted else { continue }
                added.add(result)
                if result.channel != nil { broadcasts += 1 }
            }
            // The prefix walks the rows that follow it once its first missing position arrived (each row joins it and
            // is never walked again), and goes on with a walk that gave way to an accept (its position has a row).
            prefix = try Self.extendPrefix(row.seq, from: prefix, in: database) { acceptWaiting }
            try database.withStatement(
                """
                UPDATE dispatches SET delivered = delivered + ?2, rejected = rejected + ?3,
                    unregistered = unregistered + ?4, failed = failed + ?5, expired = expired + ?6,
                    rate_limited = rate_limited + ?7, invalid = invalid + ?8, cancelled = cancelled + ?9,
                    superseded = superseded + ?10, retries = retries + ?11, done_prefix = ?12,
                    job_id = coalesce(job_id, ?13), broadcasts = broadcasts + ?14
                WHERE seq = ?1
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(row.seq, at: 1)
                let values = [
                    added.delivered, added.rejected, added.unregistered, added.failed, added.expired,
                    added.rateLimited, added.invalid, added.cancelled, added.superseded, added.retries,
                ]
                for (offset, value) in values.enumerated() { try statement.bind(Int64(value), at: Int32(offset + 2)) }
                try statement.bind(prefix, at: 12)
                try statement.bind(jobID, at: 13)
                try statement.bind(Int64(broadcasts), at: 14)
                try statement.run()
            }
            return index
        }
    }

    /// What an interrupted dispatch already finished, as the engine's `ResumePoint`: `prefix` is the first position
    /// without a result (kept up to date by `appendResults`), `beyondPrefix` the positions past it that have one (a
    /// scan of the rows past the prefix only, however long the prefix is).
    package func resumePoint(id: String) throws(DispatchStoreError) -> ResumePoint {
        let point = try read { connection throws(SQLiteError) -> ResumePoint? in
            let database = connection.database
            guard let row = try Self.dispatchRow(id: id, in: database) else { return nil }
            var beyond = Set<Int>()
            try database.withStatement(
                "SELECT position FROM dispatch_results WHERE dispatch = ?1 AND position > ?2"
            ) { statement throws(SQLiteError) in
                try statement.bind(row.seq, at: 1)
                try statement.bind(row.donePrefix, at: 2)
                while try statement.step() { beyond.insert(Int(statement.int64(at: 0))) }
            }
            return ResumePoint(prefix: Int(row.donePrefix), beyondPrefix: beyond)
        }
        guard let point else { throw Self.notFound(id) }
        return point
    }

    /// The recipients an interrupted dispatch already has a result for, by token (a broadcast's by its channel), and
    /// whether its activity broadcast has one: what a resumed run skips. By token, not by position, because the
    /// audience is read again from the registry, where tokens may have come and gone since the first run. Reads every
    /// recorded row (only when a dispatch is resumed after a crash or a stop).
    package func recordedRecipients(id: String) throws(DispatchStoreError) -> (tokens: [String: Int], broadcast: Bool) {
        let recorded = try read { connection throws(SQLiteError) -> (tokens: [String: Int], broadcast: Bool)? in
            let database = connection.database
            guard let row = try Self.dispatchRow(id: id, in: database) else { return nil }
            var tokens: [String: Int] = [:]
            var broadcast = false
            try database.withStatement(
                """
                SELECT token, channel FROM dispatch_results
                WHERE dispatch = ?1 AND position > \(DispatchSchema.jobLevelKeyLimit)
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(row.seq, at: 1)
                while try statement.step() {
                    if let token = statement.optionalString(at: 0) {
                        tokens[token, default: 0] += 1
                    } else if let channel = statement.optionalString(at: 1) {
                        tokens[channel, default: 0] += 1
                        broadcast = true
                    }
                }
            }
            return (tokens, broadcast)
        }
        guard let recorded else { throw Self.notFound(id) }
        return recorded
    }

    /// Results as JSON lines in the results-file format (`ResultLine`), in position order, at most `limit`, plus the
    /// last position returned (pass it as `after` for the next page; `after` itself when the page is empty).
    ///
    /// Start with `after: -1`: any `after` from -1 down to `DispatchSchema.jobLevelKeyLimit` starts at the
    /// beginning, where the job-level results (stored under keys far below every position) come first. Nil when
    /// there is no such dispatch or it belongs to another workspace.
    package func results(id: String, workspace: String, after: Int, limit: Int) throws(DispatchStoreError)
        -> (lines: [UInt8], last: Int)?
    {
        var lines: [UInt8] = []
        guard
            let last = try results(
                id: id, workspace: workspace, after: after, limit: limit,
                each: { _, result in
                    ResultLine.append(result, to: &lines)
                })
        else { return nil }
        return (lines, last)
    }

    /// `results`, one result at a time with its stored position (for publishing them to the other instances on
    /// Redis): calls `each` in position order for positions below `before` and returns the last position (`after` when
    /// there was none), or nil when there is no such dispatch in `workspace`.
    func results(
        id: String, workspace: String, after: Int, before: Int = .max, limit: Int,
        each: (Int, NotificationResult) -> Void
    ) throws(DispatchStoreError) -> Int? {
        let lower = after < 0 && Int64(after) > DispatchSchema.jobLevelKeyLimit ? Int64.min : Int64(after)
        return try read { connection throws(SQLiteError) -> Int? in
            let database = connection.database
            let dispatch = try database.withStatement(
                "SELECT seq, job_id FROM dispatches WHERE id = ?1 AND workspace = ?2"
            ) { statement throws(SQLiteError) -> (seq: Int64, jobID: String)? in
                try statement.bind(id, at: 1)
                try statement.bind(workspace, at: 2)
                return try statement.step() ? (statement.int64(at: 0), statement.optionalString(at: 1) ?? "") : nil
            }
            guard let dispatch else { return nil }
            var last = after
            try database.withStatement(
                """
                SELECT position, token, outcome, status, reason, apns_id, apns_unique_id, attempts, latency_ms,
                    timestamp, retry_after_s, job, channel
                FROM dispatch_results WHERE dispatch = ?1 AND position > ?2 AND position < ?4 ORDER BY position
                LIMIT ?3
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(dispatch.seq, at: 1)
                try statement.bind(lower, at: 2)
                try statement.bind(Int64(max(0, limit)), at: 3)
                try statement.bind(Int64(before), at: 4)
                while try statement.step() {
                    let position = statement.int64(at: 0)
                    var result = NotificationResult(
                        jobID: statement.optionalString(at: 11) ?? dispatch.jobID,
                        token: statement.optionalString(at: 1),
                        outcome: NotificationOutcome(code: statement.int64(at: 2)),
                        status: statement.optionalInt64(at: 3).map { Int($0) }, reason: statement.optionalString(at: 4),
                        apnsID: statement.optionalString(at: 5), apnsUniqueID: statement.optionalString(at: 6),
                        attempts: Int(statement.int64(at: 7)),
                        latency: .microseconds(Int64(statement.double(at: 8) * 1000)),
                        timestamp: statement.optionalInt64(at: 9), retryAfterSeconds: statement.optionalDouble(at: 10))
                    result.position = position >= 0 ? Int(position) : -1
                    result.channel = statement.optionalString(at: 12)
                    each(Int(position), result)
                    last = Int(position)
                }
            }
            return last
        }
    }

    /// Every position below this has its result, and results arrive in any order above it: the bound below which a
    /// running dispatch's results are final. Nil when there is no such dispatch.
    func donePrefix(id: String) throws(DispatchStoreError) -> Int? {
        try read { connection throws(SQLiteError) in
            try Self.dispatchRow(id: id, in: connection.database).map { Int($0.donePrefix) }
        }
    }

    /// How many results the dispatch has at positions up to `upTo` (job-level ones, stored far below every
    /// position, included): what its results set on Redis holds once they are published. 0 when there is no such
    /// dispatch.
    func resultCount(id: String, upTo: Int) throws(DispatchStoreError) -> Int {
        try read { connection throws(SQLiteError) -> Int in
            try connection.database.withStatement(
                """
                SELECT count(*) FROM dispatch_results
                WHERE dispatch = (SELECT seq FROM dispatches WHERE id = ?1) AND position <= ?2
                """
            ) { statement throws(SQLiteError) -> Int in
                try statement.bind(id, at: 1)
                try statement.bind(Int64(upTo), at: 2)
                return try statement.step() ? Int(statement.int64(at: 0)) : 0
            }
        }
    }

    // MARK: Helpers (inside a transaction)

    struct DispatchRow {
        var seq: Int64
        var jobID: String?
        var donePrefix: Int64
    }

    static func dispatchRow(id: String, in database: SQLiteDatabase) throws(SQLiteError) -> DispatchRow? {
        try database.withStatement("SELECT seq, job_id, done_prefix FROM dispatches WHERE id = ?1") {
            statement throws(SQLiteError) in
            try statement.bind(id, at: 1)
            guard try statement.step() else { return nil }
            return DispatchRow(
                seq: statement.int64(at: 0), jobID: statement.optionalString(at: 1), donePrefix: statement.int64(at: 2))
        }
    }

    /// The key for the dispatch's next job-level result: one past its last, or the base.
    private static func nextJobLevelKey(_ seq: Int64, in database: SQLiteDatabase) throws(SQLiteError) -> Int64 {
        try database.withStatement(
            "SELECT max(position) FROM dispatch_results WHERE dispatch = ?1 AND position <= ?2"
        ) { statement throws(SQLiteError) in
            try statement.bind(seq, at: 1)
            try statement.bind(DispatchSchema.jobLevelKeyLimit, at: 2)
            guard try statement.step(), let last = statement.optionalInt64(at: 0) else {
                return DispatchSchema.jobLevelKeyBase
            }
            return last + 1
        }
    }

    /// The first position at or after `prefix` without a row; or, when `givingWay` says an accept waits, a position
    /// at least `prefixRowsBeforeGivingWay` past `prefix` that every position below has a row for (still a done
    /// prefix: the next transaction walks on from it).
    private static func extendPrefix(
        _ seq: Int64, from prefix: Int64, in database: SQLiteDatabase, givingWay: () -> Bool
    ) throws(SQLiteError) -> Int64 {
        try database.withStatement(
            "SELECT position FROM dispatch_results WHERE dispatch = ?1 AND position >= ?2 ORDER BY position"
        ) { statement throws(SQLiteError) in
            try statement.bind(seq, at: 1)
            try statement.bind(prefix, at: 2)
            var next = prefix
            while try statement.step(), statement.int64(at: 0) == next {
                next += 1
                if next - prefix >= Self.prefixRowsBeforeGivingWay && givingWay() { break }
            }
            return next
        }
    }
}

extension SQLiteStatement {
    /// Binds a result's id as text from its bytes (the canonical form spelled on the stack), or NULL for nil: no
    /// String per result.
    fileprivate func bind(_ value: APNsIdentifier?, at index: Int32) throws(SQLiteError) {
        guard let value else { return try bindNull(at: index) }
        var bound: Result<Void, SQLiteError> = .success(())
        value.withUTF8 { bytes in bound = Result { () throws(SQLiteError) in try bind(utf8: bytes, at: index) } }
        try bound.get()
    }

    /// Binds a result's recipient token, as the id above.
    fileprivate func bind(_ value: RecipientToken?, at index: Int32) throws(SQLiteError) {
        guard let value else { return try bindNull(at: index) }
        var bound: Result<Void, SQLiteError> = .success(())
        value.withUTF8 { bytes in bound = Result { () throws(SQLiteError) in try bind(utf8: bytes, at: index) } }
        try bound.get()
    }
}
