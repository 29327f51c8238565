import FanoutCore
import FanoutTestSupport
import FanoutTransport
import XCTest

final class MockSmokeTests: XCTestCase {
    func testValidRequestWithProviderTokenIsAccepted() throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let client = try RawClient(port: mock.port, caFile: mock.material.caPEMPath)
        defer { client.close() }
        let outcome = client.send(
            path: "/3/device/\(testDeviceToken())",
            headers: [("apns-topic", "com.example.app"), ("authorization", "bearer \(try mock.providerToken())")],
            body: Array(#"{"aps":{"alert":"hi"}}"#.utf8))
        guard case .success(let response) = outcome else {
            return XCTFail("no response: \(String(describing: outcome))")
        }
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(mock.stats.accepted, 1)
    }
}
