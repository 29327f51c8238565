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
}
