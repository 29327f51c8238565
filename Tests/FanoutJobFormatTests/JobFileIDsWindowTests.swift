import FanoutJobFormat
import XCTest

/// A followed queue remembers the ids of its last lines only: a repeat within the window is refused, one past it is
/// not, and memory stays at the window however many lines go by.
final class JobFileIDsWindowTests: XCTestCase {
    func testARepeatWithinTheWindowIsRefusedAndMemoryStaysAtTheWindow() {
        var ids = JobFileIDs(window: 3)
        for line in 1...3 { XCTAssertNil(ids.claim("job-\(line)", line: line).duplicate) }
        let repeated = ids.claim("job-1", line: 4)
        XCTAssertEqual(repeated.key, "line-4")
        XCTAssertTrue(
            repeated.duplicate?.message.contains("line 1") == true, "\(String(describing: repeated.duplicate))")
        // line-4 took the window's newest slot, so job-1 and job-2 have left it: job-1 may come back.
        XCTAssertNil(ids.claim("job-5", line: 5).duplicate)
        XCTAssertNil(ids.claim("job-1", line: 6).duplicate, "job-1's line left the window")
        XCTAssertNotNil(ids.claim("job-5", line: 7).duplicate, "job-5's line is still in it")
        for line in 8...10_000 { _ = ids.claim("job-\(line)", line: line) }
        XCTAssertEqual(ids.count, 3)
        var unbounded = JobFileIDs()
        for line in 1...1_000 { _ = unbounded.claim("job-\(line)", line: line) }
        XCTAssertNotNil(unbounded.claim("job-1", line: 1_001).duplicate, "a finished file keeps every id")
    }
}
