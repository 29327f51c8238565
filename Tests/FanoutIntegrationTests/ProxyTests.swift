import FanoutTestSupport
import Foundation
import XCTest

/// `fanout send` and `fanout push` through a real HTTP proxy (Debian's tinyproxy, with Basic authentication) to a real
/// mock-apns: every connection is one `CONNECT`, TLS runs end to end, a refusal names the proxy and never its
/// password, and `HTTPS_PROXY` / `NO_PROXY` are honoured.
final class ProxyTests: XCTestCase {
    static let user = "fanout"
    static let password = "pr0xy-s3cret"

    private var directory = ""
    private var mock: MockAPNsProcess!
    private var proxy: RunningProcess!
    private var proxyPort = 0
    private var fanout = ""

    override func setUpWithError() throws {
        guard
            let tinyproxy = ProcessSupport.findTool("tinyproxy")
                ?? ["/usr/sbin/tinyproxy", "/usr/bin/tinyproxy"]
                .first(where: ProcessSupport.isExecutableFile)
        else {
            throw ProcessSupportError("tinyproxy is not installed (make deps-test installs it)")
        }
        directory = try ProcessSupport.temporaryDirectory(for: self, "proxy")
        mock = try MockAPNsProcess(arguments: [
            "--listen", "127.0.0.1:0", "--tls-dir", "\(directory)/tls", "--key-id", "KEYID12345", "--team-id",
            "TEAMID1234",
        ])
        let mock = self.mock!
        addTeardownBlock { _ = try? mock.stop() }
        let directory = self.directory
        let started = try ProcessSupport.startServer(tinyproxy) { port in
            let config = """
                Port \(port)
                Listen 127.0.0.1
                Timeout 30
                MaxClients 64
                LogLevel Connect
                Allow 127.0.0.1
                BasicAuth \(Self.user) \(Self.password)
                """
            let path = "\(directory)/tinyproxy-\(port).conf"
            _ = FileManager.default.createFile(atPath: path, contents: Data(config.utf8))
            return ["-d", "-c", path]
        }
        proxy = started.process
        proxyPort = started.port
        let proxy = self.proxy!
        addTeardownBlock { _ = try? proxy.stop(timeout: 5) }
        fanout = try ProcessSupport.builtExecutable("fanout")
    }

    private var proxyURL: String { "http://\(Self.user):\(Self.password)@127.0.0.1:\(proxyPort)" }

    /// The `CONNECT` requests tinyproxy logged (it logs to stderr with `-d`).
    private func connectRequests() -> [String] {
        (proxy.stdoutText() + proxy.stderrText()).split(separator: "\n").filter {
            $0.contains("Request") && $0.contains("CONNECT ")
        }
        .map(String.init)
    }

    private func connectionArguments() -> [String] {
        [
            "--endpoint", "localhost:\(mock.port)", "--ca-file", "\(directory)/tls/ca.pem", "--key",
            "\(directory)/tls/auth-key.p8", "--key-id", "KEYID12345", "--team-id", "TEAMID1234",
        ]
    }

    private func push(proxy: String?, environment: [String: String] = [:]) throws -> ProcessResult {
        try ProcessSupport.run(
            fanout,
            [
                "push", "--token", testDeviceToken(1), "--topic", "com.example.app", "--payload",
                #"{"aps":{"alert":"hi"}}"#,
            ]
                + connectionArguments() + (proxy.map { ["--proxy", $0] } ?? []),
            environment: ProcessSupport.cleanEnvironment(adding: environment), timeout: 30)
    }

