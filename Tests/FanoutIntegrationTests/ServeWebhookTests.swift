// Webhooks of `fanout serve` against real receivers (HTTP servers the test starts on port 0): every event of a
// dispatch's life arrives signed, exactly once after deduplication by id, in the order the outbox recorded them,
// through answers of 500, a `kill -9` of the server mid-delivery and its restart on the same database; one
// workspace's events never reach another's endpoint; a receiver that never answers does not hold up sending.
import FanoutCore
import FanoutSQLite
import FanoutTestSupport
import FanoutTransport
import Foundation
import Synchronization
import XCTest

/// An HTTP receiver of webhook deliveries: checks each signature with the shared secret, answers 500 to its first
/// `failFirst` calls, and holds (never answers) the calls `hold` picks.
final class WebhookReceiver: @unchecked Sendable {
    struct Call {
        var eventID: String
        var type: String
        var object: [String: Any]
        var signatureValid: Bool
        var status: Int
    }

    private let lock = NSLock()
    private var calls: [Call] = []
    /// Responders of held calls, kept so that they are never answered.
    private var held: [HTTPResponder] = []
    private var server: HTTPServer?
    let secret: String
    private let failFirst: Int
    private let hold: @Sendable (_ type: String, _ eventID: String, _ callIndex: Int) -> Bool

    init(
        secret: String, failFirst: Int = 0,
        hold: @escaping @Sendable (_ type: String, _ eventID: String, _ callIndex: Int) -> Bool = { _, _, _ in false }
    ) throws {
        self.secret = secret
        self.failFirst = failFirst
        self.hold = hold
        server = try HTTPServer(host: "127.0.0.1", port: 0, threads: 1, tls: nil, limits: HTTPServerLimits()) {
            [unowned self] request, responder in
            handle(request, responder)
        }
    }

    var url: String { "http://127.0.0.1:\(server!.port)/hooks/fanout" }

    func stop() {
        server?.shutdown()
        server = nil
    }

    /// Checks `Fanout-Signature: t=<seconds>,v1=<hex>` over `"<t>.<body>"`, with a 5-minute tolerance.
    private func verify(_ header: String?, body: [UInt8]) -> Bool {
        guard let header else { return false }
        var timestamp: String?
        var signatures: [String] = []
        for part in header.split(separator: ",") {
            let pair = part.split(separator: "=", maxSplits: 1).map(String.init)
            guard pair.count == 2 else { return false }
            if pair[0] == "t" { timestamp = pair[1] } else if pair[0] == "v1" { signatures.append(pair[1]) }
        }
        guard let timestamp, let seconds = Int64(timestamp),
            abs(Int64(Date().timeIntervalSince1970) - seconds) <= 300
        else { return false }
        let expected = HMACSHA256.mac(key: Array(secret.utf8), message: Array((timestamp + ".").utf8) + body)
        return signatures.contains { signature in
            guard let bytes = hexBytes(signature) else { return false }
            return SHA256Digest.constantTimeEquals(bytes, expected)
        }
    }

