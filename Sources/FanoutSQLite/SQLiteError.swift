import CSQLite

/// A failed SQLite call: SQLite's extended result code, its message, and the kinds of failure callers act on.
///
/// The registry maps these into its own errors at its boundary; nothing above FanoutSQLite sees a raw code it would
/// have to compare with a C constant.
package struct SQLiteError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The extended result code (for example `SQLITE_BUSY_SNAPSHOT`, 517); its low byte is the primary code.
    package let code: Int32
    /// SQLite's message for the failure (`sqlite3_errmsg`), or the error string of the code when there was none.
    package let message: String

    package init(code: Int32, message: String) {
        self.code = code
        self.message = message
    }

    /// The error of `code` on `database`, reading the connection's message (valid until its next call).
    init(code: Int32, database: OpaquePointer?) {
        let text = database.flatMap { sqlite3_errmsg($0) }.map { String(cString: $0) }
        self.init(code: code, message: text ?? String(cString: sqlite3_errstr(code)))
    }

    /// The primary result code (`SQLITE_BUSY`, `SQLITE_CORRUPT`, ...).
    package var primaryCode: Int32 { code & 0xFF }

    /// Another connection holds the lock we need and the busy timeout ran out (`SQLITE_BUSY`), or a lock inside this
    /// process's shared cache (`SQLITE_LOCKED`). Waiting longer may succeed.
    package var isBusy: Bool { primaryCode == SQLITE_BUSY || primaryCode == SQLITE_LOCKED }

    /// The file is damaged (`SQLITE_CORRUPT`) or is not an SQLite database at all (`SQLITE_NOTADB`).
    package var isCorrupt: Bool { primaryCode == SQLITE_CORRUPT || primaryCode == SQLITE_NOTADB }

    /// The file is not an SQLite database (`SQLITE_NOTADB`: its header is wrong).
    package var isNotADatabase: Bool { primaryCode == SQLITE_NOTADB }

    /// The file could not be opened (`SQLITE_CANTOPEN`: missing directory, no permission).
    package var isCannotOpen: Bool { primaryCode == SQLITE_CANTOPEN }

    /// The file or the connection is read-only (`SQLITE_READONLY`).
    package var isReadOnly: Bool { primaryCode == SQLITE_READONLY }

    /// A UNIQUE, NOT NULL or CHECK constraint refused a write (`SQLITE_CONSTRAINT`).
    package var isConstraint: Bool { primaryCode == SQLITE_CONSTRAINT }

    /// SQLite's name for the code, for example `database is locked`.
    package var codeDescription: String { String(cString: sqlite3_errstr(code)) }

    /// `database is locked (SQLite code 5)`; the message alone when it already is the code's description.
    package var description: String {
        message == codeDescription
            ? "\(message) (SQLite code \(code))" : "\(message) (\(codeDescription), SQLite code \(code))"
    }
}
