// The resume journal's hand-written JSON reads back, through the `Codable` decoder `load` uses, as what was written.
import Fanout
import FanoutJobLines
import Foundation
import XCTest

@testable import FanoutJobFile

final class SendJournalTests: XCTestCase {
    func testTheJournalReadsBackAsItWasWritten() throws {
        var counts = SendCounts()
        counts.jobs = 3
        counts.payloadEncodings = 2
        counts.demoted = 7
        counts.broadcasts = 1
        counts.outcomes.delivered = 12_345
        counts.outcomes.retries = 9
        let journals = [
            SendJournal(
                jobsFile: "/tmp/jobs \"é\"\n\u{1}.jsonl", jobsFileSize: 1 << 40, resultsOffset: 987_654_321,
                finishedLines: [[1, 3], [5, 5], [8, 1_000]],
                partial: [
                    "4": .init(job: "match-7 \"update\"", prefix: 250_000, beyond: [250_002, 250_007, 251_000]),
                    "7": .init(job: "😀\\", prefix: 0, beyond: []),
                    "12": .init(job: "", prefix: 3, beyond: Array(5..<5_000)),
                    "13": .init(job: "by activity", prefix: 0, beyond: [Int(Int32.max)], tokensFrom: 123_456),
                    "14": .init(job: "from the start", prefix: 0, beyond: [], tokensFrom: 0),
                ],
                counts: counts),
            SendJournal(
                jobsFile: "", jobsFileSize: 0, resultsOffset: 0, finishedLines: [], partial: [:], counts: SendCounts()),
        ]
        for journal in journals {
            let bytes = try journal.encoded()
            let decoded = try JSONDecoder().decode(SendJournal.self, from: Data(bytes))
            XCTAssertEqual(decoded, journal)
            XCTAssertEqual(
                decoded, try JSONDecoder().decode(SendJournal.self, from: JSONEncoder().encode(journal)),
                "the same journal as JSONEncoder's")
            XCTAssertNotNil(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any], "one JSON object")
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("journal-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("results.jsonl.journal").path
        try journals[0].write(to: path)
        XCTAssertEqual(try SendJournal.load(from: path), journals[0])
    }
}
