import Fanout
import FanoutSQLite
import FanoutService
import Foundation
import XCTest

#if canImport(Glibc)
    import Glibc
#endif

/// kill -9 while dispatches are being accepted and their results appended: every dispatch whose `accept` returned is
/// there after reopening, and each dispatch's counts equal its result rows.
///
/// The victim is this test bundle itself, run again with one test selected (`testCrashChild`) and
/// `FANOUT_DISPATCH_CRASH_DB` set: no extra executable to build.
final class DispatchCrashTests: XCTestCase {
    static let childVariable = "FANOUT_DISPATCH_CRASH_DB"

    func testKillDuringAcceptsAndAppendsLosesNoAcceptedDispatch() throws {
        let directory = try ScratchDirectory()
        let path = directory.file("fanout.db")
        let runner = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")

        let child = Process()
        child.executableURL = URL(fileURLWithPath: runner)
        child.arguments = ["FanoutServiceTests.DispatchCrashTests/testCrashChild"]
        child.environment = ProcessInfo.processInfo.environment.merging([Self.childVariable: path]) { $1 }
        let output = Pipe()
        child.standardOutput = output
        child.standardError = FileHandle.nullDevice
        try child.run()
        let watchdog = DispatchWorkItem { kill(child.processIdentifier, SIGKILL) }
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(120), execute: watchdog)
        defer { watchdog.cancel() }

        // Kill once 30 dispatches were reported accepted (the child is then appending to the 31st or accepting it).
        var printed = ""
        var accepted: [String] = []
        while accepted.count < 30 {
            let data = output.fileHandleForReading.availableData
            guard !data.isEmpty else { break }
            printed += String(decoding: data, as: UTF8.self)
            accepted = printed.split(separator: "\n").compactMap { line in
                line.hasPrefix("accepted ") ? String(line.dropFirst("accepted ".count)) : nil
            }
        }
        kill(child.processIdentifier, SIGKILL)
        child.waitUntilExit()
        XCTAssertEqual(child.terminationReason, .uncaughtSignal, printed)
        XCTAssertGreaterThanOrEqual(accepted.count, 30, printed)

        let store = try DispatchStore(path: path)
        for id in accepted {
            XCTAssertNotNil(try store.dispatch(id: id, workspace: "acme"), "accepted dispatch \(id) was lost")
        }
        let all = try store.recent(workspace: nil, limit: 1_000)
        XCTAssertGreaterThanOrEqual(all.count, accepted.count)
        let database = try SQLiteDatabase(path: path, mode: .readOnly)
        defer { database.close() }
        var total = 0
        for record in all {
            let rows = try database.withStatement(
                """
                SELECT count(*) FROM dispatch_results
                WHERE dispatch = (SELECT seq FROM dispatches WHERE id = ?1)
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(record.id, at: 1)
                _ = try statement.step()
                return Int(statement.int64(at: 0))
            }
            XCTAssertEqual(record.notifications, rows, "dispatch \(record.id): counts and rows agree")
            XCTAssertEqual(record.counts.delivered, rows)
            // Results were appended in position order, so the prefix is all of them.
            XCTAssertEqual(try store.resumePoint(id: record.id).prefix, rows)
            XCTAssertEqual(try store.resumePoint(id: record.id).beyondPrefix, [])
            total += rows
        }
        XCTAssertGreaterThan(total, 0, printed)
        XCTAssertEqual(try store.unfinished().count, all.count, "the child never marked one done")
    }

    /// The victim: accepts dispatches and appends their results in batches, forever, until killed. Does nothing
    /// (passes at once) in a normal test run.
    func testCrashChild() throws {
        guard let path = ProcessInfo.processInfo.environment[Self.childVariable] else { return }
        let store = try DispatchStore(path: path)
        var index = 0
        while true {
            let (record, _) = try store.accept(
                workspace: "acme", app: "com.acme.app", kind: "update", jobLine: DispatchStoreTests.jobLine,
                idempotency: IdempotencyKey(key: "key-\(index)", requestDigest: "r"), now: Int64(index))
            // Unbuffered: the parent may kill us the moment it reads this line.
            FileHandle.standardOutput.write(Data("accepted \(record.id)\n".utf8))
            try store.markRunning(id: record.id, now: Int64(index))
            for batch in 0..<20 {
                try store.appendResults(
                    (batch * 100..<(batch + 1) * 100).map { DispatchStoreTests.result($0) },
                    dispatch: record.id)
            }
            index += 1
        }
    }
}
