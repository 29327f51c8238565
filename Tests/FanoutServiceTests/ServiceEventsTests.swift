import Fanout
import FanoutCore
import FanoutObservability
import FanoutRegistry
import FanoutTransport
import Foundation
import XCTest

@testable import FanoutService

/// What `ServiceEvents.dispatchChanged` records from a dispatch's committed state, and the start's recovery of a
/// finished event a kill lost.
final class ServiceEventsTests: XCTestCase {
    private static let digest = SHA256Digest.hexHash("sk_test")
    private static let otherDigest = SHA256Digest.hexHash("sk_other")

    private var directory = ""

    override func setUpWithError() throws {
        directory = NSTemporaryDirectory() + "service-events-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    override func tearDown() {
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// acme keeps its events (`event_stream`, or `acmeKeys` in its place); globex has neither webhooks nor a stream.
    private func configuration(acmeKeys: String = #""event_stream": true"#) throws -> ServiceConfiguration {
        let app = #"{"team_id": "T1", "key_id": "K1", "key_path": "AuthKey.p8"}"#
        let json = """
            {"db": "\(directory)/fanout.db", "workspaces": {
              "acme": {"server_keys_sha256": ["\(Self.digest)"], \(acmeKeys), "apps": {"com.acme.app": \(app)}},
              "globex": {"server_keys_sha256": ["\(Self.otherDigest)"], "apps": {"com.globex.app": \(app)}}}}
            """
        return try ServiceConfiguration.parse(Array(json.utf8), relativeTo: directory)
    }

    private func start(
        _ store: DispatchStore, _ registry: SQLiteRegistryStore, acmeKeys: String = #""event_stream": true"#,
        environment: [String: String] = [:]
    ) throws -> ServiceEvents {
        try XCTUnwrap(
            ServiceEvents.start(
                configuration: try configuration(acmeKeys: acmeKeys), store: store, registry: registry,
                metrics: MetricsRegistry(), logger: FanoutLogger(sink: .init { _ in }), environment: environment))
    }

    /// Without a stream, only the types some endpoint takes are kept.
    func testOnlyTheTypesAnEndpointTakesAreKeptWithoutAStream() throws {
        let store = try DispatchStore(path: directory + "/fanout.db")
        defer { store.close() }
        let registry = try SQLiteRegistryStore(path: directory + "/fanout.db")
        defer { registry.close() }
        // An endpoint nothing listens on, retried no sooner than a day: the test reads the outbox only.
        let events = try start(
            store, registry,
            acmeKeys:
                #""webhooks": [{"url": "http://127.0.0.1:9/x", "secret_env": "S", "events": ["dispatch.finished"], "retry_seconds": 86400}]"#,
            environment: ["S": "secret"])
        defer { events.stop() }
        let id = try accept(store, kind: "push", line: #"{"id":"y"}"#)
        events.dispatchChanged(id)
        try store.markDone(id: id, now: 1_300, payloadEncodings: 0, demoted: 0)
        events.dispatchChanged(id)
        XCTAssertEqual(try recorded(events).map { $0["id"] as? String }, ["evt_\(id)_finished"])
        XCTAssertEqual(try events.outbox.backlog(), ["acme http://127.0.0.1:9/x": 1])
    }

    private func recorded(_ events: ServiceEvents, workspace: String = "acme") throws -> [[String: Any]] {
        try events.outbox.events(workspace: workspace, after: 0, limit: 100).map { row in
            try XCTUnwrap(JSONSerialization.jsonObject(with: Data(row.2)) as? [String: Any])
        }
    }

    /// - Parameter now: the acceptance time (Unix ms). Events older than the outbox's retention are pruned by the
    ///   maintenance task that every start runs at once, so a test that starts twice accepts at the real time.
    private func accept(
        _ store: DispatchStore, workspace: String = "acme", kind: String, line: String, now: Int64 = 1_000
    ) throws -> String {
        try store.accept(
            workspace: workspace, app: workspace == "acme" ? "com.acme.app" : "com.globex.app", kind: kind,
            jobLine: Array(line.utf8), idempotency: nil, now: now
        ).record.id
    }

    func testAcceptedThenFinishedFailedAndActivityEndedOnceEach() throws {
        let store = try DispatchStore(path: directory + "/fanout.db")
        defer { store.close() }
        let registry = try SQLiteRegistryStore(path: directory + "/fanout.db")
        defer { registry.close() }
        let events = try start(store, registry)
        defer { events.stop() }

        let end = try accept(
            store, kind: "end", line: #"{"id":"x","app":"com.acme.app","activity_id":"match-7","event":"end"}"#)
        events.dispatchChanged(end)
        try store.markRunning(id: end, now: 1_100)
        events.dispatchChanged(end)  // a run started: nothing new
        try store.appendResults(
            [NotificationResult(jobID: end, token: testToken(1), outcome: .delivered)], dispatch: end)
        try store.markDone(id: end, now: 1_200, payloadEncodings: 1, demoted: 0)
        events.dispatchChanged(end)
        events.dispatchChanged(end)  // repeated (a resume's): nothing twice

        let broken = try accept(store, kind: "push", line: #"{"id":"y"}"#)
        events.dispatchChanged(broken)
        try store.appendResults(
            [NotificationResult(jobID: broken, token: nil, outcome: .invalid, reason: "no recipients")],
            dispatch: broken)
        try store.markDone(id: broken, now: 1_300, payloadEncodings: 0, demoted: 0)
        events.dispatchChanged(broken)

        let other = try accept(store, workspace: "globex", kind: "push", line: #"{"id":"z"}"#)
        events.dispatchChanged(other)

        let acme = try recorded(events)
        XCTAssertEqual(
            acme.map { $0["id"] as? String },
            [
                "evt_\(end)_accepted", "evt_\(end)_finished", "evt_\(end)_activity_ended", "evt_\(broken)_accepted",
                "evt_\(broken)_failed",
            ])
        let finished = try XCTUnwrap(acme[1]["data"] as? [String: Any])
        XCTAssertEqual(finished["notifications"] as? Int, 1)
        XCTAssertEqual((finished["counts"] as? [String: Any])?["delivered"] as? Int, 1)
        XCTAssertEqual(finished["activity_id"] as? String, "match-7")
        XCTAssertEqual(acme[1]["created"] as? Int, 1_200)
        let ended = try XCTUnwrap(acme[2]["data"] as? [String: Any])
        XCTAssertEqual(ended["activity_id"] as? String, "match-7")
        XCTAssertEqual((acme[4]["data"] as? [String: Any])?["reason"] as? String, "no recipients")
        XCTAssertTrue(try recorded(events, workspace: "globex").isEmpty, "globex keeps no events")
    }

    func testAStartRecordsTheFinishedEventAKillLost() throws {
        let store = try DispatchStore(path: directory + "/fanout.db")
        defer { store.close() }
        let registry = try SQLiteRegistryStore(path: directory + "/fanout.db")
        defer { registry.close() }
        // Accepted and recorded, then done with no event (the process died between the commit and the event).
        var events = try start(store, registry)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let id = try accept(store, kind: "push", line: #"{"id":"y"}"#, now: now)
        events.dispatchChanged(id)
        try store.markDone(id: id, now: now + 1, payloadEncodings: 0, demoted: 0)
        events.stop()

        events = try start(store, registry)
        defer { events.stop() }
        XCTAssertEqual(try recorded(events).map { $0["id"] as? String }, ["evt_\(id)_accepted", "evt_\(id)_finished"])
    }

    private func testToken(_ index: Int) -> String {
        String(repeating: String(format: "%02x", index), count: 32)
    }
}
