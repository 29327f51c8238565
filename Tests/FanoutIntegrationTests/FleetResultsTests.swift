// The fleet's results records against a real redis-server: what `ResultSink` writes (the results script, per batch)
// and what `FleetReader.writeResults` reads back. The end-to-end runs (FleetTests) rarely write a position twice, since
// a successor resumes from the marks; this writes it twice on purpose, as a dead worker's last batch and its
// successor's (or a late writer whose shard was claimed) would.
import Fanout
import FanoutRedis
import FanoutTestSupport
import Foundation
import XCTest

@testable import FanoutFleet

final class FleetResultsTests: XCTestCase {
    private static let job = "records"

    /// The result of engine position `index` of a shard starting at `start` (job position `start + index`).
    private func result(
        _ index: Int, start: Int = 0, outcome: NotificationOutcome = .delivered, attempts: Int = 1, reason: String
    ) -> NotificationResult {
        var result = NotificationResult(
            jobID: Self.job, token: testDeviceToken(start + index), outcome: outcome, reason: reason,
            attempts: attempts)
        result.position = index
        return result
    }

    func testAPositionWrittenTwiceKeepsItsFirstResultIsCountedOnceAndResultsComeBackInJobOrder() async throws {
        let redis = try RedisServerProcess(for: self)
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: redis.url)))
        let keys = FleetKeys(job: Self.job)
        // Two shards of 4: positions 0..<4 and 4..<8.
        _ = try await client.command([
            "HSET", keys.meta, "line", "{}", "shards", "2", "notifications", "8", "enqueued", "1",
        ])

        // Shard 0, written in reverse order: the reader sorts by position.
        let first = ResultSink(keys: keys, shard: 0, start: 0, count: 4, positions: [0, 1, 2, 3], writer: client)
        for index in [3, 2, 1, 0] { first.add(result(index, reason: "shard-0")) }
        try await first.flush()
        XCTAssertEqual(first.written, 4)

        // Shard 1: a worker writes positions 4 and 5, then dies; its successor sends 4, 5, 6, 7 again (its engine
        // positions 0 to 3 are job positions 4 to 7).
        let dead = ResultSink(keys: keys, shard: 1, start: 4, count: 4, positions: [4, 5, 6, 7], writer: client)
        dead.add(result(0, start: 4, reason: "first"))
        dead.add(result(1, start: 4, reason: "first"))
        try await dead.flush()
        XCTAssertEqual(dead.written, 2)
        let successor = ResultSink(keys: keys, shard: 1, start: 4, count: 4, positions: [4, 5, 6, 7], writer: client)
        successor.add(result(1, start: 4, attempts: 3, reason: "second"))
        successor.add(result(2, start: 4, outcome: .rateLimited, attempts: 3, reason: "second"))
        successor.add(result(0, start: 4, attempts: 2, reason: "second"))
        successor.add(result(3, start: 4, reason: "second"))
        try await successor.flush()
        XCTAssertEqual(successor.written, 2, "only positions 6 and 7 were new")
        // All written again: nothing new.
        let late = ResultSink(keys: keys, shard: 1, start: 4, count: 4, positions: [4, 5, 6, 7], writer: client)
        for index in 0..<4 { late.add(result(index, start: 4, attempts: 5, reason: "late")) }
        try await late.flush()
        XCTAssertEqual(late.written, 0)

        let marks = try await client.command(["GET", keys.marks(shard: 1)])
        XCTAssertEqual(marks.string, "1111")
        // Counted once per position: 7 delivered, 1 rate_limited, and only that one's 2 retries.
        let counts = try await client.command(["HGETALL", keys.counts]).array?.compactMap(\.string) ?? []
        let byName = Dictionary(
            uniqueKeysWithValues: stride(from: 0, to: counts.count - 1, by: 2).map { (counts[$0], counts[$0 + 1]) })
        XCTAssertEqual(byName, ["delivered": "7", "rate_limited": "1", "retries": "2"])

        var output: [UInt8] = []
        let (status, lines) = try await FleetReader(client: client).writeResults(job: Self.job) { output += $0 }
        XCTAssertEqual(lines, 8)
        XCTAssertTrue(status.isDone == false, "no shard is in the done set")
        let parsed = try String(decoding: output, as: UTF8.self).split(separator: "\n").map { line in
            try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        }
        XCTAssertEqual(parsed.compactMap { $0["token"] as? String }, (0..<8).map { testDeviceToken($0) })
        XCTAssertEqual(
            parsed.compactMap { $0["reason"] as? String },
            ["shard-0", "shard-0", "shard-0", "shard-0", "first", "first", "second", "second"])
        XCTAssertEqual(parsed[6]["outcome"] as? String, "rate_limited")
        await client.shutdown()
    }
}
