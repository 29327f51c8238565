// `--log-format text|json`: one line per event, escaped so that an event stays on one line and JSON parses, and
// redacted so that keys and tokens of authentication never reach the output.
import Fanout
import FanoutCore
import FanoutObservability
import Foundation
import XCTest

final class LoggerTests: XCTestCase {
    /// 2026-11-30T01:02:03Z.
    private static let fixedDate = Date(timeIntervalSince1970: 1_796_000_523)

    /// Collects written lines.
    private final class Capture: Sendable {
        private let lines = FanoutMutex<[String]>([])
        var all: [String] { lines.withLock { $0 } }
        var sink: FanoutLogger.Sink {
            FanoutLogger.Sink { bytes in self.lines.withLock { $0.append(String(decoding: bytes, as: UTF8.self)) } }
        }
    }

    private func logger(_ format: FanoutLogger.Format, _ capture: Capture, minimumLevel: FanoutLogger.Level = .debug)
        -> FanoutLogger
    {
        FanoutLogger(format: format, minimumLevel: minimumLevel, sink: capture.sink, clock: { LoggerTests.fixedDate })
    }

    private func jsonObject(_ line: String, file: StaticString = #filePath, line number: UInt = #line) throws
        -> [String: String]
    {
        XCTAssertTrue(line.hasSuffix("\n"), file: file, line: number)
        XCTAssertEqual(line.filter { $0 == "\n" }.count, 1, "one line per event", file: file, line: number)
        let object = try JSONSerialization.jsonObject(with: Data(line.utf8))
        return try XCTUnwrap(object as? [String: String], file: file, line: number)
    }

    // MARK: Formats

    func testTextLine() {
        let capture = Capture()
        let log = logger(.text, capture)
        log.info("connected", fields: ["host": "api.push.apple.com", "port": "443"])
        log.warning("retrying", fields: ["reason": "TooManyRequests"])
        XCTAssertEqual(
            capture.all,
            [
                "2026-11-30T01:02:03Z info connected host=api.push.apple.com port=443\n",
                "2026-11-30T01:02:03Z warning retrying reason=TooManyRequests\n",
            ])
    }

    func testTextEscapingKeepsOneEventOnOneLine() {
        let capture = Capture()
        let log = logger(.text, capture)
        log.error(
            "line one\nline two\r\u{1B}[31m",
            fields: [
                "path": "/tmp/a b", "quote": "say \"hi\"", "empty": "", "eq": "a=b", "slash": "a\\b",
                "multi": "x\ny", "odd name!": "v",
            ])
        let lines = capture.all
        XCTAssertEqual(lines.count, 1)
        XCTAssertEqual(
            lines[0],
            "2026-11-30T01:02:03Z error line one\\nline two\\r\\u001b[31m empty=\"\" eq=\"a=b\" multi=\"x\\ny\" "
                + "odd_name_=v path=\"/tmp/a b\" quote=\"say \\\"hi\\\"\" slash=\"a\\\\b\"\n")
    }

    func testJSONLineParsesWithEveryFieldIntact() throws {
        let capture = Capture()
        let log = logger(.json, capture)
        let tricky = "quote \" backslash \\ newline \n tab \t bell \u{07} del \u{7F} snowman ☃ emoji 🚀 sep \u{2028}"
        log.info("hello \"world\"\n", fields: ["job": "match-7", "detail": tricky, "msg": "shadow", "ts": "x"])
        let lines = capture.all
        XCTAssertEqual(lines.count, 1)
        XCTAssertTrue(
            lines[0].hasPrefix(#"{"ts":"2026-11-30T01:02:03Z","level":"info","msg":"hello \"world\"\n""#), lines[0])
        let object = try jsonObject(lines[0])
        XCTAssertEqual(object["ts"], "2026-11-30T01:02:03Z")
        XCTAssertEqual(object["level"], "info")
        XCTAssertEqual(object["msg"], "hello \"world\"\n")
        XCTAssertEqual(object["job"], "match-7")
        XCTAssertEqual(object["detail"], tricky)
        XCTAssertEqual(object["field_msg"], "shadow", "a field cannot replace msg")
        XCTAssertEqual(object["field_ts"], "x")
        XCTAssertFalse(lines[0].contains("\u{07}") || lines[0].contains("\u{2028}"))
    }

    func testLevelsBelowTheMinimumAreDropped() {
        let capture = Capture()
        let log = logger(.text, capture, minimumLevel: .warning)
        log.debug("d")
        log.info("i")
        log.warning("w")
        log.error("e")
        XCTAssertEqual(capture.all.map { $0.split(separator: " ")[1] }, ["warning", "error"])
        XCTAssertLessThan(FanoutLogger.Level.debug, .info)
        XCTAssertEqual(FanoutLogger.Level("WARN"), .warning)
        XCTAssertNil(FanoutLogger.Level("loud"))
    }

    func testFormatNames() {
        XCTAssertEqual(FanoutLogger.Format("text"), .text)
        XCTAssertEqual(FanoutLogger.Format("json"), .json)
        XCTAssertNil(FanoutLogger.Format("yaml"))
    }

    func testFormatLineWithoutWriting() {
        let log = FanoutLogger(format: .json, sink: FanoutLogger.Sink { _ in XCTFail("nothing is written") })
        let line = log.formatLine(.debug, "m", fields: [:], at: Date(timeIntervalSince1970: 0))
        XCTAssertEqual(line, #"{"ts":"1970-01-01T00:00:00Z","level":"debug","msg":"m"}"#)
    }

    // MARK: Redaction

    /// Looks like an ES256 provider token (header `{"alg":"ES256","kid":"KEYID12345"}`).
    private static let jwt =
        "eyJhbGciOiJFUzI1NiIsImtpZCI6IktFWUlEMTIzNDUifQ.eyJpc3MiOiJURUFNSUQxMjM0IiwiaWF0IjoxNzY0NDYwODAwfQ"
        + ".MEUCIQDx2sM1y-3_k9VqYt0kZQp2hW8pC7n4rL6mJ5vT1aB2cwIgYd3F0e"
    private static let unsignedJWT = "eyJhbGciOiJub25lIn0.eyJpc3MiOiJURUFNIn0."
    /// A fake key (its header split so secret scanners do not flag this file).
    private static let pem =
        "-----BEGIN PRIVATE " + "KEY-----\n" + "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSECRETSECRETSECRET\n"
        + "-----END PRIVATE KEY-----"
    /// Substrings of the secrets above that must never appear in any output.
    private static let secretMarkers = [
        "eyJhbGciOiJFUzI1NiIs", "MEUCIQDx2sM1y", "eyJhbGciOiJub25l", "SECRETSECRET", "BEGIN PRIVATE",
        "s3cr3t-bearer", "hunter2", "0123456789abcdef-device",
    ]

    private func logEverySecret(_ log: FanoutLogger) {
        log.error(
            "auth failed for \(Self.jwt) (Authorization: Bearer s3cr3t-bearer) key \(Self.pem) done",
            fields: [
                "authorization": "bearer s3cr3t-bearer",
                "Authorization-Header": "x-hunter2",
                "provider_token": "hunter2",
                "apns-jwt": "hunter2",
                "signingKey": "hunter2",
                "key_path": "/etc/hunter2.p8",
                "password": "hunter2",
                "device token": "0123456789abcdef-device",
                "note": "token was \(Self.jwt)",
                "none_alg": Self.unsignedJWT,
                "pem_blob": "see \(Self.pem)",
                "bearer_in_value": "Bearer s3cr3t-bearer",
                "status": "403",
                "reason": "InvalidProviderToken",
            ])
    }

    func testSecretsNeverReachTextLogs() {
        let capture = Capture()
        logEverySecret(logger(.text, capture))
        let line = capture.all.joined()
        for marker in Self.secretMarkers { XCTAssertFalse(line.contains(marker), "\(marker) leaked: \(line)") }
        XCTAssertEqual(line.filter { $0 == "\n" }.count, 1)
        // What is not secret is kept.
        XCTAssertTrue(line.contains(" status=403"), line)
        XCTAssertTrue(line.contains(" reason=InvalidProviderToken"), line)
        XCTAssertTrue(line.contains("error auth failed for [redacted] (Authorization: Bearer [redacted]) key"), line)
        XCTAssertTrue(line.contains("[redacted] done"), line)
        for name in ["authorization", "provider_token", "apns-jwt", "signingKey", "key_path", "password", "note"] {
            XCTAssertTrue(line.contains(" \(name)=[redacted]"), "\(name): \(line)")
        }
    }

    func testSecretsNeverReachJSONLogs() throws {
        let capture = Capture()
        logEverySecret(logger(.json, capture))
        let line = capture.all.joined()
        for marker in Self.secretMarkers { XCTAssertFalse(line.contains(marker), "\(marker) leaked: \(line)") }
        let object = try jsonObject(line)
        for name in [
            "authorization", "Authorization-Header", "provider_token", "apns-jwt", "signingKey", "key_path",
            "password", "device token", "note", "none_alg", "pem_blob", "bearer_in_value",
        ] {
            XCTAssertEqual(object[name], "[redacted]", name)
        }
        XCTAssertEqual(object["status"], "403")
        XCTAssertEqual(object["reason"], "InvalidProviderToken")
    }

    func testRedactionRules() {
        XCTAssertTrue(LogRedaction.isSecretName("Authorization"))
        XCTAssertTrue(LogRedaction.isSecretName("api_key"))
        XCTAssertTrue(LogRedaction.isSecretName("JWT"))
        XCTAssertTrue(LogRedaction.isSecretName("bearer-token"))
        XCTAssertFalse(LogRedaction.isSecretName("job"))
        XCTAssertFalse(LogRedaction.isSecretName("workspace"))
        XCTAssertTrue(LogRedaction.isSecretValue(Self.jwt))
        XCTAssertTrue(LogRedaction.isSecretValue(Self.unsignedJWT))
        XCTAssertTrue(LogRedaction.isSecretValue("-----BEGIN CERTIFICATE-----"))
        XCTAssertFalse(LogRedaction.isSecretValue("eyJ without dots"))
        XCTAssertFalse(LogRedaction.isSecretValue("eyJ.one dot"))
        XCTAssertFalse(LogRedaction.isSecretValue("api.push.apple.com"))
        XCTAssertEqual(LogRedaction.redactMessage("plain message"), "plain message")
        XCTAssertEqual(LogRedaction.redactMessage("a \(Self.jwt) b \(Self.jwt)"), "a [redacted] b [redacted]")
        XCTAssertEqual(LogRedaction.redactMessage("pem: \(Self.pem)\nafter"), "pem: [redacted]\nafter")
    }
}
