import XCTest

@testable import FanoutCore

/// `JSONParser` used as a scanner (what the APNs response parser and mock-apns's validator do): RFC 8259 rules, keys
/// and strings as tokens, values read only when asked.
final class JSONScanTests: XCTestCase {
    /// Whether `text` is accepted as one complete JSON document.
    func isValid(_ bytes: [UInt8], rules: JSONParser.Rules = .rfc8259) -> Bool {
        do {
            return try JSONParser.withParser(over: bytes, rules: rules) { parser throws(JSONParseError) in
                try parser.skipValue()
                try parser.finish()
                return true
            }
        } catch {
            return false
        }
    }

    func isValid(_ text: String, rules: JSONParser.Rules = .rfc8259) -> Bool {
        isValid(Array(text.utf8), rules: rules)
    }

    func testAcceptsWellFormedDocuments() {
        let documents = [
            "{}", "[]", "0", "-0", "-0.5e+10", "1E3", "true", "false", "null", #""""#, #""\u00e9\n\/""#,
            #"{"a":[1,{"b":null},"c",true,false,-1.25e-3],"d":{}}"#, " \t\r\n{ \"a\" : 1 } \n", #""é😀""#,
        ]
        for document in documents {
            XCTAssertTrue(isValid(document), document)
        }
    }

    func testRejectsMalformedDocuments() {
        let documents = [
            "", " ", "{", "}", "[1,]", #"{"a":1,}"#, #"{"a"}"#, #"{a:1}"#, "01", "-", "1.", ".5", "1e", "+1", "tru",
            "nul", #""abc"#, "\"a\u{1}b\"", #""\x""#, #""\u12G4""#, "{} {}", "[1 2]", #"{"a":1 "b":2}"#, "NaN",
        ]
        for document in documents {
            XCTAssertFalse(isValid(document), document)
            XCTAssertFalse(isValid(document, rules: .strict), document)
        }
    }

    func testOnlyTheStrictRulesRefuseRepeatedKeysAndLoneSurrogates() throws {
        for document in [#"{"a":1,"a":2}"#, #"{"x":{"é":1,"e\u0301":2}}"#, #""\ud800""#, #""\udc00x""#] {
            XCTAssertTrue(isValid(document), document)
            XCTAssertFalse(isValid(document, rules: .strict), document)
        }
        var keys: [String] = []
        try JSONParser.withParser(over: Array(#"{"a":1,"a":[2]}"#.utf8), rules: .rfc8259) {
            parser throws(JSONParseError) in
            try parser.readObject { key, parser throws(JSONParseError) in
                keys.append(parser.string(of: key))
                try parser.skipValue()
            }
        }
        XCTAssertEqual(keys, ["a", "a"], "every occurrence is reported")
        let parsed = try JSONParser.withParser(over: Array(#"{"a":1,"b":2,"a":3}"#.utf8), rules: .rfc8259) {
            parser throws(JSONParseError) in try parser.parseValue()
        }
        XCTAssertEqual(parsed, ["a": 3, "b": 2], "a repeated key keeps its first place and its last value")
    }

    func testRejectsInvalidUTF8InStrings() {
        let quote = UInt8(ascii: "\"")
        XCTAssertFalse(isValid([quote, 0xC0, 0x80, quote]), "overlong NUL")
        XCTAssertFalse(isValid([quote, 0xED, 0xA0, 0x80, quote]), "encoded surrogate")
        XCTAssertFalse(isValid([quote, 0xF4, 0x90, 0x80, 0x80, quote]), "above U+10FFFF")
        XCTAssertFalse(isValid([quote, 0xE2, 0x82, quote]), "truncated sequence")
        XCTAssertFalse(isValid([quote, 0x80, quote]), "lone continuation byte")
        XCTAssertTrue(isValid([quote, 0xE2, 0x82, 0xAC, quote]), "euro sign")
    }

    func testNestingIsCapped() {
        let depth = JSONParser.maximumDepth
        XCTAssertTrue(isValid(String(repeating: "[", count: depth) + String(repeating: "]", count: depth)))
        XCTAssertFalse(isValid(String(repeating: "[", count: depth + 1) + String(repeating: "]", count: depth + 1)))
        XCTAssertFalse(isValid(String(repeating: "{\"a\":", count: 1000) + "1" + String(repeating: "}", count: 1000)))
    }

    func testStringDecodingResolvesEscapesAndSurrogatePairs() throws {
        let bytes = Array(#""a\"b\\c\/d\n\u00e9\ud83d\ude00\ud800x""#.utf8)
        let value = try JSONParser.withParser(over: bytes, rules: .rfc8259) { parser throws(JSONParseError) in
            try parser.readStringValue()
        }
        XCTAssertEqual(value, "a\"b\\c/d\né😀\u{FFFD}x")
    }

    func testNumbersReportIntegersOnly() throws {
        func number(_ text: String) throws -> Int64? {
            try JSONParser.withParser(over: Array(text.utf8), rules: .rfc8259) { parser throws(JSONParseError) in
                try parser.readInteger()
            }
        }
        XCTAssertEqual(try number("1508249865488"), 1_508_249_865_488)
        XCTAssertEqual(try number("-42"), -42)
        XCTAssertEqual(try number("9223372036854775807"), Int64.max)
        XCTAssertEqual(try number("-9223372036854775808"), Int64.min, "the same answer as JSONNumber.int64Value")
        XCTAssertNil(try number("9223372036854775808"), "valid JSON, but not an Int64")
        XCTAssertNil(try number("1.0"))
        XCTAssertNil(try number("1e3"))
    }

    func testPayloadShapeOfALiveActivityStart() throws {
        let body = #"{"x":[{"aps":1}],"aps":{"event":"st\u0061rt","timestamp":5,"attributes":{},"input-push-token":1}}"#
        let shape = try XCTUnwrap(PayloadShape.inspect(Array(body.utf8)))
        XCTAssertTrue(shape.hasAPSObject)
        XCTAssertEqual(shape.event, .start)
        XCTAssertTrue(shape.hasTimestamp)
        XCTAssertTrue(shape.timestampIsInteger)
        XCTAssertTrue(shape.hasAttributes)
        XCTAssertFalse(shape.hasAttributesType)
        XCTAssertTrue(shape.hasInputPushToken)
        XCTAssertFalse(shape.hasInputPushChannel)
    }

    func testPayloadShapeIgnoresNestedApsAndRejectsNonObjects() {
        XCTAssertEqual(PayloadShape.inspect(Array(#"{"x":{"aps":{}}}"#.utf8))?.hasAPSObject, false)
        XCTAssertNil(PayloadShape.inspect(Array("[]".utf8)))
        XCTAssertNil(PayloadShape.inspect(Array(#""aps""#.utf8)))
    }
}
