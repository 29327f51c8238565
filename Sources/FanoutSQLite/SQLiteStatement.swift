import CSQLite
package import Foundation

/// One prepared statement: bind parameters, step through rows, read columns, reset.
///
/// Statements come from `SQLiteDatabase.withStatement(_:_:)`, which caches them per SQL string and resets them when the
/// closure returns, so a statement never holds a read snapshot (which would stop WAL checkpoints) past its use. It is
/// confined to its database's thread like the database itself. Parameter and column indexes follow SQLite: parameters
/// from 1, columns from 0.
package final class SQLiteStatement {
    /// The `sqlite3_stmt`. Owned by this object: prepared by `SQLiteDatabase.prepare`, finalized exactly once by
    /// `finalize()`, which the database calls for every cached statement before it closes the connection. Nil after.
    private var handle: OpaquePointer?
    /// The SQL text, for messages.
    package let sql: String

    init(handle: OpaquePointer, sql: String) {
        self.handle = handle
        self.sql = sql
    }

    deinit {
        // A statement outliving its database would be a bug of the cache; finalizing here keeps it from leaking.
        finalize()
    }

    /// Releases the C statement (idempotent). Only the owning database calls it, before `sqlite3_close_v2`.
    func finalize() {
        if let handle {
            sqlite3_finalize(handle)
            self.handle = nil
        }
    }

    private var statement: OpaquePointer {
        guard let handle else { preconditionFailure("SQLiteStatement used after its database closed: \(sql)") }
        return handle
    }

    /// The error of the last call on this statement's connection.
    private func error(_ code: Int32) -> SQLiteError {
        SQLiteError(code: code, database: sqlite3_db_handle(statement))
    }

    private func check(_ code: Int32) throws(SQLiteError) {
        guard code == SQLITE_OK else { throw error(code) }
    }

    // MARK: Binding

    /// Binds an integer to the 1-based parameter `index`.
    package func bind(_ value: Int64, at index: Int32) throws(SQLiteError) {
        try check(sqlite3_bind_int64(statement, index, value))
    }

    /// Binds an integer, or NULL for nil.
    package func bind(_ value: Int64?, at index: Int32) throws(SQLiteError) {
        guard let value else { return try bindNull(at: index) }
        try bind(value, at: index)
    }

    /// Binds a floating-point number, or NULL for nil.
    package func bind(_ value: Double?, at index: Int32) throws(SQLiteError) {
        guard let value else { return try bindNull(at: index) }
        try check(sqlite3_bind_double(statement, index, value))
    }

    /// Binds text, or NULL for nil. SQLite copies the UTF-8 bytes before this returns (SQLITE_TRANSIENT, passed by
    /// `CSQLite_bind_text_transient`), because the pointer Swift lends is valid only inside `withUTF8`.
    package func bind(_ value: String?, at index: Int32) throws(SQLiteError) {
        guard var value else { return try bindNull(at: index) }
        try check(value.withUTF8 { bindText(UnsafeRawBufferPointer($0), at: index) })
    }

    /// Binds `bytes` as text (UTF-8), copied by SQLite before this returns: for text kept as bytes, with no String.
    package func bind(utf8 bytes: UnsafeRawBufferPointer, at index: Int32) throws(SQLiteError) {
        try check(bindText(bytes, at: index))
    }

    /// `sqlite3_bind_text` with SQLITE_TRANSIENT; its result code.
    private func bindText(_ bytes: UnsafeRawBufferPointer, at index: Int32) -> Int32 {
        // An empty string may have no base address, and a nil pointer would bind NULL instead of ''.
        guard let start = bytes.baseAddress, bytes.count > 0 else {
            return CSQLite_bind_text_transient(statement, index, "", 0)
        }
        return CSQLite_bind_text_transient(
            statement, index, start.assumingMemoryBound(to: CChar.self), Int32(bytes.count))
    }

    /// Binds a blob, or NULL for nil. SQLite copies the bytes before this returns (SQLITE_TRANSIENT).
    package func bind(_ value: [UInt8]?, at index: Int32) throws(SQLiteError) {
        guard let value else { return try bindNull(at: index) }
        try bindBlob(value, at: index)
    }

    /// Binds a blob, or NULL for nil. SQLite copies the bytes before this returns (SQLITE_TRANSIENT).
    package func bind(_ value: Data?, at index: Int32) throws(SQLiteError) {
        guard let value else { return try bindNull(at: index) }
        try bindBlob(value, at: index)
    }

    private func bindBlob(_ bytes: some ContiguousBytes, at index: Int32) throws(SQLiteError) {
        let code = bytes.withUnsafeBytes { raw in
            // A zero-length blob needs a non-nil pointer, or SQLite binds NULL instead.
            withUnsafePointer(to: 0 as UInt8) { empty in
                CSQLite_bind_blob_transient(
                    statement, index, raw.baseAddress ?? UnsafeRawPointer(empty), Int32(raw.count))
            }
        }
        try check(code)
    }

    /// Binds NULL.
    package func bindNull(at index: Int32) throws(SQLiteError) {
        try check(sqlite3_bind_null(statement, index))
    }

    // MARK: Running

    /// Runs the statement one step: true when a row is ready to read, false when it is done.
    package func step() throws(SQLiteError) -> Bool {
        switch sqlite3_step(statement) {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        case let code: throw error(code)
        }
    }

    /// Steps until done, for statements that return no rows (or whose rows do not matter).
    package func run() throws(SQLiteError) {
        while try step() {}
    }

    /// Rewinds the statement and clears its bindings, so the next use starts clean and no read snapshot stays open.
    /// Its result is the last step's, already reported by `step()`, so it is ignored here.
    package func reset() {
        sqlite3_reset(statement)
        sqlite3_clear_bindings(statement)
    }

    // MARK: Columns (valid after `step()` returned true, until the next step or reset)

    package func isNull(at column: Int32) -> Bool {
        sqlite3_column_type(statement, column) == SQLITE_NULL
    }

    /// The column as an integer (0 for NULL).
    package func int64(at column: Int32) -> Int64 {
        sqlite3_column_int64(statement, column)
    }

    /// The column as an integer, nil for NULL.
    package func optionalInt64(at column: Int32) -> Int64? {
        isNull(at: column) ? nil : int64(at: column)
    }

    /// The column as a floating-point number (0 for NULL).
    package func double(at column: Int32) -> Double {
        sqlite3_column_double(statement, column)
    }

    /// The column as a floating-point number, nil for NULL.
    package func optionalDouble(at column: Int32) -> Double? {
        isNull(at: column) ? nil : double(at: column)
    }

    /// The column as text ("" for NULL). The bytes are copied out: SQLite's pointer dies at the next step.
    package func string(at column: Int32) -> String {
        // sqlite3_column_text before sqlite3_column_bytes, as SQLite's documentation requires, so the byte count is
        // that of the UTF-8 form the pointer holds.
        guard let text = sqlite3_column_text(statement, column) else { return "" }
        let count = Int(sqlite3_column_bytes(statement, column))
        return String(decoding: UnsafeBufferPointer(start: text, count: count), as: UTF8.self)
    }

    /// The column as text, nil for NULL.
    package func optionalString(at column: Int32) -> String? {
        isNull(at: column) ? nil : string(at: column)
    }

    /// The column as bytes, nil for NULL. Copied out, as for text.
    package func data(at column: Int32) -> Data? {
        guard !isNull(at: column) else { return nil }
        guard let blob = sqlite3_column_blob(statement, column) else { return Data() }
        return Data(bytes: blob, count: Int(sqlite3_column_bytes(statement, column)))
    }
}
