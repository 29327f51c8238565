import FanoutRegistry
import FanoutSQLite
import Foundation
import XCTest

#if canImport(Glibc)
    import Glibc
#endif

/// kill -9 in the middle of a 1,000,000-row import: the registry opens cleanly holding a prefix of the file's batches,
/// and importing the file again completes it without a duplicate row or event.
final class RegistryCrashTests: XCTestCase {
    static let rows = 1_000_000
    static let batch = 10_000

    func testKillDuringAMillionRowImportLeavesAPrefixAndReimportCompletesIt() async throws {
        let probe = try Self.probePath()
        let directory = try ScratchDirectory()
        let file = directory.file("registrations.csv")
        let database = directory.file("registry.db")
        let started = ContinuousClock.now

        let generated = try Self.run(probe, ["generate", "--csv", "--count", "\(Self.rows)", "--out", file])
        XCTAssertTrue(generated.contains("\"generated\":\(Self.rows)"), generated)

        // Start importing; kill -9 once two batches are reported committed (the third is then being written).
        let victim = Process()
        victim.executableURL = URL(fileURLWithPath: probe)
        victim.arguments = ["import", "--db", database, "--file", file, "--progress", "--batch", "\(Self.batch)"]
        let output = Pipe()
        victim.standardOutput = output
        victim.standardError = FileHandle.nullDevice
        try victim.run()
        let watchdog = Self.killAfter(seconds: 120, victim.processIdentifier)
        defer { watchdog.cancel() }
        var printed = ""
        var committedBeforeKill = 0
        while committedBeforeKill < 2 * Self.batch {
            let data = output.fileHandleForReading.availableData
            guard !data.isEmpty else { break }
            printed += String(decoding: data, as: UTF8.self)
            committedBeforeKill =
                printed.split(separator: "\n").compactMap { line in
                    line.hasPrefix("committed ") ? Int(line.dropFirst("committed ".count)) : nil
                }.last ?? 0
        }
        kill(victim.processIdentifier, SIGKILL)
        victim.waitUntilExit()
        XCTAssertEqual(victim.terminationReason, .uncaughtSignal, "the import was killed, not finished: \(printed)")
        XCTAssertGreaterThanOrEqual(committedBeforeKill, 2 * Self.batch, printed)

        // The registry opens cleanly and holds whole batches, the file's first ones.
        let prefix = try await Self.check(database)
        XCTAssertGreaterThanOrEqual(prefix.rows, committedBeforeKill)
        XCTAssertLessThan(prefix.rows, Self.rows)
        XCTAssertEqual(prefix.rows % Self.batch, 0, "a batch is all there or not at all")
        XCTAssertEqual(prefix.distinct, prefix.rows)
        XCTAssertEqual(prefix.lastLine, prefix.rows - 1, "the rows are lines 0..<\(prefix.rows) of the file")
        XCTAssertEqual(prefix.events, prefix.rows)

        // Importing the same file again completes it: the prefix is unchanged, the rest added, once each.
        let finished = try Self.run(probe, ["import", "--db", database, "--file", file, "--batch", "\(Self.batch)"])
        XCTAssertTrue(finished.contains("\"imported\":\(Self.rows)"), finished)
        XCTAssertTrue(finished.contains("\"added\":\(Self.rows - prefix.rows)"), finished)
        XCTAssertTrue(finished.contains("\"unchanged\":\(prefix.rows)"), finished)
        let complete = try await Self.check(database)
        XCTAssertEqual(complete.rows, Self.rows)
        XCTAssertEqual(complete.distinct, Self.rows)
        XCTAssertEqual(complete.lastLine, Self.rows - 1)
        XCTAssertEqual(complete.events, Self.rows, "no duplicate event for the rows the first run committed")
        print(
            "kill -9 after \(committedBeforeKill) reported rows left \(prefix.rows); "
                + "the whole test took \(ContinuousClock.now - started)")
    }

    /// Opens the registry as the store does (so it must open cleanly), then counts with one read-only connection.
    private static func check(_ path: String) async throws -> (rows: Int, distinct: Int, lastLine: Int, events: Int) {
        let store = try SQLiteRegistryStore(path: path)
        let stats = try await store.stats()
        store.close()
        let database = try SQLiteDatabase(path: path, mode: .readOnly)
        defer { database.close() }
        let rows = Int(try database.scalarInt64("SELECT count(*) FROM update_tokens") ?? -1)
        XCTAssertEqual(stats.updateTokens, rows)
        let distinct = Int(try database.scalarInt64("SELECT count(DISTINCT token) FROM update_tokens") ?? -1)
        // The generator puts each line's index in the last 16 hex digits of its token.
        let last = try database.scalarString("SELECT max(substr(token, 49)) FROM update_tokens") ?? ""
        let events = Int(try database.scalarInt64("SELECT count(*) FROM events") ?? -1)
        return (rows, distinct, Int(last, radix: 16) ?? -1, events)
    }

    /// Runs the probe to completion (bounded) and returns its standard output.
    private static func run(_ probe: String, _ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: probe)
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let watchdog = killAfter(seconds: 120, process.processIdentifier)
        defer { watchdog.cancel() }
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        guard process.terminationReason == .exit, process.terminationStatus == 0 else {
            throw ProbeError("registry-import-probe \(arguments.joined(separator: " ")) failed: \(text)")
        }
        return text
    }

    /// Kills `pid` with SIGKILL after `seconds` unless cancelled, so a hung child cannot hang the suite.
    private static func killAfter(seconds: Int, _ pid: Int32) -> DispatchWorkItem {
        let item = DispatchWorkItem { kill(pid, SIGKILL) }
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(seconds), execute: item)
        return item
    }

    /// The built probe: next to the test runner (`<scratch>/debug/`), or in `FANOUT_BIN_DIR`.
    private static func probePath() throws -> String {
        var directories: [String] = []
        if let override = ProcessInfo.processInfo.environment["FANOUT_BIN_DIR"] { directories.append(override) }
        if let runner = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            var directory = URL(fileURLWithPath: runner).deletingLastPathComponent()
            for _ in 0..<5 {
                directories.append(directory.path)
                directory.deleteLastPathComponent()
            }
        }
        for directory in directories {
            let path = directory + "/registry-import-probe"
            if FileManager.default.isExecutableFile(atPath: path) { return path }
        }
        throw ProbeError(
            "registry-import-probe is not built near the test runner (looked in \(directories)); "
                + "run swift build --build-tests first")
    }

    struct ProbeError: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }
}