    private func hexBytes(_ text: String) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count == 64 else { return nil }
        var bytes: [UInt8] = []
        for index in stride(from: 0, to: 64, by: 2) {
            guard let byte = UInt8(String(decoding: digits[index..<index + 2], as: UTF8.self), radix: 16) else {
                return nil
            }
            bytes.append(byte)
        }
        return bytes
    }

    private func handle(_ request: HTTPRequest, _ responder: HTTPResponder) {
        let object = (try? JSONSerialization.jsonObject(with: Data(request.body))) as? [String: Any] ?? [:]
        let eventID = object["id"] as? String ?? ""
        let type = object["type"] as? String ?? ""
        let valid =
            verify(request.header("fanout-signature"), body: request.body)
            && request.header("fanout-event-id") == eventID && request.method == "POST"
            && request.target == "/hooks/fanout"
        let (index, holdIt) = lock.withLock { () -> (Int, Bool) in
            let index = calls.count
            let holdIt = hold(type, eventID, index)
            let status = holdIt ? 0 : (index < failFirst ? 500 : 200)
            calls.append(Call(eventID: eventID, type: type, object: object, signatureValid: valid, status: status))
            if holdIt { held.append(responder) }
            return (index, holdIt)
        }
        guard !holdIt else { return }
        responder.respond(HTTPResponse(status: index < failFirst ? 500 : 200))
    }

    var allCalls: [Call] { lock.withLock { calls } }

    /// Events answered 200, first arrival of each id, in arrival order.
    var deduplicated: [Call] {
        var seen: Set<String> = []
        return allCalls.filter { $0.status == 200 && seen.insert($0.eventID).inserted }
    }

    /// Waits until `condition` holds for the calls, or fails after `timeout` seconds.
    func wait(timeout: TimeInterval, _ what: String, until condition: ([Call]) -> Bool) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while !condition(allCalls) {
            guard Date() < deadline else {
                throw ProcessSupportError("\(what): not after \(timeout) s; calls: \(allCalls.map(\.type))")
            }
            usleep(20_000)
        }
    }
}

final class ServeWebhookTests: XCTestCase {
    static let secret = "whsec_test_3f9a1c0e"
    static let globexSecret = "whsec_globex_77aa"
    static let tokens = 10_000
    static let unregisteredCount = 100

    private func endpoint(_ receiver: WebhookReceiver, env: String, extra: [String: Any] = [:]) -> [[String: Any]] {
        [
            ["url": receiver.url, "secret_env": env, "retry_seconds": 0.2, "max_retry_seconds": 1].merging(extra) {
                _, new in new
            }
        ]
    }

    /// The events the outbox recorded for `workspace`, in its order (ids).
    private func outboxOrder(_ database: String, workspace: String) throws -> [String] {
        let db = try SQLiteDatabase(path: database, mode: .readOnly)
        defer { db.close() }
        return try db.withStatement("SELECT id FROM webhook_events WHERE workspace = ?1 ORDER BY seq") {
            statement throws(SQLiteError) in
            try statement.bind(workspace, at: 1)
            var ids: [String] = []
            while try statement.step() { ids.append(statement.string(at: 0)) }
            return ids
        }
    }

    private func registryRemovals(_ database: String) throws -> Int {
        let db = try SQLiteDatabase(path: database, mode: .readOnly)
        defer { db.close() }
        return Int(try db.scalarInt64("SELECT count(*) FROM events WHERE reason IS NOT NULL") ?? 0)
    }

    func testEveryEventOfADispatchArrivesOnceInOrderThroughFailuresAndAKill() throws {
        let unregistered = (0..<Self.unregisteredCount).map { testDeviceToken($0 * 97) }
        let unregisteredFile = FileManager.default.temporaryDirectory.appendingPathComponent(
            "webhook-unregistered-\(UUID().uuidString)"
        ).path
        try unregistered.joined(separator: "\n").write(toFile: unregisteredFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: unregisteredFile) }
        let mock = try MockHarness { $0.unregisteredPath = unregisteredFile }
        defer { mock.stop() }
        // Holds the first delivery of the first `dispatch.finished`: the server is killed while it waits.
        let held = HeldOnce()
        let receiver = try WebhookReceiver(secret: Self.secret, failFirst: 3) { type, _, _ in
            type == "dispatch.finished" && !held.flag.exchange(true, ordering: .relaxed)
        }
        defer { receiver.stop() }
        let globexReceiver = try WebhookReceiver(secret: Self.globexSecret)
        defer { globexReceiver.stop() }
        let serve = try ServeHarness(
            testCase: self, mock: mock, acmeExtra: ["webhooks": endpoint(receiver, env: "ACME_HOOK_SECRET")],
            globexExtra: ["webhooks": endpoint(globexReceiver, env: "GLOBEX_HOOK_SECRET")])
        let environment = ["ACME_HOOK_SECRET": Self.secret, "GLOBEX_HOOK_SECRET": Self.globexSecret]

