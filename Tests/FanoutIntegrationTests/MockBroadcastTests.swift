import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation
import MockAPNsKit
import XCTest

/// mock-apns's broadcast push (iOS 18) end to end over HTTP/2 and TLS: the channel-management listener, broadcast
/// sends on the push listener, and their stats (docs/reference/broadcast-channels.md, "Channel management API" and
/// "Broadcast send"). Driven with the raw HTTP/2
/// client; curl where a test reads response headers the raw client does not keep (`apns-channel-id`,
/// `apns-request-id`).
final class MockBroadcastTests: XCTestCase {
    private var mock: MockHarness!
    private var push: RawClient!
    private var manage: RawClient!
    private var bearer = ""

    static let app = "com.example.app"
    static let channelsPath = "/1/apps/\(app)/channels"
    static let listPath = "/1/apps/\(app)/all-channels"
    static let broadcastPath = "/4/broadcasts/apps/\(app)"
    static let createBody = Array(#"{"message-storage-policy": 1, "push-type": "LiveActivity"}"#.utf8)
    static let updateBody = Array(
        (#"{"aps":{"timestamp":1685952000,"event":"update","content-state":{"score":"2-1"},"#
            + #""alert":{"title":"Goal!","body":"2-1"}}}"#).utf8)
    static let requestID = "0b3a6f5e-9f2a-4c61-8a55-1f0d7c1c2e3f"

    override func setUpWithError() throws {
        try start()
    }

    private func start(_ configure: @escaping (inout MockOptions) -> Void = { _ in }) throws {
        tearDown()
        mock = try MockHarness { options in
            options.manageListen = MockListenAddress(host: "127.0.0.1", port: 0)
            configure(&options)
        }
        push = try mock.makeClient()
        manage = try mock.makeManageClient()
        bearer = "bearer \(try mock.providerToken())"
    }

    override func tearDown() {
        push?.close()
        manage?.close()
        mock?.stop()
        push = nil
        manage = nil
        mock = nil
    }

    // MARK: Helpers

    private struct Answer {
        var status: Int
        var reason: String?
        var body: [UInt8]
        var uniqueID: String?

        func json() throws -> [String: Any] {
            try XCTUnwrap(JSONSerialization.jsonObject(with: Data(body)) as? [String: Any])
        }
    }

    private func answer(
        _ outcome: Result<HTTP2Response, HTTP2StreamFailure>?, file: StaticString, line: UInt
    ) -> Answer? {
        switch outcome {
        case .success(let response):
            let reason = response.body.isEmpty ? nil : APNsResponse.parseErrorBody(response.body).reason?.rawValue
            return Answer(status: response.status, reason: reason, body: response.body, uniqueID: response.apnsUniqueID)
        case .failure(let failure):
            XCTFail("stream failed: \(failure)", file: file, line: line)
        case nil:
            XCTFail("no response within the timeout", file: file, line: line)
        }
        return nil
    }

    /// A management request with the provider token (unless `authorization` is given) plus `headers`.
    private func manageRequest(
        _ method: String, _ path: String = channelsPath, headers: [(String, String)] = [], body: [UInt8] = [],
        authorization: String? = nil, file: StaticString = #filePath, line: UInt = #line
    ) -> Answer? {
        answer(
            manage.send(
                method: method, path: path, headers: [("authorization", authorization ?? bearer)] + headers,
                body: body),
            file: file, line: line)
    }

    /// Creates a channel over HTTP and returns its id, found as the one new entry of the app's list.
    private func createChannel(
        policy: Int = 1, file: StaticString = #filePath, line: UInt = #line
    ) throws -> String {
        let before = Set(try listChannels(file: file, line: line))
        let body = Array(#"{"message-storage-policy": \#(policy), "push-type": "LiveActivity"}"#.utf8)
        let created = manageRequest("POST", body: body, file: file, line: line)
        XCTAssertEqual(created?.status, 201, "reason: \(created?.reason ?? "none")", file: file, line: line)
        XCTAssertEqual(created?.body, [], "create answers with an empty body", file: file, line: line)
        let added = Set(try listChannels(file: file, line: line)).subtracting(before)
        XCTAssertEqual(added.count, 1, file: file, line: line)
        return try XCTUnwrap(added.first, file: file, line: line)
    }

    private func listChannels(file: StaticString = #filePath, line: UInt = #line) throws -> [String] {
        let listed = try XCTUnwrap(manageRequest("GET", Self.listPath, file: file, line: line), file: file, line: line)
        XCTAssertEqual(listed.status, 200, file: file, line: line)
        return try XCTUnwrap(listed.json()["channels"] as? [String], file: file, line: line)
    }

    private func assertRejected(
        _ answer: Answer?, _ status: Int, _ reason: String, file: StaticString = #filePath, line: UInt = #line
    ) {
        guard let answer else { return }
        XCTAssertEqual(answer.status, status, "status (reason \(answer.reason ?? "none"))", file: file, line: line)
        XCTAssertEqual(answer.reason, reason, "reason", file: file, line: line)
    }

    /// Headers of a valid broadcast on `channel`, with `replacing` values swapped in (nil removes one) and `extra`.
    private func broadcastHeaders(
        channel: String, replacing: [String: String?] = [:], extra: [(String, String)] = []
    ) -> [(String, String)] {
        let base: [(String, String?)] = [
            ("apns-channel-id", channel), ("apns-push-type", "liveactivity"), ("apns-priority", "10"),
            ("apns-expiration", "0"),
        ]
        return base.compactMap { name, value in
            let chosen = replacing.keys.contains(name) ? replacing[name]! : value
            return chosen.map { (name, $0) }
        } + extra
    }

    private func broadcast(
        channel: String, replacing: [String: String?] = [:], extra: [(String, String)] = [],
        body: [UInt8] = updateBody, path: String = broadcastPath, method: String = "POST",
        authorization: String? = nil, file: StaticString = #filePath, line: UInt = #line
    ) -> Answer? {
        answer(
            push.send(
                method: method, path: path,
                headers: [("authorization", authorization ?? bearer)]
                    + broadcastHeaders(channel: channel, replacing: replacing, extra: extra),
                body: body),
            file: file, line: line)
    }

    /// One curl request to the mock (for the response headers the raw client does not keep).
    private func curl(
        _ method: String, _ port: Int, _ path: String, headers: [String: String] = [:], body: String? = nil
    ) throws -> CurlResponse {
        let curl = try XCTUnwrap(ProcessSupport.findTool("curl"), "curl is installed by make deps")
        let directory = try ProcessSupport.temporaryDirectory(for: self, "curl")
        let headerFile = (directory as NSString).appendingPathComponent("headers")
        var arguments = [
            "-sS", "--http2", "--cacert", mock.material.caPEMPath, "-X", method, "-D", headerFile, "--max-time", "20",
            "-o", "-", "-H", "authorization: \(bearer)",
        ]
        for (name, value) in headers { arguments += ["-H", "\(name): \(value)"] }
        if let body { arguments += ["--data-binary", body] }
        arguments.append("https://localhost:\(port)\(path)")
        let result = try ProcessSupport.run(curl, arguments, timeout: 30)
        guard result.exitCode == 0 else { throw ProcessSupportError("curl failed: \(result.summary)") }
        return CurlResponse(
            rawHeaders: (try? String(contentsOfFile: headerFile, encoding: .utf8)) ?? "", body: result.stdoutData)
    }

    // MARK: Channel management

    func testCreateReadListDelete() throws {
        XCTAssertEqual(try listChannels(), [])
        let stored = try createChannel(policy: 1)
        let unstored = try createChannel(policy: 0)
        XCTAssertNotEqual(stored, unstored)
        XCTAssertTrue(ChannelID.isWellFormed(stored))
        XCTAssertEqual(Set(try listChannels()), [stored, unstored])
        XCTAssertEqual(mock.server.channels.policy(app: Self.app, channel: unstored), .noMessageStored)

        let read = try XCTUnwrap(manageRequest("GET", headers: [("apns-channel-id", stored)]))
        XCTAssertEqual(read.status, 200)
        XCTAssertEqual(read.reason, nil)
        XCTAssertEqual(try read.json()["message-storage-policy"] as? Int, 1)
        XCTAssertEqual(try read.json()["push-type"] as? String, "LiveActivity")
        let readUnstored = try XCTUnwrap(manageRequest("GET", headers: [("apns-channel-id", unstored)]))
        XCTAssertEqual(try readUnstored.json()["message-storage-policy"] as? Int, 0)

        let deleted = try XCTUnwrap(manageRequest("DELETE", headers: [("apns-channel-id", stored)]))
        XCTAssertEqual(deleted.status, 204)
        XCTAssertEqual(deleted.body, [])
        assertRejected(manageRequest("GET", headers: [("apns-channel-id", stored)]), 400, "ChannelNotRegistered")
        assertRejected(manageRequest("DELETE", headers: [("apns-channel-id", stored)]), 400, "ChannelNotRegistered")
        XCTAssertEqual(try listChannels(), [unstored])
        XCTAssertEqual(mock.stats.channelCount, 1)
        XCTAssertEqual(mock.stats.snapshot()["channels"] as? Int, 1)

        // Channels belong to their app: another app sees none of them.
        let other = try XCTUnwrap(manageRequest("GET", "/1/apps/com.other.app/all-channels"))
        XCTAssertEqual(try other.json()["channels"] as? [String], [])
        assertRejected(
            manageRequest("GET", "/1/apps/com.other.app/channels", headers: [("apns-channel-id", unstored)]), 400,
            "ChannelNotRegistered")
    }

    func testPushTypeIsCaseInsensitiveOnCreate() throws {
        for pushType in ["LiveActivity", "liveactivity", "LIVEACTIVITY"] {
            let body = Array(#"{"message-storage-policy": 0, "push-type": "\#(pushType)"}"#.utf8)
            XCTAssertEqual(manageRequest("POST", body: body)?.status, 201, pushType)
        }
        XCTAssertEqual(mock.server.channels.count, 3)
    }

    /// The headers the raw client does not keep: `apns-channel-id` on create, `apns-request-id` echoed when given
    /// (on errors too) and generated (lowercase) when not.
    func testCreateAnswersWithChannelIDAndRequestIDHeaders() throws {
        let port = try XCTUnwrap(mock.server.managePort)
        let created = try curl(
            "POST", port, Self.channelsPath, headers: ["apns-request-id": Self.requestID],
            body: #"{"message-storage-policy": 1, "push-type": "LiveActivity"}"#)
        XCTAssertEqual(created.status, 201)
        XCTAssertEqual(created.headers["apns-request-id"], Self.requestID)
        let channel = try XCTUnwrap(created.headers["apns-channel-id"])
        XCTAssertTrue(ChannelID.isWellFormed(channel), channel)
        XCTAssertEqual(created.body, Data())
        XCTAssertTrue(mock.server.channels.exists(app: Self.app, channel: channel))

        let listed = try curl("GET", port, Self.listPath)
        XCTAssertEqual(listed.status, 200)
        let generated = try XCTUnwrap(listed.headers["apns-request-id"])
        XCTAssertTrue(BroadcastRules.isValidRequestID(generated), generated)

        let failed = try curl("GET", port, Self.channelsPath, headers: ["apns-request-id": Self.requestID])
        XCTAssertEqual(failed.status, 400)
        XCTAssertEqual(failed.headers["apns-request-id"], Self.requestID, "echoed on errors too")
        XCTAssertEqual(try failed.object()["reason"] as? String, "MissingChannelId")

        let sent = try curl(
            "POST", mock.port, Self.broadcastPath,
            headers: [
                "apns-channel-id": channel, "apns-push-type": "liveactivity", "apns-priority": "5",
                "apns-expiration": "0", "apns-request-id": Self.requestID,
            ], body: String(decoding: Self.updateBody, as: UTF8.self))
        XCTAssertEqual(sent.status, 200, sent.text)
        XCTAssertEqual(sent.headers["apns-request-id"], Self.requestID)
        XCTAssertTrue(APNsID.isValid(sent.headers["apns-unique-id"] ?? ""))
        XCTAssertEqual(sent.body, Data())
    }

    func testManagementErrors() throws {
        let channel = try createChannel()
        let json = { (text: String) in Array(text.utf8) }
        assertRejected(manageRequest("GET"), 400, "MissingChannelId")
        assertRejected(manageRequest("DELETE"), 400, "MissingChannelId")
        assertRejected(manageRequest("GET", headers: [("apns-channel-id", "not base64!")]), 400, "BadChannelId")
        assertRejected(
            manageRequest("GET", headers: [("apns-channel-id", "AAAAAAAAAAAAAAAAAAAAAA==")]), 400,
            "ChannelNotRegistered")
        assertRejected(
            manageRequest(
                "POST", body: json(#"{"message-storage-policy": 1, "push-type": "LiveActivity", "name": "x"}"#)),
            400, "BadRequestParams")
        assertRejected(
            manageRequest("POST", body: json(#"{"message-storage-policy": 2, "push-type": "LiveActivity"}"#)),
            400, "BadRequestParams")
        assertRejected(manageRequest("POST", body: json("{not json")), 400, "BadRequestPayload")
        assertRejected(manageRequest("POST"), 400, "BadRequestPayload")
        assertRejected(manageRequest("POST", body: json(#"{"message-storage-policy": 1}"#)), 400, "MissingPushType")
        assertRejected(
            manageRequest("POST", body: json(#"{"message-storage-policy": 1, "push-type": "alert"}"#)), 400,
            "InvalidPushType")
        assertRejected(manageRequest("GET", "/1/apps/\(Self.app)/channel"), 404, "BadPath")
        assertRejected(manageRequest("GET", "/3/device/\(testDeviceToken())"), 404, "BadPath")
        assertRejected(manageRequest("PUT", body: Self.createBody), 405, "MethodNotAllowed")
        assertRejected(manageRequest("DELETE", Self.listPath), 405, "MethodNotAllowed")
        assertRejected(
            manageRequest("POST", "/1/apps/\(Self.app).push-type.liveactivity/channels", body: Self.createBody), 400,
            "TopicDisallowed")
        XCTAssertEqual(try listChannels(), [channel], "no failed request created a channel")
    }

    func testManageListenerChecksProviderTokens() throws {
        assertRejected(
            answer(
                manage.send(method: "GET", path: Self.listPath, headers: [], body: []), file: #filePath, line: #line),
            403, "MissingProviderToken")
        assertRejected(
            manageRequest("GET", Self.listPath, authorization: "bearer not.a.jwt"), 403, "InvalidProviderToken")
        let stale = "bearer \(try mock.providerToken(issuedAt: Int64(time(nil)) - 7200))"
        assertRejected(manageRequest("POST", body: Self.createBody, authorization: stale), 403, "ExpiredProviderToken")
        let otherKey = try ES256PrivateKey.generate()
        let foreign = try makeProviderToken(
            key: otherKey, keyID: "KEYID12345", teamID: "TEAMID1234", issuedAt: Int64(time(nil)))
        assertRejected(
            manageRequest("POST", body: Self.createBody, authorization: "bearer \(foreign)"), 403,
            "InvalidProviderToken")
        XCTAssertEqual(mock.server.channels.count, 0)
        XCTAssertEqual(manageRequest("GET", Self.listPath)?.status, 200, "a good token still works")
    }

    /// Apple's limit, for real: 10,000 channels of one app in one environment, then CannotCreateChannelConfig.
    func testTheTenThousandAndFirstChannelCannotBeCreated() throws {
        XCTAssertEqual(mock.server.channels.maxPerApp, 10_000)
        let started = Date()
        // One request first: the connection gets its full stream window after the first good token.
        XCTAssertEqual(manageRequest("POST", body: Self.createBody)?.status, 201)
        var remaining = 9_999
        while remaining > 0 {
            let batch = min(remaining, 1000)
            let outcomes = manage.sendConcurrently(
                paths: Array(repeating: Self.channelsPath, count: batch), headers: [("authorization", bearer)],
                body: Self.createBody, timeout: 30)
            let created = outcomes.filter { (try? $0?.get().status) == 201 }.count
            XCTAssertEqual(created, batch)
            guard created == batch else { return }
            remaining -= batch
        }
        XCTAssertEqual(mock.server.channels.count, 10_000)
        assertRejected(manageRequest("POST", body: Self.createBody), 400, "CannotCreateChannelConfig")
        XCTAssertEqual(try listChannels().count, 10_000)
        XCTAssertEqual(
            manageRequest("POST", "/1/apps/com.other.app/channels", body: Self.createBody)?.status, 201,
            "the limit is per app")
        let one = try XCTUnwrap(try listChannels().first)
        XCTAssertEqual(manageRequest("DELETE", headers: [("apns-channel-id", one)])?.status, 204)
        XCTAssertEqual(manageRequest("POST", body: Self.createBody)?.status, 201, "deleting frees a slot")
        XCTAssertLessThan(Date().timeIntervalSince(started), 20, "the real limit must stay cheap to test")
    }

    func testChannelLimitOption() throws {
        try start { $0.maxChannelsPerApp = 2 }
        XCTAssertEqual(manageRequest("POST", body: Self.createBody)?.status, 201)
        XCTAssertEqual(manageRequest("POST", body: Self.createBody)?.status, 201)
        assertRejected(manageRequest("POST", body: Self.createBody), 400, "CannotCreateChannelConfig")
        XCTAssertNil(mock.server.channels.create(app: Self.app), "the test accessor obeys the limit too")
    }

    /// One mock process is one environment: a channel made on the development mock does not exist on production.
    func testChannelsAreKeptPerEnvironment() throws {
        let developmentChannel = try createChannel()
        XCTAssertEqual(mock.server.channels.environment, .development)
        let production = try MockHarness { options in
            options.environment = .production
            options.manageListen = MockListenAddress()
        }
        defer { production.stop() }
        XCTAssertEqual(production.server.channels.environment, .production)
        let client = try production.makeClient()
        defer { client.close() }
        let token = "bearer \(try production.providerToken())"
        let outcome = client.send(
            path: Self.broadcastPath,
            headers: [("authorization", token)] + broadcastHeaders(channel: developmentChannel), body: Self.updateBody)
        assertRejected(answer(outcome, file: #filePath, line: #line), 400, "ChannelNotRegistered")
        XCTAssertEqual(broadcast(channel: developmentChannel)?.status, 200, "while development accepts it")
    }

    // MARK: Broadcast sends

    func testValidBroadcastsAreCountedPerChannel() throws {
        let first = try createChannel(policy: 1)
        let second = mock.server.channels.create(app: Self.app, policy: .noMessageStored)!
        for _ in 0..<3 {
            let sent = try XCTUnwrap(broadcast(channel: first, replacing: ["apns-expiration": "1900000000"]))
            XCTAssertEqual(sent.status, 200, "reason: \(sent.reason ?? "none")")
            XCTAssertEqual(sent.body, [])
            XCTAssertTrue(APNsID.isValid(sent.uniqueID ?? ""), "apns-unique-id")
        }
        XCTAssertEqual(broadcast(channel: second, replacing: ["apns-priority": "5"])?.status, 200)
        XCTAssertEqual(broadcast(channel: second, replacing: ["apns-push-type": "LiveActivity"])?.status, 200)
        let end = Array(#"{"aps":{"timestamp":1685952001,"event":"end","content-state":{}}}"#.utf8)
        XCTAssertEqual(broadcast(channel: second, body: end)?.status, 200)
        assertRejected(broadcast(channel: first, replacing: ["apns-priority": "3"]), 400, "BadPriority")

        XCTAssertEqual(mock.stats.broadcasts(channel: first), 3)
        XCTAssertEqual(mock.stats.broadcasts(channel: second), 3)
        XCTAssertEqual(mock.stats.broadcasts, 6)
        XCTAssertEqual(mock.stats.broadcastsByChannel, [first: 3, second: 3])
        XCTAssertEqual(mock.stats.accepted, 0, "accepted counts device pushes")
        let snapshot = mock.stats.snapshot()
        XCTAssertEqual(snapshot["broadcasts"] as? Int, 6)
        XCTAssertEqual(snapshot["broadcasts_by_channel"] as? [String: Int], [first: 3, second: 3])
        XCTAssertEqual(snapshot["channels"] as? Int, 2)
        XCTAssertEqual(snapshot["requests"] as? Int, 7, "broadcasts count as requests on the push listener")
        XCTAssertEqual(snapshot["by_reason"] as? [String: Int], ["BadPriority": 1])
    }

    /// Every rejection of BroadcastRequestValidator's table, over the wire.
    func testEachBroadcastValidationReason() throws {
        let channel = try createChannel(policy: 1)
        let unstored = try createChannel(policy: 0)
        assertRejected(broadcast(channel: channel, method: "GET"), 405, "MethodNotAllowed")
        assertRejected(broadcast(channel: channel, path: "/4/broadcasts/apps/"), 404, "BadPath")
        assertRejected(broadcast(channel: channel, path: "/4/broadcast/\(Self.app)"), 404, "BadPath")
        assertRejected(
            broadcast(channel: channel, path: Self.broadcastPath + ".push-type.liveactivity"), 400, "TopicDisallowed")
        assertRejected(broadcast(channel: channel, extra: [("apns-topic", Self.app)]), 400, "TopicDisallowed")
        assertRejected(broadcast(channel: channel, extra: [("apns-priority", "5")]), 400, "DuplicateHeaders")
        assertRejected(broadcast(channel: channel, extra: [("apns-request-id", "nope")]), 400, "BadMessageId")
        assertRejected(broadcast(channel: channel, replacing: ["apns-channel-id": nil]), 400, "MissingChannelId")
        assertRejected(broadcast(channel: "not base64!"), 400, "BadChannelId")
        assertRejected(broadcast(channel: "AAAAAAAAAAAAAAAAAAAAAA=="), 400, "ChannelNotRegistered")
        assertRejected(
            broadcast(channel: channel, path: "/4/broadcasts/apps/com.other.app"), 400, "ChannelNotRegistered")
        assertRejected(broadcast(channel: channel, replacing: ["apns-push-type": nil]), 400, "MissingPushType")
        assertRejected(broadcast(channel: channel, replacing: ["apns-push-type": "alert"]), 400, "InvalidPushType")
        assertRejected(broadcast(channel: channel, replacing: ["apns-priority": nil]), 400, "BadPriority")
        assertRejected(broadcast(channel: channel, replacing: ["apns-priority": "7"]), 400, "BadPriority")
        assertRejected(broadcast(channel: channel, replacing: ["apns-expiration": nil]), 400, "BadExpirationDate")
        assertRejected(broadcast(channel: channel, replacing: ["apns-expiration": "-5"]), 400, "BadExpirationDate")
        assertRejected(
            broadcast(channel: unstored, replacing: ["apns-expiration": "1900000000"]), 400, "BadExpirationDate")
        assertRejected(broadcast(channel: channel, body: []), 400, "PayloadEmpty")
        assertRejected(broadcast(channel: channel, body: paddedAlertPayload(size: 5121)), 413, "PayloadTooLarge")
        assertRejected(broadcast(channel: channel, body: Array("{".utf8)), 400, "BadRequestPayload")
        let start = Array(#"{"aps":{"timestamp":1,"event":"start","content-state":{}}}"#.utf8)
        assertRejected(broadcast(channel: channel, body: start), 400, "BadRequestPayload")
        assertRejected(broadcast(channel: channel, body: paddedAlertPayload(size: 100)), 400, "BadRequestPayload")

        // A deleted channel is gone for sends too.
        XCTAssertEqual(manageRequest("DELETE", headers: [("apns-channel-id", channel)])?.status, 204)
        assertRejected(broadcast(channel: channel), 400, "ChannelNotRegistered")
        XCTAssertEqual(mock.stats.broadcasts, 0)
    }

    func testBroadcastChecksProviderTokens() throws {
        let channel = try createChannel()
        assertRejected(broadcast(channel: channel, authorization: "bearer x.y.z"), 403, "InvalidProviderToken")
        assertRejected(
            answer(
                push.send(path: Self.broadcastPath, headers: broadcastHeaders(channel: channel), body: Self.updateBody),
                file: #filePath, line: #line), 403, "MissingProviderToken")
        XCTAssertEqual(mock.stats.broadcasts, 0)
    }

    /// Device pushes are untouched by the broadcast route, and broadcast paths never reach the device validator.
    func testDevicePushesStillWork() throws {
        let outcome = push.send(
            path: "/3/device/\(testDeviceToken())",
            headers: [("authorization", bearer), ("apns-topic", Self.app), ("apns-push-type", "alert")],
            body: Array(#"{"aps":{"alert":"hi"}}"#.utf8))
        XCTAssertEqual(apnsResponse(outcome)?.status, 200)
        XCTAssertEqual(mock.stats.accepted, 1)
        XCTAssertEqual(mock.stats.broadcasts, 0)
    }

    // MARK: The binary

    /// `--manage-listen` prints a second line in the first one's format, and `--stats` gains the broadcast keys.
    func testBinaryPrintsTheManageListenerAndWritesBroadcastStats() throws {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "mock")
        let statsPath = (directory as NSString).appendingPathComponent("stats.json")
        let process = try MockAPNsProcess(arguments: [
            "--listen", "127.0.0.1:0", "--manage-listen", "127.0.0.1:0", "--tls-dir", directory, "--no-auth",
            "--environment", "production", "--stats", statsPath,
        ])
        defer { _ = try? process.stop() }
        let deadline = Date().addingTimeInterval(10)
        var lines: [Substring] = []
        while Date() < deadline {
            lines = process.child.stdoutText().split(separator: "\n")
            if lines.count >= 2 { break }
            usleep(20_000)
        }
        XCTAssertEqual(lines.count, 2, "\(lines)")
        let second = String(try XCTUnwrap(lines.last))
        XCTAssertTrue(second.hasPrefix("manage listening on 127.0.0.1:"), second)
        let managePort = try XCTUnwrap(Int(second.split(separator: ":").last ?? ""))
        XCTAssertNotEqual(managePort, process.port)

        let client = try RawClient(port: managePort, caFile: (directory as NSString).appendingPathComponent("ca.pem"))
        defer { client.close() }
        let created = client.send(path: Self.channelsPath, headers: [], body: Self.createBody)
        XCTAssertEqual(try created?.get().status, 201)
        try process.stop()
        let stats = try MockAPNsProcess.readStats(statsPath)
        XCTAssertEqual(stats["channels"] as? Int, 1)
        XCTAssertEqual(stats["broadcasts"] as? Int, 0)
        XCTAssertEqual(stats["broadcasts_by_channel"] as? [String: Int], [:])
    }
}
