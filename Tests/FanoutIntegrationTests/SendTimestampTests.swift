// The default Live Activity `timestamp` of a job-file job: the moment the job starts sending (docs/SEND.md), in
// process: the job-file driver against an in-process mock-apns that keeps each token's payload.
import Fanout
import Foundation
import MockAPNsKit
import XCTest

@testable import FanoutJobFile

final class SendTimestampTests: XCTestCase {
    /// With one job at a time and a mock that answers after 2.5 s, the second job cannot start sending before the
    /// first has its answer, so its default timestamp is at least 2 s after the first's. Before, both were taken
    /// as the lines were read, a few microseconds apart: a job queued behind long ones went out with a stale one.
    func testADefaultTimestampIsTakenWhenTheJobGetsItsSlotNotWhenItsLineIsRead() async throws {
        let mock = try MockHarness {
            $0.capturePayloads = true
            $0.latencyMilliseconds = 2_500
        }
        addTeardownBlock { mock.stop() }
        let directory = try ProcessSupport.temporaryDirectory(for: self, "send-timestamp")
        let jobs = "\(directory)/jobs.jsonl"
        let tokens = [testDeviceToken(1), testDeviceToken(2)]
        let lines = tokens.enumerated().map { index, token in
            #"{"id": "j\#(index)", "topic": "com.example.app.push-type.liveactivity", "push_type": "liveactivity", "#
                + #""live_activity": {"event": "update", "content_state": {"n": \#(index)}}, "tokens": ["\#(token)"]}"#
        }
        try (lines.joined(separator: "\n") + "\n").write(toFile: jobs, atomically: true, encoding: .utf8)

        let engine = try makeEngine(for: mock)
        var options = SendOptions(jobsPath: jobs)
        options.resultsPath = "\(directory)/results.jsonl"
        options.progress = .never
        options.concurrentJobs = 1
        let summary = try await JobFileRunner(engine: engine, options: options).run()
        XCTAssertEqual(summary.counts.outcomes.delivered, 2, summary.jsonLine)

        let timestamps = try tokens.map { token -> Int in
            let payload = try XCTUnwrap(mock.stats.payloadsByToken[token]?.first, "\(token) was sent")
            let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(payload)) as? [String: Any])
            return try XCTUnwrap((object["aps"] as? [String: Any])?["timestamp"] as? Int, "\(object)")
        }
        XCTAssertGreaterThanOrEqual(timestamps[1] - timestamps[0], 2, "\(timestamps)")
    }
}
