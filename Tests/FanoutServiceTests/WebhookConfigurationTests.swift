import FanoutTransport
import XCTest

@testable import FanoutService

/// `webhooks` in `fanout serve`'s config, the signature, and the outbox's order and deduplication.
final class WebhookConfigurationTests: XCTestCase {
    private static let digest = SHA256Digest.hexHash("sk_test")

    private func parse(webhooks: String) throws(ServiceConfigurationError) -> ServiceConfiguration {
        let json = """
            {"workspaces": {"acme": {"server_keys_sha256": ["\(Self.digest)"],
              "apps": {"x": {"team_id": "T1", "key_id": "K1", "key_path": "AuthKey.p8"}},
              "webhooks": \(webhooks)}}}
            """
        return try ServiceConfiguration.parse(Array(json.utf8), relativeTo: "/etc/fanout")
    }

    private func message(_ webhooks: String) -> String {
        do {
            _ = try parse(webhooks: webhooks)
            return "accepted"
        } catch {
            return error.description
        }
    }

    func testReadsEndpointsWithDefaultsAndRelativeSecretFiles() throws {
        let config = try parse(
            webhooks: """
                [{"url": "http://127.0.0.1:9000/hooks?x=1", "secret_env": "HOOK_SECRET"},
                 {"url": "https://hooks.example.com", "secret_file": "hook.secret", "events": ["token.removed"],
                  "timeout_seconds": 2.5, "retry_seconds": 0.5, "max_retry_seconds": 60, "concurrency": 1}]
                """)
        let endpoints = try XCTUnwrap(config.workspaces["acme"]).webhooks
        XCTAssertEqual(endpoints.count, 2)
        XCTAssertEqual(endpoints[0].target.host, "127.0.0.1")
        XCTAssertEqual(endpoints[0].target.port, 9000)
        XCTAssertEqual(endpoints[0].target.pathAndQuery, "/hooks?x=1")
        XCTAssertEqual(endpoints[0].events, Set(WebhookEventType.allCases))
        XCTAssertEqual(endpoints[0].timeout, .seconds(10))
        XCTAssertEqual(endpoints[0].concurrency, 4)
        XCTAssertEqual(endpoints[1].concurrency, 1)
        XCTAssertEqual(endpoints[1].target.secure, true)
        XCTAssertEqual(endpoints[1].target.port, 443)
        XCTAssertEqual(endpoints[1].target.pathAndQuery, "/")
        XCTAssertEqual(endpoints[1].secretFile, "/etc/fanout/hook.secret")
        XCTAssertEqual(endpoints[1].events, [.tokenRemoved])
        XCTAssertEqual(endpoints[1].timeout, .milliseconds(2500))
        XCTAssertEqual(endpoints[1].retryDelay, .milliseconds(500))
        XCTAssertEqual(endpoints[1].maxRetryDelay, .seconds(60))
        XCTAssertEqual(endpoints[1].path, "workspaces.acme.webhooks[1]")
    }

