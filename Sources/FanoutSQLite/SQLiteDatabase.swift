import CSQLite
import Synchronization

/// One SQLite connection: open, configure, run SQL, cache prepared statements, wrap transactions.
///
/// Not thread-safe, on purpose: the connection is opened in SQLite's multi-thread mode (`SQLITE_OPEN_NOMUTEX`, no
/// per-call mutex), so its owner must confine it to one thread at a time, as `SQLiteRegistryStore` does with a mutex
/// per connection.
package final class SQLiteDatabase {
    /// How to open the file.
    package struct OpenMode: Sendable, Hashable {
        fileprivate let flags: Int32

        /// Read and write; create the file when it does not exist.
        package static let readWriteCreate = OpenMode(flags: SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)
        /// Read and write an existing file.
        package static let readWrite = OpenMode(flags: SQLITE_OPEN_READWRITE)
        /// Read an existing file.
        package static let readOnly = OpenMode(flags: SQLITE_OPEN_READONLY)
    }

    /// How a transaction takes its locks.
    package enum TransactionKind: Sendable {
        /// `BEGIN`: the write lock is taken at the first write (a read-then-write transaction may then fail busy).
        case deferred
        /// `BEGIN IMMEDIATE`: the write lock is taken at once, waiting up to the busy timeout. Use for every write.
        case immediate
    }

    /// The `sqlite3` connection. Owned by this object: opened in `init`, closed exactly once by `close()` (after every
    /// cached statement is finalized), which `deinit` calls when the owner did not. Nil once closed.
    private var handle: OpaquePointer?
    /// Prepared statements by SQL text; each one owns its `sqlite3_stmt` and is finalized by `close()`.
    private var statements: [String: SQLiteStatement] = [:]
    /// Prepared statements of `SQLiteSQL` constants, by their index (no hashing of the text on the hot path); owned
    /// like `statements`.
    private var indexedStatements: [SQLiteStatement?] = []
    /// The path as given.
    package let path: String

    /// Opens `path` (`:memory:` for a private in-memory database) and sets the busy timeout: how long a statement
    /// waits for a lock another connection holds before failing with `SQLITE_BUSY`.
    package init(path: String, mode: OpenMode = .readWriteCreate, busyTimeoutMilliseconds: Int32 = 5_000)
        throws(SQLiteError)
    {
        self.path = path
        _ = SQLiteDatabase.configureLibrary
        var opened: OpaquePointer?
        let code = sqlite3_open_v2(path, &opened, mode.flags | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE, nil)
        guard code == SQLITE_OK, let opened else {
            let error = SQLiteError(code: code, database: opened)
            // sqlite3_open_v2 allocates a connection even when it fails; it is ours to close (close(NULL) is a no-op).
            sqlite3_close_v2(opened)
            throw error
        }
        handle = opened
        sqlite3_busy_timeout(opened, busyTimeoutMilliseconds)
    }

    deinit {
        close()
    }

    /// Process-wide settings applied once, before the first connection initializes SQLite: no allocation statistics
    /// (which take a global mutex per allocation). If something else in the process initialized SQLite first, the
    /// call is refused and the defaults stay.
    private static let configureLibrary: Void = {
        _ = CSQLite_config_memstatus(0)
    }()

    /// Finalizes every cached statement and closes the connection (idempotent). An open transaction is rolled back by
    /// SQLite.
    package func close() {
        guard let handle else { return }
        for statement in statements.values { statement.finalize() }
        for statement in indexedStatements { statement?.finalize() }
        statements.removeAll()
        indexedStatements.removeAll()
        // With every statement finalized, close_v2 closes at once (it would otherwise leave a zombie connection).
        sqlite3_close_v2(handle)
        self.handle = nil
    }

    package var isOpen: Bool { handle != nil }

    private var connection: OpaquePointer {
        guard let handle else { preconditionFailure("SQLiteDatabase used after close(): \(path)") }
        return handle
    }

    // MARK: Running SQL

    /// Runs one or more statements separated by semicolons, ignoring any rows (schema, pragmas, BEGIN/COMMIT).
    package func execute(_ sql: String) throws(SQLiteError) {
        // sqlite3_exec allocates the message with sqlite3_malloc; it is ours to free with sqlite3_free.
        var message: UnsafeMutablePointer<CChar>?
        let code = sqlite3_exec(connection, sql, nil, nil, &message)
        defer { sqlite3_free(message) }
        guard code == SQLITE_OK else {
            throw SQLiteError(code: code, message: message.map { String(cString: $0) } ?? "")
        }
    }

    /// Runs `body` with the cached prepared statement for `sql` (preparing it on first use), then resets it and clears
    /// its bindings, whatever `body` did. The statement must not escape `body`.
    package func withStatement<R>(_ sql: String, _ body: (SQLiteStatement) throws(SQLiteError) -> R)
        throws(SQLiteError) -> R
    {
        let statement = try cachedStatement(sql)
        defer { statement.reset() }
        return try body(statement)
    }

    /// `withStatement` for a statement run once per row of a bulk write: the same, without hashing the SQL text.
    package func withStatement<R>(_ sql: SQLiteSQL, _ body: (SQLiteStatement) throws(SQLiteError) -> R)
        throws(SQLiteError) -> R
    {
        let statement: SQLiteStatement
        if sql.index < indexedStatements.count, let cached = indexedStatements[sql.index] {
            statement = cached
        } else {
            statement = try prepare(sql.text)
            if sql.index >= indexedStatements.count {
                indexedStatements += Array(repeating: nil, count: sql.index + 1 - indexedStatements.count)
            }
            indexedStatements[sql.index] = statement
        }
        defer { statement.reset() }
        return try body(statement)
    }

    private func cachedStatement(_ sql: String) throws(SQLiteError) -> SQLiteStatement {
        if let statement = statements[sql] { return statement }
        let statement = try prepare(sql)
        statements[sql] = statement
        return statement
    }

    /// Prepares `sql`; the returned object owns the statement (the caller's cache keeps it until close()).
    private func prepare(_ sql: String) throws(SQLiteError) -> SQLiteStatement {
        var prepared: OpaquePointer?
        // PERSISTENT: a hint that the statement is kept and reused, so SQLite allocates it outside its lookaside pool.
        let code = sqlite3_prepare_v3(connection, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &prepared, nil)
        guard code == SQLITE_OK, let prepared else {
            // On failure SQLite sets the statement to NULL, so nothing to finalize.
            throw SQLiteError(code: code, database: connection)
        }
        // The statement object now owns `prepared`.
        return SQLiteStatement(handle: prepared, sql: sql)
    }

    /// The first column of the first row of `sql` as an integer; nil when there is no row or it is NULL.
    package func scalarInt64(_ sql: String) throws(SQLiteError) -> Int64? {
        try withStatement(sql) { statement throws(SQLiteError) in
            try statement.step() ? statement.optionalInt64(at: 0) : nil
        }
    }

    /// The first column of the first row of `sql` as text; nil when there is no row or it is NULL.
    package func scalarString(_ sql: String) throws(SQLiteError) -> String? {
        try withStatement(sql) { statement throws(SQLiteError) in
            try statement.step() ? statement.optionalString(at: 0) : nil
        }
    }

    // MARK: Transactions

    /// Runs `body` in a transaction: committed when it returns, rolled back when it (or the commit) throws, so the
    /// database holds all of its writes or none, even if the process is killed halfway.
    package func transaction<R>(
        _ kind: TransactionKind = .immediate, _ body: () throws(SQLiteError) -> R
    ) throws(SQLiteError) -> R {
        try execute(kind == .immediate ? "BEGIN IMMEDIATE" : "BEGIN")
        do {
            let result = try body()
            try execute("COMMIT")
            return result
        } catch {
            // A failed COMMIT may leave the transaction open; a failed statement may already have ended it.
            if isInTransaction { try? execute("ROLLBACK") }
            throw error
        }
    }

    /// Whether a transaction is open (the connection is not in autocommit mode).
    package var isInTransaction: Bool { sqlite3_get_autocommit(connection) == 0 }

    // MARK: State

    /// Rows changed by the last INSERT, UPDATE or DELETE.
    package var changes: Int { Int(sqlite3_changes64(connection)) }

    /// The rowid of the last successful INSERT on this connection.
    package var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(connection) }

    /// `PRAGMA application_id`: the 32-bit number at offset 68 of the header, identifying the file's format.
    package func applicationID() throws(SQLiteError) -> Int32 {
        Int32(truncatingIfNeeded: try scalarInt64("PRAGMA application_id") ?? 0)
    }

    package func setApplicationID(_ value: Int32) throws(SQLiteError) {
        try execute("PRAGMA application_id = \(value)")
    }

    /// `PRAGMA user_version`: the 32-bit number at offset 60 of the header, used as the schema version.
    package func userVersion() throws(SQLiteError) -> Int32 {
        Int32(truncatingIfNeeded: try scalarInt64("PRAGMA user_version") ?? 0)
    }

    package func setUserVersion(_ value: Int32) throws(SQLiteError) {
        try execute("PRAGMA user_version = \(value)")
    }

    /// The SQLite library's version, for example `3.40.1`.
    package static var libraryVersion: String { String(cString: sqlite3_libversion()) }
}

