import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation
import MockAPNsKit
import XCTest

/// mock-apns's provider-token checks (docs/reference/apns.md, "Provider tokens") and the
/// one-stream-until-authenticated rule ("Stream limits").
final class MockAuthTests: XCTestCase {
    private static let body = Array(#"{"aps":{"alert":"hi"}}"#.utf8)

    private func send(_ client: RawClient, authorization: String?, token: Int = 0) -> APNsResponse? {
        var headers = [("apns-topic", "com.example.app"), ("apns-push-type", "alert")]
        if let authorization { headers.append(("authorization", authorization)) }
        return apnsResponse(client.send(path: "/3/device/\(testDeviceToken(token))", headers: headers, body: Self.body))
    }

    private func assertForbidden(
        _ response: APNsResponse?, _ reason: String, file: StaticString = #filePath, line: UInt = #line
    ) {
        guard let response else { return }
        XCTAssertEqual(response.status, 403, file: file, line: line)
        XCTAssertEqual(response.reason?.rawValue, reason, file: file, line: line)
        XCTAssertNotNil(response.apnsID, file: file, line: line)
    }

    func testNoAuthorizationIsMissingProviderToken() throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let client = try mock.makeClient()
        defer { client.close() }
        assertForbidden(send(client, authorization: nil), "MissingProviderToken")
        // (A value with trailing whitespace, "bearer ", is malformed HTTP/2 and nghttp2 resets the stream.)
        assertForbidden(send(client, authorization: "bearer"), "MissingProviderToken")
        assertForbidden(send(client, authorization: "basic dXNlcjpwYXNz"), "MissingProviderToken")
        XCTAssertEqual(mock.stats.count(reason: "MissingProviderToken"), 3)
        XCTAssertEqual(mock.stats.accepted, 0)
    }

