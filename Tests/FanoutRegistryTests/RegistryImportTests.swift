import FanoutRegistry
import XCTest

/// Import lines (JSON lines and CSV): typed registrations, errors naming the line and field, idempotent re-import.
final class RegistryImportTests: XCTestCase {
    let app = "com.acme.app"

    func testJSONLinesOfTheThreeKindsImportOnceAndAgainChangeNothing() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let seconds = clock.now / 1000 - 60
        let lines = [
            #"{"app": "com.acme.app", "activity_id": "match-7", "token": "\#(TestTokens.token(1))", "device": "d1", "user": "u1"}"#,
            #"{"app": "com.acme.app", "activity_id": "match-7", "token": "\#(TestTokens.token(2).uppercased())"}"#,
            "",
            #"{"app": "com.acme.app", "push_to_start_token": "\#(TestTokens.token(3))", "attributes_type": "MatchAttributes", "device": "d1", "user": "u1"}"#,
            #"{"app": "com.acme.app", "device": "d2", "user": "u2", "push_token": "\#(TestTokens.token(4))", "registered_at": \#(seconds)}"#,
            #"{"app": "com.acme.app", "activity_id": "match-8", "token": "\#(TestTokens.token(5))", "device": null, "registered_at": \#(seconds).5}"#,
        ]
        let file = directory.file("registrations.jsonl")
        try lines.joined(separator: "\n").write(toFile: file, atomically: true, encoding: .utf8)

        var invalid: [RegistryImportError] = []
        let first = try await RegistryImporter().run(path: file, into: store) { invalid.append($0) }
        XCTAssertEqual(invalid, [])
        XCTAssertEqual(first.lines, 6)
        XCTAssertEqual(first.registrations, 5)
        XCTAssertEqual(first.added, 5)
        XCTAssertEqual(first.batches, 1)

        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(Set(live.map(\.token)), [TestTokens.token(1), TestTokens.token(2)], "tokens are lowercased")
        let backFilled = try await store.allLiveTokens(activityID: "match-8", now: clock.now)
        XCTAssertEqual(backFilled.first?.registeredAt, seconds * 1000 + 500)
        let starts = try await store.pushToStartTokens(
            app: app, attributesType: "MatchAttributes", selection: .users(["u1"]), after: nil, limit: 10)
        XCTAssertEqual(starts.items.map(\.token), [TestTokens.token(3)])
        let devices = try await store.devices(app: app, selection: .users(["u2"]), after: nil, limit: 10)
        XCTAssertEqual(devices.items.map(\.pushToken), [TestTokens.token(4)])
        XCTAssertEqual(devices.items.first?.pushTokenRegisteredAt, seconds * 1000)
        let eventsAfterFirst = try await store.allEvents()
        XCTAssertEqual(eventsAfterFirst.count, 5)