        // match-0's 10,000 update tokens, 100 of which APNs calls unregistered.
        var lines = ""
        for index in 0..<Self.tokens {
            lines +=
                #"{"app": "\#(ServeHarness.acmeApp)", "activity_id": "match-0", "token": "\#(testDeviceToken(index))", "device": "d\#(index)"}"#
                + "\n"
        }
        let importFile = (serve.directory as NSString).appendingPathComponent("import.jsonl")
        try lines.write(toFile: importFile, atomically: true, encoding: .utf8)
        let imported = try ProcessSupport.run(
            serve.fanout, ["registry", "--db", serve.database, "import", importFile], timeout: 120)
        XCTAssertEqual(imported.exitCode, 0, imported.summary)

        let started = Date()
        try serve.start(environment: environment)
        let update = try serve.curl(
            "POST", "/v1/activities/match-0/update", key: ServeKeys.acmeServer,
            json: #"{"content_state": {"minute": 1}}"#)
        XCTAssertEqual(update.status, 202, update.text)
        let updateID = try XCTUnwrap(try update.object()["dispatch_id"] as? String)

        // The finished event is held; the registry's removals are committed (the feed may or may not have read
        // them): kill -9 between this delivery and the next.
        try receiver.wait(timeout: 120, "the held dispatch.finished") { calls in
            calls.contains { $0.type == "dispatch.finished" && $0.status == 0 }
        }
        let deadline = Date().addingTimeInterval(60)
        while try registryRemovals(serve.database) < Self.unregisteredCount {
            guard Date() < deadline else { return XCTFail("the registry did not remove the unregistered tokens") }
            usleep(20_000)
        }
        // The refused attempts are counted (by this process, before it dies).
        let firstMetrics = try serve.curl("GET", "/metrics").text
        XCTAssertTrue(
            firstMetrics.contains(#"fanout_webhook_failures_total{endpoint="acme/0",reason="status"} 3"#), firstMetrics)
        let firstLog = serve.log
        serve.kill()

        try serve.start(environment: environment)
        let end = try serve.curl(
            "POST", "/v1/activities/match-0/end", key: ServeKeys.acmeServer, json: #"{"content_state": {"minute": 2}}"#)
        XCTAssertEqual(end.status, 202, end.text)
        let endID = try XCTUnwrap(try end.object()["dispatch_id"] as? String)
        _ = try serve.waitForDispatch(endID, timeout: 120)

        let expected = Set(
            [
                "evt_\(updateID)_accepted", "evt_\(updateID)_finished", "evt_\(endID)_accepted",
                "evt_\(endID)_finished", "evt_\(endID)_activity_ended",
            ])
        try receiver.wait(timeout: 60, "every event") { _ in
            let ids = Set(receiver.deduplicated.map(\.eventID))
            return expected.isSubset(of: ids)
                && receiver.deduplicated.filter { $0.type == "token.removed" }.count == Self.unregisteredCount
        }
        let elapsed = Date().timeIntervalSince(started)

        let calls = receiver.allCalls
        XCTAssertEqual(calls.prefix(3).map(\.status), [500, 500, 500], "the first three calls were refused")
        XCTAssertTrue(calls.allSatisfy(\.signatureValid), "every signature checks out")
        let events = receiver.deduplicated
        XCTAssertEqual(events.count, expected.count + Self.unregisteredCount, "\(events.map(\.type))")
        // Exactly the outbox's order, the held and killed delivery included.
        let order = try outboxOrder(serve.database, workspace: "acme")
        XCTAssertEqual(events.map(\.eventID), order)
        let position = Dictionary(uniqueKeysWithValues: events.enumerated().map { ($1.eventID, $0) })
        XCTAssertEqual(position["evt_\(updateID)_accepted"], 0)
        XCTAssertLessThan(position["evt_\(updateID)_finished"]!, position["evt_\(endID)_accepted"]!)
        XCTAssertLessThan(position["evt_\(endID)_accepted"]!, position["evt_\(endID)_finished"]!)
        XCTAssertLessThan(position["evt_\(endID)_finished"]!, position["evt_\(endID)_activity_ended"]!)

        let finished = try XCTUnwrap(events.first { $0.eventID == "evt_\(updateID)_finished" }).object
        XCTAssertEqual(finished["workspace"] as? String, "acme")
        XCTAssertNotNil(finished["created"] as? Int)
        let data = try XCTUnwrap(finished["data"] as? [String: Any])
        XCTAssertEqual(data["dispatch_id"] as? String, updateID)
        XCTAssertEqual(data["activity_id"] as? String, "match-0")
        XCTAssertEqual(data["notifications"] as? Int, Self.tokens)
        let counts = try XCTUnwrap(data["counts"] as? [String: Any])
        XCTAssertEqual(counts["delivered"] as? Int, Self.tokens - Self.unregisteredCount)
        XCTAssertEqual(counts["unregistered"] as? Int, Self.unregisteredCount)
        let removed = events.filter { $0.type == "token.removed" }.compactMap {
            ($0.object["data"] as? [String: Any])?["token"] as? String
        }
        XCTAssertEqual(Set(removed), Set(unregistered))
        for event in events where event.type == "token.removed" {
            let data = try XCTUnwrap(event.object["data"] as? [String: Any])
            XCTAssertEqual(data["reason"] as? String, "unregistered")
            XCTAssertEqual(data["activity_id"] as? String, "match-0")
        }

        // The other workspace's endpoint got nothing of acme's.
        XCTAssertTrue(globexReceiver.allCalls.isEmpty, "\(globexReceiver.allCalls.map(\.eventID))")
        // The metrics count the deliveries; the backlog drains.
        try receiver.wait(timeout: 10, "backlog 0") { _ in
            (try? serve.curl("GET", "/metrics").text.contains(#"fanout_webhook_backlog{endpoint="acme/0"} 0"#))
                == true
        }
        let metrics = try serve.curl("GET", "/metrics").text
        XCTAssertTrue(metrics.contains(#"fanout_webhook_deliveries_total{endpoint="acme/0"}"#), metrics)
        for log in [firstLog, serve.log] {
            XCTAssertFalse(log.contains(Self.secret), "the secret is never logged")
            XCTAssertFalse(log.contains(Self.globexSecret), "the secret is never logged")
        }
        print("webhook life test: \(calls.count) calls for \(events.count) events in \(Int(elapsed)) s")
    }

    /// Whether the receiver has held its one call yet.
    private final class HeldOnce: Sendable {
        let flag = Atomic<Bool>(false)
    }

    /// A receiver that accepts connections and never answers: a 10,000-token push still finishes in about the time
    /// the same push takes for a workspace without webhooks, and the events wait in the backlog.
    func testAReceiverThatNeverAnswersDoesNotHoldUpSending() throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let receiver = try WebhookReceiver(secret: Self.secret) { _, _, _ in true }
        defer { receiver.stop() }
        let serve = try ServeHarness(
            testCase: self, mock: mock,
            acmeExtra: ["webhooks": endpoint(receiver, env: "ACME_HOOK_SECRET", extra: ["timeout_seconds": 30])])
        try serve.start(environment: ["ACME_HOOK_SECRET": Self.secret])
        defer { serve.stop() }
        let tokens = (0..<Self.tokens).map { "\"\(testDeviceToken($0))\"" }.joined(separator: ",")
        let body = #"{"alert": {"title": "Hi"}, "audience": {"tokens": [\#(tokens)]}}"#

        func timedPush(key: String) throws -> TimeInterval {
            let started = Date()
            let response = try serve.curl("POST", "/v1/push", key: key, json: body)
            XCTAssertEqual(response.status, 202, response.text)
            let id = try XCTUnwrap(try response.object()["dispatch_id"] as? String)
            let done = try serve.waitForDispatch(id, key: key, timeout: 120)
            XCTAssertEqual(done["delivered"] as? Int, Self.tokens, "\(done)")
            return Date().timeIntervalSince(started)
        }
        // Alternating, so that warm-up favours neither.
        let without1 = try timedPush(key: ServeKeys.globexServer)
        let hung1 = try timedPush(key: ServeKeys.acmeServer)
        let without2 = try timedPush(key: ServeKeys.globexServer)
        let hung2 = try timedPush(key: ServeKeys.acmeServer)
        let without = min(without1, without2)
        let hung = min(hung1, hung2)
        XCTAssertLessThan(hung, without * 2 + 1, "with a hung receiver \(hung) s, without webhooks \(without) s")
        // The receiver holds the first event of each lane in use; the rest wait in the backlog.
        try receiver.wait(timeout: 10, "the first delivery") { !$0.isEmpty }
        // A dispatch reads `done` a moment before its finished event is recorded: the backlog reaches 4 then.
        let backlogFour = #"fanout_webhook_backlog{endpoint="acme/0"} 4"#
        var metrics = try serve.curl("GET", "/metrics").text
        let recorded = Date().addingTimeInterval(10)
        while !metrics.contains(backlogFour) && Date() < recorded {
            usleep(20_000)
            metrics = try serve.curl("GET", "/metrics").text
        }
        XCTAssertTrue(metrics.contains(backlogFour), metrics)
        // The status shows the workspace's own endpoint and its backlog, by label, not by URL.
        let status = try serve.curl("GET", "/v1/status", key: ServeKeys.acmeServer)
        let webhooks = try XCTUnwrap(try status.object()["webhooks"] as? [[String: Any]], status.text)
        XCTAssertEqual(webhooks.map { $0["endpoint"] as? String }, ["acme/0"], status.text)
        XCTAssertEqual(webhooks.first?["backlog"] as? Int, 4, status.text)
        XCTAssertEqual(webhooks.first?["delivered"] as? Int, 0, status.text)
        XCTAssertFalse(status.text.contains("127.0.0.1"), "no endpoint URL in the status: \(status.text)")
        let other = try serve.curl("GET", "/v1/status", key: ServeKeys.globexServer)
        XCTAssertNil(try other.object()["webhooks"], "a workspace without webhooks shows none: \(other.text)")
        print("hung receiver: 10,000-token push \(hung) s with it, \(without) s without webhooks")
    }

    /// The `text/event-stream` blocks of an answer: (id, event, data) for each event, and the last `id:` seen.
    private func parseStream(_ text: String) -> (events: [(id: Int, type: String, data: [String: Any])], lastID: Int?) {
        var events: [(id: Int, type: String, data: [String: Any])] = []
        var lastID: Int?
        for block in text.components(separatedBy: "\n\n") {
            var id: Int?
            var type = "message"
            var data: String?
            for line in block.split(separator: "\n") {
                if line.hasPrefix("id: ") { id = Int(line.dropFirst(4)) }
                if line.hasPrefix("event: ") { type = String(line.dropFirst(7)) }
                if line.hasPrefix("data: ") { data = String(line.dropFirst(6)) }
            }
            if let id { lastID = id }
            if let id, let data,
                let object = (try? JSONSerialization.jsonObject(with: Data(data.utf8))) as? [String: Any]
            {
                events.append((id, type, object))
            }
        }
        return (events, lastID)
    }

    /// `GET /v1/events`: a workspace with `event_stream` reads its own events, resuming after `Last-Event-ID`, and
    /// never another workspace's.
    func testEventStreamResumesAfterLastEventIDAndKeepsWorkspacesApart() throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let receiver = try WebhookReceiver(secret: Self.secret)
        defer { receiver.stop() }
        let serve = try ServeHarness(
            testCase: self, mock: mock, acmeExtra: ["webhooks": endpoint(receiver, env: "ACME_HOOK_SECRET")],
            globexExtra: ["event_stream": true])
        try serve.start(environment: ["ACME_HOOK_SECRET": Self.secret])
        defer { serve.stop() }

        // From now: an empty answer whose id is where the next one starts.
        let first = try serve.curl("GET", "/v1/events?wait=0", key: ServeKeys.globexServer)
        XCTAssertEqual(first.status, 200, first.text)
        XCTAssertEqual(first.headers["content-type"], "text/event-stream; charset=utf-8")
        let start = try XCTUnwrap(parseStream(first.text).lastID)
        XCTAssertTrue(parseStream(first.text).events.isEmpty)

        func push(_ key: String) throws -> String {
            let response = try serve.curl(
                "POST", "/v1/push", key: key,
                json: #"{"alert": {"title": "Hi"}, "audience": {"tokens": ["\#(testDeviceToken(1))"]}}"#)
            XCTAssertEqual(response.status, 202, response.text)
            let id = try XCTUnwrap(try response.object()["dispatch_id"] as? String)
            _ = try serve.waitForDispatch(id, key: key)
            return id
        }
        let acmeID = try push(ServeKeys.acmeServer)
        let globexID = try push(ServeKeys.globexServer)

        var seen: [(id: Int, type: String, data: [String: Any])] = []
        var cursor = start
        let deadline = Date().addingTimeInterval(30)
        while seen.count < 2 && Date() < deadline {
            let answer = try serve.curl(
                "GET", "/v1/events?wait=5", key: ServeKeys.globexServer, headers: ["Last-Event-ID": String(cursor)])
            XCTAssertEqual(answer.status, 200, answer.text)
            let parsed = parseStream(answer.text)
            seen += parsed.events
            cursor = parsed.lastID ?? cursor
        }
        XCTAssertEqual(seen.map(\.type), ["dispatch.accepted", "dispatch.finished"])
        XCTAssertEqual(
            seen.map { $0.data["id"] as? String }, ["evt_\(globexID)_accepted", "evt_\(globexID)_finished"])
        XCTAssertTrue(seen.allSatisfy { $0.data["workspace"] as? String == "globex" })
        XCTAssertEqual(seen.map(\.id), seen.map(\.id).sorted())
        // Resuming after the first event gives the second again; nothing after the last.
        let resumed = try serve.curl(
            "GET", "/v1/events?wait=0", key: ServeKeys.globexServer, headers: ["Last-Event-ID": String(seen[0].id)])
        XCTAssertEqual(parseStream(resumed.text).events.map(\.id), [seen[1].id])
        let after = try serve.curl(
            "GET", "/v1/events?wait=0", key: ServeKeys.globexServer, headers: ["Last-Event-ID": String(seen[1].id)])
        XCTAssertTrue(parseStream(after.text).events.isEmpty)
        // From the beginning: still only globex's; acme reads its own (it has webhooks).
        let all = try serve.curl("GET", "/v1/events?wait=0&last_event_id=0", key: ServeKeys.globexServer)
        XCTAssertEqual(parseStream(all.text).events.count, 2)
        let acme = try serve.curl("GET", "/v1/events?wait=0&last_event_id=0", key: ServeKeys.acmeServer)
        XCTAssertEqual(
            Set(parseStream(acme.text).events.compactMap { $0.data["id"] as? String }),
            ["evt_\(acmeID)_accepted", "evt_\(acmeID)_finished"])
        // Device keys and bad ids are refused.
        XCTAssertEqual(try serve.curl("GET", "/v1/events?wait=0", key: ServeKeys.globexDevice).status, 403)
        XCTAssertEqual(
            try serve.curl(
                "GET", "/v1/events?wait=0", key: ServeKeys.globexServer, headers: ["Last-Event-ID": "abc"]
            ).status, 400)
    }

    /// A secret the environment does not have stops the start (exit 2) naming the key, not the variable's value.
    func testAMissingSecretStopsTheStartNamingTheKey() throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let receiver = try WebhookReceiver(secret: Self.secret)
        defer { receiver.stop() }
        let serve = try ServeHarness(
            testCase: self, mock: mock, acmeExtra: ["webhooks": endpoint(receiver, env: "ACME_HOOK_SECRET")])
        let result = try ProcessSupport.run(
            serve.fanout,
            ["serve", "--config", serve.configPath, "--db", serve.database, "--listen", "127.0.0.1:0"],
            environment: ProcessSupport.cleanEnvironment(adding: [:]), timeout: 30)
        XCTAssertEqual(result.exitCode, 2, result.summary)
        XCTAssertTrue(
            result.stderr.contains(
                "workspaces.acme.webhooks[0].secret_env: environment variable ACME_HOOK_SECRET is not set"),
            result.summary)
    }

    /// With the registry on Redis (`--redis`), token removals come from its stream: APNs's 410s and a device's stop
    /// reach the webhook as `token.removed`, with their reasons.
    func testTokenRemovalsFromARedisRegistryReachTheWebhook() throws {
        let redis = try RedisServerProcess(for: self)
        let dead = (0..<5).map { testDeviceToken(500 + $0) }
        let unregisteredFile = FileManager.default.temporaryDirectory.appendingPathComponent(
            "webhook-redis-unregistered-\(UUID().uuidString)"
        ).path
        try dead.joined(separator: "\n").write(toFile: unregisteredFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: unregisteredFile) }
        let mock = try MockHarness { $0.unregisteredPath = unregisteredFile }
        defer { mock.stop() }
        let receiver = try WebhookReceiver(secret: Self.secret)
        defer { receiver.stop() }
        let serve = try ServeHarness(
            testCase: self, mock: mock, acmeExtra: ["webhooks": endpoint(receiver, env: "ACME_HOOK_SECRET")])
        try serve.start(arguments: ["--redis", redis.url], environment: ["ACME_HOOK_SECRET": Self.secret])
        addTeardownBlock { serve.stop() }

        for index in 0..<20 {
            let registered = try serve.curl(
                "POST", "/v1/activities/match-r/tokens", key: ServeKeys.acmeDevice,
                json: #"{"token": "\#(testDeviceToken(490 + index))", "device_id": "d-\#(index)"}"#)
            XCTAssertEqual(registered.status, 200, registered.text)
        }
        let stopped = try serve.curl(
            "DELETE", "/v1/activities/match-r/tokens", key: ServeKeys.acmeDevice, json: #"{"device_id": "d-0"}"#)
        XCTAssertEqual(stopped.status, 200, stopped.text)
        let update = try serve.curl(
            "POST", "/v1/activities/match-r/update", key: ServeKeys.acmeServer,
            json: #"{"content_state": {"minute": 1}}"#)
        XCTAssertEqual(update.status, 202, update.text)
        let id = try XCTUnwrap(try update.object()["dispatch_id"] as? String)

        try receiver.wait(timeout: 60, "the removals and the dispatch") { _ in
            let events = receiver.deduplicated
            return events.filter { $0.type == "token.removed" }.count == dead.count + 1
                && events.contains { $0.eventID == "evt_\(id)_finished" }
        }
        XCTAssertTrue(receiver.allCalls.allSatisfy(\.signatureValid))
        var reasons: [String: String] = [:]
        for event in receiver.deduplicated where event.type == "token.removed" {
            let data = try XCTUnwrap(event.object["data"] as? [String: Any])
            reasons[try XCTUnwrap(data["token"] as? String)] = data["reason"] as? String
            XCTAssertEqual(data["activity_id"] as? String, "match-r")
        }
        var expected = Dictionary(uniqueKeysWithValues: dead.map { ($0, "unregistered") })
        expected[testDeviceToken(490)] = "stopped"
        XCTAssertEqual(reasons, expected)
    }
}
