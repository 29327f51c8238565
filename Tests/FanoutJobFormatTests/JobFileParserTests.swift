// The job-file line parser (JobLineParser) and the streaming line reader (JobFileReader).
import Fanout
import FanoutCore
import FanoutJobFile
import FanoutJobFormat
import FanoutJobLines
import Foundation
import XCTest

final class JobFileParserTests: XCTestCase {
    static let token0 = testDeviceToken(0)
    static let token1 = testDeviceToken(1)

    /// The members of the example job line of docs/SEND.md, in order, as JSON text.
    static let exampleMembers: [(String, String)] = [
        ("id", #""match-7-update-12""#),
        ("workspace", #""acme""#),
        ("topic", #""com.acme.app.push-type.liveactivity""#),
        ("push_type", #""liveactivity""#),
        ("priority", "10"),
        ("expiration", "0"),
        ("collapse_id", "null"),
        (
            "live_activity",
            #"{"event": "update", "timestamp": 1764460800, "content_state": {"home": 2, "away": 1}, "#
                + #""stale_date": null, "dismissal_date": null, "relevance_score": 50, "#
                + #""alert": {"title": "Goal!", "body": "2-1", "sound": "default"}, "#
                + #""attributes_type": null, "attributes": null, "input_push_token": false}"#
        ),
        ("payload", "null"),
        ("tokens", #"["\#(token0)", "\#(token1)"]"#),
        ("tokens_file", "null"),
    ]

    /// The example line with members replaced (a JSON text), removed (nil) or added (at the end).
    static func jobLine(_ changes: [String: String?] = [:]) -> String {
        var members: [String] = []
        for (key, value) in exampleMembers {
            let replaced = changes.keys.contains(key) ? changes[key]! : value
            if let replaced { members.append("\"\(key)\": \(replaced)") }
        }
        for (key, value) in changes.sorted(by: { $0.key < $1.key })
        where !exampleMembers.contains(where: { $0.0 == key }) {
            if let value { members.append("\"\(key)\": \(value)") }
        }
        return "{" + members.joined(separator: ", ") + "}"
    }

    /// A regular alert job line with a raw payload.
    static func alertLine(_ changes: [String: String?] = [:]) -> String {
        var all: [String: String?] = [
            "topic": #""com.acme.app""#, "push_type": #""alert""#, "live_activity": nil,
            "payload": #"{"aps": {"alert": "hi"}}"#,
        ]
        all.merge(changes) { $1 }
        return jobLine(all)
    }

    private func parse(
        _ line: String, lineNumber: Int = 7, directory: String = "/jobs", now: Int64 = 1_700_000_000
    ) -> Result<ParsedJobLine, JobLineError> {
        JobLineParser().parse(line: Array(line.utf8), lineNumber: lineNumber, jobFileDirectory: directory, now: now)
    }

    private func parsed(
        _ line: String, directory: String = "/jobs", now: Int64 = 1_700_000_000, file: StaticString = #filePath,
        line sourceLine: UInt = #line
    ) throws -> FanoutJob {
        switch parse(line, directory: directory, now: now) {
        case .success(let parsed):
            XCTAssertEqual(parsed.lineNumber, 7, file: file, line: sourceLine)
            return FanoutJob(parsed.job)
        case .failure(let error):
            XCTFail("unexpected error: \(error)", file: file, line: sourceLine)
            throw error
        }
    }

    /// Asserts that `line` is refused on line 7, naming `field`, with a description that starts with `prefix` (after
    /// `line 7: `) and contains each of `contains`.
    private func assertRefused(
        _ line: String, field: String?, prefix: String = "", contains: [String] = [],
        jobID: String? = "match-7-update-12", file: StaticString = #filePath, line sourceLine: UInt = #line
    ) {
        guard case .failure(let error) = parse(line) else {
            return XCTFail("line was accepted: \(line)", file: file, line: sourceLine)
        }
        XCTAssertEqual(error.lineNumber, 7, file: file, line: sourceLine)
        XCTAssertEqual(error.field, field, "\(error)", file: file, line: sourceLine)
        XCTAssertEqual(error.jobID, jobID, file: file, line: sourceLine)
        XCTAssertTrue(error.description.hasPrefix("line 7: " + prefix), "\(error)", file: file, line: sourceLine)
        if let field {
            XCTAssertTrue(
                error.message.contains(field), "message must name the field: \(error)", file: file, line: sourceLine)
        }
        for part in contains {
            XCTAssertTrue(error.description.contains(part), "\(error) lacks \(part)", file: file, line: sourceLine)
        }
    }

    // MARK: Valid lines

    func testProductExampleLineParses() throws {
        let job = try parsed(Self.jobLine())
        XCTAssertEqual(job.id, "match-7-update-12")
        XCTAssertEqual(job.workspace, "acme")
        XCTAssertEqual(
            job.headers,
            NotificationHeaders(
                pushType: .liveactivity, topic: "com.acme.app.push-type.liveactivity", priority: 10, expiration: 0))
        XCTAssertNil(job.headers.collapseID)
        guard case .liveActivity(let content) = job.payload else { return XCTFail("payload \(job.payload)") }
        XCTAssertEqual(content.timestamp, 1_764_460_800)
        XCTAssertEqual(
            String(decoding: try job.payload.encode(), as: UTF8.self),
            #"{"aps":{"timestamp":1764460800,"event":"update","content-state":{"home": 2, "away": 1},"#
                + #""relevance-score":50,"alert":{"title":"Goal!","body":"2-1","sound":"default"}}}"#)
        guard case .tokens(let tokens) = job.recipients else { return XCTFail("recipients \(job.recipients)") }
        XCTAssertEqual(tokens, [Self.token0, Self.token1])
    }

    func testTimestampDefaultsToNowWhenNullOrAbsent() throws {
        let withNull = Self.jobLine([
            "live_activity": #"{"event": "update", "timestamp": null, "content_state": {"home": 3}}"#
        ])
        let absent = Self.jobLine(["live_activity": #"{"event": "update", "content_state": {"home": 3}}"#])
        for line in [withNull, absent] {
            let job = try parsed(line, now: 1_777_000_123)
            guard case .liveActivity(let content) = job.payload else { return XCTFail("payload \(job.payload)") }
            XCTAssertEqual(content.timestamp, 1_777_000_123)
            XCTAssertTrue(
                String(decoding: try job.payload.encode(), as: UTF8.self).hasPrefix(#"{"aps":{"timestamp":1777000123,"#)
            )
        }
    }

    func testDefaultsForWorkspacePriorityAndExpiration() throws {
        let job = try parsed(
            Self.alertLine(["workspace": nil, "priority": nil, "expiration": nil, "collapse_id": #""score""#]))
        XCTAssertEqual(job.workspace, "default")
        XCTAssertEqual(job.headers.effectivePriority, 10)
        XCTAssertNil(job.headers.expiration)
        XCTAssertEqual(job.headers.collapseID, "score")

        let background = try parsed(
            Self.alertLine([
                "push_type": #""background""#, "priority": "null", "payload": #"{"aps": {"content-available": 1}}"#,
            ]))
        XCTAssertEqual(background.headers.pushType, .background)
        XCTAssertEqual(background.headers.effectivePriority, 5)
    }

    func testRawPayloadIsKeptByteForByte() throws {
        let payload = #"{ "aps" : {"alert":"hi",  "badge": 1.50}, "x": [1, 2] }"#
        let job = try parsed(Self.alertLine(["payload": payload]))
        guard case .raw(let bytes) = job.payload else { return XCTFail("payload \(job.payload)") }
        XCTAssertEqual(String(decoding: bytes, as: UTF8.self), payload)
    }

    func testTokensAreLowercased() throws {
        let job = try parsed(Self.jobLine(["tokens": "[\"\(Self.token1.uppercased())\"]"]))
        guard case .tokens(let tokens) = job.recipients else { return XCTFail("recipients \(job.recipients)") }
        XCTAssertEqual(tokens, [Self.token1])
    }

    /// A job has one result per (job, token): a token given twice, in either case, is sent once, in its first place.
    func testARepeatedInlineTokenIsSentOnce() throws {
        let token2 = testDeviceToken(2)
        let list = [Self.token1, token2, Self.token1.uppercased(), token2, Self.token1]
        let job = try parsed(Self.jobLine(["tokens": "[" + list.map { "\"\($0)\"" }.joined(separator: ", ") + "]"]))
        guard case .tokens(let tokens) = job.recipients else { return XCTFail("recipients \(job.recipients)") }
        XCTAssertEqual(tokens, [Self.token1, token2])
    }

    func testTokensFileIsResolvedRelativeToTheJobFileDirectory() throws {
        let directory = try temporaryDirectory("jobfile")
        try FileManager.default.createDirectory(atPath: directory + "/lists", withIntermediateDirectories: true)
        try Data("\(Self.token0)\n".utf8).write(to: URL(fileURLWithPath: directory + "/lists/tokens.txt"))
        let jobsPath = directory + "/jobs.jsonl"
        try Data(Self.jobLine(["tokens": nil, "tokens_file": #""lists/tokens.txt""#]).utf8)
            .write(to: URL(fileURLWithPath: jobsPath))

        let reader = try JobFileReader(path: jobsPath)
        XCTAssertEqual(reader.directory, directory)
        let line = try XCTUnwrap(reader.nextLine())
        let result = JobLineParser().parse(
            line: line.bytes, lineNumber: line.number, jobFileDirectory: reader.directory, now: 0)
        let job = try result.get().job
        guard case .file(let path) = job.recipients else { return XCTFail("recipients \(job.recipients)") }
        XCTAssertEqual(path, directory + "/lists/tokens.txt")

        // An empty `tokens` next to `tokens_file` is no recipients inline; an absolute path is kept.
        let absolute = try parsed(
            Self.jobLine(["tokens": "[]", "tokens_file": "\"\(directory)/lists/tokens.txt\""]), directory: "/elsewhere")
        guard case .file(let absolutePath) = absolute.recipients else { return XCTFail("\(absolute.recipients)") }
        XCTAssertEqual(absolutePath, directory + "/lists/tokens.txt")

        XCTAssertEqual(JobLineParser.resolve(tokensFile: "t.txt", jobFileDirectory: "."), "t.txt")
        XCTAssertEqual(JobLineParser.resolve(tokensFile: "t.txt", jobFileDirectory: "/"), "/t.txt")
        XCTAssertEqual(JobLineParser.resolve(tokensFile: "t.txt", jobFileDirectory: "a/b"), "a/b/t.txt")
    }

    // MARK: Refused lines

    func testMalformedJSONReportsTheByteOffset() {
        assertRefused(
            #"{"id": "x", "topic" "t"}"#, field: nil, prefix: "not valid JSON", contains: ["byte offset 20"], jobID: nil
        )
    }

    func testLineMustBeAnObject() {
        assertRefused(#"["id", "x"]"#, field: nil, prefix: "a job must be a JSON object, not an array", jobID: nil)
    }

    func testIDIsRequired() {
        assertRefused(Self.jobLine(["id": nil]), field: "id", prefix: "id is required", jobID: nil)
        assertRefused(Self.jobLine(["id": #""""#]), field: "id", prefix: "id is required", jobID: nil)
        assertRefused(Self.jobLine(["id": "12"]), field: "id", prefix: "id must be a string, not a number", jobID: nil)
    }

    func testUnknownKeysAreRefused() {
        assertRefused(
            Self.jobLine(["tokens_fle": #""t.txt""#]), field: "tokens_fle", prefix: #"unknown key "tokens_fle""#,
            contains: ["tokens_file"])
    }

    func testUnknownPushType() {
        assertRefused(
            Self.jobLine(["push_type": #""foo""#]), field: "push_type",
            prefix: #"push_type "foo" is not an APNs push type"#)
        assertRefused(Self.jobLine(["push_type": nil]), field: "push_type", prefix: "push_type is required")
    }

    func testMissingTopic() {
        assertRefused(Self.jobLine(["topic": nil]), field: "topic", prefix: "topic is required")
        assertRefused(Self.jobLine(["topic": #""""#]), field: "topic", prefix: "topic is empty")
    }

    func testTopicMustMatchThePushType() {
        assertRefused(
            Self.jobLine(["topic": #""com.acme.app""#]), field: "topic", prefix: #"topic "com.acme.app" is not"#,
            contains: [".push-type.liveactivity"])
    }

    func testBadPriority() {
        assertRefused(Self.jobLine(["priority": "7"]), field: "priority", prefix: "priority 7 is not 1, 5 or 10")
        assertRefused(
            Self.jobLine(["priority": #""10""#]), field: "priority", prefix: "priority must be an integer",
            contains: ["not a string"])
        assertRefused(Self.jobLine(["priority": "5.5"]), field: "priority", contains: ["not 5.5"])
        assertRefused(
            Self.alertLine(["push_type": #""background""#, "priority": "10"]), field: "priority",
            prefix: "priority 10 is not allowed for background pushes")
    }

    func testNegativeExpiration() {
        assertRefused(Self.jobLine(["expiration": "-5"]), field: "expiration", prefix: "expiration -5 is negative")
    }

    func testLongCollapseID() {
        let collapseID = String(repeating: "c", count: 65)
        assertRefused(
            Self.jobLine(["collapse_id": "\"\(collapseID)\""]), field: "collapse_id",
            prefix: "collapse_id is 65 bytes; APNs allows at most 64")
    }

    func testPayloadAndLiveActivityTogetherOrNeither() {
        assertRefused(
            Self.jobLine(["payload": #"{"aps": {}}"#]), field: "payload",
            prefix: "payload and live_activity are both given")
        assertRefused(
            Self.jobLine(["live_activity": nil]), field: "payload",
            prefix: "one of payload and live_activity is required")
    }

    func testPayloadMustBeAnObject() {
        assertRefused(
            Self.alertLine(["payload": #""hi""#]), field: "payload",
            prefix: "payload must be a JSON object, not a string")
    }

    func testLiveActivityNeedsTheLiveActivityPushType() {
        assertRefused(
            Self.jobLine(["push_type": #""alert""#, "topic": #""com.acme.app""#]), field: "live_activity",
            prefix: #"live_activity needs push_type "liveactivity", not "alert""#)
    }

    func testLiveActivityErrorsNameTheNestedField() {
        assertRefused(
            Self.jobLine(["live_activity": #"{"event": "bogus", "content_state": {}}"#]), field: "live_activity.event",
            prefix: "live_activity.event: must be")
        assertRefused(
            Self.jobLine(["live_activity": #"{"event": "update"}"#]), field: "live_activity.content_state",
            prefix: "live_activity.content_state: required")
    }

    func testNoRecipientsOrBoth() {
        assertRefused(Self.jobLine(["tokens": nil]), field: "tokens", prefix: "no recipients")
        assertRefused(Self.jobLine(["tokens": "[]"]), field: "tokens", prefix: "no recipients")
        assertRefused(
            Self.jobLine(["tokens_file": #""tokens.txt""#]), field: "tokens_file",
            prefix: "tokens and tokens_file are both given")
    }

    // MARK: Registry addressing

    private func recipients(_ changes: [String: String?]) throws -> ParsedJob.Recipients {
        switch parse(Self.jobLine(changes)) {
        case .success(let parsed): return parsed.job.recipients
        case .failure(let error): throw error
        }
    }

    func testActivityIDAddressesTheActivityOfTheTopicsApp() throws {
        XCTAssertEqual(
            try recipients(["tokens": nil, "activity_id": #""match-7""#]), .activity(app: "com.acme.app", id: "match-7")
        )
        XCTAssertEqual(
            try recipients(["tokens": nil, "activity_id": #""match-7""#, "app": #""com.other""#]),
            .activity(app: "com.other", id: "match-7"))
    }

    func testPushToStartSelectsUsersDevicesOrAllAndKeepsTheActivityID() throws {
        let start =
            #"{"event": "start", "content_state": {"home": 0}, "attributes_type": "MatchAttributes", "attributes": {"team": "A"}, "alert": {"title": "Kick-off"}}"#
        XCTAssertEqual(
            try recipients([
                "tokens": nil, "live_activity": start, "activity_id": #""match-9""#,
                "push_to_start": #"{"attributes_type": "MatchAttributes", "users": ["u1", "u2"]}"#,
            ]),
            .pushToStart(
                app: "com.acme.app", attributesType: "MatchAttributes", selection: .users(["u1", "u2"]),
                activityID: "match-9"))
        XCTAssertEqual(
            try recipients(["tokens": nil, "live_activity": start, "push_to_start": #"{"devices": ["d1"]}"#]),
            .pushToStart(app: "com.acme.app", attributesType: nil, selection: .devices(["d1"]), activityID: nil))
        XCTAssertEqual(
            try recipients(["tokens": nil, "live_activity": start, "push_to_start": #"{"all": true}"#]),
            .pushToStart(app: "com.acme.app", attributesType: nil, selection: .all, activityID: nil))
    }

    /// `push_to_start.activity_id_attribute` says where the start writes its activity id (the SDK's key); without
    /// it the engine's default applies.
    func testPushToStartNamesWhereItWritesTheActivityID() throws {
        let start = #"{"event": "start", "content_state": {}, "attributes_type": "T", "attributes": {}}"#
        let job = try parsed(
            Self.jobLine([
                "tokens": nil, "live_activity": start, "activity_id": #""match-9""#,
                "push_to_start": #"{"users": ["u1"], "activity_id_attribute": ["pushwoosh", "activityId"]}"#,
            ]))
        XCTAssertEqual(job.activityIDAttribute, .pushwoosh)
        let plain = try parsed(
            Self.jobLine([
                "tokens": nil, "live_activity": start, "activity_id": #""match-9""#,
                "push_to_start": #"{"users": ["u1"]}"#,
            ]))
        XCTAssertNil(plain.activityIDAttribute)
        assertRefused(
            Self.jobLine([
                "tokens": nil, "live_activity": start,
                "push_to_start": #"{"users": ["u1"], "activity_id_attribute": ["brazeActivityId"]}"#,
            ]), field: "push_to_start.activity_id_attribute",
            prefix: "push_to_start.activity_id_attribute goes with activity_id")
        assertRefused(
            Self.jobLine([
                "tokens": nil, "live_activity": start, "activity_id": #""match-9""#,
                "push_to_start": #"{"users": ["u1"], "activity_id_attribute": "brazeActivityId"}"#,
            ]), field: "push_to_start.activity_id_attribute",
            prefix: "push_to_start.activity_id_attribute must be a non-empty array of strings")
    }

    func testUsersAndDevicesAddressRegularPushTokens() throws {
        XCTAssertEqual(
            try recipients(["tokens": nil, "users": #"["u1"]"#]),
            .devices(app: "com.acme.app", selection: .users(["u1"])))
        XCTAssertEqual(
            try recipients(["tokens": nil, "devices": #"["d1", "d2"]"#]),
            .devices(app: "com.acme.app", selection: .devices(["d1", "d2"])))
    }

    func testRegistryAddressingErrorsNameTheField() {
        assertRefused(
            Self.jobLine(["activity_id": #""match-7""#]), field: "activity_id",
            prefix: "tokens and activity_id are both given")
        assertRefused(
            Self.jobLine(["tokens": nil, "activity_id": "\"" + String(repeating: "a", count: 257) + "\""]),
            field: "activity_id", prefix: "activity_id is 257 bytes, over the 256-byte limit")
        assertRefused(
            Self.jobLine(["tokens": nil, "push_to_start": #"{"users": ["u"], "all": true}"#]), field: "push_to_start",
            prefix: "push_to_start needs exactly one of users, devices or all: true")
        assertRefused(
            Self.jobLine(["tokens": nil, "users": "[]"]), field: "users", prefix: "users must be a non-empty array")
        assertRefused(
            Self.jobLine(["tokens": nil, "devices": #"["d", 3]"#]), field: "devices[1]",
            prefix: "devices[1] must be a non-empty string")
        assertRefused(
            Self.jobLine(["app": #""com.acme.app""#]), field: "app", prefix: "app goes with activity_id")
    }

    func testTokenThatIsNotHexNamesItsIndex() {
        let tokens = "[\"\(Self.token0)\", \"\(Self.token1)\", \"\(Self.token0)\", \"xyz\"]"
        assertRefused(
            Self.jobLine(["tokens": tokens]), field: "tokens[3]",
            prefix: #"tokens[3]: "xyz" is not a device token (64 to 200 hex digits)"#)
        assertRefused(
            Self.jobLine(["tokens": "[\"\(Self.token0)\", 5]"]), field: "tokens[1]",
            prefix: "tokens[1] must be a string, not a number")
        assertRefused(
            Self.jobLine(["tokens": "\"\(Self.token0)\""]), field: "tokens",
            prefix: "tokens must be an array of hex token strings, not a string")
    }

    func testMissingTokensFileNamesTheResolvedPath() throws {
        assertRefused(
            Self.jobLine(["tokens": nil, "tokens_file": #""lists/missing.txt""#]), field: "tokens_file",
            prefix: #"tokens_file "/jobs/lists/missing.txt" does not exist"#)
        let directory = try temporaryDirectory("jobfile")
        assertRefused(
            Self.jobLine(["tokens": nil, "tokens_file": "\"\(directory)\""]), field: "tokens_file",
            prefix: "tokens_file \"\(directory)\" cannot be read: is a directory")
    }

    func testPayloadOverTheSizeLimit() {
        let big = String(repeating: "x", count: 4100)
        assertRefused(
            Self.alertLine(["payload": #"{"aps": {"alert": "\#(big)"}}"#]), field: "payload",
            prefix: "payload: 4122 bytes, over the 4096-byte limit for alert")
        assertRefused(
            Self.jobLine(["live_activity": #"{"event": "update", "content_state": {"text": "\#(big)"}}"#]),
            field: "live_activity", prefix: "live_activity: the encoded payload is",
            contains: ["over the 4096-byte limit"])
    }

    // MARK: Reader

    func testReaderStreamsAHundredThousandLinesWithTheirNumbers() throws {
        let directory = try temporaryDirectory("jobfile")
        let path = directory + "/jobs.jsonl"
        var text = ""
        text.reserveCapacity(4_000_000)
        for number in 1...100_000 {
            // Every 1000th line is blank (or whitespace only); the rest say their own number.
            if number % 1000 == 0 {
                text += number % 2000 == 0 ? "\n" : " \t\r\n"
            } else {
                text += #"{"id": "job-\#(number)", "n": \#(number)}"# + (number % 3 == 0 ? "\r\n" : "\n")
            }
        }
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))

        // A small chunk makes lines straddle chunk boundaries; the default chunk is the normal case.
        for chunkSize in [4096, JobFileReader.defaultChunkSize] {
            let reader = try JobFileReader(path: path, chunkSize: chunkSize)
            var count = 0
            var previous = 0
            while let line = try reader.nextLine() {
                count += 1
                XCTAssertGreaterThan(line.number, previous)
                previous = line.number
                XCTAssertNotEqual(line.number % 1000, 0, "blank line \(line.number) returned")
                let expected = #"{"id": "job-\#(line.number)", "n": \#(line.number)}"#
                if String(decoding: line.bytes, as: UTF8.self) != expected {
                    return XCTFail("line \(line.number) is \(String(decoding: line.bytes, as: UTF8.self))")
                }
            }
            XCTAssertEqual(count, 99_900)
            XCTAssertEqual(previous, 99_999)
            XCTAssertNil(try reader.nextLine())
        }
    }

    func testBlankLinesAreSkippedButCounted() throws {
        let directory = try temporaryDirectory("jobfile")
        let path = directory + "/jobs.jsonl"
        let long = String(repeating: "a", count: 10_000)
        let text = "\u{FEFF}{\"a\": 1}\n\n   \r\n{\"b\": 2}\r\n\"\(long)\"\n\n{\"c\": 3}"
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        let reader = try JobFileReader(path: path, chunkSize: 1024)
        var lines: [(Int, String)] = []
        while let line = try reader.nextLine() {
            lines.append((line.number, String(decoding: line.bytes, as: UTF8.self)))
        }
        XCTAssertEqual(lines.map(\.0), [1, 4, 5, 7])
        XCTAssertEqual(lines.map(\.1), [#"{"a": 1}"#, #"{"b": 2}"#, "\"\(long)\"", #"{"c": 3}"#])

        // Parsing keeps the line number it is given.
        guard
            case .failure(let error) = JobLineParser().parse(
                line: Array(lines[1].1.utf8), lineNumber: lines[1].0, jobFileDirectory: ".", now: 0)
        else { return XCTFail("accepted") }
        XCTAssertEqual(
            error.description,
            #"line 4: unknown key "b" (known: "# + JobLineParser.knownKeys.joined(separator: ", ") + ")")
    }

    func testMissingOrUnreadableJobFileThrowsWithThePath() throws {
        let directory = try temporaryDirectory("jobfile")
        let missing = directory + "/nope.jsonl"
        XCTAssertThrowsError(try JobFileReader(path: missing)) { error in
            XCTAssertEqual((error as? JobFileError)?.path, missing)
            XCTAssertTrue("\(error)".contains(missing), "\(error)")
            XCTAssertTrue("\(error)".contains("No such file"), "\(error)")
        }
        XCTAssertThrowsError(try JobFileReader(path: directory)) { error in
            XCTAssertEqual("\(error)", "cannot read job file \(directory): is a directory")
        }
    }

    func testLineLongerThanTheMaximumIsAnError() throws {
        let directory = try temporaryDirectory("jobfile")
        let path = directory + "/jobs.jsonl"
        try Data(("{}\n" + String(repeating: " ", count: 5000) + "{}\n").utf8).write(to: URL(fileURLWithPath: path))
        let reader = try JobFileReader(path: path, chunkSize: 1024, maximumLineLength: 2048)
        XCTAssertEqual(try reader.nextLine()?.number, 1)
        XCTAssertThrowsError(try reader.nextLine()) { error in
            XCTAssertTrue("\(error)".contains("line 2 is longer than 2048 bytes"), "\(error)")
        }
    }

    /// `JobLineParser.jobID(of:)`, which a resumed run reads from the lines it skips, is the id a parse reports, so
    /// that `JobFileIDs` takes the same keys in both runs.
    func testTheJobIDOfALineIsTheOneItsParseReports() {
        let lines = [
            Self.alertLine(["id": #""a""#]),
            Self.alertLine(["id": #""b""#, "push_type": #""carrier-pigeon""#]),
            Self.alertLine(["id": #""c""#, "colour": #""red""#]),
            Self.alertLine(["id": "null"]), Self.alertLine(["id": #""""#]), Self.alertLine(["id": "5"]),
            Self.alertLine(["id": nil]), #"{"id": "d", "#, "[1, 2]", #"{"id": "e", "id": "f"}"#,
        ]
        for line in lines {
            XCTAssertEqual(JobLineParser.jobID(of: Array(line.utf8)), parse(line).jobID, line)
        }
        XCTAssertEqual(lines.map { JobLineParser.jobID(of: Array($0.utf8)) }.compactMap { $0 }, ["a", "b", "c"])
    }

    /// The first line with an id takes it; a later one is refused naming both lines, and is keyed `line-N`, as is a
    /// line without an id, whose key a later line cannot take either.
    func testJobFileIDsRefuseARepeatedID() {
        var ids = JobFileIDs()
        XCTAssertEqual(ids.claim("a", line: 1), .init(key: "a"))
        XCTAssertEqual(ids.claim(nil, line: 2), .init(key: "line-2"))
        let repeated = ids.claim("a", line: 3)
        XCTAssertEqual(repeated.key, "line-3")
        XCTAssertEqual(repeated.duplicate?.field, "id")
        XCTAssertEqual(
            repeated.duplicate?.description,
            #"line 3: id "a" is already the id of line 1 (job ids must be unique in a job file)"#)
        XCTAssertEqual(
            ids.claim("line-2", line: 4).duplicate?.message.hasPrefix(#"id "line-2" is already the id of line 2"#), true
        )
        XCTAssertEqual(ids.claim("b", line: 5), .init(key: "b"))
    }
}