    func testErrorsNameTheField() {
        XCTAssertEqual(message(#"{"url": "x"}"#), "workspaces.acme.webhooks: must be an array of endpoints")
        XCTAssertEqual(
            message(#"[{"secret_env": "S"}]"#),
            "workspaces.acme.webhooks[0].url: is required (an http:// or https:// URL)")
        XCTAssertTrue(
            message(#"[{"url": "ftp://h/x", "secret_env": "S"}]"#).hasPrefix(
                "workspaces.acme.webhooks[0].url: must be an http:// or https:// URL"))
        XCTAssertTrue(
            message(#"[{"url": "http://u:p@h/x", "secret_env": "S"}]"#).hasPrefix("workspaces.acme.webhooks[0].url:"))
        XCTAssertEqual(
            message(#"[{"url": "http://h/x"}]"#),
            "workspaces.acme.webhooks[0].secret_env: give the signing secret: secret_env or secret_file")
        XCTAssertEqual(
            message(#"[{"url": "http://h/x", "secret": "hunter2"}]"#),
            "workspaces.acme.webhooks[0].secret: the signing secret is not kept in the config: give secret_env or "
                + "secret_file")
        XCTAssertTrue(
            message(#"[{"url": "http://h/x", "secret_env": "S", "secret_file": "f"}]"#).hasPrefix(
                "workspaces.acme.webhooks[0].secret_file:"))
        XCTAssertTrue(
            message(#"[{"url": "http://h/x", "secret_env": "S", "events": ["dispatch.sent"]}]"#).hasPrefix(
                "workspaces.acme.webhooks[0].events[0]: must be one of dispatch.accepted"))
        XCTAssertTrue(
            message(#"[{"url": "http://h/x", "secret_env": "S", "timeout_seconds": 0}]"#).hasPrefix(
                "workspaces.acme.webhooks[0].timeout_seconds:"))
        XCTAssertEqual(
            message(#"[{"url": "http://h/x", "secret_env": "S", "retry_seconds": 10, "max_retry_seconds": 5}]"#),
            "workspaces.acme.webhooks[0].max_retry_seconds: must be at least retry_seconds")
        XCTAssertEqual(message(#"[{"url": "http://h/x", "secret_env": "S", "retry_seconds": 600}]"#), "accepted")
        XCTAssertEqual(
            message(#"[{"url": "http://h/x", "secret_env": "S", "concurrency": 0}]"#),
            "workspaces.acme.webhooks[0].concurrency: must be a whole number from 1 to 32")
        XCTAssertTrue(
            message(#"[{"url": "http://h/x", "secret_env": "S", "colour": 1}]"#).hasPrefix(
                "workspaces.acme.webhooks[0].colour: unknown key"))
        XCTAssertEqual(
            message(#"[{"url": "http://h/x", "secret_env": "S"}, {"url": "http://h/x", "secret_env": "T"}]"#),
            "workspaces.acme.webhooks[1].url: is listed twice in the workspace")
    }

    func testEventStreamIsAFlag() throws {
        let json = """
            {"workspaces": {"acme": {"server_keys_sha256": ["\(Self.digest)"], "event_stream": true,
              "apps": {"x": {"team_id": "T1", "key_id": "K1", "key_path": "AuthKey.p8"}}}}}
            """
        XCTAssertEqual(
            try ServiceConfiguration.parse(Array(json.utf8), relativeTo: "").workspaces["acme"]?.eventStream, true)
        let wrong = json.replacingOccurrences(of: "true", with: "\"yes\"")
        XCTAssertThrowsError(try ServiceConfiguration.parse(Array(wrong.utf8), relativeTo: "")) { error in
            XCTAssertEqual("\(error)", "workspaces.acme.event_stream: must be true or false")
        }
    }

    func testSecretsComeFromTheEnvironmentOrAFileAndErrorsNeverShowThem() throws {
        let directory = NSTemporaryDirectory() + "webhook-secret-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "whsec_file\n".write(toFile: directory + "/hook.secret", atomically: true, encoding: .utf8)
        let json = """
            {"workspaces": {"acme": {"server_keys_sha256": ["\(Self.digest)"],
              "apps": {"x": {"team_id": "T1", "key_id": "K1", "key_path": "AuthKey.p8"}},
              "webhooks": [{"url": "http://h/1", "secret_env": "HOOK_SECRET"},
                           {"url": "http://h/2", "secret_file": "hook.secret"},
                           {"url": "http://h/3", "secret_file": "missing.secret"}]}}}
            """
        let endpoints = try XCTUnwrap(
            ServiceConfiguration.parse(Array(json.utf8), relativeTo: directory).workspaces["acme"]
        ).webhooks
        XCTAssertEqual(try endpoints[0].secret(environment: ["HOOK_SECRET": "whsec_env"]), Array("whsec_env".utf8))
        XCTAssertThrowsError(try endpoints[0].secret(environment: [:])) { error in
            XCTAssertEqual(
                "\(error)", "workspaces.acme.webhooks[0].secret_env: environment variable HOOK_SECRET is not set")
        }
        XCTAssertEqual(try endpoints[1].secret(environment: [:]), Array("whsec_file".utf8))
        XCTAssertThrowsError(try endpoints[2].secret(environment: [:])) { error in
            XCTAssertTrue("\(error)".hasPrefix("workspaces.acme.webhooks[2].secret_file:"))
        }
    }

    /// RFC 4231's test case 2, and the header's shape.
    func testSignatureIsHMACSHA256OfTimestampDotBody() {
        XCTAssertEqual(
            HMACSHA256.hex(key: Array("Jefe".utf8), message: Array("what do ya want for nothing?".utf8)),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        let header = WebhookSignature.sign(secret: Array("s".utf8), timestamp: "1700000000", body: Array("{}".utf8))
        XCTAssertEqual(
            header, "t=1700000000,v1=" + HMACSHA256.hex(key: Array("s".utf8), message: Array("1700000000.{}".utf8)))
    }

    func testOutboxKeepsOrderPerEndpointAndRecordsAnEventOnce() throws {
        let directory = NSTemporaryDirectory() + "webhook-outbox-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try DispatchStore(path: directory + "/fanout.db")
        defer { store.close() }
        let outbox = try WebhookOutbox(path: directory + "/fanout.db")
        defer { outbox.close() }
        func event(_ id: String) -> WebhookEvent {
            WebhookEvent(
                id: id, type: .dispatchAccepted, workspace: "acme", created: 1, data: ["n": .string(id)], orderKey: "k")
        }
        XCTAssertEqual(try outbox.record([event("e1"), event("e2")], endpoints: { _ in [("a", 0), ("b", 0)] }), 2)
        // The same events again (a repeated hook after a restart): nothing new, no second delivery.
        XCTAssertEqual(try outbox.record([event("e1"), event("e3")], endpoints: { _ in [("a", 0)] }), 1)
        XCTAssertEqual(try outbox.backlog(), ["a": 3, "b": 2])
        XCTAssertEqual(try outbox.next(endpoint: "a", lane: 0)?.eventID, "e1")
        try outbox.failed(endpoint: "a", sequence: try XCTUnwrap(outbox.next(endpoint: "a", lane: 0)).sequence)
        XCTAssertEqual(try outbox.next(endpoint: "a", lane: 0)?.attempts, 1)
        try outbox.delivered(endpoint: "a", sequence: try XCTUnwrap(outbox.next(endpoint: "a", lane: 0)).sequence)
        XCTAssertEqual(try outbox.next(endpoint: "a", lane: 0)?.eventID, "e2")
        XCTAssertEqual(try outbox.next(endpoint: "b", lane: 0)?.eventID, "e1", "each endpoint has its own queue")
        XCTAssertEqual(try outbox.dropEndpoints(except: ["a"]), 2)
        XCTAssertNil(try outbox.next(endpoint: "b", lane: 0))
        XCTAssertEqual(try outbox.events(workspace: "acme", after: 0, limit: 10).count, 3)
        // Lanes: each read on its own; a lowered concurrency folds the lanes past it into the ones left.
        XCTAssertEqual(try outbox.record([event("e4")], endpoints: { _ in [("a", 3)] }), 1)
        XCTAssertEqual(try outbox.next(endpoint: "a", lane: 3)?.eventID, "e4")
        try outbox.fold(endpoint: "a", lanes: 2)
        XCTAssertNil(try outbox.next(endpoint: "a", lane: 3))
        XCTAssertEqual(try outbox.backlog(), ["a": 3])
        XCTAssertEqual(event("e").lane(of: 4), event("f").lane(of: 4), "the lane is the order key's")
        XCTAssertEqual(try outbox.events(workspace: "globex", after: 0, limit: 10).count, 0)
    }
}