    func testTokenSignedByAnotherKeyIsInvalidProviderToken() throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let client = try mock.makeClient()
        defer { client.close() }
        let otherKey = try ES256PrivateKey.generate()
        let token = try makeProviderToken(
            key: otherKey, keyID: "KEYID12345", teamID: "TEAMID1234", issuedAt: Int64(time(nil)))
        assertForbidden(send(client, authorization: "bearer \(token)"), "InvalidProviderToken")
        // The same connection then accepts a good token.
        XCTAssertEqual(send(client, authorization: "bearer \(try mock.providerToken())")?.status, 200)
    }

    func testGarbageTokenIsInvalidProviderToken() throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let client = try mock.makeClient()
        defer { client.close() }
        let good = try mock.providerToken()
        let parts = good.split(separator: ".").map(String.init)
        let tampered = parts[0] + "." + parts[1] + "." + String(parts[2].reversed())
        for garbage in [
            "garbage", "a.b.c", "...", tampered, parts[0] + "." + parts[1], String(repeating: "x", count: 2000),
        ] {
            assertForbidden(send(client, authorization: "bearer \(garbage)"), "InvalidProviderToken")
        }
    }

    func testWrongKeyIDOrTeamIDIsInvalidProviderTokenWhenConfigured() throws {
        let mock = try MockHarness {
            $0.keyID = "KEYID12345"
            $0.teamID = "TEAMID1234"
        }
        defer { mock.stop() }
        let client = try mock.makeClient()
        defer { client.close() }
        let wrongKid = try mock.providerToken(keyID: "OTHERKEY99", teamID: "TEAMID1234")
        assertForbidden(send(client, authorization: "bearer \(wrongKid)"), "InvalidProviderToken")
        let wrongIss = try mock.providerToken(keyID: "KEYID12345", teamID: "OTHERTEAM9")
        assertForbidden(send(client, authorization: "bearer \(wrongIss)"), "InvalidProviderToken")
        let right = try mock.providerToken(keyID: "KEYID12345", teamID: "TEAMID1234")
        XCTAssertEqual(send(client, authorization: "bearer \(right)")?.status, 200)
    }

    func testAnyKeyIDAndTeamIDAreAcceptedWhenNotConfigured() throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let client = try mock.makeClient()
        defer { client.close() }
        let token = try mock.providerToken(keyID: "ANYKEY0001", teamID: "ANYTEAM001")
        XCTAssertEqual(send(client, authorization: "bearer \(token)")?.status, 200)
    }

    func testTokenOlderThanMaxAgeIsExpiredProviderToken() throws {
        let mock = try MockHarness { $0.tokenMaxAge = 60 }
        defer { mock.stop() }
        let client = try mock.makeClient()
        defer { client.close() }
        let now = Int64(time(nil))
        let old = try mock.providerToken(issuedAt: now - 120)
        assertForbidden(send(client, authorization: "bearer \(old)"), "ExpiredProviderToken")
        let fresh = try mock.providerToken(issuedAt: now - 30)
        XCTAssertEqual(send(client, authorization: "bearer \(fresh)")?.status, 200)
        XCTAssertEqual(mock.stats.count(reason: "ExpiredProviderToken"), 1)
    }

    /// A connection's repeated token skips the signature check (its bytes are compared with the last good one's) but
    /// not the age check: the same token, once past `--token-max-age`, is `ExpiredProviderToken`.
    func testARepeatedTokenIsStillCheckedForAge() throws {
        let maxAge: Int64 = 2
        let mock = try MockHarness { $0.tokenMaxAge = maxAge }
        defer { mock.stop() }
        let client = try mock.makeClient()
        defer { client.close() }
        let issuedAt = Int64(time(nil)) - maxAge + 1
        let bearer = "bearer \(try mock.providerToken(issuedAt: issuedAt))"
        XCTAssertEqual(send(client, authorization: bearer)?.status, 200)
        XCTAssertEqual(send(client, authorization: bearer, token: 1)?.status, 200)
        // Wait for the clock, not for the mock: the token is too old once a whole second past iat + maxAge.
        let deadline = Date().addingTimeInterval(10)
        while Int64(time(nil)) <= issuedAt + maxAge && Date() < deadline { usleep(50_000) }
        assertForbidden(send(client, authorization: bearer, token: 2), "ExpiredProviderToken")
        // Another good token on the same connection is checked in full and accepted.
        XCTAssertEqual(send(client, authorization: "bearer \(try mock.providerToken())", token: 3)?.status, 200)
        XCTAssertEqual(mock.stats.count(reason: "ExpiredProviderToken"), 1)
        XCTAssertEqual(mock.stats.accepted, 3)
    }

    func testStreamLimitIsOneUntilAValidTokenThenMaxStreams() throws {
        let mock = try MockHarness { $0.maxStreams = 50 }
        defer { mock.stop() }
        let client = try mock.makeClient()
        defer { client.close() }

        // Rejected requests (no token, bad token) leave the connection at one stream.
        assertForbidden(send(client, authorization: nil), "MissingProviderToken")
        XCTAssertEqual(client.streamLimit(), 1)
        assertForbidden(send(client, authorization: "bearer garbage"), "InvalidProviderToken")
        XCTAssertEqual(client.streamLimit(), 1)

        // The first valid token raises MAX_CONCURRENT_STREAMS to the configured value.
        XCTAssertEqual(send(client, authorization: "bearer \(try mock.providerToken())")?.status, 200)
        XCTAssertTrue(
            client.wait { $0?.streamLimit == 50 }, "streamLimit is \(String(describing: client.streamLimit()))")

        // The connection can now really run many streams at once.
        let bearer = "bearer \(try mock.providerToken())"
        let outcomes = client.sendConcurrently(
            paths: (1...40).map { "/3/device/\(testDeviceToken($0))" },
            headers: [("apns-topic", "com.example.app"), ("authorization", bearer)], body: Self.body)
        XCTAssertEqual(outcomes.compactMap { try? $0?.get().status }.filter { $0 == 200 }.count, 40)
        XCTAssertEqual(mock.stats.streamLimitViolations, 0)
        XCTAssertEqual(client.onLoop { $0?.peakOpenStreams ?? 0 }, 40, "all 40 streams were open at once")
    }

    func testNewConnectionStartsAtOneStreamAgain() throws {
        let mock = try MockHarness { $0.maxStreams = 50 }
        defer { mock.stop() }
        let first = try mock.makeClient()
        defer { first.close() }
        XCTAssertEqual(send(first, authorization: "bearer \(try mock.providerToken())")?.status, 200)
        XCTAssertTrue(first.wait { $0?.streamLimit == 50 })

        // Authentication is per connection.
        let second = try mock.makeClient()
        defer { second.close() }
        assertForbidden(send(second, authorization: nil), "MissingProviderToken")
        XCTAssertEqual(second.streamLimit(), 1)
    }

    func testNoAuthMockOpensAllStreamsAtOnce() throws {
        let mock = try MockHarness {
            $0.noAuth = true
            $0.maxStreams = 50
        }
        defer { mock.stop() }
        let client = try mock.makeClient()
        defer { client.close() }
        XCTAssertEqual(send(client, authorization: nil)?.status, 200)
        XCTAssertTrue(client.wait { $0?.streamLimit == 50 })
    }
}
