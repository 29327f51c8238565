// Interoperability with HTTP/2 implementations nobody here wrote: h2load and curl (nghttp2 and libcurl clients)
// against mock-apns, and Fanout's own HTTP/2 client against nghttpd. Each test skips only when its tool is not
// installed (`make deps` installs nghttp2-client, nghttp2-server and curl).
import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation
import XCTest

final class InteropTests: XCTestCase {
    static let topic = "com.example.app"
    static let alertPayload = #"{"aps":{"alert":"hi"}}"#

    private func requireTool(_ name: String, package: String) throws -> String {
        guard let path = ProcessSupport.findTool(name) else {
            print("InteropTests: skipping, \(name) is not installed (Debian package \(package))")
            throw XCTSkip("\(name) is not installed (Debian package \(package))")
        }
        return path
    }

    private func write(_ text: String, to path: String) throws {
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
    }

    // MARK: h2load → mock-apns

    func testH2LoadGetsTwoThousand200sFromMockAPNs() throws {
        let scratch = try ProcessSupport.temporaryDirectory(for: self, "h2load")
        try checkH2LoadGetsTwoThousand200s(
            scratch: scratch, transport: ["--tls-dir", (scratch as NSString).appendingPathComponent("tls")],
            scheme: "https")
    }

    /// `--h2c`: the same over cleartext HTTP/2 with prior knowledge (h2load sends the preface at once for http://),
    /// given as the synopsis in docs/MOCK-APNS.md allows, without --auth-key or --no-auth (tokens are then not
    /// checked).
    func testH2LoadGetsTwoThousand200sFromMockAPNsOverH2C() throws {
        let scratch = try ProcessSupport.temporaryDirectory(for: self, "h2load-h2c")
        try checkH2LoadGetsTwoThousand200s(scratch: scratch, transport: ["--h2c"], scheme: "http", auth: [])
    }

    private func checkH2LoadGetsTwoThousand200s(
        scratch: String, transport: [String], scheme: String, auth: [String] = ["--no-auth"]
    ) throws {
        let h2load = try requireTool("h2load", package: "nghttp2-client")
        let statsPath = (scratch as NSString).appendingPathComponent("stats.json")
        let bodyPath = (scratch as NSString).appendingPathComponent("body.json")
        try write(Self.alertPayload, to: bodyPath)
        let mock = try MockAPNsProcess(
            arguments: ["--listen", "127.0.0.1:0", "--stats", statsPath] + auth + transport)
        var running: MockAPNsProcess? = mock
        defer { _ = try? running?.stop() }

        let result = try ProcessSupport.run(
            h2load,
            [
                "-n", "2000", "-c", "2", "-m", "50", "-d", bodyPath, "-H", "apns-topic: \(Self.topic)",
                "\(scheme)://127.0.0.1:\(mock.port)/3/device/\(testDeviceToken(7))",
            ], timeout: 45)
        XCTAssertEqual(result.exitCode, 0, result.summary)
        let requestsLine = result.stdoutLines.first { $0.hasPrefix("requests:") } ?? ""
        let statusLine = result.stdoutLines.first { $0.hasPrefix("status codes:") } ?? ""
        XCTAssertTrue(requestsLine.contains("2000 total"), result.summary)
        XCTAssertTrue(requestsLine.contains(" 2000 succeeded,"), result.summary)
        XCTAssertTrue(requestsLine.contains(" 0 failed,") && requestsLine.contains(" 0 errored,"), result.summary)
        XCTAssertTrue(statusLine.hasPrefix("status codes: 2000 2xx,"), result.summary)
        XCTAssertTrue(statusLine.contains(" 0 4xx,") && statusLine.contains(" 0 5xx"), result.summary)

        running = nil
        XCTAssertEqual(try mock.stop(), 0)
        let stats = try MockAPNsProcess.readStats(statsPath)
        XCTAssertEqual(stats["accepted"] as? Int, 2000, "\(stats)")
        XCTAssertEqual(stats["requests"] as? Int, 2000, "\(stats)")
        XCTAssertEqual((stats["by_status"] as? [String: Int])?["200"], 2000, "\(stats)")
        XCTAssertEqual(stats["connections"] as? Int, 2, "\(stats)")
        XCTAssertEqual(stats["duplicate_apns_ids"] as? Int, 0, "\(stats)")
    }

