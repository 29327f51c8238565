import Foundation
import XCTest

@testable import FanoutJobFile

/// The lag of a followed job file: complete lines and bytes written and not read, and the age of the oldest.
final class FollowedQueueLagTests: XCTestCase {
    private func identity(of path: String) -> String? { FollowedJobFile.identity(ofPath: path) }

    private func append(_ text: String, to path: String) throws {
        let handle = try XCTUnwrap(FileHandle(forWritingAtPath: path))
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(text.utf8))
    }

    func testLinesBytesAndTheOldestAgeFollowTheReaderAndTheProducers() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("lag-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("queue.jsonl").path
        let line = #"{"id":"j"}"# + "\n"  // 11 bytes
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: Data((line + line + line + "{\"id").utf8)))
        let lag = FollowedQueueLag(path: path)
        let start = ContinuousClock.now
        lag.readerAt(identity: identity(of: path), bytesRead: 0)
        XCTAssertEqual(
            lag.measure(now: start), FollowedQueueLag.Reading(bytes: 37, jobs: 3, oldestAge: .zero),
            "a line counts once its newline is written")
        XCTAssertEqual(lag.measure(now: start + .seconds(2)).oldestAge, .seconds(2))
        try append("\":\"k\"}\n" + line, to: path)
        XCTAssertEqual(lag.measure(now: start + .seconds(3)).jobs, 5)
        // The reader has read the first three lines: the oldest unread was first seen (its start) at `start`.
        lag.readerAt(identity: identity(of: path), bytesRead: 33)
        XCTAssertEqual(
            lag.measure(now: start + .seconds(4)), FollowedQueueLag.Reading(bytes: 22, jobs: 2, oldestAge: .seconds(4)))
        // Everything read: nothing waits.
        lag.readerAt(identity: identity(of: path), bytesRead: 55)
        XCTAssertEqual(
            lag.measure(now: start + .seconds(5)), FollowedQueueLag.Reading(bytes: 0, jobs: 0, oldestAge: nil))
        XCTAssertEqual(lag.latest, FollowedQueueLag.Reading(bytes: 0, jobs: 0, oldestAge: nil))
        // Rotated: the old file renamed away, a new one created; the reader moves to it, and so does the lag.
        try FileManager.default.moveItem(atPath: path, toPath: path + ".1")
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: Data((line + line).utf8)))
        lag.readerAt(identity: identity(of: path), bytesRead: 0)
        XCTAssertEqual(
            lag.measure(now: start + .seconds(6)), FollowedQueueLag.Reading(bytes: 22, jobs: 2, oldestAge: .zero))
    }
}