        clock.advance(milliseconds: 5_000)
        let second = try await RegistryImporter().run(path: file, into: store)
        XCTAssertEqual(second.added + second.rotated + second.removed, 0)
        XCTAssertEqual(second.unchanged, 5)
        let eventsAfterSecond = try await store.allEvents()
        XCTAssertEqual(eventsAfterSecond, eventsAfterFirst, "no event for an unchanged row")
        let stats = try await store.stats()
        XCTAssertEqual(stats.updateTokens, 3)
        XCTAssertEqual(stats.pushToStartTokens, 1)
        XCTAssertEqual(stats.devices, 2)
    }

    func testCSVWithAHeaderRowImportsTheSameWay() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let file = directory.file("registrations.csv")
        try #"""
        app,activity_id,token,device,user
        com.acme.app,match-7,\#(TestTokens.token(1)),d1,u1
        com.acme.app,"match,7",\#(TestTokens.token(2)),,"u ""2"""
        com.acme.app,match-7,\#(TestTokens.token(3))\#r
        """#.write(toFile: file, atomically: true, encoding: .utf8)
        var invalid: [RegistryImportError] = []
        let first = try await RegistryImporter().run(path: file, into: store) { invalid.append($0) }
        XCTAssertEqual(invalid, [])
        XCTAssertEqual(first.added, 3)
        let quoted = try await store.allLiveTokens(activityID: "match,7", now: clock.now)
        XCTAssertEqual(quoted.map(\.token), [TestTokens.token(2)])
        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(Set(live.map(\.token)), [TestTokens.token(1), TestTokens.token(3)])
        let second = try await RegistryImporter().run(path: file, into: store)
        XCTAssertEqual(second.unchanged, 3)
        XCTAssertEqual(second.added, 0)
    }

    func testBadLinesAreReportedWithTheirLineAndFieldAndTheOthersImported() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let good = TestTokens.token(1)
        let lines = [
            #"{"app": "com.acme.app", "activity_id": "match-7", "token": "\#(good)"}"#,
            #"{"app": "com.acme.app", "activity_id": "match-7", "token": "#,
            #"{"app": "com.acme.app", "activity_id": "match-7", "token": "abc"}"#,
            #"{"app": "com.acme.app", "activity_id": "\#(String(repeating: "x", count: 257))", "token": "\#(good)"}"#,
            #"{"app": "com.unknown.app", "activity_id": "match-7", "token": "\#(good)"}"#,
            #"{"app": "com.acme.app", "activity_id": "match-7", "tokn": "\#(good)"}"#,
            #"{"app": "com.acme.app", "activity_id": "match-7", "push_to_start_token": "\#(good)", "device": "d"}"#,
            #"{"app": "com.acme.app", "push_to_start_token": "\#(good)"}"#,
            #"{"app": "com.acme.app", "activity_id": "m", "token": "\#(good)", "registered_at": "yesterday"}"#,
            #"["not", "an", "object"]"#,
            #"{"activity_id": "match-7", "token": "\#(good)"}"#,
            #"{"app": "com.acme.app", "activity_id": "match-7"}"#,
            #"{"app": "com.acme.app", "activity_id": 7, "token": "\#(good)"}"#,
            #"{"app": "com.acme.app", "activity_id": "match-7", "token": "\#(TestTokens.token(2))"}"#,
        ]
        let file = directory.file("bad.jsonl")
        try lines.joined(separator: "\n").write(toFile: file, atomically: true, encoding: .utf8)
        var invalid: [RegistryImportError] = []
        let summary = try await RegistryImporter().run(path: file, into: store) { invalid.append($0) }
        XCTAssertEqual(summary.added, 2)
        XCTAssertEqual(summary.invalid, 12)
        XCTAssertEqual(invalid.map(\.lineNumber), Array(2...13))
        XCTAssertEqual(
            invalid.map(\.field),
            [
                nil, "token", "activity_id", "app", "tokn", "push_to_start_token", "device", "registered_at", nil,
                "app", "token", "activity_id",
            ])
        XCTAssertTrue(invalid[0].description.hasPrefix("line 2: not valid JSON"), invalid[0].description)
        XCTAssertTrue(invalid[1].description.hasPrefix("line 3: token: \"abc\" is not a device token"), "\(invalid[1])")
        XCTAssertTrue(invalid[2].message.contains("257 bytes"), invalid[2].message)
        XCTAssertTrue(invalid[3].message.contains("unknown app"), invalid[3].message)
        XCTAssertTrue(invalid[11].message.contains("must be a string, not a number"), invalid[11].message)
    }

    func testCSVErrorsNameTheLine() throws {
        var parser = RegistryImportParser(format: .csv)
        XCTAssertThrowsError(try parser.parse(line: Array("app,activity,token".utf8), lineNumber: 1)) { error in
            XCTAssertTrue("\(error)".hasPrefix("line 1: unknown column \"activity\""), "\(error)")
        }
        XCTAssertNil(try parser.parse(line: Array("app,activity_id,token".utf8), lineNumber: 1))
        XCTAssertThrowsError(try parser.parse(line: Array("com.acme.app,\"match,7".utf8), lineNumber: 2)) { error in
            XCTAssertEqual("\(error)", "line 2: a quoted CSV field is not closed")
        }
        XCTAssertThrowsError(try parser.parse(line: Array("com.acme.app,m,t,extra".utf8), lineNumber: 3)) { error in
            XCTAssertEqual("\(error)", "line 3: 4 cells, but the header names 3 columns")
        }
        XCTAssertEqual(
            try parser.parse(line: Array("com.acme.app,m,\(TestTokens.token(1))".utf8), lineNumber: 4),
            .updateToken(.init(app: app, activityID: "m", token: TestTokens.token(1))))
        XCTAssertEqual(RegistryImportFormat.detect(firstLine: Array("  {\"app\"".utf8)), .jsonLines)
        XCTAssertEqual(RegistryImportFormat.detect(firstLine: Array("app,token".utf8)), .csv)
    }

    func testAnUnreadableFileIsAClearError() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let error = await assertRegistryError(.unreadableInput) {
            try await RegistryImporter().run(path: directory.file("missing.jsonl"), into: store)
        }
        XCTAssertTrue(error?.message.contains("missing.jsonl") ?? false)
    }
}
