import Fanout
import FanoutCore
import Foundation
import XCTest

/// Who gives a notification its `apns-id`: APNs by default (no header sent, the answer's id in the result), or
/// Fanout (`.fanout`: an id of its own, sent and kept).
final class APNsIDAssignmentTests: XCTestCase {
    private func sendJob(_ mode: APNsIDAssignment?) async throws -> (ids: [String], requestIDs: Int, record: [String]) {
        let record = FileManager.default.temporaryDirectory.appendingPathComponent("ids-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: record) }
        let mock = try MockHarness { $0.recordPath = record }
        let engine = try makeEngine(for: mock, loops: 1, connections: 1) { configuration in
            if let mode { configuration.apnsIDs = mode }
        }
        let ids = FanoutMutex<[String: String]>([:])
        let tokens = (0..<100).map { testDeviceToken($0) }
        let summary = try await engine.run(scoreUpdateJob(id: "ids", tokens: tokens)) { result in
            ids.withLock { $0[result.token ?? "-"] = result.apnsID ?? "none" }
        }
        await engine.shutdown()
        XCTAssertEqual(summary.counts.delivered, 100)
        let requestIDs = mock.stats.distinctRequestAPNsIDs
        mock.stop()
        let recorded = try String(contentsOfFile: record, encoding: .utf8).split(separator: "\n").map(String.init)
        let byToken = ids.withLock { $0 }
        return (tokens.map { byToken[$0] ?? "missing" }, requestIDs, recorded)
    }

    func testByDefaultAPNsAssignsTheIdAndEveryResultCarriesIt() async throws {
        let (ids, requestIDs, record) = try await sendJob(nil)
        XCTAssertEqual(requestIDs, 0, "no request carried an apns-id")
        XCTAssertTrue(ids.allSatisfy(APNsID.isValid), "\(ids.prefix(3))")
        XCTAssertEqual(Set(ids).count, 100)
        // The mock records each accepted token with the id it answered with: the results carry those.
        XCTAssertEqual(Set(record.map { String($0.split(separator: " ")[1]) }), Set(ids))
    }

    func testWithFanoutIdsEachRequestCarriesTheIdItsResultReports() async throws {
        let (ids, requestIDs, record) = try await sendJob(.fanout)
        XCTAssertEqual(requestIDs, 100, "each request carried an id of its own")
        XCTAssertEqual(Set(record.map { String($0.split(separator: " ")[1]) }), Set(ids))
    }
}
