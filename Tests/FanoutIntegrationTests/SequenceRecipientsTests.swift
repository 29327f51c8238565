import Fanout
import Synchronization
import XCTest

/// Recipients from the caller's own `AsyncSequence`: pulled while sending, never read ahead of what may be in flight,
/// and a sequence that throws ends the job as a tokens file that breaks mid-read does.
final class SequenceRecipientsTests: XCTestCase {
    /// A database cursor stand-in: yields `count` tokens on demand, records how far it has been read, and throws after
    /// `failAfter` tokens when set.
    struct Cursor: AsyncSequence, Sendable {
        let count: Int
        let failAfter: Int?
        let yielded: Counter

        struct AsyncIterator: AsyncIteratorProtocol {
            let cursor: Cursor
            var next = 0
            mutating func next() async throws -> String? {
                if let failAfter = cursor.failAfter, next == failAfter { throw CursorError() }
                guard next < cursor.count else { return nil }
                defer { next += 1 }
                cursor.yielded.value.add(1, ordering: .sequentiallyConsistent)
                return testDeviceToken(next)
            }
        }
        func makeAsyncIterator() -> AsyncIterator { AsyncIterator(cursor: self) }
    }

    struct CursorError: Error, CustomStringConvertible {
        var description: String { "cursor lost its connection" }
    }

    final class Counter: Sendable {
        let value = Atomic<Int>(0)
    }

    private func job(_ id: String, _ recipients: Recipients) -> FanoutJob {
        FanoutJob(
            id: id, headers: NotificationHeaders(pushType: .alert, topic: "com.example.app"),
            payload: .raw(Array(#"{"aps":{"alert":"hi"}}"#.utf8)), recipients: recipients)
    }

    func testEveryTokenOfASequenceIsSentOnceAndItIsReadOnlyAsFarAsSendingNeeds() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let maxInFlight = 100
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.maxInFlight = maxInFlight }
        let yielded = Counter()
        let cursor = Cursor(count: 10_000, failAfter: nil, yielded: yielded)
        // At each result, the cursor must not be further ahead of the results seen than what may be in flight, one
        // batch read while waiting for room, and results finished but not yet handed to this closure (each at most
        // `maxInFlight`): memory stays bounded, and the sequence is never read to its end first.
        let finished = FanoutMutex((count: 0, maxAhead: 0, positions: Set<Int>()))
        let summary = try await engine.run(job("cursor", .sequence(TokenSequence(cursor)))) { result in
            let read = yielded.value.load(ordering: .sequentiallyConsistent)
            finished.withLock {
                $0.count += 1
                $0.maxAhead = max($0.maxAhead, read - $0.count)
                if let index = result.recipientIndex { $0.positions.insert(index) }
            }
        }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.delivered, 10_000)
        XCTAssertEqual(mock.stats.accepted, 10_000)
        let state = finished.withLock { $0 }
        XCTAssertEqual(state.positions, Set(0..<10_000), "one result per recipient, by its index in the sequence")
        XCTAssertLessThanOrEqual(state.maxAhead, 3 * maxInFlight, "read ahead of the results: \(state.maxAhead)")
    }

    func testASequenceThatThrowsSendsWhatItYieldedAndEndsWithOneInvalidResultNamingTheError() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let cursor = Cursor(count: 1_000, failAfter: 300, yielded: Counter())
        let invalid = FanoutMutex<[NotificationResult]>([])
        let summary = try await engine.run(job("broken-cursor", .sequence(TokenSequence(cursor)))) { result in
            if result.outcome == .invalid { invalid.withLock { $0.append(result) } }
        }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.delivered, 300)
        XCTAssertEqual(mock.stats.accepted, 300)
        let reasons = invalid.withLock { $0.map { $0.reason ?? "" } }
        XCTAssertEqual(reasons.count, 1)
        XCTAssertTrue(reasons.first?.contains("cursor lost its connection") == true, "\(reasons)")
        XCTAssertTrue(reasons.first?.contains("after 300 recipients") == true, "\(reasons)")
    }

    func testTheSameJobRunTwiceReadsItsSequenceAgain() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let cursor = Cursor(count: 50, failAfter: nil, yielded: Counter())
        let twice = job("twice", .sequence(TokenSequence(cursor)))
        let first = try await engine.run(twice) { _ in }
        let second = try await engine.run(twice) { _ in }
        await engine.shutdown()
        XCTAssertEqual(first.counts.delivered, 50)
        XCTAssertEqual(second.counts.delivered, 50)
        XCTAssertEqual(mock.stats.accepted, 100)
    }
}
