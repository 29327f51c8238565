// The results file's line: written by `ResultLine.append`, read back by `ResultLine.parse` when a run resumes.
import Fanout
import XCTest

@testable import FanoutJobFile

final class ResultLineTests: XCTestCase {
    func testLinesReadBackAsTheyWereWritten() {
        var full = NotificationResult(
            jobID: "job \"7\"\n", token: String(repeating: "ab", count: 32), outcome: .delivered, reason: nil)
        full.status = 200
        full.apnsID = "eabeae54-14a8-11e5-b60b-1697f925ec7b"
        full.attempts = 2
        full.latencyMilliseconds = 12.34
        full.retryAfterSeconds = 1.5
        let invalid = NotificationResult(jobID: "é😀", token: nil, outcome: .invalid, reason: "line 3: bad")
        for result in [full, invalid] {
            var line: [UInt8] = []
            ResultLine.append(result, to: &line)
            XCTAssertEqual(line.last, UInt8(ascii: "\n"))
            let parsed = ResultLine.parse(line.dropLast())
            XCTAssertEqual(parsed?.job, result.jobID)
            XCTAssertEqual(parsed?.token, result.token)
            XCTAssertEqual(parsed?.outcome, result.outcome.name)
        }
    }

    func testATornLineIsNotAResult() {
        var line: [UInt8] = []
        ResultLine.append(NotificationResult(jobID: "a", token: "t", outcome: .delivered, reason: nil), to: &line)
        for cut in [1, line.count / 2, line.count - 2] {
            XCTAssertNil(ResultLine.parse(line.prefix(cut)), "cut at \(cut)")
        }
        XCTAssertNil(ResultLine.parse(Array(#"{"job":"a"}"#.utf8)), "no outcome")
        XCTAssertNil(ResultLine.parse(Array(#"["a"]"#.utf8)), "not an object")
    }
}
