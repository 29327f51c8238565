import FanoutCore
import XCTest

final class APNsReasonTests: XCTestCase {
    /// docs/reference/apns.md, "Status codes and reasons", with its decisions of Fanout's own: reason, status,
    /// class, drops the token, reconnects.
    let expectations: [(APNsReason, String, Int, ReasonClass, Bool, Bool)] = [
        (.badCollapseId, "BadCollapseId", 400, .configuration, false, false),
        (.badDeviceToken, "BadDeviceToken", 400, .permanent, true, false),
        (.badExpirationDate, "BadExpirationDate", 400, .configuration, false, false),
        (.badMessageId, "BadMessageId", 400, .configuration, false, false),
        (.badPriority, "BadPriority", 400, .configuration, false, false),
        (.badTopic, "BadTopic", 400, .configuration, false, false),
        (.deviceTokenNotForTopic, "DeviceTokenNotForTopic", 400, .permanent, true, false),
        (.duplicateHeaders, "DuplicateHeaders", 400, .configuration, false, false),
        (.idleTimeout, "IdleTimeout", 400, .transient, false, true),
        (.invalidPushType, "InvalidPushType", 400, .configuration, false, false),
        (.missingDeviceToken, "MissingDeviceToken", 400, .configuration, false, false),
        (.missingTopic, "MissingTopic", 400, .configuration, false, false),
        (.payloadEmpty, "PayloadEmpty", 400, .configuration, false, false),
        (.topicDisallowed, "TopicDisallowed", 400, .configuration, false, false),
        (.badPayload, "BadPayload", 400, .configuration, false, false),
        (.badCertificate, "BadCertificate", 403, .configuration, false, false),
        (.badCertificateEnvironment, "BadCertificateEnvironment", 403, .configuration, false, false),
        (.expiredProviderToken, "ExpiredProviderToken", 403, .providerTokenRefresh, false, true),
        (.forbidden, "Forbidden", 403, .configuration, false, false),
        (.invalidProviderToken, "InvalidProviderToken", 403, .configuration, false, false),
        (.missingProviderToken, "MissingProviderToken", 403, .configuration, false, false),
        (.unrelatedKeyIdInToken, "UnrelatedKeyIdInToken", 403, .providerTokenRefresh, false, true),
        (.badEnvironmentKeyIdInToken, "BadEnvironmentKeyIdInToken", 403, .configuration, false, false),
        (.badEnvironmentKeyInToken, "BadEnvironmentKeyInToken", 403, .configuration, false, false),
        (.badPath, "BadPath", 404, .configuration, false, false),
        (.methodNotAllowed, "MethodNotAllowed", 405, .configuration, false, false),
        (.expiredToken, "ExpiredToken", 410, .permanent, true, false),
        (.unregistered, "Unregistered", 410, .permanent, true, false),
        (.payloadTooLarge, "PayloadTooLarge", 413, .configuration, false, false),
        (.tooManyProviderTokenUpdates, "TooManyProviderTokenUpdates", 429, .providerTokenThrottled, false, false),
        (.tooManyRequests, "TooManyRequests", 429, .transient, false, false),
        (.internalServerError, "InternalServerError", 500, .transient, false, false),
        (.serviceUnavailable, "ServiceUnavailable", 503, .transient, false, true),
        (.shutdown, "Shutdown", 503, .transient, false, true),
    ]

    func testEveryKnownReasonHasItsStatusAndClass() {
        for (reason, name, status, reasonClass, invalidates, reconnects) in expectations {
            XCTAssertEqual(reason.rawValue, name)
            XCTAssertEqual(reason.description, name)
            XCTAssertEqual(APNsReason(name), reason)
            XCTAssertTrue(reason.isKnown, name)
            XCTAssertEqual(APNsReason.statusFor(reason), status, name)
            XCTAssertEqual(reason.reasonClass, reasonClass, name)
            XCTAssertEqual(reason.invalidatesToken, invalidates, name)
            XCTAssertEqual(reason.requiresNewConnection, reconnects, name)
            XCTAssertEqual(ReasonClass(status: status, reason: reason), reasonClass, name)
        }
    }

    func testTheTableCoversEveryKnownReason() {
        XCTAssertEqual(Set(APNsReason.allKnown), Set(expectations.map(\.0)))
        XCTAssertEqual(APNsReason.allKnown.count, expectations.count)
    }

    func testUnknownReasonIsKeptAndClassifiedByStatus() {
        let reason = APNsReason("SomethingNew")
        XCTAssertEqual(reason.rawValue, "SomethingNew")
        XCTAssertFalse(reason.isKnown)
        XCTAssertNil(reason.reasonClass)
        XCTAssertNil(APNsReason.statusFor(reason))
        XCTAssertFalse(reason.invalidatesToken)
        XCTAssertEqual(ReasonClass(status: 500, reason: reason), .transient)
        XCTAssertEqual(ReasonClass(status: 503, reason: reason), .transient)
        XCTAssertEqual(ReasonClass(status: 429, reason: reason), .transient)
        XCTAssertEqual(ReasonClass(status: 400, reason: reason), .configuration)
        XCTAssertEqual(ReasonClass(status: 403, reason: reason), .configuration)
        XCTAssertEqual(ReasonClass(status: 410, reason: reason), .permanent)
        XCTAssertEqual(ReasonClass(status: 502, reason: nil), .transient)
        XCTAssertEqual(ReasonClass(status: 418, reason: nil), .configuration)
    }

    func testKnownReasonWinsOverStatus() {
        // IdleTimeout arrives as a 400 but is transient; Unregistered is permanent whatever the status says.
        XCTAssertEqual(ReasonClass(status: 400, reason: .idleTimeout), .transient)
        XCTAssertEqual(ReasonClass(status: 500, reason: .unregistered), .permanent)
    }

    func testRetryability() {
        XCTAssertFalse(ReasonClass.permanent.isRetryable)
        XCTAssertFalse(ReasonClass.configuration.isRetryable)
        XCTAssertTrue(ReasonClass.transient.isRetryable)
        XCTAssertTrue(ReasonClass.providerTokenRefresh.isRetryable)
        XCTAssertTrue(ReasonClass.providerTokenThrottled.isRetryable)
        XCTAssertEqual(ReasonClass.providerTokenThrottled.description, "providerTokenThrottled")
    }

    func testReasonsApplesSaysNeverToRetryAreNotRetryable() {
        let neverRetry: [APNsReason] = [
            .badDeviceToken, .deviceTokenNotForTopic, .forbidden, .expiredToken, .unregistered, .payloadTooLarge,
        ]
        for reason in neverRetry {
            XCTAssertEqual(reason.reasonClass?.isRetryable, false, "\(reason)")
        }
    }
}
