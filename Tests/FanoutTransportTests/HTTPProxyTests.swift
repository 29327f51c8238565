import XCTest

@testable import FanoutTransport

/// Proxy URLs, their redaction, and the environment's `HTTPS_PROXY` and `NO_PROXY`.
final class HTTPProxyTests: XCTestCase {
    func testURLsParseWithTheirDefaultsAndNeverShowThePassword() throws {
        let full = try HTTPProxy.parse("http://us%40er:p%3Ass@proxy.example.com:3128/")
        XCTAssertEqual(full, HTTPProxy(host: "proxy.example.com", port: 3128, user: "us@er", password: "p:ss"))
        XCTAssertEqual(full.description, "http://us%40er@proxy.example.com:3128")
        XCTAssertEqual(try HTTPProxy.parse("proxy.example.com:8080"), HTTPProxy(host: "proxy.example.com", port: 8080))
        XCTAssertEqual(try HTTPProxy.parse("http://proxy"), HTTPProxy(host: "proxy", port: 80))
        XCTAssertEqual(try HTTPProxy.parse("http://[::1]:3128"), HTTPProxy(host: "::1", port: 3128))
        XCTAssertEqual(try HTTPProxy.parse("http://[::1]:3128").description, "http://[::1]:3128")
        for (text, mention) in [
            ("https://user:hunter2@proxy:443", "only http://"), ("socks5://proxy:1080", "only http://"),
            ("http://user:hunter2@:3128", "host is empty"), ("http://user:hunter2@proxy:99999", "port"),
            ("http://:hunter2@proxy:3128", "user is empty"), ("http://proxy:3128/path", "no path"),
        ] {
            XCTAssertThrowsError(try HTTPProxy.parse(text), text) { error in
                let message = "\(error)"
                XCTAssertTrue(message.contains(mention), "\(text): \(message)")
                XCTAssertFalse(message.contains("hunter2"), "\(text): \(message)")
            }
        }
    }

    func testTheConnectRequestCarriesBasicCredentialsOnlyWithAUser() {
        let anonymous = String(
            decoding: HTTPProxy(host: "p", port: 1).connectRequest(toHost: "api.push.apple.com", port: 443),
            as: UTF8.self)
        XCTAssertEqual(anonymous, "CONNECT api.push.apple.com:443 HTTP/1.1\r\nHost: api.push.apple.com:443\r\n\r\n")
        let authenticated = String(
            decoding: HTTPProxy(host: "p", port: 1, user: "Aladdin", password: "open sesame").connectRequest(
                toHost: "::1", port: 8443), as: UTF8.self)
        XCTAssertEqual(
            authenticated,
            "CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\nProxy-Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==\r\n\r\n"
        )
    }

    func testHTTPSProxyAppliesUnlessNoProxyNamesTheHost() throws {
        let proxy = ["HTTPS_PROXY": "http://proxy.corp:3128"]
        XCTAssertEqual(try HTTPProxy.fromEnvironment(for: "api.push.apple.com", environment: proxy)?.port, 3128)
        XCTAssertNil(try HTTPProxy.fromEnvironment(for: "api.push.apple.com", environment: [:]))
        XCTAssertEqual(
            try HTTPProxy.fromEnvironment(for: "x", environment: ["https_proxy": "proxy.corp:8080"])?.port, 8080)
        for noProxy in ["apple.com", ".apple.com", "*.apple.com", "push.apple.com:443", "localhost, apple.com", "*"] {
            var environment = proxy
            environment["NO_PROXY"] = noProxy
            XCTAssertNil(try HTTPProxy.fromEnvironment(for: "api.push.apple.com", environment: environment), noProxy)
        }
        for noProxy in ["pple.com", "api.push.apple.com.evil", "example.com", ""] {
            var environment = proxy
            environment["no_proxy"] = noProxy
            XCTAssertNotNil(try HTTPProxy.fromEnvironment(for: "api.push.apple.com", environment: environment), noProxy)
        }
        XCTAssertThrowsError(
            try HTTPProxy.fromEnvironment(for: "x", environment: ["HTTPS_PROXY": "ftp://u:hunter2@p:1"])
        ) { XCTAssertFalse("\($0)".contains("hunter2")) }
    }
}
