import XCTest

@testable import FanoutCore

/// FanoutCore's one string escaper, in its two strengths.
final class JSONStringEscapingTests: XCTestCase {
    static let tricky =
        "q\" b\\ nl\n cr\r tab\t nul\u{0} esc\u{1B} del\u{7F} c1\u{85}\u{9F} é ☃ 😀 ls\u{2028} ps\u{2029}"

    func testRequiredEscapesOnlyWhatRFC8259Demands() {
        XCTAssertEqual(
            JSONStringEscaping.quoted(Self.tricky),
            #""q\" b\\ nl\n cr\r tab\t nul\u0000 esc\u001b "# + "del\u{7F} c1\u{85}\u{9F} é ☃ 😀 ls\u{2028} ps\u{2029}\""
        )
    }

    func testAllEscapesEveryControlAndTheLineSeparators() {
        let quoted = JSONStringEscaping.quoted(Self.tricky, controls: .all)
        XCTAssertEqual(
            quoted,
            #""q\" b\\ nl\n cr\r tab\t nul\u0000 esc\u001b del\u007f c1\u0085\u009f é ☃ 😀 ls\u2028 ps\u2029""#)
        XCTAssertEqual(try JSONValue.parse(quoted), .string(Self.tricky), "still JSON, with the same value")
        // U+00A0 (C2 A0) and U+2027 (E2 80 A7) sit next to escaped ranges and are left alone.
        XCTAssertEqual(JSONStringEscaping.quoted("\u{A0}\u{2027}\u{80}", controls: .all), "\"\u{A0}\u{2027}\\u0080\"")
    }

    func testContentsWithoutQuotes() {
        XCTAssertEqual(
            JSONStringEscaping.escaped("say \"hi\" a\\b\n\u{85}", controls: .all, quotesAndBackslashes: false),
            "say \"hi\" a\\b\\n\\u0085")
        XCTAssertEqual(JSONStringEscaping.escaped("say \"hi\"", controls: .required), #"say \"hi\""#)
        var bytes = Array("x".utf8)
        JSONStringEscaping.appendString("", to: &bytes)
        XCTAssertEqual(bytes, Array(#"x"""#.utf8))
    }
}