    // MARK: curl → mock-apns

    /// One curl request; returns (status, HTTP version, response headers, body).
    private struct CurlAnswer {
        var status: Int
        var httpVersion: String
        var headers: [String: String]
        var body: String
    }

    private func curl(
        _ curl: String, caFile: String, url: String, method: String, headers: [String] = [], body: String? = nil,
        scratch: String
    ) throws -> CurlAnswer {
        let id = UUID().uuidString
        let headerPath = (scratch as NSString).appendingPathComponent("headers-\(id)")
        let bodyPath = (scratch as NSString).appendingPathComponent("body-\(id)")
        var arguments = [
            "--silent", "--show-error", "--http2", "--cacert", caFile, "--max-time", "10", "--request", method,
            "--dump-header", headerPath, "--output", bodyPath, "--write-out", "%{http_code} %{http_version}",
        ]
        for header in headers { arguments += ["--header", header] }
        if let body {
            let requestPath = (scratch as NSString).appendingPathComponent("request-\(id)")
            try write(body, to: requestPath)
            arguments += ["--data-binary", "@\(requestPath)"]
        }
        let result = try ProcessSupport.run(curl, arguments + [url], timeout: 20)
        guard result.exitCode == 0 else { throw ProcessSupportError("curl failed: \(result.summary)") }
        let parts = result.stdout.split(separator: " ")
        guard parts.count == 2, let status = Int(parts[0]) else {
            throw ProcessSupportError("unexpected curl --write-out: \(result.summary)")
        }
        var responseHeaders: [String: String] = [:]
        let headerText = (try? String(contentsOfFile: headerPath, encoding: .utf8)) ?? ""
        for line in headerText.split(whereSeparator: \.isNewline) {
            guard let colon = line.firstIndex(of: ":") else { continue }
            responseHeaders[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
                in: .whitespaces)
        }
        let responseBody = (try? String(contentsOfFile: bodyPath, encoding: .utf8)) ?? ""
        return CurlAnswer(status: status, httpVersion: String(parts[1]), headers: responseHeaders, body: responseBody)
    }

    func testCurlGetsAPNsShapedErrorsFromMockAPNs() throws {
        let curlPath = try requireTool("curl", package: "curl")
        let scratch = try ProcessSupport.temporaryDirectory(for: self, "curl")
        let tls = (scratch as NSString).appendingPathComponent("tls")
        let mock = try MockAPNsProcess(arguments: ["--listen", "127.0.0.1:0", "--no-auth", "--tls-dir", tls])
        defer { _ = try? mock.stop() }
        let caFile = TestTLSMaterial(directory: tls).caPEMPath
        let base = "https://127.0.0.1:\(mock.port)"
        let token = testDeviceToken(3)
        let topic = "apns-topic: \(Self.topic)"

        let cases:
            [(
                name: String, method: String, path: String, headers: [String], body: String?, status: Int,
                reason: String?
            )] = [
                ("bad token", "POST", "/3/device/zz", [topic], Self.alertPayload, 400, "BadDeviceToken"),
                ("GET", "GET", "/3/device/\(token)", [topic], nil, 405, "MethodNotAllowed"),
                ("no topic", "POST", "/3/device/\(token)", [], Self.alertPayload, 400, "MissingTopic"),
                ("bad path", "POST", "/3/devices/\(token)", [topic], Self.alertPayload, 404, "BadPath"),
                (
                    "bad priority", "POST", "/3/device/\(token)", [topic, "apns-priority: 7"], Self.alertPayload, 400,
                    "BadPriority"
                ),
                ("empty body", "POST", "/3/device/\(token)", [topic], "", 400, "PayloadEmpty"),
                ("valid", "POST", "/3/device/\(token)", [topic], Self.alertPayload, 200, nil),
            ]
        for check in cases {
            let answer = try curl(
                curlPath, caFile: caFile, url: base + check.path, method: check.method, headers: check.headers,
                body: check.body, scratch: scratch)
            XCTAssertEqual(answer.httpVersion, "2", check.name)
            XCTAssertEqual(answer.status, check.status, "\(check.name): \(answer)")
            XCTAssertNotNil(
                UUID(uuidString: answer.headers["apns-id"] ?? ""), "\(check.name): apns-id header: \(answer)")
            if let reason = check.reason {
                XCTAssertEqual(answer.body, #"{"reason":"\#(reason)"}"#, check.name)
                XCTAssertEqual(answer.headers["content-type"], "application/json", check.name)
                let object = try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any]
                XCTAssertEqual(object?["reason"] as? String, reason, check.name)
            } else {
                XCTAssertEqual(answer.body, "", "\(check.name): a 200 has no body")
                XCTAssertNotNil(UUID(uuidString: answer.headers["apns-unique-id"] ?? ""), "\(check.name): \(answer)")
            }
        }
    }

