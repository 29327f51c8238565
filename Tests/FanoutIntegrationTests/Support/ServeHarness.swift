// `fanout serve` as users run it: the real binary, a config written for the test, an in-process mock-apns for its
// apps, and real HTTP clients (curl, python3) against it.
import FanoutTestSupport
import FanoutTransport
import Foundation
import MockAPNsKit
import XCTest

/// The keys the harness's config accepts (their SHA-256 digests go into the config, never the keys).
enum ServeKeys {
    static let acmeServer = "sk_acme_0123456789abcdef"
    static let acmeDevice = "dk_acme_fedcba9876543210"
    static let globexServer = "sk_globex_5555aaaa5555aaaa"
    static let globexDevice = "dk_globex_7777bbbb7777bbbb"
    static var all: [String] { [acmeServer, acmeDevice, globexServer, globexDevice] }
}

/// A running `fanout serve` with two workspaces: `acme` (app `com.acme.app`, Pushwoosh application `ACME1-00001`,
/// Braze app id `braze-acme`) and `globex` (app `com.globex.app`), both sending to `mock`.
final class ServeHarness: @unchecked Sendable {
    let directory: String
    let database: String
    let configPath: String
    private(set) var process: RunningProcess?
    private(set) var port = 0
    let fanout: String

    static let acmeApp = "com.acme.app"
    static let globexApp = "com.globex.app"
    static let pushwooshApplication = "ACME1-00001"
    static let brazeAppID = "braze-acme"

    /// - Parameters:
    ///   - acmeRateLimit: acme's API budget (`{"requests_per_hour": N, "burst": B}`), the default when nil.
    ///   - extraConfig: top-level config keys (e.g. `"max_connections": 4`).
    ///   - acmeExtra: keys of acme's workspace (e.g. its `send_budget`).
    ///   - globexExtra: keys of globex's workspace (e.g. its `webhooks`).
    ///   - acmeCertificate: the keys of a push certificate (`cert_path`, ...) for acme's app, in place of its
    ///     signing key.
    convenience init(
        testCase: XCTestCase, mock: MockHarness, acmeRateLimit: (perHour: Int, burst: Int)? = nil,
        extraConfig: [String: Any] = [:], acmeExtra: [String: Any] = [:], acmeCertificate: [String: Any]? = nil,
        globexExtra: [String: Any] = [:]
    ) throws {
        try self.init(
            testCase: testCase, mockPort: mock.port, material: mock.material, managePort: mock.server.managePort,
            acmeRateLimit: acmeRateLimit, extraConfig: extraConfig, acmeExtra: acmeExtra,
            acmeCertificate: acmeCertificate, globexExtra: globexExtra)
    }

    /// - Parameters:
    ///   - mockPort, material: the mock-apns to send to, and its CA and signing key.
    ///   - managePort: its channel management listener, if it has one.
    init(
        testCase: XCTestCase, mockPort: Int, material: TestTLSMaterial, managePort: Int? = nil,
        acmeRateLimit: (perHour: Int, burst: Int)? = nil, extraConfig: [String: Any] = [:],
        acmeExtra: [String: Any] = [:], acmeCertificate: [String: Any]? = nil, globexExtra: [String: Any] = [:]
    ) throws {
        directory = try ProcessSupport.temporaryDirectory(for: testCase, "serve")
        database = (directory as NSString).appendingPathComponent("fanout.db")
        configPath = (directory as NSString).appendingPathComponent("serve.json")
        fanout = try ProcessSupport.builtExecutable("fanout")
        func app(_ extra: [String: Any]) -> [String: Any] {
            var app: [String: Any] = [
                "team_id": "TEAMID1234", "key_id": "KEYID12345", "key_path": material.authKeyP8Path,
                "endpoint": "127.0.0.1:\(mockPort)", "ca_file": material.caPEMPath,
            ]
            if let managePort { app["manage_endpoint"] = "localhost:\(managePort)" }
            return app.merging(extra) { _, new in new }
        }
        var acmeApp = app([
            "pushwoosh_application": Self.pushwooshApplication, "braze_app_id": Self.brazeAppID,
        ])
        if let acmeCertificate {
            for key in ["team_id", "key_id", "key_path"] { acmeApp[key] = nil }
            acmeApp.merge(acmeCertificate) { _, new in new }
        }
        var acme: [String: Any] = [
            "server_keys_sha256": [SHA256Digest.hexHash(ServeKeys.acmeServer)],
            "device_keys_sha256": [SHA256Digest.hexHash(ServeKeys.acmeDevice)],
            "apps": [Self.acmeApp: acmeApp],
        ]
        if let limit = acmeRateLimit {
            acme["rate_limit"] = ["requests_per_hour": limit.perHour, "burst": limit.burst]
        }
        acme.merge(acmeExtra) { _, new in new }
        var globex: [String: Any] = [
            "server_keys_sha256": [SHA256Digest.hexHash(ServeKeys.globexServer)],
            "device_keys_sha256": [SHA256Digest.hexHash(ServeKeys.globexDevice)],
            "apps": [Self.globexApp: app([:])],
        ]
        globex.merge(globexExtra) { _, new in new }
        var config: [String: Any] = ["workspaces": ["acme": acme, "globex": globex], "grace_seconds": 5]
        config.merge(extraConfig) { _, new in new }
        let data = try JSONSerialization.data(withJSONObject: config, options: [.sortedKeys, .prettyPrinted])
        try data.write(to: URL(fileURLWithPath: configPath))
    }

