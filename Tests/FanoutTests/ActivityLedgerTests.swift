import XCTest

@testable import Fanout

/// `ActivityLedger` in a long-running engine: an activity quiet for an hour, whose job is gone, is forgotten once
/// the ledger has grown, so memory does not grow with every activity ever updated; a job still sending keeps its
/// activity's entry (it must still be superseded by a newer update).
final class ActivityLedgerTests: XCTestCase {
    private func run(_ id: String) -> FanoutRun {
        FanoutRun(jobID: id, onResult: { _ in }, deliversOnLoop: false, cancelOnLoops: { _ in })
    }

    func testQuietActivitiesWhoseJobsAreGoneAreForgotten() {
        let ledger = ActivityLedger()
        let sending = run("still-sending")
        XCTAssertEqual(
            ledger.claim(
                key: "live", timestamp: 1, persistedTimestamp: nil, resuming: false, run: sending, nowSeconds: 0),
            .latest)
        for index in 0..<ActivityLedger.minimumForgetThreshold {
            _ = ledger.claim(
                key: "match-\(index)", timestamp: 1, persistedTimestamp: nil, resuming: false, run: run("\(index)"),
                nowSeconds: 0)
        }
        XCTAssertEqual(ledger.activityCount, ActivityLedger.minimumForgetThreshold + 1, "nothing forgotten yet")
        // An hour later, one more claim sweeps: only the activity whose job is still sending, and the new one, stay.
        _ = ledger.claim(
            key: "new", timestamp: 1, persistedTimestamp: nil, resuming: false, run: run("new"), nowSeconds: 3_601)
        XCTAssertEqual(ledger.activityCount, 2)
        // The job still sending is still superseded by a newer update to its activity.
        _ = ledger.claim(
            key: "live", timestamp: 2, persistedTimestamp: nil, resuming: false, run: run("newer"), nowSeconds: 3_602)
        XCTAssertTrue(sending.isSuperseded)
    }

    /// A dispatch run again after a failure mid-send (its registry read failed, say) is its own earlier run with the
    /// same timestamp: resuming, it is not stale, here as in the registry. A new job with that timestamp still is.
    func testAResumedRunOfTheSameContentIsNotStale() {
        let ledger = ActivityLedger()
        let first = run("dispatch")
        XCTAssertEqual(
            ledger.claim(key: "match", timestamp: 7, persistedTimestamp: nil, resuming: false, run: first), .latest)
        XCTAssertEqual(
            ledger.claim(key: "match", timestamp: 7, persistedTimestamp: 7, resuming: true, run: run("dispatch")),
            .latest, "the resumed run goes on")
        XCTAssertEqual(
            ledger.claim(key: "match", timestamp: 7, persistedTimestamp: 7, resuming: false, run: run("another")),
            .stale, "another job with the same content is superseded")
        XCTAssertEqual(
            ledger.claim(key: "match", timestamp: 6, persistedTimestamp: 7, resuming: true, run: run("older")),
            .stale, "an older content is superseded, resumed or not")
    }
}
