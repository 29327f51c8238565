// A result's typed view: the outcome as an enum to switch over, APNs's reason typed, and what to do about it.
import Fanout
import XCTest

final class NotificationActionTests: XCTestCase {
    private func result(_ outcome: NotificationOutcome, status: Int? = nil, reason: String? = nil) -> NotificationResult
    {
        NotificationResult(
            jobID: "j", token: String(repeating: "ab", count: 32), outcome: outcome, status: status, reason: reason)
    }

    func testEveryOutcomeHasAKindWhoseNameItKeeps() {
        XCTAssertEqual(NotificationOutcome.all.map(\.kind), NotificationOutcome.Kind.allCases)
        XCTAssertEqual(NotificationOutcome(named: "rate_limited").kind, .rateLimited)
    }

    func testTheActionSaysWhatToDo() {
        XCTAssertEqual(result(.delivered, status: 200).action, .none)
        XCTAssertEqual(result(.unregistered, status: 410, reason: "Unregistered").action, .dropToken)
        XCTAssertEqual(result(.unregistered, reason: "BadDeviceToken").action, .dropToken, "found by Fanout")
        XCTAssertEqual(result(.failed, status: 429, reason: "TooManyRequests").action, .retryLater)
        XCTAssertEqual(result(.failed, reason: "DeadlineExceeded").action, .retryLater)
        XCTAssertEqual(result(.rateLimited).action, .retryLater)
        XCTAssertEqual(result(.rejected, status: 400, reason: "BadTopic").action, .fixRequest)
        XCTAssertEqual(result(.rejected, status: 413, reason: "PayloadTooLarge").action, .fixRequest)
        XCTAssertEqual(result(.rejected, status: 403, reason: "InvalidProviderToken").action, .fixCredentials)
        XCTAssertEqual(result(.rejected, status: 400, reason: "TopicDisallowed").action, .fixCredentials)
        XCTAssertEqual(result(.invalid, reason: "line 3: ...").action, .fixRequest)
        XCTAssertEqual(result(.cancelled, reason: "Cancelled").action, .none)
    }

    func testAPNsReasonIsTypedOnlyWhenAPNsAnswered() {
        XCTAssertEqual(result(.failed, status: 429, reason: "TooManyRequests").apnsReason, .tooManyRequests)
        XCTAssertNil(result(.failed, reason: "DeadlineExceeded").apnsReason, "Fanout's own reason")
        XCTAssertEqual(result(.rejected, status: 400, reason: "SomethingNew").apnsReason?.rawValue, "SomethingNew")
    }

    func testAJobLevelResultHasNoRecipientIndex() {
        XCTAssertNil(NotificationResult(jobID: "j", token: nil, outcome: .invalid).recipientIndex)
    }
}
