import Fanout
import FanoutCore
import FanoutTestSupport
import Foundation
import XCTest

/// `maxPendingSends`: past that many `send` calls under way, a call is refused at once with `.overloaded` and sends
/// nothing, while the calls under way are answered as usual; the count goes back down as they return.
final class PendingSendsTests: XCTestCase {
    private let headers = NotificationHeaders(pushType: .alert, topic: "com.example.app")
    private let payload = Array(#"{"aps":{"alert":"hi"}}"#.utf8)

    func testASendPastTheLimitIsRefusedAtOnceAndTheOthersAreAnswered() async throws {
        // The mock holds every answer long enough that the first ten are still under way when the rest are made.
        let mock = try MockHarness { $0.latencyMilliseconds = 1_000 }
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) {
            $0.maxInFlight = 5  // five on the wire, five waiting for room: both count
            $0.maxPendingSends = 10
        }
        let headers = self.headers
        let payload = self.payload
        let underWay = (0..<10).map { index in
            Task {
                try await engine.send(
                    PushNotification(deviceToken: testDeviceToken(index), headers: headers, payload: payload))
            }
        }
        let allUnderWay = await eventually { engine.pendingSendCount == 10 }
        XCTAssertTrue(allUnderWay, "\(engine.pendingSendCount) of 10 sends under way")
        for index in 10..<15 {
            let started = ContinuousClock.now
            do {
                _ = try await engine.send(
                    PushNotification(deviceToken: testDeviceToken(index), headers: headers, payload: payload))
                XCTFail("send \(index) past the limit was sent")
            } catch {
                XCTAssertEqual(error.kind, .overloaded)
                XCTAssertTrue(error.message.contains("10 sends are already under way"), error.message)
            }
            // Refused without waiting for room (the mock answers nothing for a second).
            XCTAssertLessThan(ContinuousClock.now - started, .milliseconds(500) * testTimeScale)
        }
        var delivered = 0
        for task in underWay where try await task.value.outcome == .delivered { delivered += 1 }
        XCTAssertEqual(delivered, 10)
        XCTAssertEqual(engine.pendingSendCount, 0)
        // Room again: the next call is sent.
        let after = try await engine.send(
            PushNotification(deviceToken: testDeviceToken(20), headers: headers, payload: payload))
        XCTAssertEqual(after.outcome, .delivered)
        await engine.shutdown()
        XCTAssertEqual(mock.stats.accepted, 11, "a refused send reached the mock")
    }

    /// A caller's `apns-id` is checked before anything is sent, as the rest of the headers are: a malformed one would
    /// otherwise go out and come back `BadMessageId`.
    /// A job whose `onResult` is stuck holds the job's in-flight permits (they come back only as its results are
    /// delivered), and a `send` beside it is answered anyway: sends take permits of their own. In one queue with the
    /// job's it waited for the handler (1.1 to 1.8 s per send in a review, for a handler of 1 ms a result).
    func testASendIsAnsweredWhileAJobsHandlerHoldsEveryJobPermit() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { $0.maxInFlight = 64 }
        let handler = DispatchSemaphore(value: 0)
        let (headers, payload) = (self.headers, self.payload)
        let stuck = Task {
            try await engine.run(
                FanoutJob(
                    id: "slow-handler", headers: headers, payload: .raw(payload),
                    recipients: .tokens((0..<1_000).map { testDeviceToken($0) }))
            ) { result in
                if result.position == 0 { _ = handler.wait(timeout: .now() + 60) }
            }
        }
        var released = false
        defer { if !released { handler.signal() } }
        // All but the permits of the results delivered before the handler stuck (at least one batch of 64 is short
        // of them, so the job's feeding waits, first in the job's queue).
        let full = await eventually { engine.inFlight >= 60 }
        XCTAssertTrue(full, "the job holds its permits: \(engine.inFlight) in flight")
        let send = Task {
            try await engine.send(
                PushNotification(deviceToken: testDeviceToken(5_000), headers: headers, payload: payload))
        }
        let answered = await withTaskGroup(of: NotificationOutcome?.self) { group in
            group.addTask { try? await send.value.outcome }
            group.addTask {
                try? await Task.sleep(for: .seconds(20))
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        XCTAssertEqual(answered, .delivered, "the send waited behind the stuck handler")
        handler.signal()
        released = true
        let summary = try await stuck.value
        XCTAssertEqual(summary.counts.delivered, 1_000)
        await engine.shutdown()
    }

    func testASendWithAMalformedApnsIDIsRefusedBeforeSending() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        var headers = self.headers
        headers.apnsID = "not-a-uuid"
        do {
            _ = try await engine.send(
                PushNotification(deviceToken: testDeviceToken(1), headers: headers, payload: payload))
            XCTFail("a malformed apns-id was sent")
        } catch {
            XCTAssertEqual(error.kind, .invalidNotification)
            XCTAssertTrue(error.message.contains("apns-id"), error.message)
        }
        headers.apnsID = "123E4567-E89B-12D3-A456-426614174000"
        let sent = try await engine.send(
            PushNotification(deviceToken: testDeviceToken(2), headers: headers, payload: payload))
        XCTAssertEqual(sent.outcome, .delivered)
        XCTAssertEqual(sent.apnsID, "123E4567-E89B-12D3-A456-426614174000")
        await engine.shutdown()
        XCTAssertEqual(mock.stats.requests, 1, "only the well-formed one reached the mock")
    }

