// FanoutSQLite, the binding the registry and the service's dispatch store are written on: statements and their
// bindings, transactions that keep all of their writes or none, and errors that say what kind of failure they are.
import FanoutSQLite
import Foundation
import XCTest

final class SQLiteDatabaseTests: XCTestCase {
    private func temporaryFile(_ name: String) throws -> String {
        let directory = (NSTemporaryDirectory() as NSString).appendingPathComponent(
            "fanout-sqlite-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        addTeardownBlock { try? FileManager.default.removeItem(atPath: directory) }
        return (directory as NSString).appendingPathComponent(name)
    }

    func testBoundValuesReadBackWithTheirTypes() throws {
        let database = try SQLiteDatabase(path: try temporaryFile("values.db"))
        defer { database.close() }
        try database.execute("CREATE TABLE t (i INTEGER, s TEXT, b BLOB, d REAL)")
        try database.withStatement("INSERT INTO t (i, s, b, d) VALUES (?1, ?2, ?3, ?4)") {
            statement throws(SQLiteError) in
            try statement.bind(Int64.max, at: 1)
            try statement.bind("caf\u{E9} \"quoted\"", at: 2)
            try statement.bind([0, 1, 255] as [UInt8], at: 3)
            try statement.bind(2.5 as Double?, at: 4)
            try statement.run()
        }
        XCTAssertEqual(database.changes, 1)
        XCTAssertEqual(database.lastInsertRowID, 1)
        try database.withStatement("SELECT i, s, d FROM t") { statement throws(SQLiteError) in
            XCTAssertTrue(try statement.step())
            XCTAssertEqual(statement.int64(at: 0), Int64.max)
            XCTAssertEqual(statement.string(at: 1), "caf\u{E9} \"quoted\"")
            XCTAssertEqual(statement.double(at: 2), 2.5)
            XCTAssertFalse(try statement.step())
        }
        XCTAssertEqual(try database.scalarInt64("SELECT length(b) FROM t"), 3)
        XCTAssertNil(try database.scalarString("SELECT s FROM t WHERE i = 0"))
    }

    func testATransactionThatThrowsLeavesNoneOfItsWrites() throws {
        let database = try SQLiteDatabase(path: try temporaryFile("transaction.db"))
        defer { database.close() }
        try database.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
        try database.transaction { () throws(SQLiteError) in try database.execute("INSERT INTO t VALUES ('a')") }
        do {
            try database.transaction { () throws(SQLiteError) in
                try database.execute("INSERT INTO t VALUES ('b')")
                try database.execute("INSERT INTO t VALUES ('a')")  // the primary key refuses it
            }
            XCTFail("a repeated primary key was taken")
        } catch {
            XCTAssertTrue(error.isConstraint, "\(error)")
        }
        XCTAssertFalse(database.isInTransaction)
        XCTAssertEqual(try database.scalarInt64("SELECT count(*) FROM t"), 1, "'b' rolled back with the failure")
    }

    func testAFileThatIsNotADatabaseIsReportedAsSuch() throws {
        let path = try temporaryFile("not-a-database.db")
        try Data(repeating: 0x41, count: 4096).write(to: URL(fileURLWithPath: path))
        do {
            let database = try SQLiteDatabase(path: path)
            defer { database.close() }
            _ = try database.identify()
            XCTFail("a file of 'A's read as a database")
        } catch {
            XCTAssertTrue(error.isNotADatabase, "\(error)")
            XCTAssertTrue(error.isCorrupt, "\(error)")
        }
    }

    func testTheApplicationIDAndUserVersionIdentifyAFile() throws {
        let path = try temporaryFile("identity.db")
        let database = try SQLiteDatabase(path: path)
        XCTAssertEqual(try database.identify(), .empty)
        try database.setApplicationID(0x464E_4F54)
        try database.setUserVersion(4)
        database.close()
        let reopened = try SQLiteDatabase(path: path, mode: .readOnly)
        defer { reopened.close() }
        XCTAssertEqual(try reopened.identify(), .database(applicationID: 0x464E_4F54, userVersion: 4))
    }

    func testAMissingFileOpenedWithoutCreateCannotBeOpened() throws {
        let path = try temporaryFile("missing.db")
        XCTAssertThrowsError(try SQLiteDatabase(path: path, mode: .readWrite)) { error in
            XCTAssertTrue((error as? SQLiteError)?.isCannotOpen ?? false, "\(error)")
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: path))
    }
}