    func testCurlWithProviderTokensAgainstMockAPNs() throws {
        let curlPath = try requireTool("curl", package: "curl")
        let scratch = try ProcessSupport.temporaryDirectory(for: self, "curl-auth")
        let tls = (scratch as NSString).appendingPathComponent("tls")
        let mock = try MockAPNsProcess(arguments: [
            "--listen", "127.0.0.1:0", "--tls-dir", tls, "--key-id", "ABC123DEFG", "--team-id", "DEF123GHIJ",
        ])
        defer { _ = try? mock.stop() }
        let material = TestTLSMaterial(directory: tls)
        let key = try ES256PrivateKey(pemFilePath: material.authKeyP8Path)
        let now = Int64(Date().timeIntervalSince1970)
        let good = try makeProviderToken(key: key, keyID: "ABC123DEFG", teamID: "DEF123GHIJ", issuedAt: now)
        let wrongTeam = try makeProviderToken(key: key, keyID: "ABC123DEFG", teamID: "ZZZ999ZZZZ", issuedAt: now)
        let url = "https://127.0.0.1:\(mock.port)/3/device/\(testDeviceToken(4))"
        let topic = "apns-topic: \(Self.topic)"

        let cases: [(name: String, headers: [String], status: Int, reason: String?)] = [
            ("no token", [topic], 403, "MissingProviderToken"),
            ("wrong team", [topic, "authorization: bearer \(wrongTeam)"], 403, "InvalidProviderToken"),
            ("good token", [topic, "authorization: bearer \(good)"], 200, nil),
        ]
        for check in cases {
            let answer = try curl(
                curlPath, caFile: material.caPEMPath, url: url, method: "POST", headers: check.headers,
                body: Self.alertPayload, scratch: scratch)
            XCTAssertEqual(answer.httpVersion, "2", check.name)
            XCTAssertEqual(answer.status, check.status, "\(check.name): \(answer)")
            XCTAssertEqual(answer.body, check.reason.map { #"{"reason":"\#($0)"}"# } ?? "", check.name)
        }
    }

    // MARK: Fanout's client → nghttpd

    private func startNghttpd(docroot: String, material: TestTLSMaterial, extra: [String] = []) throws -> (
        RunningProcess, Int
    ) {
        let nghttpd = try requireTool("nghttpd", package: "nghttp2-server")
        // nghttpd [OPTION]... <PORT> <PRIVATE_KEY> <CERT>
        return try ProcessSupport.startServer(nghttpd) { port in
            ["--address=127.0.0.1", "--htdocs=\(docroot)"] + extra
                + [String(port), material.serverKeyPath, material.serverCertPath]
        }
    }

    private func send(
        _ client: RawClient, method: String, path: String, body: [UInt8] = [], file: StaticString = #filePath,
        line: UInt = #line
    ) throws -> HTTP2Response {
        let outcome = client.send(method: method, path: path, headers: [], body: body, timeout: 10)
        switch outcome {
        case .success(let response)?: return response
        case .failure(let failure)?: throw ProcessSupportError("\(method) \(path) failed: \(failure)")
        case nil: throw ProcessSupportError("\(method) \(path): no answer within 10 s")
        }
    }

    /// Deterministic bytes that are not text, so a truncated or reordered body cannot pass.
    private func patternBytes(count: Int, seed: UInt32) -> [UInt8] {
        var state = seed
        return (0..<count).map { _ in
            state = state &* 1_664_525 &+ 1_013_904_223
            return UInt8(truncatingIfNeeded: state >> 24)
        }
    }

    func testFanoutClientReadsStatusesAndBodiesFromNghttpd() throws {
        _ = try requireTool("nghttpd", package: "nghttp2-server")
        let scratch = try ProcessSupport.temporaryDirectory(for: self, "nghttpd")
        let material = try TestTLSMaterial.createOrReuse(in: (scratch as NSString).appendingPathComponent("tls"))
        let docroot = (scratch as NSString).appendingPathComponent("htdocs")
        try FileManager.default.createDirectory(atPath: docroot, withIntermediateDirectories: true)
        let hello = Array("hello from nghttpd\n".utf8)
        let big = patternBytes(count: 1 << 20, seed: 42)  // over every default flow-control window
        try Data(hello).write(to: URL(fileURLWithPath: (docroot as NSString).appendingPathComponent("hello.txt")))
        try Data(big).write(to: URL(fileURLWithPath: (docroot as NSString).appendingPathComponent("big.bin")))

        let (server, port) = try startNghttpd(docroot: docroot, material: material)
        defer { _ = try? server.stop() }
        let client = try RawClient(host: "localhost", port: port, caFile: material.caPEMPath)
        defer { client.close() }

        let file = try send(client, method: "GET", path: "/hello.txt")
        XCTAssertEqual(file.status, 200)
        XCTAssertEqual(file.body, hello)

        let large = try send(client, method: "GET", path: "/big.bin")
        XCTAssertEqual(large.status, 200)
        XCTAssertEqual(large.body.count, big.count)
        XCTAssertTrue(large.body == big, "1 MiB body differs from the file")

        let missing = try send(client, method: "GET", path: "/missing.txt")
        XCTAssertEqual(missing.status, 404)
        XCTAssertTrue(String(decoding: missing.body, as: UTF8.self).contains("404 Not Found"), "\(missing)")

        // Without --echo-upload nghttpd ignores an uploaded body and serves the file, as for GET.
        let posted = try send(client, method: "POST", path: "/hello.txt", body: Array("ignored upload".utf8))
        XCTAssertEqual(posted.status, 200)
        XCTAssertEqual(posted.body, hello)

        // All on one connection, and the server is still there.
        XCTAssertTrue(server.isRunning, server.stderrText())
    }

    func testFanoutClientUploadsBodiesThatNghttpdEchoes() throws {
        _ = try requireTool("nghttpd", package: "nghttp2-server")
        let scratch = try ProcessSupport.temporaryDirectory(for: self, "nghttpd-echo")
        let material = try TestTLSMaterial.createOrReuse(in: (scratch as NSString).appendingPathComponent("tls"))
        let docroot = (scratch as NSString).appendingPathComponent("htdocs")
        try FileManager.default.createDirectory(atPath: docroot, withIntermediateDirectories: true)
        let (server, port) = try startNghttpd(docroot: docroot, material: material, extra: ["--echo-upload"])
        defer { _ = try? server.stop() }
        let client = try RawClient(host: "localhost", port: port, caFile: material.caPEMPath)
        defer { client.close() }

        for (index, size) in [1, 4096, 200_000].enumerated() {
            let upload = patternBytes(count: size, seed: UInt32(index + 7))
            let echoed = try send(client, method: "POST", path: "/upload-\(index)", body: upload)
            XCTAssertEqual(echoed.status, 200, "size \(size)")
            XCTAssertEqual(echoed.body.count, size, "size \(size)")
            XCTAssertTrue(echoed.body == upload, "echo of \(size) bytes differs")
        }
    }
}