    func testSendDeliversEveryTokenThroughTheProxyWithOneConnectPerConnection() throws {
        let tokens = (0..<100_000).map { testDeviceToken($0) }
        let tokensFile = "\(directory)/tokens.txt"
        try (tokens.joined(separator: "\n") + "\n").write(toFile: tokensFile, atomically: true, encoding: .utf8)
        let jobs = "\(directory)/jobs.jsonl"
        try
            (#"{"id": "through-proxy", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "hi"}}, "tokens_file": "\#(tokensFile)"}"#
            + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)
        let summaryPath = "\(directory)/summary.json"
        let result = try ProcessSupport.run(
            fanout,
            [
                "send", "--jobs", jobs, "--results", "\(directory)/results.jsonl", "--summary", summaryPath,
                "--progress",
                "never", "--loops", "1", "--connections", "2", "--proxy", proxyURL,
            ] + connectionArguments(),
            environment: ProcessSupport.cleanEnvironment(), timeout: 120)
        XCTAssertEqual(result.exitCode, 0, result.summary)
        let summary = try XCTUnwrap(
            JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: summaryPath))) as? [String: Any])
        XCTAssertEqual(summary["delivered"] as? Int, 100_000, "\(summary)")
        XCTAssertEqual(
            connectRequests().count, 2, "one CONNECT per connection: \(connectRequests())\n\(proxy.stderrText())")
        XCTAssertTrue(connectRequests().allSatisfy { $0.contains("CONNECT localhost:\(mock.port) ") })
        XCTAssertFalse(result.stderr.contains(Self.password), result.summary)
    }

    func testAWrongPasswordIsAClearErrorWithoutThePassword() throws {
        let wrong = "wr0ng-pa55word"
        let result = try push(proxy: "http://\(Self.user):\(wrong)@127.0.0.1:\(proxyPort)")
        XCTAssertNotEqual(result.exitCode, 0, result.summary)
        let output = result.stdout + result.stderr
        XCTAssertTrue(output.contains("proxy http://\(Self.user)@127.0.0.1:\(proxyPort)"), result.summary)
        XCTAssertTrue(output.contains("check the user and password"), result.summary)
        XCTAssertFalse(output.contains(wrong), "the password in the output: \(result.summary)")
        // Without credentials at all, the proxy's 407 says it wants them.
        let anonymous = try push(proxy: "http://127.0.0.1:\(proxyPort)")
        XCTAssertTrue((anonymous.stdout + anonymous.stderr).contains("wants a user and password"), anonymous.summary)
    }

    func testHTTPSProxyIsHonouredAndNoProxyBypassesIt() throws {
        let through = try push(proxy: nil, environment: ["HTTPS_PROXY": proxyURL])
        XCTAssertEqual(through.exitCode, 0, through.summary)
        XCTAssertEqual(connectRequests().count, 1, "HTTPS_PROXY used: \(proxy.stderrText())")
        // A proxy that does not exist: NO_PROXY naming the host is why the push still goes out.
        let closedPort = try ProcessSupport.freeLoopbackPort()
        let bypassed = try push(
            proxy: nil,
            environment: ["HTTPS_PROXY": "http://127.0.0.1:\(closedPort)", "NO_PROXY": "example.com,localhost"])
        XCTAssertEqual(bypassed.exitCode, 0, bypassed.summary)
        let refused = try push(proxy: nil, environment: ["HTTPS_PROXY": "http://127.0.0.1:\(closedPort)"])
        XCTAssertNotEqual(refused.exitCode, 0, "without NO_PROXY the dead proxy is used: \(refused.summary)")
        XCTAssertTrue(
            (refused.stdout + refused.stderr).contains("proxy http://127.0.0.1:\(closedPort)"), refused.summary)
        // --proxy none ignores the environment.
        let direct = try push(proxy: "none", environment: ["HTTPS_PROXY": "http://127.0.0.1:\(closedPort)"])
        XCTAssertEqual(direct.exitCode, 0, direct.summary)
        XCTAssertEqual(connectRequests().count, 1, "no CONNECT but the first push's")
    }

    /// `fanout serve` reaches APNs through the proxy its config names, and refuses at start a proxy URL it cannot
    /// use, naming the key and never the password.
    func testServeSendsThroughTheProxyOfItsConfig() throws {
        let material = TestTLSMaterial(directory: "\(directory)/tls")
        let serve = try ServeHarness(
            testCase: self, mockPort: mock.port, material: material, extraConfig: ["proxy": proxyURL])
        try serve.start()
        addTeardownBlock { XCTAssertEqual(serve.stop(), 0, "fanout serve exits 0 on SIGTERM") }
        let pushed = try serve.curl(
            "POST", "/v1/push", key: ServeKeys.acmeServer,
            json:
                #"{"alert": {"title": "t"}, "audience": {"tokens": ["\#(testDeviceToken(1))", "\#(testDeviceToken(2))"]}}"#
        )
        XCTAssertEqual(pushed.status, 202, pushed.text)
        let id = try XCTUnwrap(try pushed.object()["dispatch_id"] as? String, pushed.text)
        let done = try serve.waitForDispatch(id)
        XCTAssertEqual(done["delivered"] as? Int, 2, "\(done)")
        XCTAssertFalse(connectRequests().isEmpty, "through the proxy: \(proxy.stdoutText())")
        XCTAssertTrue(connectRequests().allSatisfy { $0.contains("CONNECT 127.0.0.1:\(mock.port) ") })
        let broken = try ServeHarness(
            testCase: self, mockPort: mock.port, material: material,
            extraConfig: ["proxy": "socks5://\(Self.user):\(Self.password)@127.0.0.1:1080"])
        XCTAssertThrowsError(try broken.start()) { error in
            XCTAssertTrue("\(error)".contains("proxy"), "\(error)")
            XCTAssertFalse("\(error)".contains(Self.password), "\(error)")
        }
    }
}
