package import Fanout
import FanoutCore
import FanoutRegistry
import FanoutSQLite
import Foundation
import Synchronization

/// Where a dispatch is in its life: accepted, being sent, finished.
package enum DispatchState: String, Sendable {
    case queued, running, done
}

/// One accepted API call: the job to run and what has come of it so far.
package struct DispatchRecord: Sendable, Equatable {
    /// Random and unguessable: `d_` and 20 base32 characters (100 bits) from the system's CSPRNG.
    package var id: String
    package var workspace: String
    package var app: String
    /// What the API call was: `start`, `update`, `end` or `push`.
    package var kind: String
    /// The canonical job line to run; opaque to the store.
    package var jobLine: [UInt8]
    package var state: DispatchState
    /// Of the results recorded so far.
    package var counts: OutcomeCounts
    package var payloadEncodings: Int
    package var demoted: Int
    /// Unix milliseconds.
    package var createdAt: Int64
    package var startedAt: Int64?
    package var finishedAt: Int64?
    package var idempotencyKey: String?
    /// Broadcast requests among the results (their results carry `channel`).
    package var broadcasts = 0
    package var notifications: Int { counts.total }
}

/// The durable dispatch queue of `fanout serve`, in the registry's SQLite file (`--db`), in tables of its own
/// (`dispatch_*`, see `DispatchSchema`).
///
/// A dispatch is committed before `accept` returns, so the `202` that follows survives kill -9: WAL with
/// `synchronous=NORMAL` has the commit in the WAL file (the OS's page cache) when `COMMIT` returns, which a process
/// kill cannot lose (a power loss can lose the last commits, never tear one). Results are recorded under
/// (dispatch, position), once each, with the dispatch's counts in the same transaction, so after a restart
/// `resumePoint` says exactly which recipients are done and the counts equal the rows.
///
/// Two connections of its own, as the registry has: a writer (`BEGIN IMMEDIATE` transactions, waiting up to
/// `busyTimeoutMilliseconds` for the registry's writer or another process) and a reader that never waits for a
/// writer. Each is behind its own mutex; calls block their thread for one transaction or one page.
package final class DispatchStore: Sendable {
    package let path: String
    private let writer: FanoutMutex<DispatchConnection>
    private let reader: FanoutMutex<DispatchConnection>
    /// Only for `checkpointIfDue`.
    private let checkpointer: FanoutMutex<DispatchConnection>
    private let lastCheckpoint = Atomic<UInt64>(0)
    /// Accepts waiting for the writer: a results transaction in progress commits the rows it has and lets them in
    /// (`appendResults`), so that a `202` waits for a few rows, not for a batch of a thousand.
    private let acceptsWaiting = Atomic<Int>(0)

    /// How long a write waits for another connection's lock (the registry's import commits 50,000 rows at a time).
    package static let busyTimeoutMilliseconds: Int32 = 5_000

    /// Opens the dispatch tables in the registry file at `path`, creating them (and the registry, when the file is
    /// missing or empty) as needed. The registry's own open decides whether the file is acceptable (`notARegistry`,
    /// `corrupt`, `unsupportedVersion`, `busy`), so a file that is not a registry is never written to; dispatch
    /// tables from a newer Fanout are `unsupportedVersion`.
    package init(path: String) throws(DispatchStoreError) {
        self.path = path
        do {
            // The registry creates the file (page size, WAL, its schema) or checks it is one; then it is closed.
            let registry = try SQLiteRegistryStore(path: path)
            registry.close()
        } catch {
            throw DispatchStoreError.map(error)
        }
        do {
            let writerDatabase = try SQLiteDatabase(
                path: path, mode: .readWrite, busyTimeoutMilliseconds: Self.busyTimeoutMilliseconds)
            try writerDatabase.useWriteAheadLog()
            // No checkpoint inside a commit: with results arriving at tens of thousands a second the WAL passes
            // SQLite's 1,000-page mark several times a second, and the commit that crosses it copies the WAL into the
            // database (tens of milliseconds), which could be an API request's accept. `checkpoint()` does it instead,
            // from the result writers' threads, on a connection of its own.
            try writerDatabase.execute("PRAGMA temp_store = MEMORY; PRAGMA wal_autocheckpoint = 0")
            try Self.prepareSchema(writerDatabase, path: path)
            let readerDatabase = try SQLiteDatabase(
                path: path, mode: .readWrite, busyTimeoutMilliseconds: Self.busyTimeoutMilliseconds)
            // The reader never writes (query_only makes SQLite refuse it if a bug tried) and maps nothing, as the
            // registry's reader: paging a million results should not grow the service's resident memory.
            try readerDatabase.execute("PRAGMA cache_size = -8192; PRAGMA mmap_size = 0; PRAGMA query_only = 1")
            let checkpointDatabase = try SQLiteDatabase(
                path: path, mode: .readWrite, busyTimeoutMilliseconds: Self.busyTimeoutMilliseconds)
            writer = FanoutMutex(DispatchConnection(database: writerDatabase))
            reader = FanoutMutex(DispatchConnection(database: readerDatabase))
            checkpointer = FanoutMutex(DispatchConnection(database: checkpointDatabase))
        } catch let error as DispatchStoreError {
            throw error
        } catch let error as SQLiteError {
            throw DispatchStoreError.map(error, path: path)
        } catch {
            throw DispatchStoreError(.storage, "\(path): \(error)")
        }
    }

    /// Creates the tables when they are missing (checked again under the write lock, in case another process created
    /// them meanwhile) and refuses a newer version.
    private static func prepareSchema(_ database: SQLiteDatabase, path: String) throws {
        let exists = "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'dispatch_meta'"
        if try database.scalarInt64(exists) == 0 {
            try database.transaction { () throws(SQLiteError) in
                guard try database.scalarInt64(exists) == 0 else { return }
                try database.execute(DispatchSchema.create)
            }
        }
        let versionQuery = "SELECT value FROM dispatch_meta WHERE name = 'version'"
        if try database.scalarInt64(versionQuery) == 1 {
            try database.transaction { () throws(SQLiteError) in
                guard try database.scalarInt64(versionQuery) == 1 else { return }
                try database.execute(DispatchSchema.upgradeFrom1)
            }
        }
        let version = try database.scalarInt64(versionQuery) ?? 0
        guard version <= DispatchSchema.version else {
            throw DispatchStoreError(
                .unsupportedVersion,
                "\(path) has dispatch tables of version \(version); this Fanout reads version \(DispatchSchema.version)"
            )
        }
    }

    /// Closes the connections (idempotent). Calls after it fail `unavailable`.
    package func close() {
        writer.withLock { $0.database.close() }
        reader.withLock { $0.database.close() }
        checkpointer.withLock { $0.database.close() }
    }

    /// Copies the WAL into the database (a passive checkpoint: it takes no write lock, so commits go on meanwhile),
    /// at most every 200 ms however many result writers call it. The writer connection never checkpoints itself.
    package func checkpointIfDue() {
        let now = DispatchTime.now().uptimeNanoseconds
        let last = lastCheckpoint.load(ordering: .relaxed)
        guard now &- last >= 200_000_000,
            lastCheckpoint.compareExchange(expected: last, desired: now, ordering: .relaxed).exchanged
        else { return }
        checkpointer.withLock { connection in
            guard connection.database.isOpen else { return }
            try? connection.database.execute("PRAGMA wal_checkpoint(PASSIVE)")
        }
    }

    deinit {
        close()
    }

    // MARK: Running on a connection

    /// Runs `body` in one `BEGIN IMMEDIATE` transaction on the writer. An `accept` says so (`forAccept`): the results
    /// writer gives way to it between rows.
    func write<R: Sendable>(
        forAccept: Bool = false, _ body: (DispatchConnection) throws(SQLiteError) -> R
    ) throws(DispatchStoreError) -> R {
        if forAccept { acceptsWaiting.add(1, ordering: .relaxed) }
        return try writer.withLock { connection throws(DispatchStoreError) -> R in
            if forAccept { acceptsWaiting.subtract(1, ordering: .relaxed) }
            guard connection.database.isOpen else { throw DispatchStoreError(.unavailable, "\(path) is closed") }
            return try Self.transaction(.immediate, on: connection, path: path, body)
        }
    }

    /// Whether an accept waits for the writer (`write(forAccept:)`).
    var acceptWaiting: Bool { acceptsWaiting.load(ordering: .relaxed) > 0 }

    /// Reads in one deferred transaction on the reader, so every statement of `body` sees the same commit.
    func read<R: Sendable>(_ body: (DispatchConnection) throws(SQLiteError) -> R) throws(DispatchStoreError) -> R {
        try reader.withLock { connection throws(DispatchStoreError) -> R in
            guard connection.database.isOpen else { throw DispatchStoreError(.unavailable, "\(path) is closed") }
            return try Self.transaction(.deferred, on: connection, path: path, body)
        }
    }

    private static func transaction<R>(
        _ kind: SQLiteDatabase.TransactionKind, on connection: DispatchConnection, path: String,
        _ body: (DispatchConnection) throws(SQLiteError) -> R
    ) throws(DispatchStoreError) -> R {
        do {
            return try connection.database.transaction(kind) { () throws(SQLiteError) in try body(connection) }
        } catch {
            throw DispatchStoreError.map(error, path: path)
        }
    }

    // MARK: Dispatches

    /// Commits a new queued dispatch before returning. If the workspace already used the idempotency key, returns that
    /// earlier dispatch and `created == false` (nothing written), or, when the key came with another request (another
    /// `requestDigest`), throws `.idempotencyKeyReused` naming the earlier dispatch.
    /// - Parameter id: the new dispatch's id (one from `newID()`, given when it had to be known before the commit).
    package func accept(
        id: String = DispatchStore.newID(), workspace: String, app: String, kind: String, jobLine: [UInt8],
        idempotency: IdempotencyKey?, now: Int64
    ) throws(DispatchStoreError) -> (record: DispatchRecord, created: Bool) {
        let idempotencyKey = idempotency?.key
        let outcome = try write(forAccept: true) { connection throws(SQLiteError) -> (DispatchRecord, Bool, String?) in
            let database = connection.database
            if let idempotencyKey {
                let earlier = try database.withStatement(
                    """
                    SELECT \(DispatchSchema.recordColumns), request_digest FROM dispatches
                    WHERE workspace = ?1 AND idempotency_key = ?2
                    """
                ) { statement throws(SQLiteError) in
                    try statement.bind(workspace, at: 1)
                    try statement.bind(idempotencyKey, at: 2)
                    return try statement.step()
                        ? (
                            DispatchRecord(row: statement),
                            statement.optionalString(at: DispatchSchema.recordColumnCount)
                        )
                        : nil
                }
                if let earlier { return (earlier.0, false, earlier.1) }
            }
            try database.withStatement(
                """
                INSERT INTO dispatches (id, workspace, app, kind, job_line, state, created_at, idempotency_key,
                    request_digest)
                VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?7, ?8)
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(id, at: 1)
                try statement.bind(workspace, at: 2)
                try statement.bind(app, at: 3)
                try statement.bind(kind, at: 4)
                try statement.bind(jobLine, at: 5)
                try statement.bind(now, at: 6)
                try statement.bind(idempotencyKey, at: 7)
                try statement.bind(idempotency?.requestDigest, at: 8)
                try statement.run()
            }
            let record = DispatchRecord(
                id: id, workspace: workspace, app: app, kind: kind, jobLine: jobLine, state: .queued,
                counts: OutcomeCounts(), payloadEncodings: 0, demoted: 0, createdAt: now, startedAt: nil,
                finishedAt: nil, idempotencyKey: idempotencyKey)
            return (record, true, nil)
        }
        let (record, created, earlierDigest) = outcome
        if let idempotency, !idempotency.matches(earlierDigest) {
            throw DispatchStoreError(.idempotencyKeyReused, record.id)
        }
        return (record, created)
    }

    /// Takes in a dispatch from the shared queue (accepted by any instance): inserts it, queued, unless this store
    /// has it already, and raises its run count to at least `runsBefore` (the runs other processes gave it), so that
    /// this run's positions (`positionOffset(run:)`) are its own. Returns it as stored.
    package func adopt(_ record: DispatchRecord, runsBefore: Int) throws(DispatchStoreError) -> DispatchRecord {
        try write { connection throws(SQLiteError) in
            let database = connection.database
            try database.withStatement(
                """
                INSERT INTO dispatches (id, workspace, app, kind, job_line, state, created_at, idempotency_key)
                VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?7) ON CONFLICT DO NOTHING
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(record.id, at: 1)
                try statement.bind(record.workspace, at: 2)
                try statement.bind(record.app, at: 3)
                try statement.bind(record.kind, at: 4)
                try statement.bind(record.jobLine, at: 5)
                try statement.bind(record.createdAt, at: 6)
                try statement.bind(record.idempotencyKey, at: 7)
                try statement.run()
            }
            try database.withStatement("UPDATE dispatches SET runs = max(runs, ?2) WHERE id = ?1") {
                statement throws(SQLiteError) in
                try statement.bind(record.id, at: 1)
                try statement.bind(Int64(runsBefore), at: 2)
                try statement.run()
            }
        }
        guard let stored = try self.record(id: record.id) else { throw Self.notFound(record.id) }
        return stored
    }

    /// nil when there is no such dispatch OR it belongs to another workspace (the API answers 404 either way).
    package func dispatch(id: String, workspace: String) throws(DispatchStoreError) -> DispatchRecord? {
        try read { connection throws(SQLiteError) in
            try connection.database.withStatement(
                "SELECT \(DispatchSchema.recordColumns) FROM dispatches WHERE id = ?1 AND workspace = ?2"
            ) { statement throws(SQLiteError) in
                try statement.bind(id, at: 1)
                try statement.bind(workspace, at: 2)
                return try statement.step() ? DispatchRecord(row: statement) : nil
            }
        }
    }

    /// Any workspace's dispatch (for publishing it to the other instances, never for an API answer).
    func record(id: String) throws(DispatchStoreError) -> DispatchRecord? {
        try read { connection throws(SQLiteError) in
            try connection.database.withStatement(
                "SELECT \(DispatchSchema.recordColumns) FROM dispatches WHERE id = ?1"
            ) { statement throws(SQLiteError) in
                try statement.bind(id, at: 1)
                return try statement.step() ? DispatchRecord(row: statement) : nil
            }
        }
    }

    /// Queued and running dispatches, oldest first (what a restart must finish).
    package func unfinished() throws(DispatchStoreError) -> [DispatchRecord] {
        try read { connection throws(SQLiteError) in
            try connection.database.withStatement(
                "SELECT \(DispatchSchema.recordColumns) FROM dispatches WHERE state < 2 ORDER BY seq"
            ) { statement throws(SQLiteError) in
                var records: [DispatchRecord] = []
                while try statement.step() { records.append(DispatchRecord(row: statement)) }
                return records
            }
        }
    }

    /// The newest dispatches (all workspaces when nil), newest first, for the status page.
    package func recent(workspace: String?, limit: Int) throws(DispatchStoreError) -> [DispatchRecord] {
        try read { connection throws(SQLiteError) in
            let database = connection.database
            let sql =
                workspace == nil
                ? "SELECT \(DispatchSchema.recordColumns) FROM dispatches ORDER BY seq DESC LIMIT ?1"
                : "SELECT \(DispatchSchema.recordColumns) FROM dispatches WHERE workspace = ?2 ORDER BY seq DESC LIMIT ?1"
            return try database.withStatement(sql) { statement throws(SQLiteError) in
                try statement.bind(Int64(max(0, limit)), at: 1)
                if let workspace { try statement.bind(workspace, at: 2) }
                var records: [DispatchRecord] = []
                while try statement.step() { records.append(DispatchRecord(row: statement)) }
                return records
            }
        }
    }

    /// Marks the dispatch running (a done one stays done). Its `startedAt` is the first time it started: a dispatch
    /// resumed after a restart keeps it.
    /// Marks the dispatch running and counts one more run of it; returns that run's number (1 for the first). A
    /// run after the first is a resume: its results are stored at positions of their own (`positionOffset(run:)`).
    @discardableResult
    package func markRunning(id: String, now: Int64) throws(DispatchStoreError) -> Int {
        let run = try write { connection throws(SQLiteError) -> Int? in
            let database = connection.database
            return try database.withStatement(
                """
                UPDATE dispatches SET state = max(state, 1), started_at = coalesce(started_at, ?2), runs = runs + 1
                WHERE id = ?1 RETURNING runs
                """
            ) { statement throws(SQLiteError) -> Int? in
                try statement.bind(id, at: 1)
                try statement.bind(now, at: 2)
                guard try statement.step() else { return nil }
                let runs = Int(statement.int64(at: 0))
                while try statement.step() {}
                return runs
            }
        }
        guard let run else { throw Self.notFound(id) }
        return run
    }

    /// Where run `run`'s results are stored: the engine's positions plus this, so a resumed run, whose recipients
    /// may sit at other positions than before (the registry changed meanwhile), never collides with the first.
    package static func positionOffset(run: Int) -> Int { max(0, run - 1) << 40 }

    /// Marks the dispatch done, with what its run counted beside the results.
    package func markDone(id: String, now: Int64, payloadEncodings: Int, demoted: Int) throws(DispatchStoreError) {
        let found = try write { connection throws(SQLiteError) in
            let database = connection.database
            try database.withStatement(
                """
                UPDATE dispatches SET state = 2, started_at = coalesce(started_at, ?2), finished_at = ?2,
                    payload_encodings = ?3, demoted = ?4
                WHERE id = ?1
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(id, at: 1)
                try statement.bind(now, at: 2)
                try statement.bind(Int64(payloadEncodings), at: 3)
                try statement.bind(Int64(demoted), at: 4)
                try statement.run()
            }
            return database.changes == 1
        }
        guard found else { throw Self.notFound(id) }
    }

    static func notFound(_ id: String) -> DispatchStoreError {
        // The id came from the caller, maybe from a URL: quoted only when it looks like one of ours.
        let shown = isWellFormedID(id) ? id : "(malformed id)"
        return DispatchStoreError(.notFound, "no dispatch \(shown)")
    }

    // MARK: Ids

    /// RFC 4648's base32 alphabet, lowercase.
    private static let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567".utf8)

    /// `d_` and 20 base32 characters: 100 random bits from `SystemRandomNumberGenerator` (the kernel's CSPRNG).
    package static func newID() -> String {
        var generator = SystemRandomNumberGenerator()
        let high = generator.next() as UInt64
        let low = generator.next() as UInt64
        var bytes: [UInt8] = Array("d_".utf8)
        bytes.reserveCapacity(22)
        for index in 0..<20 {
            // 12 characters from `high` (60 bits), 8 from `low` (40 bits).
            let word = index < 12 ? high >> (UInt64(index) * 5) : low >> (UInt64(index - 12) * 5)
            bytes.append(alphabet[Int(word & 31)])
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Whether `id` has the shape `newID()` makes.
    package static func isWellFormedID(_ id: String) -> Bool {
        let bytes = Array(id.utf8)
        return bytes.count == 22 && bytes[0] == UInt8(ascii: "d") && bytes[1] == UInt8(ascii: "_")
            && bytes[2...].allSatisfy { alphabet.contains($0) }
    }
}

/// One of the store's SQLite connections. `@unchecked Sendable` because the store's mutex around it confines it to one
/// thread at a time (it is only ever used inside `withLock`); without it, region checking refuses handing the
/// connection to the closures `write` and `read` run.
final class DispatchConnection: @unchecked Sendable {
    let database: SQLiteDatabase

    init(database: SQLiteDatabase) {
        self.database = database
    }
}

extension DispatchRecord {
    /// The record from a row of `DispatchSchema.recordColumns`.
    init(row: SQLiteStatement) {
        var counts = OutcomeCounts()
        counts.delivered = Int(row.int64(at: 12))
        counts.rejected = Int(row.int64(at: 13))
        counts.unregistered = Int(row.int64(at: 14))
        counts.failed = Int(row.int64(at: 15))
        counts.expired = Int(row.int64(at: 16))
        counts.rateLimited = Int(row.int64(at: 17))
        counts.invalid = Int(row.int64(at: 18))
        counts.cancelled = Int(row.int64(at: 19))
        counts.superseded = Int(row.int64(at: 20))
        counts.retries = Int(row.int64(at: 21))
        self.init(
            id: row.string(at: 0), workspace: row.string(at: 1), app: row.string(at: 2), kind: row.string(at: 3),
            jobLine: row.data(at: 4).map { [UInt8]($0) } ?? [], state: DispatchState(code: row.int64(at: 5)),
            counts: counts, payloadEncodings: Int(row.int64(at: 10)), demoted: Int(row.int64(at: 11)),
            createdAt: row.int64(at: 6), startedAt: row.optionalInt64(at: 7), finishedAt: row.optionalInt64(at: 8),
            idempotencyKey: row.optionalString(at: 9))
        broadcasts = Int(row.int64(at: 22))
    }
}
