import FanoutRegistry
import FanoutSQLite
import Foundation
import XCTest

/// Opening files: a new registry, an existing one, anything else refused untouched, a damaged one, a locked one.
final class RegistryFileTests: XCTestCase {
    func testANewFileBecomesARegistryAndKeepsItsContentsAcrossOpens() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let path = directory.file("registry.db")
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: Data()))  // an empty file counts as new
        var store = try await makeStore(in: directory, clock: clock)
        try await store.register(
            .updateToken(.init(app: "com.acme.app", activityID: "match-7", token: TestTokens.token(1))))
        store.close()

        store = try SQLiteRegistryStore(
            path: path,
            configuration: { () -> RegistryConfiguration in
                var configuration = RegistryConfiguration()
                configuration.clock = clock.registryClock
                return configuration
            }())
        let apps = try await store.apps()
        XCTAssertEqual(apps, [RegistryApp(bundleID: "com.acme.app", workspace: "acme")])
        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live.map(\.token), [TestTokens.token(1)])

        let database = try SQLiteDatabase(path: path, mode: .readOnly)
        XCTAssertEqual(try database.scalarString("PRAGMA journal_mode"), "wal")
    }

    func testAFileThatIsNotSQLiteIsRefusedAndLeftAsItWas() async throws {
        let directory = try ScratchDirectory()
        let path = directory.file("registry.db")
        let contents = Data(String(repeating: "not a database, just some text\n", count: 200).utf8)
        try contents.write(to: URL(fileURLWithPath: path))
        let error = await assertRegistryError(.notARegistry) { try SQLiteRegistryStore(path: path) }
        XCTAssertEqual(error?.description, "\(path) is not a Fanout registry (not an SQLite database)")
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: path)), contents)
    }

    func testAnotherApplicationsSQLiteDatabaseIsRefusedAndLeftAsItWas() async throws {
        let directory = try ScratchDirectory()
        let path = directory.file("other.db")
        do {
            let database = try SQLiteDatabase(path: path)
            try database.execute(
                "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT); INSERT INTO notes VALUES (1, 'x')")
            database.close()
        }
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        let error = await assertRegistryError(.notARegistry) { try SQLiteRegistryStore(path: path) }
        XCTAssertTrue(error?.message.contains("an SQLite database of something else") ?? false)
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: path)), before, "not even switched to WAL")
        XCTAssertFalse(FileManager.default.fileExists(atPath: path + "-wal"))
    }

    func testARegistryFromANewerFanoutIsRefused() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        store.close()
        let database = try SQLiteDatabase(path: directory.file("registry.db"))
        try database.setUserVersion(99)
        database.close()
        let error = await assertRegistryError(.unsupportedVersion) {
            try SQLiteRegistryStore(path: directory.file("registry.db"))
        }
        XCTAssertTrue(error?.message.contains("schema version 99") ?? false)
    }

    func testARegistryOfSchemaVersion1IsUpgradedWhenOpened() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let path = directory.file("registry.db")
        let store = try await makeStore(in: directory, clock: clock)
        try await store.apply([.channel(app: "com.acme.app", activityID: "match-7", channelID: "dHN0LTE=")])
        store.close()
        // What version 1 wrote: no channel_storage_policy column (nor version 3's update_tokens_in_order, nor
        // version 4's channel_environment).
        let database = try SQLiteDatabase(path: path)
        try database.execute("ALTER TABLE activities DROP COLUMN channel_storage_policy")
        try database.execute("ALTER TABLE activities DROP COLUMN channel_environment")
        try database.execute("DROP INDEX update_tokens_in_order")
        try database.setUserVersion(1)
        database.close()

        var configuration = RegistryConfiguration()
        configuration.clock = clock.registryClock
        let upgraded = try SQLiteRegistryStore(path: path, configuration: configuration)
        let kept = try await upgraded.activity(app: "com.acme.app", activityID: "match-7")
        XCTAssertEqual(kept?.channelID, "dHN0LTE=", "what version 1 held is kept")
        XCTAssertNil(kept?.channelStoragePolicy)
        try await upgraded.apply([
            .channel(app: "com.acme.app", activityID: "match-8", channelID: "dHN0LTI=", storagePolicy: 0)
        ])
        let bound = try await upgraded.activity(app: "com.acme.app", activityID: "match-8")
        XCTAssertEqual(bound?.channelStoragePolicy, 0)
        upgraded.close()
        let reopened = try SQLiteDatabase(path: path)
        XCTAssertEqual(try reopened.identify(), .database(applicationID: 0x466E_5267, userVersion: 4))
        reopened.close()
    }

    func testARegistryOfSchemaVersion2IsUpgradedWhenOpenedAndItsCursorsStillWork() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let path = directory.file("registry.db")
        let store = try await makeStore(in: directory, clock: clock)
        let tokens = (0..<3).map { TestTokens.token($0) }
        try await store.apply(
            tokens.enumerated().map { index, token in
                .updateToken(.init(app: "com.acme.app", activityID: "match-7", deviceID: "d\(index)", token: token))
            })
        let first = try await store.liveUpdateTokens(
            app: "com.acme.app", activityID: "match-7", after: nil, limit: 1, now: clock.now)
        store.close()
        // What version 2 wrote: no update_tokens_in_order (nor version 4's channel_environment); and its cursors
        // were `expiry:row`.
        let database = try SQLiteDatabase(path: path)
        try database.execute("DROP INDEX update_tokens_in_order")
        try database.execute("ALTER TABLE activities DROP COLUMN channel_environment")
        try database.setUserVersion(2)
        database.close()
        let row = try XCTUnwrap(first.next?.rawValue)
        let versionTwoCursor = RegistryCursor(rawValue: "\(first.items[0].expiresAt):\(row)")

        var configuration = RegistryConfiguration()
        configuration.clock = clock.registryClock
        let upgraded = try SQLiteRegistryStore(path: path, configuration: configuration)
        clock.advance(milliseconds: 61_000)
        // Registered again: with version 2's paging it moved behind the cursor and was read twice.
        try await upgraded.register(
            .updateToken(.init(app: "com.acme.app", activityID: "match-7", deviceID: "d0", token: tokens[0])))
        var rest: [String] = []
        var cursor: RegistryCursor? = versionTwoCursor
        while let after = cursor {
            let page = try await upgraded.liveUpdateTokens(
                app: "com.acme.app", activityID: "match-7", after: after, limit: 1, now: clock.now)
            rest += page.items.map(\.token)
            cursor = page.next
        }
        XCTAssertEqual(rest, Array(tokens[1...]), "a version 2 cursor goes on after its row, each token once")
        upgraded.close()
        let reopened = try SQLiteDatabase(path: path)
        XCTAssertEqual(try reopened.identify(), .database(applicationID: 0x466E_5267, userVersion: 4))
        XCTAssertEqual(
            try reopened.scalarInt64(
                "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'update_tokens_in_order'"), 1)
        reopened.close()
    }

    func testARegistryOfSchemaVersion3IsUpgradedWhenOpened() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let path = directory.file("registry.db")
        let store = try await makeStore(in: directory, clock: clock)
        try await store.apply([
            .channel(app: "com.acme.app", activityID: "match-7", channelID: "dHN0LTE=", storagePolicy: 1)
        ])
        store.close()
        // What version 3 wrote: no channel_environment column.
        let database = try SQLiteDatabase(path: path)
        try database.execute("ALTER TABLE activities DROP COLUMN channel_environment")
        try database.setUserVersion(3)
        database.close()

        var configuration = RegistryConfiguration()
        configuration.clock = clock.registryClock
        let upgraded = try SQLiteRegistryStore(path: path, configuration: configuration)
        let kept = try await upgraded.activity(app: "com.acme.app", activityID: "match-7")
        XCTAssertEqual(kept?.channelID, "dHN0LTE=", "what version 3 held is kept")
        XCTAssertEqual(kept?.channelStoragePolicy, 1)
        XCTAssertNil(kept?.channelEnvironment, "bound before environments were recorded: unknown")
        try await upgraded.apply([
            .channel(app: "com.acme.app", activityID: "match-8", channelID: "dHN0LTI=", environment: "development")
        ])
        let bound = try await upgraded.activity(app: "com.acme.app", activityID: "match-8")
        XCTAssertEqual(bound?.channelEnvironment, "development")
        upgraded.close()
        let reopened = try SQLiteDatabase(path: path)
        XCTAssertEqual(try reopened.identify(), .database(applicationID: 0x466E_5267, userVersion: 4))
        reopened.close()
    }

    func testADamagedRegistryIsReportedCorrupt() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let path = directory.file("registry.db")
        let store = try await makeStore(in: directory, clock: clock)
        store.close()
        // Checkpointed and closed: the whole registry is in the main file. Overwrite its first page after the
        // 100-byte header: the schema table's b-tree page.
        let handle = try XCTUnwrap(FileHandle(forUpdatingAtPath: path))
        try handle.seek(toOffset: 100)
        handle.write(Data(repeating: 0xA5, count: 3_000))
        try handle.close()
        let error = await assertRegistryError(.corrupt) { try SQLiteRegistryStore(path: path) }
        XCTAssertTrue(error?.message.hasPrefix("\(path) is corrupt") ?? false, "\(String(describing: error))")
    }

    func testAWriteWaitsForAnotherProcesssLockThenFailsBusy() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock) { $0.busyTimeoutMilliseconds = 300 }
        // Another connection (as another process would) holds the write lock.
        let other = try SQLiteDatabase(path: directory.file("registry.db"), busyTimeoutMilliseconds: 0)
        try other.execute("BEGIN IMMEDIATE")
        let start = ContinuousClock.now
        let error = await assertRegistryError(.busy) {
            try await store.register(
                .updateToken(.init(app: "com.acme.app", activityID: "m", token: TestTokens.token(1))))
        }
        let waited = ContinuousClock.now - start
        XCTAssertGreaterThanOrEqual(waited, .milliseconds(250), "it waited for the busy timeout first")
        XCTAssertTrue(error?.message.contains("locked by another process") ?? false)
        // Reads go on meanwhile (WAL readers never wait for the writer).
        let stats = try await store.stats()
        XCTAssertEqual(stats.updateTokens, 0)
        try other.execute("ROLLBACK")
        try await store.register(
            .updateToken(.init(app: "com.acme.app", activityID: "m", token: TestTokens.token(1))))
    }

    func testAMissingDirectoryIsUnavailable() async throws {
        await assertRegistryError(.unavailable) {
            try SQLiteRegistryStore(path: "/nonexistent-fanout-dir/registry.db")
        }
    }
}
