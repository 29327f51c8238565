// The results file's line: written by `ResultLine.append`, read back by `ResultLine.parse` when a run resumes.
import Fanout
import FanoutCore
import XCTest

@testable import FanoutJobLines

final class ResultLineTests: XCTestCase {
    func testLinesReadBackAsTheyWereWritten() {
        var full = NotificationResult(
            jobID: "job \"7\"\n", token: String(repeating: "ab", count: 32), outcome: .delivered, reason: nil)
        full.status = 200
        full.apnsID = "eabeae54-14a8-11e5-b60b-1697f925ec7b"
        full.attempts = 2
        full.latency = .microseconds(12_340)
        full.retryAfterSeconds = 1.5
        let invalid = NotificationResult(jobID: "é😀", token: nil, outcome: .invalid, reason: "line 3: bad")
        var broadcast = NotificationResult(jobID: "m7", token: nil, outcome: .delivered, reason: nil)
        broadcast.channel = "dHN0LTEyMzQ1Njc4OTA="
        broadcast.attempts = 1
        for result in [full, invalid, broadcast] {
            var line: [UInt8] = []
            ResultLine.append(result, to: &line)
            XCTAssertEqual(line.last, UInt8(ascii: "\n"))
            let parsed = ResultLine.parse(line.dropLast())
            XCTAssertEqual(parsed?.job, result.jobID)
            XCTAssertEqual(parsed?.token, result.token)
            XCTAssertEqual(parsed?.outcome, result.outcome.name)
            XCTAssertEqual(parsed?.channel, result.channel)
            XCTAssertEqual(parsed?.attempts, result.attempts)
        }
        XCTAssertEqual(ResultLine.parse(Array(#"{"job":"j","token":null,"outcome":"invalid"}"#.utf8))?.isJobLine, true)
        XCTAssertEqual(ResultLine.parse(Array(#"{"job":"j","token":"ab","outcome":"delivered"}"#.utf8))?.attempts, 1)
    }

    /// A token kept as bytes (64 lowercase hex digits) is written as the same JSON string as the text would be.
    func testAPackedTokenIsWrittenAsItsText() {
        let token = String(repeating: "0f", count: 16) + String(repeating: "a9", count: 16)
        var result = NotificationResult(jobID: "j", token: token, outcome: .delivered, reason: nil)
        guard case .hex64 = result.tokenValue else {
            return XCTFail("not packed: \(String(describing: result.tokenValue))")
        }
        var packed: [UInt8] = []
        ResultLine.append(result, to: &packed)
        result.tokenValue = .text(token)
        var text: [UInt8] = []
        ResultLine.append(result, to: &text)
        XCTAssertEqual(String(decoding: packed, as: UTF8.self), String(decoding: text, as: UTF8.self))
        XCTAssertTrue(String(decoding: packed, as: UTF8.self).contains(#","token":"\#(token)","#))
        XCTAssertEqual(ResultLine.parse(packed.dropLast())?.token, token)
    }

    /// Numbers are written in place, not through String(format:); latency as milliseconds with one decimal.
    func testNumbersReadAsFormatPrintsThem() {
        for value: Int64 in [0, 7, -7, 10, 200, 429, 1_733_000_000_000, .max, .min] {
            var output: [UInt8] = []
            ResultLine.appendDecimal(value, to: &output)
            XCTAssertEqual(String(decoding: output, as: UTF8.self), String(value))
        }
        let tenths: [(Int64, String)] = [
            (0, "0.0"), (49_999, "0.0"), (50_000, "0.1"), (340_000, "0.3"), (1_250_000, "1.3"), (12_340_000, "12.3"),
            (999_960_000, "1000.0"), (-3_500_000, "-3.5"), (-40_000, "0.0"), (Int64.max, "9223372036854.8"),
        ]
        for (nanoseconds, text) in tenths {
            var output: [UInt8] = []
            ResultLine.appendTenths(ofNanoseconds: nanoseconds, to: &output)
            XCTAssertEqual(String(decoding: output, as: UTF8.self), text, "\(nanoseconds)")
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
