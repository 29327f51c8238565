import Fanout
import Foundation
import XCTest

/// `PushNotification`'s typed constructors set what APNs requires of each push type, so mock-apns's validator
/// (APNs's rules for push type, topic suffix and priority) accepts each as it is built.
final class TypedSendTests: XCTestCase {
    func testEachTypedNotificationIsWhatAPNsAccepts() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let token = testDeviceToken(1)
        let notifications: [PushNotification] = [
            try .alert(AlertPayload(title: "Goal!", body: "2-1", badge: 3), to: token, app: "com.example.app"),
            try .background(to: token, app: "com.example.app"),
            try .liveActivity(
                LiveActivityContent(
                    event: .update, timestamp: 1_764_460_800, contentState: try RawJSON(validating: #"{"home":2}"#)),
                to: token, app: "com.example.app", priority: .considerate),
            try .raw(.voip, payload: try RawJSON(validating: #"{"call":"c-1"}"#), to: token, app: "com.example.app"),
        ]
        XCTAssertEqual(
            notifications.map(\.headers.topic),
            ["com.example.app", "com.example.app", "com.example.app.push-type.liveactivity", "com.example.app.voip"])
        XCTAssertEqual(notifications[1].headers.effectivePriority, 5, "background goes at 5")
        for notification in notifications {
            let result = try await engine.send(notification)
            XCTAssertEqual(result.outcome, .delivered, "\(notification.headers.pushType): \(result.reason ?? "")")
        }
        await engine.shutdown()
    }

    func testAnInvalidPayloadIsRefusedWhereItIsBuilt() {
        XCTAssertThrowsError(try PushNotification.alert(AlertPayload(), to: testDeviceToken(1), app: "com.example.app"))
        { error in
            XCTAssertEqual((error as? FanoutError)?.kind, .invalidNotification)
        }
    }
}
