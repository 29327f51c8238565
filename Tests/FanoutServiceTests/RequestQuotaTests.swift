import FanoutPolicy
import XCTest

final class RequestQuotaTests: XCTestCase {
    private let wall = 1_700_000_000.0

    func testABurstThenRefusalWithRetryAfterAndACountdown() {
        var quota = RequestQuota(rule: RequestQuotaRule(requestsPerHour: 100, burst: 10))
        for expected in stride(from: 9, through: 0, by: -1) {
            let decision = quota.take(now: 1_000, wallClockSeconds: wall)
            XCTAssertTrue(decision.admitted)
            XCTAssertEqual(decision.remaining, expected)
            XCTAssertEqual(decision.limit, 100)
        }
        let refused = quota.take(now: 1_000, wallClockSeconds: wall)
        XCTAssertFalse(refused.admitted)
        XCTAssertEqual(refused.remaining, 0)
        // 100 per hour: one request every 36 s; the bucket is full again after 10 × 36 s.
        XCTAssertEqual(refused.retryAfterSeconds, 36)
        XCTAssertEqual(refused.resetAtUnixSeconds, Int64(wall) + 360)
        // 36 s later one request is back.
        let later = quota.take(now: 1_000 + 36_000_000_000, wallClockSeconds: wall + 36)
        XCTAssertTrue(later.admitted)
        XCTAssertEqual(later.remaining, 0)
    }

    func testRefillsNoFurtherThanTheBurst() {
        var quota = RequestQuota(rule: RequestQuotaRule(requestsPerHour: 3600, burst: 5))
        _ = quota.take(now: 0, wallClockSeconds: wall)
        let decision = quota.take(now: 3_600_000_000_000, wallClockSeconds: wall + 3600)
        XCTAssertEqual(decision.remaining, 4, "a quiet hour refills to the burst, not past it")
    }

    func testBurstSecondsIsAShareOfTheHourlyRate() {
        XCTAssertEqual(RequestQuotaRule(requestsPerHour: 250_000, burstSeconds: 60).burst, 4166)
        XCTAssertEqual(RequestQuotaRule(requestsPerHour: 10, burstSeconds: 60).burst, 1)
    }
}