    /// A `send`'s error names what is wrong and no job: the caller made none (it said "job single: apns-topic: …", or
    /// "job <the caller's apns-id>: …"). A job's errors still name the job, once.
    func testASendsErrorNamesNoJob() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        var wrongTopic = NotificationHeaders(pushType: .liveactivity, topic: "com.example.app")
        for apnsID in [nil, "123E4567-E89B-12D3-A456-426614174000"] {
            wrongTopic.apnsID = apnsID
            do {
                _ = try await engine.send(
                    PushNotification(deviceToken: testDeviceToken(1), headers: wrongTopic, payload: payload))
                XCTFail("a wrong topic was sent")
            } catch {
                XCTAssertEqual(error.kind, .invalidNotification)
                XCTAssertTrue(error.message.hasPrefix("apns-topic: "), error.message)
                XCTAssertFalse(error.message.contains("job"), error.message)
            }
        }
        do {
            _ = try await engine.send(PushNotification(deviceToken: testDeviceToken(1), headers: headers, payload: []))
            XCTFail("an empty payload was sent")
        } catch {
            XCTAssertEqual(error.message, "payload: empty")
        }
        let job = FanoutJob(
            id: "wrong-topic", headers: wrongTopic, payload: .raw(payload), recipients: .tokens([testDeviceToken(1)]))
        do {
            _ = try await engine.run(job) { _ in }
            XCTFail("a wrong topic was sent")
        } catch {
            XCTAssertTrue(error.message.hasPrefix("job wrong-topic: apns-topic: "), error.message)
        }
        let broadcast = FanoutJob(
            id: "alert-broadcast", headers: headers, payload: .raw(payload),
            recipients: .channel(app: "com.example.app", id: "dHN0LTIxMDk4NzY1NDMyMQ=="))
        do {
            _ = try await engine.run(broadcast) { _ in }
            XCTFail("an alert broadcast was sent")
        } catch {
            XCTAssertTrue(error.message.hasPrefix("job alert-broadcast: push_type: "), error.message)
            XCTAssertFalse(error.message.hasPrefix("job alert-broadcast: job alert-broadcast:"), error.message)
        }
        await engine.shutdown()
        XCTAssertEqual(mock.stats.requests, 0)
    }

    /// A payload that is not one JSON object is refused before sending, naming what is wrong, as `send` promises;
    /// it went out and came back `rejected` (400 BadPayload).
    func testASendWhosePayloadIsNotAJSONObjectIsRefusedBeforeSending() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let refused: [(payload: String, mention: String)] = [
            ("hello", "payload: not valid JSON: at byte offset 0"),
            (#"{"aps":{"alert":"hi"}"#, "payload: not valid JSON"),
            (#"{"aps":{}} trailing"#, "payload: not valid JSON"),
            (#"[{"aps":{}}]"#, "payload: must be a JSON object, not an array"),
            ("\"text\"", "payload: must be a JSON object, not a string"),
        ]
        for (payload, mention) in refused {
            do {
                let result = try await engine.send(
                    PushNotification(deviceToken: testDeviceToken(1), headers: headers, payload: Array(payload.utf8)))
                XCTFail("\(payload) was sent: \(result.outcome) \(result.reason ?? "")")
            } catch {
                XCTAssertEqual(error.kind, .invalidNotification, payload)
                XCTAssertTrue(error.message.contains(mention), "\(payload): \(error.message)")
            }
        }
        // Spacing around the object is JSON too.
        let sent = try await engine.send(
            PushNotification(
                deviceToken: testDeviceToken(2), headers: headers,
                payload: Array(" {\"aps\":{\"alert\":\"hi\"}}\n".utf8)))
        XCTAssertEqual(sent.outcome, .delivered)
        await engine.shutdown()
        XCTAssertEqual(mock.stats.requests, 1, "only the JSON object reached the mock")
    }
}
