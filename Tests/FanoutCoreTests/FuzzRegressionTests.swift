// The fuzz seed corpus (Tests/Fuzz/Corpus, run by `make fuzz` through the libFuzzer targets in Fuzz/) replayed in
// `make test`, each input with the outcome it must have, so the seeds stay meaningful and every input the fuzzers
// ever crashed on stays fixed. An input `make fuzz` finds a crash with goes into the corpus directory of its target
// (under a descriptive name) and into the tables below with the outcome it should have had.
import FanoutCore
import Foundation
import XCTest

final class FuzzRegressionTests: XCTestCase {
    /// Tests/Fuzz/Corpus.
    static let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz/Corpus")

    /// Every input of one target's corpus, by file name.
    func inputs(_ target: String, file: StaticString = #filePath, line: UInt = #line) throws -> [String: [UInt8]] {
        let directory = Self.corpus.appendingPathComponent(target)
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        XCTAssertFalse(names.isEmpty, "no seeds in \(directory.path)", file: file, line: line)
        var inputs: [String: [UInt8]] = [:]
        for name in names {
            inputs[name] = Array(try Data(contentsOf: directory.appendingPathComponent(name)))
        }
        return inputs
    }

    /// Fails for an input the table does not know and for a table entry whose input is gone.
    func assertSameNames(
        _ inputs: [String: [UInt8]], _ expected: some Collection<String>, file: StaticString = #filePath,
        line: UInt = #line
    ) {
        XCTAssertEqual(
            Set(inputs.keys), Set(expected), "the corpus and the table of expected outcomes differ", file: file,
            line: line)
    }

    // MARK: response-parser

    /// Reason and timestamp the engine reads from each body (Fuzz/ResponseParser.swift: an optional `<status>` line,
    /// then the body).
    static let responses: [String: (reason: String?, timestamp: Int64?)] = [
        "ok-200-empty": (nil, nil),
        "bad-device-token": ("BadDeviceToken", nil),
        "unregistered-410-timestamp-ms": ("Unregistered", 1_508_249_865_488),
        "expired-provider-token": ("ExpiredProviderToken", nil),
        "too-many-requests": ("TooManyProviderTokenUpdates", nil),
        "shutdown-503": ("ServiceUnavailable", nil),
        "whitespace-order-extra": ("Unregistered", 1_508_249_865_488),
        "escaped-reason": ("BadDeviceToken", 0),
        // A surrogate pair is one scalar; a lone high surrogate becomes U+FFFD.
        "surrogates": ("\u{1F600}\u{FFFD}x", nil),
        "timestamp-not-integer": ("Unregistered", nil),
        "timestamp-overflow": ("Unregistered", nil),
        // Repeated keys: the response is read under RFC 8259 rules, which allow them; the last one wins.
        "duplicate-reason": ("B", nil),
        "not-json": (nil, nil),
        "truncated": (nil, nil),
        "no-status-line": ("IdleTimeout", nil),
        "goaway-debug-data": ("Shutdown", nil),
    ]

    func testResponseParserCorpus() throws {
        let inputs = try inputs("response-parser")
        assertSameNames(inputs, Self.responses.keys)
        for (name, input) in inputs {
            guard let expected = Self.responses[name] else { continue }
            var status = 400
            var body = input[...]
            if let newline = input.prefix(4).firstIndex(of: UInt8(ascii: "\n")), newline > 0,
                let parsed = Int(String(decoding: input[..<newline], as: UTF8.self))
            {
                status = parsed
                body = input[(newline + 1)...]
            }
            let response = APNsResponse.parse(status: status, apnsID: nil, apnsUniqueID: nil, body: body)
            XCTAssertEqual(response.status, status, name)
            XCTAssertEqual(response.reason?.rawValue, expected.reason, name)
            XCTAssertEqual(response.timestamp, expected.timestamp, name)
            if let reason = response.reason {
                let written = APNsResponse.errorBody(reason: reason, timestamp: response.timestamp)
                let (readBack, timestamp) = APNsResponse.parseErrorBody(written)
                XCTAssertEqual(readBack, reason, "\(name): errorBody round trip")
                XCTAssertEqual(timestamp, response.timestamp, "\(name): errorBody round trip")
            }
        }
    }

    // MARK: json

    /// The strict parser's verdict on each document: nil when it parses, else the error it must report.
    static let documents: [String: String?] = [
        "object-nested": nil,
        "scalars-true": nil,
        "scalars-null": nil,
        "number-exp": nil,
        "string-escapes": nil,
        "utf8-raw": nil,
        "empty-containers": nil,
        "ok-depth-64": nil,
        "bad-leading-zero": "at byte offset 1: a number may not have a leading zero",
        "bad-trailing-comma": "at byte offset 3: unexpected ']', expected a value",
        "bad-duplicate-key": #"at byte offset 7: duplicate key "a""#,
        "bad-lone-surrogate": "at byte offset 1: high surrogate not followed by a low one",
        "bad-control-char": "at byte offset 2: control character byte 0x09 in a string must be escaped",
        "bad-trailing-garbage": "at byte offset 3: unexpected 'x' after the JSON value",
        "bad-deep": "at byte offset 64: nested deeper than 64 arrays and objects",
        "bad-utf8": "at byte offset 1: invalid UTF-8 in a string",
        // "é" precomposed and "e" + U+0301 are one key to Swift's String (and to a device's Codable decoding).
        "canonically-equal-keys": #"at byte offset 8: duplicate key "é""#,
    ]

    func testJSONCorpus() throws {
        let inputs = try inputs("json")
        assertSameNames(inputs, Self.documents.keys)
        for (name, input) in inputs {
            guard let expected = Self.documents[name] else { continue }
            let raw = Result { () throws(JSONParseError) in try RawJSON(validating: input) }
            do {
                let value = try JSONValue.parse(input)
                XCTAssertNil(expected, "\(name) parsed")
                XCTAssertEqual(try JSONValue.parse(value.encoded()), value, "\(name): compact encoding round trip")
                XCTAssertEqual(try raw.get().value, value, name)
            } catch {
                XCTAssertEqual(error.description, expected, name)
                XCTAssertThrowsError(try raw.get(), "\(name): RawJSON accepts what JSONValue.parse refuses")
            }
        }
    }
}
