// The request-validator part of the fuzz seed corpus (Tests/Fuzz/Corpus/request-validator, run by `make fuzz`)
// replayed in `make test`, each input with mock-apns's answer to it.
import FanoutCore
import Foundation
import MockAPNsKit
import XCTest

final class ValidatorCorpusTests: XCTestCase {
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

    // MARK: request-validator

    /// mock-apns's answer to each request (nil: accepted), in Fuzz/RequestValidator.swift's framing.
    static let requests: [String: String?] = [
        "valid-alert": nil,
        "valid-liveactivity-update": nil,
        "valid-background": nil,
        "valid-voip-no-aps": nil,
        "push-type-uppercase": nil,
        "escaped-keys-nested": nil,
        "get-method": "405 MethodNotAllowed",
        "bad-path": "404 BadPath",
        "missing-token": "400 MissingDeviceToken",
        "bad-token": "400 BadDeviceToken",
        "duplicate-topic": "400 DuplicateHeaders",
        "invalid-push-type": "400 InvalidPushType",
        "missing-topic": "400 MissingTopic",
        "bad-topic-liveactivity": "400 BadTopic",
        "background-priority-10": "400 BadPriority",
        "bad-expiration": "400 BadExpirationDate",
        "long-collapse-id": "400 BadCollapseId",
        "bad-apns-id": "400 BadMessageId",
        "empty-body": "400 PayloadEmpty",
        "body-too-large": "413 PayloadTooLarge",
        "body-not-object": "400 BadPayload",
        "alert-without-aps": "400 BadPayload",
        "liveactivity-bad-event": "400 BadPayload",
        "liveactivity-attributes-on-update": "400 BadPayload",
        "liveactivity-token-and-channel": "400 BadPayload",
        "liveactivity-negative-timestamp": "400 BadPayload",
    ]

    func testRequestValidatorCorpus() throws {
        let inputs = try inputs("request-validator")
        assertSameNames(inputs, Self.requests.keys)
        for (name, input) in inputs {
            guard let expected = Self.requests[name] else { continue }
            let request = FramedRequest(input)
            let rejection = APNsRequestValidator().validate(
                method: request.method, path: request.path, headers: request.headers, body: request.body)
            XCTAssertEqual(rejection?.description, expected, name)
        }
    }
}
