import FanoutPolicy
import FanoutTransport
import XCTest

@testable import FanoutService

final class ServiceConfigurationTests: XCTestCase {
    private static let digest = SHA256Digest.hexHash("sk_test")

    private func parse(_ json: String) throws(ServiceConfigurationError) -> ServiceConfiguration {
        try ServiceConfiguration.parse(Array(json.utf8), relativeTo: "/etc/fanout")
    }

    private func app(_ extra: String = "") -> String {
        #"{"team_id": "T1", "key_id": "K1", "key_path": "AuthKey.p8", "endpoint": "127.0.0.1:8443"\#(extra)}"#
    }

    func testReadsWorkspacesAppsKeysAndLimits() throws {
        let config = try parse(
            """
            {"listen": "0.0.0.0:9000", "db": "data/fanout.db", "max_connections": 50, "write_timeout_seconds": 5,
             "workspaces": {"acme": {"server_keys_sha256": ["\(Self.digest)"],
               "rate_limit": {"requests_per_hour": 100, "burst": 10},
               "apps": {"com.acme.app": \(app(#", "pushwoosh_application": "ACME1-00001", "braze_app_id": "b1""#))}}}}
            """)
        XCTAssertEqual(config.listenHost, "0.0.0.0")
        XCTAssertEqual(config.listenPort, 9000)
        XCTAssertEqual(config.database, "/etc/fanout/data/fanout.db")
        XCTAssertEqual(config.maxConnections, 50)
        XCTAssertEqual(config.writeTimeout, .seconds(5))
        let defaults = try parse(
            #"{"workspaces": {"a": {"server_keys_sha256": ["\#(Self.digest)"], "apps": {"x": \#(app())}}}}"#)
        XCTAssertEqual(defaults.writeTimeout, .seconds(30))
        let acme = try XCTUnwrap(config.workspaces["acme"])
        XCTAssertEqual(acme.rateLimit, RequestQuotaRule(requestsPerHour: 100, burst: 10))
        XCTAssertEqual(acme.deviceRateLimit, RequestQuotaRule(requestsPerHour: 1000, burst: 100))
        let app = try XCTUnwrap(config.app("com.acme.app"))
        XCTAssertEqual(app.keyPath, "/etc/fanout/AuthKey.p8")
        XCTAssertEqual(app.endpoint.port, 8443)
        XCTAssertEqual(app.pushwooshApplication, "ACME1-00001")
        XCTAssertEqual(app.workspace, "acme")
    }

    func testErrorsNameTheKeyPath() {
        func message(_ json: String) -> String {
            do {
                _ = try parse(json)
                return "accepted"
            } catch {
                return error.description
            }
        }
        XCTAssertEqual(message(#"{"workspaces": {}}"#), "workspaces: must be an object with at least one workspace")
        XCTAssertTrue(
            message(#"{"workspaces": {"a": {"server_keys_sha256": ["sk_test"], "apps": {}}}}"#).hasPrefix(
                "workspaces.a.server_keys_sha256[0]: must be 64 hex digits"))
        XCTAssertTrue(
            message(
                #"{"workspaces": {"a": {"server_keys_sha256": ["\#(Self.digest)"], "apps": {"x": {"key_id": "K"}}}}}"#
            )
            .hasPrefix("workspaces.a.apps.x.team_id: is required"))
        XCTAssertTrue(message(#"{"workspace": {}}"#).hasPrefix("workspace: unknown key"))
        XCTAssertTrue(
            message(#"{"write_timeout_seconds": 0}"#).hasPrefix("write_timeout_seconds: "),
            message(#"{"write_timeout_seconds": 0}"#))
        let other = SHA256Digest.hexHash("sk_other")
        let shared = """
            {"workspaces": {"a": {"server_keys_sha256": ["\(Self.digest)"], "apps": {"x": \(app())}},
                            "b": {"server_keys_sha256": ["\(other)"], "apps": {"x": \(app())}}}}
            """
        XCTAssertTrue(message(shared).contains("an app belongs to one workspace"), message(shared))
        let sharedKey = """
            {"workspaces": {"a": {"server_keys_sha256": ["\(Self.digest)"], "apps": {"x": \(app())}},
                            "b": {"server_keys_sha256": ["\(Self.digest)"], "apps": {"y": \(app())}}}}
            """
        XCTAssertTrue(message(sharedKey).contains("a key digest is listed twice"), message(sharedKey))
        let sharedCode = """
            {"workspaces": {"a": {"server_keys_sha256": ["\(Self.digest)"],
              "apps": {"x": \(app(#", "braze_app_id": "b1""#)), "y": \(app(#", "braze_app_id": "b1""#))}}}}
            """
        XCTAssertTrue(message(sharedCode).contains("braze_app_id b1 is also"), message(sharedCode))
    }

    /// A workspace's `send_budget` reads as `fanout send`'s `rate_limits` do; a budget that cannot be enforced, an
    /// unknown counting or policy, or an unknown key is refused, naming it.
    func testSendBudgetsAreReadAndCheckedPerWorkspace() throws {
        func workspace(_ budget: String) -> String {
            #"{"workspaces": {"a": {"server_keys_sha256": ["\#(Self.digest)"], "send_budget": \#(budget), "apps": {"x": \#(app())}}}}"#
        }
        let config = try parse(
            workspace(#"{"requests_per_hour": 7200, "burst_seconds": 5, "counting": "notification", "policy": "wait"}"#)
        )
        let budget = try XCTUnwrap(config.workspaces["a"]?.sendBudget)
        XCTAssertEqual(budget.requestsPerHour, 7_200)
        XCTAssertEqual(budget.burstSeconds, 5)
        XCTAssertEqual(budget.countingUnit, .notification)
        XCTAssertNil(try parse(workspace("null")).workspaces["a"]?.sendBudget, "absent: 250,000 jobs an hour")
        for (budget, mention) in [
            (#"{"counting": "token"}"#, "workspaces.a.send_budget.counting: must be job or notification"),
            (#"{"policy": "drop"}"#, "workspaces.a.send_budget.policy: must be wait, reject or demote"),
            (#"{"per_hour": 10}"#, "workspaces.a.send_budget.per_hour: unknown key"),
            (#"{"requests_per_hour": 7200, "burst_seconds": 1}"#, "workspaces.a.send_budget: priority"),
        ] {
            XCTAssertThrowsError(try parse(workspace(budget)), budget) { error in
                XCTAssertTrue("\(error)".hasPrefix(mention), "\(budget): \(error)")
            }
        }
    }

    func testKeyringFindsTheWorkspaceAndKindOfAKey() throws {
        let config = try parse(
            """
            {"workspaces": {
              "a": {"server_keys_sha256": ["\(SHA256Digest.hexHash("sk_a"))"], "device_keys_sha256": ["\(SHA256Digest.hexHash("dk_a"))"],
                    "apps": {"x": \(app())}},
              "b": {"server_keys_sha256": ["\(SHA256Digest.hexHash("sk_b"))"], "apps": {"y": \(app())}}}}
            """)
        let keyring = APIKeyring(config)
        XCTAssertEqual(keyring.caller(forKey: "sk_a"), Caller(workspace: "a", kind: .server))
        XCTAssertEqual(keyring.caller(forKey: "dk_a"), Caller(workspace: "a", kind: .device))
        XCTAssertEqual(keyring.caller(forKey: "sk_b"), Caller(workspace: "b", kind: .server))
        XCTAssertNil(keyring.caller(forKey: "sk_c"))
        XCTAssertNil(keyring.caller(forKey: ""))
        XCTAssertNil(keyring.caller(forKey: SHA256Digest.hexHash("sk_a")), "the digest is not the key")
    }

    func testSHA256MatchesAKnownVector() {
        XCTAssertEqual(
            SHA256Digest.hexHash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }

    func testISO8601DatesInBrazeSpellings() {
        XCTAssertEqual(ISO8601Date.parse("2024-01-22T16:55:49+0000"), 1_705_942_549)
        XCTAssertEqual(ISO8601Date.parse("2024-01-22T16:55:49Z"), 1_705_942_549)
        XCTAssertEqual(ISO8601Date.parse("2024-01-22T17:55:49+01:00"), 1_705_942_549)
        XCTAssertEqual(ISO8601Date.parse("2024-01-22T16:55:49.250Z"), 1_705_942_549)
        XCTAssertNil(ISO8601Date.parse("2024-01-22"))
        XCTAssertNil(ISO8601Date.parse("2024-13-22T16:55:49Z"))
        XCTAssertNil(ISO8601Date.parse("2024-01-22T16:55:49Zjunk"))
        XCTAssertEqual(ISO8601Date.parse("2024-01-22T21:55:49+05"), 1_705_942_549)
        XCTAssertNil(ISO8601Date.parse("2024-01-22T21:55:49+05:"), "a colon without the minutes")
        XCTAssertNil(ISO8601Date.parse("2024-01-22T21:55:49+05:3"))
    }
}
