import FanoutRegistry
import XCTest

/// The change feed: every change is returned, published to every subscriber, and kept in the event log.
class RegistryEventTests: RegistryStoreTestCase {
    let app = "com.acme.app"

    func testEveryChangeReachesEverySubscriberAndTheLogInOrder() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let first = store.subscribe()
        let second = store.subscribe()

        let added = try await store.apply([
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: TestTokens.token(1))),
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d2", token: TestTokens.token(2))),
        ])
        clock.advance(milliseconds: 10)
        let rotated = try await store.register(
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: TestTokens.token(3))))
        let stopped = try await store.register(
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d2", token: "")))
        let unregistered = try await store.recordUnregistered(token: TestTokens.token(3), timestamp: clock.now + 1)
        let returned = added.events + rotated.events + stopped.events + unregistered.events
        XCTAssertEqual(returned.map(\.change), [.added, .added, .rotated, .removed, .removed])
        XCTAssertEqual(returned.map(\.reason), [nil, nil, nil, .stopped, .unregistered])
        XCTAssertEqual(returned.map(\.sequence), Array(1...5), "sequences increase by one per event")

        for stream in [first, second] {
            var received: [RegistryEvent] = []
            for await event in stream {
                received.append(event)
                if received.count == returned.count { break }
            }
            XCTAssertEqual(received, returned)
        }
        let logged = try await store.allEvents()
        XCTAssertEqual(logged, returned)

        let tail = try await store.events(after: RegistryCursor(rawValue: "3"), limit: 10)
        XCTAssertEqual(tail.items.map(\.sequence), [4, 5])
        XCTAssertEqual(tail.next, RegistryCursor(rawValue: "5"))
        let caughtUp = try await store.events(after: tail.next, limit: 10)
        XCTAssertEqual(caughtUp.items, [])
        XCTAssertEqual(caughtUp.next, tail.next, "at the end, the cursor stays where it was, for --follow")
    }

    func testTheEventJSONLineIsProductMdsShape() {
        let event = RegistryEvent(
            sequence: 7, at: 1_764_460_800_123, app: "com.acme.app", activityID: "match \"7\"", deviceID: "d1",
            token: TestTokens.token(1), kind: .update, change: .removed, reason: .unregistered)
        XCTAssertEqual(
            event.jsonLine,
            #"{"at":1764460800123,"app":"com.acme.app","activity_id":"match \"7\"","token":""#
                + TestTokens.token(1) + #"","change":"removed","reason":"unregistered","kind":"update"}"#)
        let start = RegistryEvent(
            sequence: 8, at: 1, app: "a", activityID: nil, deviceID: nil, token: "ab", kind: .pushToStart,
            change: .added, reason: nil)
        XCTAssertEqual(
            start.jsonLine,
            #"{"at":1,"app":"a","activity_id":null,"token":"ab","change":"added","reason":null,"kind":"push_to_start"}"#
        )
        var bytes: [UInt8] = []
        start.appendJSONLine(to: &bytes, newline: true)
        XCTAssertEqual(bytes.last, UInt8(ascii: "\n"))
    }

    func testChangesThatChangeNothingLogNothing() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let registration = RegistryChange.updateToken(
            .init(app: app, activityID: "match-7", deviceID: "d1", token: TestTokens.token(1)))
        try await store.apply([registration])
        try await store.apply([registration, .stopUpdateTokens(app: app, activityID: "nope", deviceID: nil)])
        try await store.recordUnregistered(token: TestTokens.token(2), timestamp: clock.now)
        let logged = try await store.allEvents()
        XCTAssertEqual(logged.count, 1)
    }

    func testClosingTheStoreEndsTheStreams() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let stream = store.subscribe()
        store.close()
        var count = 0
        for await _ in stream { count += 1 }
        XCTAssertEqual(count, 0)
        await assertRegistryError(.unavailable) { try await store.stats() }
    }

    func testSweepsDropEventsOlderThanTheRetentionButKeepTheNewest() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock) { $0.eventRetention = 3_600_000 }
        for index in 0..<5 {
            try await store.register(
                .device(.init(app: app, deviceID: "d\(index)", pushToken: TestTokens.token(index))))
        }
        clock.advance(hours: 2)
        let sweep = try await store.sweep()
        XCTAssertEqual(sweep.eventsPruned, 4)
        try await store.register(.device(.init(app: app, deviceID: "d9", pushToken: TestTokens.token(9))))
        let logged = try await store.allEvents()
        XCTAssertEqual(logged.map(\.sequence), [5, 6], "sequence numbers are never reused")
    }
}
