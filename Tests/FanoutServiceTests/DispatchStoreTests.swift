import Fanout
import FanoutCore
import FanoutJobLines
import FanoutRegistry
import FanoutSQLite
import FanoutService
import Foundation
import Synchronization
import XCTest

final class DispatchStoreTests: XCTestCase {
    static let jobLine = Array(#"{"id":"match-7","app":"com.acme.app","activity_id":"match-7","event":"update"}"#.utf8)

    // MARK: Dispatches

    func testAcceptRoundTripsWithinItsWorkspaceAndIdempotencyKeyReturnsTheFirst() throws {
        let directory = try ScratchDirectory()
        let store = try DispatchStore(path: directory.file("fanout.db"))

        let (record, created) = try store.accept(
            workspace: "acme", app: "com.acme.app", kind: "update", jobLine: Self.jobLine, idempotency: nil,
            now: 1_000)
        XCTAssertTrue(created)
        XCTAssertTrue(DispatchStore.isWellFormedID(record.id), record.id)
        XCTAssertEqual(record.state, .queued)
        XCTAssertEqual(try store.dispatch(id: record.id, workspace: "acme"), record)
        XCTAssertNil(try store.dispatch(id: record.id, workspace: "other"), "another workspace gets a 404")
        XCTAssertNil(try store.dispatch(id: "d_aaaaaaaaaaaaaaaaaaaa", workspace: "acme"))

        let first = try store.accept(
            workspace: "acme", app: "com.acme.app", kind: "start", jobLine: Self.jobLine, idempotency: Self.key("k1"),
            now: 2_000)
        let retried = try store.accept(
            workspace: "acme", app: "com.acme.app", kind: "start", jobLine: [0x7B, 0x7D], idempotency: Self.key("k1"),
            now: 3_000)
        XCTAssertTrue(first.created)
        XCTAssertFalse(retried.created)
        XCTAssertEqual(retried.record, first.record)
        // The same key with another request is refused, naming the dispatch that took it; nothing is written.
        XCTAssertThrowsError(
            try store.accept(
                workspace: "acme", app: "com.acme.app", kind: "start", jobLine: Self.jobLine,
                idempotency: Self.key("k1", request: "another body"), now: 3_500)
        ) { error in
            XCTAssertEqual((error as? DispatchStoreError)?.kind, .idempotencyKeyReused)
            XCTAssertEqual((error as? DispatchStoreError)?.message, first.record.id)
        }
        let elsewhere = try store.accept(
            workspace: "globex", app: "com.globex.app", kind: "start", jobLine: Self.jobLine,
            idempotency: Self.key("k1"),
            now: 4_000)
        XCTAssertTrue(elsewhere.created, "keys are per workspace")
        XCTAssertNotEqual(elsewhere.record.id, first.record.id)
        XCTAssertEqual(try store.recent(workspace: nil, limit: 10).count, 3, "the retried POST wrote nothing")

        // A new store on the same file (a restart) sees them, and the registry still opens the file.
        store.close()
        let reopened = try DispatchStore(path: directory.file("fanout.db"))
        XCTAssertEqual(try reopened.dispatch(id: record.id, workspace: "acme"), record)
        try SQLiteRegistryStore(path: directory.file("fanout.db")).close()
    }

    /// An idempotency key as the API makes it, for a request whose body is `request`.
    static func key(_ key: String, request: String = "{}") -> IdempotencyKey {
        IdempotencyKey(key: key, method: "POST", path: "/v1/activities/match-7/update", body: Array(request.utf8))
    }

    /// A file whose dispatch tables are version 1 (no request digests) is upgraded when opened: its keys still return
    /// their dispatch to any request (nothing to compare with), and new keys keep their request's digest.
    func testVersion1TablesAreUpgradedAndTheirKeysStillAnswer() throws {
        let directory = try ScratchDirectory()
        let path = directory.file("fanout.db")
        let store = try DispatchStore(path: path)
        let old = try store.accept(
            workspace: "acme", app: "com.acme.app", kind: "start", jobLine: Self.jobLine, idempotency: Self.key("k1"),
            now: 1_000)
        store.close()
        let database = try SQLiteDatabase(path: path)
        try database.execute(
            """
            ALTER TABLE dispatches DROP COLUMN request_digest;
            UPDATE dispatch_meta SET value = 1 WHERE name = 'version';
            """)
        database.close()

        let upgraded = try DispatchStore(path: path)
        defer { upgraded.close() }
        let retried = try upgraded.accept(
            workspace: "acme", app: "com.acme.app", kind: "start", jobLine: Self.jobLine,
            idempotency: Self.key("k1", request: "whatever"), now: 2_000)
        XCTAssertFalse(retried.created)
        XCTAssertEqual(retried.record.id, old.record.id)
        _ = try upgraded.accept(
            workspace: "acme", app: "com.acme.app", kind: "start", jobLine: Self.jobLine, idempotency: Self.key("k2"),
            now: 3_000)
        XCTAssertThrowsError(
            try upgraded.accept(
                workspace: "acme", app: "com.acme.app", kind: "start", jobLine: Self.jobLine,
                idempotency: Self.key("k2", request: "another"), now: 4_000))
    }

    func testIdsAreDistinctAndWellFormed() {
        let ids = (0..<10_000).map { _ in DispatchStore.newID() }
        XCTAssertEqual(Set(ids).count, ids.count)
        XCTAssertTrue(ids.allSatisfy(DispatchStore.isWellFormedID))
        XCTAssertFalse(DispatchStore.isWellFormedID("d_AAAAAAAAAAAAAAAAAAAA"))
    }

    func testStateTransitionsUnfinishedAndRecent() throws {
        let directory = try ScratchDirectory()
        let store = try DispatchStore(path: directory.file("fanout.db"))
        var ids: [String] = []
        for (index, workspace) in ["acme", "globex", "acme", "acme"].enumerated() {
            ids.append(
                try store.accept(
                    workspace: workspace, app: "app", kind: "push", jobLine: Self.jobLine, idempotency: nil,
                    now: Int64(index)
                ).record.id)
        }
        XCTAssertEqual(try store.unfinished().map(\.id), ids)

        try store.markRunning(id: ids[0], now: 10)
        try store.markRunning(id: ids[1], now: 11)
        try store.markDone(id: ids[1], now: 20, payloadEncodings: 1, demoted: 2)
        try store.markRunning(id: ids[0], now: 30)  // resumed after a restart: started stays 10
        let running = try XCTUnwrap(try store.dispatch(id: ids[0], workspace: "acme"))
        XCTAssertEqual(running.state, .running)
        XCTAssertEqual(running.startedAt, 10)
        let done = try XCTUnwrap(try store.dispatch(id: ids[1], workspace: "globex"))
        XCTAssertEqual(done.state, .done)
        XCTAssertEqual(done.startedAt, 11)
        XCTAssertEqual(done.finishedAt, 20)
        XCTAssertEqual(done.payloadEncodings, 1)
        XCTAssertEqual(done.demoted, 2)
        try store.markRunning(id: ids[1], now: 40)
        XCTAssertEqual(try store.dispatch(id: ids[1], workspace: "globex")?.state, .done, "done stays done")

        XCTAssertEqual(try store.unfinished().map(\.id), [ids[0], ids[2], ids[3]], "oldest first")
        XCTAssertEqual(try store.recent(workspace: nil, limit: 10).map(\.id), ids.reversed())
        XCTAssertEqual(try store.recent(workspace: "acme", limit: 2).map(\.id), [ids[3], ids[2]])
        XCTAssertEqual(try store.recent(workspace: "initech", limit: 10), [])

        XCTAssertThrowsError(try store.markRunning(id: "d_bbbbbbbbbbbbbbbbbbbb", now: 1)) { error in
            XCTAssertEqual((error as? DispatchStoreError)?.kind, .notFound)
        }
        XCTAssertThrowsError(try store.markDone(id: "nope", now: 1, payloadEncodings: 0, demoted: 0))
    }

    func testRefusesAFileThatIsNotARegistry() throws {
        let directory = try ScratchDirectory()
        let path = directory.file("other.db")
        let other = try SQLiteDatabase(path: path)
        try other.execute("CREATE TABLE t (x INTEGER)")
        other.close()
        XCTAssertThrowsError(try DispatchStore(path: path)) { error in
            XCTAssertEqual((error as? DispatchStoreError)?.kind, .notARegistry, "\(error)")
        }
    }

    func testNewerDispatchTablesAreRefused() throws {
        let directory = try ScratchDirectory()
        let path = directory.file("fanout.db")
        try DispatchStore(path: path).close()
        let database = try SQLiteDatabase(path: path)
        try database.execute("UPDATE dispatch_meta SET value = 99 WHERE name = 'version'")
        database.close()
        XCTAssertThrowsError(try DispatchStore(path: path)) { error in
            XCTAssertEqual((error as? DispatchStoreError)?.kind, .unsupportedVersion, "\(error)")
        }
    }

    // MARK: Results

    func testOverlappingAppendsRecordEachPositionOnceWithExactCounts() throws {
        let directory = try ScratchDirectory()
        let store = try DispatchStore(path: directory.file("fanout.db"))
        let id = try Self.newDispatch(in: store)

        try store.appendResults((0..<10).map { Self.result($0, attempts: 2) }, dispatch: id)
        // Positions 5..<15 again (5..<10 resent after a crash, with another outcome): only 10..<15 are new.
        try store.appendResults((5..<15).map { Self.result($0, outcome: .failed) }, dispatch: id)

        let record = try XCTUnwrap(try store.dispatch(id: id, workspace: "acme"))
        XCTAssertEqual(record.counts.delivered, 10)
        XCTAssertEqual(record.counts.failed, 5)
        XCTAssertEqual(record.counts.retries, 10)
        XCTAssertEqual(record.notifications, 15)
        XCTAssertEqual(try Self.rowCount(directory.file("fanout.db")), 15)
        let resume = try store.resumePoint(id: id)
        XCTAssertEqual(resume.prefix, 15)
        XCTAssertEqual(resume.beyondPrefix, [])
        XCTAssertThrowsError(try store.appendResults([Self.result(0)], dispatch: "d_cccccccccccccccccccc"))
    }

    /// A `202` waits for its dispatch's commit: an accept that comes while a large batch of results is being written
    /// goes in after a few rows of it, not after the whole batch, and the batch's counts and done prefix stay exact.
    func testAnAcceptGoesBeforeTheRestOfAResultsBatchWrittenMeanwhile() throws {
        let directory = try ScratchDirectory()
        let store = try DispatchStore(path: directory.file("fanout.db"))
        let id = try Self.newDispatch(in: store)
        // Position 0 last: its row moves the done prefix over the whole batch.
        let batch = (1..<100_000).map { Self.result($0) } + [Self.result(0)]
        let writing = DispatchSemaphore(value: 0)
        let written = DispatchSemaphore(value: 0)
        let failure = FanoutMutex<Error?>(nil)
        Thread.detachNewThread {
            writing.signal()
            do { try store.appendResults(batch, dispatch: id) } catch { failure.withLock { $0 = error } }
            written.signal()
        }
        writing.wait()
        // Well inside the batch's transaction, which takes a few hundred milliseconds at the least.
        usleep(50_000)
        let accepted = try store.accept(
            workspace: "acme", app: "app", kind: "update", jobLine: Self.jobLine, idempotency: nil, now: 1)
        XCTAssertTrue(accepted.created)
        let meanwhile = try XCTUnwrap(try store.dispatch(id: id, workspace: "acme")).counts.delivered
        XCTAssertGreaterThan(meanwhile, 0, "the rows before the accept were committed first")
        XCTAssertLessThan(meanwhile, batch.count, "the accept did not wait for the whole batch")
        XCTAssertEqual(written.wait(timeout: .now() + 120), .success)
        XCTAssertNil(failure.withLock { $0 })
        let record = try XCTUnwrap(try store.dispatch(id: id, workspace: "acme"))
        XCTAssertEqual(record.counts.delivered, batch.count)
        XCTAssertEqual(try Self.rowCount(directory.file("fanout.db")), batch.count)
        let resume = try store.resumePoint(id: id)
        XCTAssertEqual(resume.prefix, batch.count)
        XCTAssertEqual(resume.beyondPrefix, [])
    }

    func testResumePointAfterOutOfOrderPositions() throws {
        let directory = try ScratchDirectory()
        let store = try DispatchStore(path: directory.file("fanout.db"))
        let id = try Self.newDispatch(in: store)
        XCTAssertEqual(try store.resumePoint(id: id).prefix, 0)

        try store.appendResults([1, 2, 5, 9].map { Self.result($0) }, dispatch: id)
        var resume = try store.resumePoint(id: id)
        XCTAssertEqual(resume.prefix, 0)
        XCTAssertEqual(resume.beyondPrefix, [1, 2, 5, 9])

        try store.appendResults([0, 4].map { Self.result($0) }, dispatch: id)
        resume = try store.resumePoint(id: id)
        XCTAssertEqual(resume.prefix, 3, "0, 1 and 2 are done; 3 is not")
        XCTAssertEqual(resume.beyondPrefix, [4, 5, 9])

        try store.appendResults([3, 7, 6].map { Self.result($0) }, dispatch: id)
        resume = try store.resumePoint(id: id)
        XCTAssertEqual(resume.prefix, 8)
        XCTAssertEqual(resume.beyondPrefix, [9])
        XCTAssertThrowsError(try store.resumePoint(id: "d_dddddddddddddddddddd"))
    }

    func testResultsPageInPositionOrderAsResultLines() throws {
        let directory = try ScratchDirectory()
        let store = try DispatchStore(path: directory.file("fanout.db"))
        let id = try Self.newDispatch(in: store)
        var unregistered = Self.result(3, outcome: .unregistered)
        unregistered.status = 410
        unregistered.reason = "Unregistered"
        unregistered.timestamp = 1_764_460_800_123
        var limited = Self.result(4, outcome: .rateLimited)
        limited.retryAfterSeconds = 1.25
        limited.apnsID = nil
        // Lowercase UUIDs, kept as words inside the engine (and a 64-digit token as four): bound from their bytes.
        var lowercaseIDs = Self.result(2)
        lowercaseIDs.apnsID = "eabeae54-14a8-11e5-b60b-1697f925ec7b"
        lowercaseIDs.apnsUniqueID = "0b8e5a1c-2d3f-4e60-8a9b-c0d1e2f3a4b5"
        try store.appendResults([lowercaseIDs, limited, Self.result(0), unregistered, Self.result(1)], dispatch: id)

        XCTAssertNil(try store.results(id: id, workspace: "globex", after: -1, limit: 10))
        let first = try XCTUnwrap(try store.results(id: id, workspace: "acme", after: -1, limit: 2))
        XCTAssertEqual(first.last, 1)
        let second = try XCTUnwrap(try store.results(id: id, workspace: "acme", after: first.last, limit: 2))
        XCTAssertEqual(second.last, 3)
        let third = try XCTUnwrap(try store.results(id: id, workspace: "acme", after: second.last, limit: 2))
        XCTAssertEqual(third.last, 4)
        let end = try XCTUnwrap(try store.results(id: id, workspace: "acme", after: third.last, limit: 2))
        XCTAssertEqual(end.lines, [])
        XCTAssertEqual(end.last, 4)

        let lines = (first.lines + second.lines + third.lines).split(separator: UInt8(ascii: "\n"))
        XCTAssertEqual(lines.count, 5)
        let objects = try lines.map { line in try XCTUnwrap(try JSONValue.parse(line).objectValue) }
        XCTAssertEqual(objects.map { $0["token"]?.stringValue }, (0..<5).map { Self.token($0) })
        XCTAssertEqual(objects.map { $0["job"]?.stringValue }, Array(repeating: "match-7", count: 5))
        XCTAssertEqual(objects[3]["outcome"]?.stringValue, "unregistered")
        XCTAssertEqual(objects[3]["status"]?.int64Value, 410)
        XCTAssertEqual(objects[3]["reason"]?.stringValue, "Unregistered")
        XCTAssertEqual(objects[3]["timestamp"]?.int64Value, 1_764_460_800_123)
        XCTAssertEqual(objects[4]["retry_after_s"]?.doubleValue, 1.25)
        XCTAssertEqual(objects[4]["apns_id"], .null)
        XCTAssertEqual(objects[0]["attempts"]?.int64Value, 1)
        XCTAssertEqual(objects[0]["latency_ms"]?.doubleValue, 12.5)
        // Byte for byte what the results file would hold.
        var expected: [UInt8] = []
        ResultLine.append(Self.result(0), to: &expected)
        XCTAssertEqual(Array(lines[0]) + [UInt8(ascii: "\n")], expected)
        expected = []
        ResultLine.append(lowercaseIDs, to: &expected)
        XCTAssertEqual(Array(lines[2]) + [UInt8(ascii: "\n")], expected)
    }

    func testJobLevelResultsAreStoredOnceEachAndListedFirst() throws {
        let directory = try ScratchDirectory()
        let store = try DispatchStore(path: directory.file("fanout.db"))
        let id = try Self.newDispatch(in: store)
        let invalid = NotificationResult(jobID: "match-7", token: nil, outcome: .invalid, reason: "job match-7: bad")
        try store.appendResults([Self.result(0), invalid], dispatch: id)
        try store.appendResults([invalid], dispatch: id)

        XCTAssertEqual(try store.dispatch(id: id, workspace: "acme")?.counts.invalid, 2)
        XCTAssertEqual(try store.resumePoint(id: id).prefix, 1, "job-level results are no recipient's")
        let page = try XCTUnwrap(try store.results(id: id, workspace: "acme", after: -1, limit: 10))
        let outcomes = try page.lines.split(separator: UInt8(ascii: "\n")).map {
            try JSONValue.parse($0).objectValue?["outcome"]?.stringValue
        }
        XCTAssertEqual(outcomes, ["invalid", "invalid", "delivered"])
        XCTAssertEqual(page.last, 0)
    }

    // MARK: The result buffer

    func testResultBufferRecordsResultsFromFourThreadsExactlyOnce() async throws {
        let directory = try ScratchDirectory()
        let path = directory.file("fanout.db")
        let store = try DispatchStore(path: path)
        let id = try Self.newDispatch(in: store)
        let buffer = DispatchResultBuffer(store: store, dispatchID: id)
        let total = 200_000
        let threads = 4
        let started = ContinuousClock.now
        DispatchQueue.concurrentPerform(iterations: threads) { thread in
            // Interleaved positions, as loops finish them: thread t adds t, t + 4, t + 8, ...
            for position in stride(from: thread, to: total, by: threads) { buffer.add(Self.result(position)) }
        }
        try await buffer.flush()
        let elapsed = ContinuousClock.now - started
        XCTAssertEqual(buffer.waiting, 0)

        let record = try XCTUnwrap(try store.dispatch(id: id, workspace: "acme"))
        XCTAssertEqual(record.counts.delivered, total)
        XCTAssertEqual(try Self.rowCount(path), total)
        XCTAssertEqual(try store.resumePoint(id: id).prefix, total)
        XCTAssertEqual(try store.resumePoint(id: id).beyondPrefix, [])
        try await buffer.flush()  // nothing new: returns at once
        print(
            "DispatchResultBuffer: \(total) results from \(threads) threads in \(elapsed), max waiting \(buffer.maxWaiting)"
        )
    }

    /// A writer that cannot commit (another connection holds the file's write lock) holds `add` back once
    /// `maxUncommitted` results wait: the engine gives a notification's in-flight permit back only when `add` returns,
    /// so sending pauses, and a crash then can send twice at most the in-flight ones plus those 1,024. Once the lock
    /// is gone every result is committed, exactly once.
    func testResultBufferHoldsAddBackWhileMaxUncommittedWaitForTheDisk() async throws {
        let directory = try ScratchDirectory()
        let path = directory.file("fanout.db")
        let store = try DispatchStore(path: path)
        let id = try Self.newDispatch(in: store)
        let blocker = try SQLiteDatabase(path: path, mode: .readWrite)
        defer { blocker.close() }
        try blocker.execute("BEGIN IMMEDIATE")

        let buffer = DispatchResultBuffer(store: store, dispatchID: id)
        let total = 5_000
        let returned = Atomic<Int>(0)
        let adder = Thread {
            for position in 0..<total {
                buffer.add(Self.result(position))
                returned.add(1, ordering: .relaxed)
            }
        }
        adder.start()
        // The adder stops at the cap: everything it added waits, none is committed.
        let deadline = ContinuousClock.now + .seconds(4)
        while buffer.waiting < DispatchResultBuffer.maxUncommitted && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        XCTAssertEqual(buffer.waiting, DispatchResultBuffer.maxUncommitted)
        XCTAssertLessThanOrEqual(returned.load(ordering: .relaxed), DispatchResultBuffer.maxUncommitted)
        XCTAssertEqual(try Self.rowCount(path), 0, "nothing committed while the lock is held")
        try blocker.execute("ROLLBACK")

        while returned.load(ordering: .relaxed) < total && ContinuousClock.now < deadline + .seconds(20) {
            try await Task.sleep(for: .milliseconds(5))
        }
        XCTAssertEqual(returned.load(ordering: .relaxed), total, "every add returned once the writer caught up")
        try await buffer.flush()
        XCTAssertLessThanOrEqual(buffer.maxWaiting, DispatchResultBuffer.maxUncommitted)
        XCTAssertEqual(try Self.rowCount(path), total)
        XCTAssertEqual(try store.resumePoint(id: id).prefix, total)
    }

    // MARK: Helpers

    static func token(_ position: Int) -> String {
        let digits = String(position, radix: 16)
        return String(repeating: "a", count: 64 - digits.count) + digits
    }

    /// The id of a new update dispatch of workspace `acme`, accepted at time 0.
    static func newDispatch(in store: DispatchStore) throws -> String {
        try store.accept(
            workspace: "acme", app: "app", kind: "update", jobLine: jobLine, idempotency: nil, now: 0
        ).record.id
    }

    static func result(_ position: Int, outcome: NotificationOutcome = .delivered, attempts: Int = 1)
        -> NotificationResult
    {
        var result = NotificationResult(
            jobID: "match-7", token: token(position), outcome: outcome, status: outcome == .delivered ? 200 : nil,
            apnsID: "8F1E2D3C-4B5A-6978-8695-A4B3C2D1E0F\(position % 10)", attempts: attempts,
            latency: .microseconds(12_500))
        result.position = position
        return result
    }

    /// Result rows in the file, counted with a connection of the test's own.
    static func rowCount(_ path: String) throws -> Int {
        let database = try SQLiteDatabase(path: path, mode: .readOnly)
        defer { database.close() }
        return Int(try database.scalarInt64("SELECT count(*) FROM dispatch_results") ?? -1)
    }
}

/// A scratch directory removed after the test.
final class ScratchDirectory {
    let path: String

    init(_ name: String = #function) throws {
        let base = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent(
            "fanout-dispatch-\(name.filter { $0.isLetter || $0.isNumber })-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: base, withIntermediateDirectories: true)
        path = base.path
    }

    func file(_ name: String) -> String { path + "/" + name }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }
}
