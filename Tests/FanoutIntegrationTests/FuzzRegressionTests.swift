// The job-line fuzz seed corpus (Tests/Fuzz/Corpus/job-line, run by `make fuzz` through Fuzz/JobLine.swift)
// replayed in `make test`: each line with the outcome it must have, so the seeds stay meaningful and every line the
// fuzzer ever crashed on stays fixed. A line `make fuzz` finds a crash with goes into that directory (under a
// descriptive name) and into the table below with the outcome it should have had.
import Fanout
import FanoutCore
import FanoutJobFile
import FanoutJobLines
import Foundation
import MockAPNsKit
import XCTest

final class JobLineFuzzRegressionTests: XCTestCase {
    /// Tests/Fuzz/Corpus/job-line.
    static let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz/Corpus/job-line")

    /// nil: the line is a valid job. Otherwise the refusal's field (nil for the line as a whole) and the start of its
    /// message.
    static let expected: [String: (field: String?, message: String)?] = [
        "valid-readme-liveactivity-update": nil,
        "valid-examples-jobs-1": nil,
        "valid-examples-jobs-2": nil,
        "valid-examples-jobs-3": nil,
        "valid-examples-jobs-4": nil,
        "valid-examples-jobs-5": nil,
        "valid-alert-raw-payload": nil,
        "valid-background-priority-5": nil,
        "valid-voip-no-aps": nil,
        "valid-liveactivity-start-loc-critical": nil,
        "valid-liveactivity-end-collapse-id": nil,
        "invalid-not-json": (nil, "not valid JSON: at byte offset 21: unexpected end of input"),
        "invalid-array-root": (nil, "a job must be a JSON object, not an array"),
        "invalid-duplicate-key": (nil, #"not valid JSON: at byte offset 12: duplicate key "id""#),
        "invalid-lone-surrogate": (nil, "not valid JSON: at byte offset 9: high surrogate not followed by a low one"),
        "invalid-deep-nesting": (nil, "not valid JSON: at byte offset 86: nested deeper than 64 arrays and objects"),
        "invalid-unknown-key": ("topics", #"unknown key "topics""#),
        "invalid-push-type": ("push_type", #"push_type "foo" is not an APNs push type"#),
        "invalid-background-priority-10": ("priority", "priority 10 is not allowed for background pushes"),
        "invalid-priority-fraction": ("priority", "priority must be an integer (1, 5 or 10), not 1e1"),
        "invalid-expiration-negative": ("expiration", "expiration -1 is negative"),
        "invalid-collapse-id-too-long": ("collapse_id", "collapse_id is 65 bytes; APNs allows at most 64"),
        "invalid-topic-suffix": (
            "topic", #"topic "com.acme.app" is not a bundle ID followed by ".push-type.liveactivity""#
        ),
        "invalid-both-payloads": ("payload", "payload and live_activity are both given"),
        "invalid-attributes-on-update": (
            "live_activity.attributes_type", #"live_activity.attributes_type: only allowed with event "start""#
        ),
        "invalid-input-push-channel-on-end": (
            "live_activity.input_push_channel", #"live_activity.input_push_channel: only allowed with event "start""#
        ),
        "invalid-relevance-infinite": (
            "live_activity.relevance_score", "live_activity.relevance_score: must be a finite number"
        ),
        "invalid-payload-too-large": ("payload", "payload: 4122 bytes, over the 4096-byte limit for alert"),
        "invalid-token": ("tokens[1]", #"tokens[1]: "xyz" is not a device token"#),
        "invalid-tokens-and-file": ("tokens_file", "tokens and tokens_file are both given"),
        "invalid-tokens-file-missing": ("tokens_file", "tokens_file "),
    ]

    func testJobLineCorpus() throws {
        // The job file's directory, with the tokens file the seeds name.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("fanout-fuzz-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try (testDeviceToken(0) + "\n").write(
            to: directory.appendingPathComponent("tokens.txt"), atomically: true, encoding: .utf8)

        let names = try FileManager.default.contentsOfDirectory(atPath: Self.corpus.path)
        XCTAssertEqual(Set(names), Set(Self.expected.keys), "the corpus and the table of expected outcomes differ")
        for name in names {
            guard let expected = Self.expected[name] else { continue }
            let line = Array(try Data(contentsOf: Self.corpus.appendingPathComponent(name)))
            let result = JobLineParser().parse(
                line: line, lineNumber: 7, jobFileDirectory: directory.path, now: 1_764_460_800)
            switch (result, expected) {
            case (.success(let parsed), nil):
                XCTAssertEqual(parsed.lineNumber, 7, name)
                assertSendable(FanoutJob(parsed.job), name)
            case (.success(let parsed), let expected?):
                XCTFail("\(name): accepted as job \(parsed.job.id), expected \(expected.message)")
            case (.failure(let error), nil):
                XCTFail("\(name): refused: \(error)")
            case (.failure(let error), let expected?):
                XCTAssertEqual(error.lineNumber, 7, name)
                XCTAssertEqual(error.field, expected.field, name)
                XCTAssertTrue(
                    error.message.hasPrefix(expected.message),
                    "\(name): \(error.message) (expected \(expected.message))")
                XCTAssertEqual(error.description, "line 7: " + error.message, name)
            }
        }
    }

    /// What Fuzz/JobLine.swift checks of every accepted line: the request Fanout builds from the job passes
    /// mock-apns's validator (a raw `payload` is sent as given, so it may only fail for its body, `BadPayload`).
    func assertSendable(_ job: FanoutJob, _ name: String, file: StaticString = #filePath, line: UInt = #line) {
        do {
            let payload = try job.payload.encode()
            var token = DeviceToken(testDeviceToken(0))!
            if case .tokens(let tokens) = job.recipients {
                token = try XCTUnwrap(DeviceToken(tokens[0]), name, file: file, line: line)
            }
            var headers = job.headers
            headers.apnsID = "eabeae54-14a8-11e5-b60b-1697f925ec7b"
            headers.bearerToken = "eyJhbGciOiJFUzI1NiJ9.e30.c2ln"
            let fields = try headers.headerFields(deviceToken: token, authority: "api.push.apple.com")
            let rejection = APNsRequestValidator().validate(
                method: "POST", path: NotificationHeaders.path(for: token),
                headers: fields.map { ($0.name, $0.value) }, body: payload)
            if case .raw = job.payload, rejection?.reason == .badPayload { return }
            XCTAssertNil(rejection, "\(name): mock-apns rejects the request built from it", file: file, line: line)
        } catch {
            XCTFail("\(name): \(error)", file: file, line: line)
        }
    }
}
