// The worker's cache of parsed job lines: bounded, least recently used dropped first, and an enqueue of a job id is
// an entry of its own (FleetWorkerTests shows what the worker sends with it).
import XCTest

@testable import FanoutFleet

final class FleetJobCacheTests: XCTestCase {
    private typealias Key = FleetJobCache<String>.Key

    func testPastItsCapacityTheLeastRecentlyUsedJobIsDropped() {
        let cache = FleetJobCache<String>(capacity: 2)
        let a = Key(job: "a", enqueueID: "1")
        let b = Key(job: "b", enqueueID: "1")
        let c = Key(job: "c", enqueueID: "1")
        cache.insert("line a", for: a)
        cache.insert("line b", for: b)
        XCTAssertEqual(cache.value(for: a), "line a", "a is now used more recently than b")
        cache.insert("line c", for: c)
        XCTAssertEqual(cache.count, 2)
        XCTAssertNil(cache.value(for: b), "the least recently used went")
        XCTAssertEqual(cache.value(for: a), "line a")
        XCTAssertEqual(cache.value(for: c), "line c")
        // Thousands of jobs through one worker leave it at its capacity.
        for job in 0..<1_000 { cache.insert("line", for: Key(job: "job-\(job)", enqueueID: "1")) }
        XCTAssertEqual(cache.count, 2)
    }

    func testAJobIDEnqueuedAgainIsAnotherEntryAndAGoneJobDropsThemAll() {
        let cache = FleetJobCache<String>(capacity: 8)
        let first = Key(job: "reused", enqueueID: "first")
        let second = Key(job: "reused", enqueueID: "second")
        cache.insert("first line", for: first)
        XCTAssertNil(cache.value(for: second), "the first enqueue's line is not the second's")
        cache.insert("second line", for: second)
        cache.insert("other line", for: Key(job: "other", enqueueID: "first"))
        XCTAssertEqual(cache.value(for: first), "first line")
        XCTAssertEqual(cache.value(for: second), "second line")
        cache.removeAll(job: "reused")
        XCTAssertNil(cache.value(for: first))
        XCTAssertNil(cache.value(for: second))
        XCTAssertEqual(cache.value(for: Key(job: "other", enqueueID: "first")), "other line")
    }
}