    /// Starts (or restarts) the server on a free port and waits for its `listening on` line.
    /// `environment` is added to the test's clean environment.
    func start(arguments: [String] = [], environment: [String: String] = [:]) throws {
        let child = try RunningProcess(
            fanout,
            ["serve", "--config", configPath, "--db", database, "--listen", "127.0.0.1:0", "--log-format", "json"]
                + arguments,
            environment: ProcessSupport.cleanEnvironment(adding: environment))
        let line = try child.firstStdoutLine(timeout: 30)
        guard line.hasPrefix("listening on 127.0.0.1:"), let port = Int(line.split(separator: ":").last ?? "") else {
            throw ProcessSupportError("unexpected first line from fanout serve: \(line)")
        }
        self.port = port
        process = child
    }

    /// SIGTERM and wait: the exit status.
    @discardableResult
    func stop(timeout: TimeInterval = 30) -> Int32? {
        guard let process else { return nil }
        process.kill(SIGTERM)
        guard process.waitForExit(timeout: timeout) else {
            process.kill(SIGKILL)
            _ = process.waitForExit(timeout: 5)
            return nil
        }
        return process.process.terminationStatus
    }

    /// SIGKILL, as a crash.
    func kill() {
        process?.kill(SIGKILL)
        _ = process?.waitForExit(timeout: 10)
    }

    /// What the server logged so far (stderr).
    var log: String { process?.stderrText() ?? "" }

    /// `https` after `start(arguments: ["--tls-cert", ..., "--tls-key", ...])`.
    var scheme = "http"
    var baseURL: String { "\(scheme)://127.0.0.1:\(port)" }

    /// One curl request: status, headers (lowercased names), body.
    func curl(
        _ method: String, _ path: String, key: String? = nil, scheme: String = "Bearer", json: String? = nil,
        headers: [String: String] = [:], extra: [String] = []
    ) throws -> CurlResponse {
        let curl = try XCTUnwrap(ProcessSupport.findTool("curl"), "curl is installed by make deps")
        let headerFile = (directory as NSString).appendingPathComponent("headers-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(atPath: headerFile) }
        var arguments = ["-sS", "-X", method, "-D", headerFile, "--max-time", "20", "-o", "-"]
        if let key { arguments += ["-H", "Authorization: \(scheme) \(key)"] }
        for (name, value) in headers { arguments += ["-H", "\(name): \(value)"] }
        if let json {
            // Through a file: a body of many tokens is longer than an argument may be.
            let bodyFile = headerFile + ".body"
            try Data(json.utf8).write(to: URL(fileURLWithPath: bodyFile))
            arguments += ["-H", "Content-Type: application/json", "--data-binary", "@" + bodyFile]
        }
        defer { try? FileManager.default.removeItem(atPath: headerFile + ".body") }
        arguments += extra
        arguments.append(baseURL + path)
        let result = try ProcessSupport.run(curl, arguments, timeout: 30)
        guard result.exitCode == 0 else { throw ProcessSupportError("curl failed: \(result.summary)") }
        return CurlResponse(
            rawHeaders: (try? String(contentsOfFile: headerFile, encoding: .utf8)) ?? "", body: result.stdoutData)
    }

    /// Every results line of a dispatch, parsed, paged through `/v1/dispatches/{id}/results` (`limit` a page).
    func resultObjects(of id: String, key: String = ServeKeys.acmeServer, limit: Int = 1_000) throws
        -> [[String: Any]]
    {
        var objects: [[String: Any]] = []
        var after = "-1"
        while true {
            let page = try curl("GET", "/v1/dispatches/\(id)/results?limit=\(limit)&after=\(after)", key: key)
            guard page.status == 200 else { throw ProcessSupportError("results page: \(page.status) \(page.text)") }
            let lines = page.text.split(separator: "\n")
            if lines.isEmpty { return objects }
            for line in lines {
                guard let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
                    throw ProcessSupportError("not a results line: \(line)")
                }
                objects.append(object)
            }
            guard let last = page.headers["x-fanout-last-position"] else {
                throw ProcessSupportError("a results page without x-fanout-last-position")
            }
            after = last
        }
    }

    /// A dispatch's JSON, waiting until its state is `done`.
    func waitForDispatch(_ id: String, key: String = ServeKeys.acmeServer, timeout: TimeInterval = 60) throws
        -> [String: Any]
    {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let response = try curl("GET", "/v1/dispatches/\(id)", key: key)
            let object = try response.object()
            if object["state"] as? String == "done" { return object }
            guard Date() < deadline else {
                throw ProcessSupportError("dispatch \(id) not done after \(timeout) s: \(response.text)")
            }
            usleep(50_000)
        }
    }
}

/// What curl got back.
struct CurlResponse {
    var status = 0
    var headers: [String: String] = [:]
    var body: Data

    init(rawHeaders: String, body: Data) {
        self.body = body
        // With redirects or 100-continue there are several blocks: the last one is the answer.
        let blocks = rawHeaders.components(separatedBy: "\r\n\r\n").filter { !$0.isEmpty }
        for line in (blocks.last ?? "").components(separatedBy: "\r\n") {
            if line.hasPrefix("HTTP/") {
                status = Int(line.split(separator: " ")[1]) ?? 0
            } else if let colon = line.firstIndex(of: ":") {
                headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
                    in: .whitespaces)
            }
        }
    }

    var text: String { String(decoding: body, as: UTF8.self) }

    func object() throws -> [String: Any] {
        guard let object = try JSONSerialization.jsonObject(with: body) as? [String: Any] else {
            throw ProcessSupportError("not a JSON object: \(text)")
        }
        return object
    }
}