// MARK: - File identity and configuration

extension SQLiteDatabase {
    /// What a file holds, read from its header before anything is written to it.
    package enum FileIdentity: Sendable, Hashable {
        /// A new or empty database: no schema, application id 0. Safe to initialise.
        case empty
        /// An SQLite database with this application id and user version (0 and 0 for one that never set them).
        case database(applicationID: Int32, userVersion: Int32)
    }

    /// Reads the header's application id, user version and whether any schema exists. Throws `SQLITE_NOTADB` for a
    /// file that is not SQLite, `SQLITE_CORRUPT` for a damaged one, `SQLITE_BUSY` when another connection holds an
    /// exclusive lock beyond the busy timeout. Writes nothing, so a foreign file is left as it was.
    package func identify() throws(SQLiteError) -> FileIdentity {
        let objects = try scalarInt64("SELECT count(*) FROM sqlite_schema") ?? 0
        let applicationID = try applicationID()
        let userVersion = try userVersion()
        if objects == 0 && applicationID == 0 && userVersion == 0 { return .empty }
        return .database(applicationID: applicationID, userVersion: userVersion)
    }

    /// Switches the file to write-ahead logging (readers never block the writer, and a commit is one append) and sets
    /// `synchronous=NORMAL`: in WAL mode a commit is then durable once the WAL is checkpointed, and a crash (even
    /// kill -9 or power loss) can lose only the last transactions, never corrupt the file or tear a transaction.
    /// Returns the journal mode in force (`wal`, or `memory` for an in-memory database).
    @discardableResult
    package func useWriteAheadLog() throws(SQLiteError) -> String {
        let mode = try scalarString("PRAGMA journal_mode = WAL") ?? ""
        try execute("PRAGMA synchronous = NORMAL")
        return mode
    }
}

/// SQL text declared once (a `static let`) for statements run once per row: each gets a small index when created, and
/// `SQLiteDatabase.withStatement(_:_:)` finds its prepared statement by that index instead of hashing the text.
/// Make them only as constants: every value takes a new index for the life of the process.
package struct SQLiteSQL: Sendable {
    package let text: String
    let index: Int

    private static let nextIndex = Atomic<Int>(0)

    package init(_ text: String) {
        self.text = text
        index = SQLiteSQL.nextIndex.add(1, ordering: .relaxed).oldValue
    }
}
