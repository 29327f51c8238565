// The results writer between flushes: lines reach the file every `writeThreshold` bytes, unsynced and without a
// journal, so a killed `fanout send` loses (and sends again on resume) only the few it had not written.
import Fanout
import FanoutJobLines
import Foundation
import XCTest

@testable import FanoutJobFile

final class ResultsWriterTests: XCTestCase {
    func testLinesReachTheFileEveryWriteThresholdWithoutAFlush() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("writer-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("results.jsonl").path
        let writer = try ResultsWriter(
            path: path, journal: true, jobsFile: "jobs.jsonl", jobsFileSize: 1, resumeFrom: nil, fileLength: 0)
        func fileSize() throws -> Int { try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int ?? -1 }
        func result(_ position: Int) -> NotificationResult {
            var result = NotificationResult(
                jobID: "j", token: String(format: "%064x", position), outcome: .delivered, reason: nil)
            result.position = position
            return result
        }
        var line: [UInt8] = []
        ResultLine.append(result(0), to: &line)
        let perThreshold = ResultsWriter.writeThreshold / line.count + 1
        for position in 0..<(perThreshold - 1) { writer.record(result(position), line: 1) }
        XCTAssertEqual(try fileSize(), 0, "under the threshold, the lines wait for a flush")
        var recorded = perThreshold - 1
        while try fileSize() == 0 && recorded < 2 * perThreshold {
            writer.record(result(recorded), line: 1)
            recorded += 1
        }
        XCTAssertEqual(recorded, perThreshold, "written as soon as the buffer reached the threshold")
        XCTAssertEqual(try fileSize(), recorded * line.count, "every recorded line is in the file")
        XCTAssertFalse(
            FileManager.default.fileExists(atPath: SendJournal.path(forResults: path)), "no journal until a flush")
        try writer.flush()
        XCTAssertTrue(FileManager.default.fileExists(atPath: SendJournal.path(forResults: path)))
        let journal = try XCTUnwrap(try SendJournal.load(from: SendJournal.path(forResults: path)))
        XCTAssertEqual(journal.resultsOffset, recorded * line.count)
        XCTAssertEqual(journal.partial["1"]?.prefix, recorded, "the journal covers what was written before it")
    }
}
