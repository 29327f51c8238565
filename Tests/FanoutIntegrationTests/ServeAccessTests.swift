// Keys, workspaces and budgets of `fanout serve`: who may call what, that one workspace never sees another's
// ids, that no key reaches a log or a result, and Braze-style rate-limit headers that count down.
import Foundation
import XCTest

final class ServeAccessTests: XCTestCase {
    private var mock: MockHarness!
    private var serve: ServeHarness!

    override func tearDown() {
        serve?.stop()
        mock?.stop()
    }

    private func start(rateLimit: (Int, Int)? = nil) throws {
        mock = try MockHarness()
        serve = try ServeHarness(testCase: self, mock: mock, acmeRateLimit: rateLimit)
        try serve.start()
    }

    func testKeysKindsAndWorkspaceIsolation() throws {
        try start()
        let update = #"{"content_state": {"home": 1}}"#
        XCTAssertEqual(try serve.curl("POST", "/v1/activities/m/update", json: update).status, 401, "no key")
        XCTAssertEqual(try serve.curl("POST", "/v1/activities/m/update", key: "sk_guess", json: update).status, 401)
        XCTAssertEqual(
            try serve.curl("POST", "/v1/activities/m/update", key: ServeKeys.acmeDevice, json: update).status, 403,
            "a device key cannot send")
        XCTAssertEqual(try serve.curl("GET", "/v1/status", key: ServeKeys.acmeDevice).status, 403)

        // acme's dispatch and activity are invisible to globex: 404, exactly as for an id that does not exist.
        let accepted = try serve.curl("POST", "/v1/activities/m/update", key: ServeKeys.acmeServer, json: update)
        XCTAssertEqual(accepted.status, 202, accepted.text)
        let id = try XCTUnwrap(try accepted.object()["dispatch_id"] as? String)
        _ = try serve.waitForDispatch(id)
        XCTAssertEqual(try serve.curl("GET", "/v1/dispatches/\(id)", key: ServeKeys.acmeServer).status, 200)
        let foreign = try serve.curl("GET", "/v1/dispatches/\(id)", key: ServeKeys.globexServer)
        let missing = try serve.curl("GET", "/v1/dispatches/d_aaaaaaaaaaaaaaaaaaaa", key: ServeKeys.globexServer)
        XCTAssertEqual(foreign.status, 404)
        XCTAssertEqual(foreign.body, missing.body, "another workspace's id looks like no id at all")
        XCTAssertEqual(try serve.curl("GET", "/v1/dispatches/\(id)/results", key: ServeKeys.globexServer).status, 404)
        let token = ServeNativeAPITests.token("a1", 1)
        XCTAssertEqual(
            try serve.curl(
                "POST", "/v1/activities/m/tokens", key: ServeKeys.acmeDevice, json: #"{"token": "\#(token)"}"#
            ).status, 200)
        XCTAssertEqual(
            try serve.curl("GET", "/v1/activities/m?app=\(ServeHarness.acmeApp)", key: ServeKeys.globexServer).status,
            404)
        XCTAssertEqual(
            try serve.curl(
                "POST", "/v1/activities/m/update", key: ServeKeys.globexServer,
                json: #"{"app": "\#(ServeHarness.acmeApp)", "content_state": {}}"#
            ).status, 404, "globex cannot send to acme's app")
        XCTAssertEqual(
            try serve.curl(
                "POST", "/v1/activities/m/tokens", key: ServeKeys.globexDevice,
                json: #"{"app": "\#(ServeHarness.acmeApp)", "token": "\#(token)"}"#
            ).status, 404, "nor register into it")
        let status = try serve.curl("GET", "/v1/status", key: ServeKeys.globexServer).object()
        XCTAssertEqual((status["dispatches"] as? [Any])?.count, 0, "globex's status shows none of acme's dispatches")

        // No key anywhere: the log, the results, the metrics, the database file.
        let results = try serve.curl("GET", "/v1/dispatches/\(id)/results", key: ServeKeys.acmeServer).text
        let metrics = try serve.curl("GET", "/metrics").text
        serve.stop()
        let database = try String(decoding: Data(contentsOf: URL(fileURLWithPath: serve.database)), as: UTF8.self)
        for key in ServeKeys.all {
            XCTAssertFalse(serve.log.contains(key), "a key in the log")
            XCTAssertFalse(results.contains(key), "a key in the results")
            XCTAssertFalse(metrics.contains(key), "a key in the metrics")
            XCTAssertFalse(database.contains(key), "a key in the database")
        }
    }

    func testRateLimitHeadersCountDownAndTheEleventhRequestIsRefused() throws {
        try start(rateLimit: (100, 10))
        var resets: Set<Int> = []
        for expected in stride(from: 9, through: 0, by: -1) {
            let response = try serve.curl("GET", "/v1/status", key: ServeKeys.acmeServer)
            XCTAssertEqual(response.status, 200, response.text)
            XCTAssertEqual(response.headers["x-ratelimit-limit"], "100")
            XCTAssertEqual(response.headers["x-ratelimit-remaining"], String(expected))
            resets.insert(try XCTUnwrap(Int(response.headers["x-ratelimit-reset"] ?? "")))
        }
        let now = Int(Date().timeIntervalSince1970)
        XCTAssertTrue(
            resets.allSatisfy { $0 > now && $0 <= now + 400 }, "reset is the epoch second the bucket refills: \(resets)"
        )
        let refused = try serve.curl("GET", "/v1/status", key: ServeKeys.acmeServer)
        XCTAssertEqual(refused.status, 429, refused.text)
        XCTAssertEqual(refused.headers["x-ratelimit-remaining"], "0")
        let retryAfter = try XCTUnwrap(Int(refused.headers["retry-after"] ?? ""))
        XCTAssertTrue((1...36).contains(retryAfter), "one request per 36 s: \(retryAfter)")
        // Another workspace's budget is its own; device registrations have their own, larger budget.
        XCTAssertEqual(try serve.curl("GET", "/v1/status", key: ServeKeys.globexServer).status, 200)
        let registration = try serve.curl(
            "POST", "/v1/devices", key: ServeKeys.acmeDevice, json: #"{"device_id": "d1"}"#)
        XCTAssertEqual(registration.status, 200, registration.text)
        XCTAssertEqual(registration.headers["x-ratelimit-limit"], "1000")
    }
}
