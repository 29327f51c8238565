import Foundation
import XCTest

@testable import FanoutCore

final class PayloadJSONTests: XCTestCase {
    func parseError(_ text: String) -> JSONParseError? {
        do {
            _ = try JSONValue.parse(text)
            return nil
        } catch {
            return error
        }
    }

    func testParsesEveryKindInOrder() throws {
        let value = try JSONValue.parse(#" {"b":[1,-2.5e3,true,false,null],"a":"x\u00e9\n","c":{}} "#)
        XCTAssertEqual(value.objectValue?.keys, ["b", "a", "c"])
        XCTAssertEqual(value["b"], [1, .number(JSONNumber(literal: "-2.5e3")!), true, false, nil])
        XCTAssertEqual(value["a"], "xé\n")
        XCTAssertEqual(value["c"], .object([:]))
        XCTAssertEqual(
            String(decoding: value.encoded(), as: UTF8.self), #"{"b":[1,-2.5e3,true,false,null],"a":"xé\n","c":{}}"#)
    }

    func testNumbersKeepTheirExactLiteral() throws {
        for literal in ["12345678901234567890", "0.1", "1e400", "-0", "-9223372036854775808", "1.50"] {
            let value = try JSONValue.parse(literal)
            XCTAssertEqual(value.numberValue?.literal, literal)
            XCTAssertEqual(String(decoding: value.encoded(), as: UTF8.self), literal)
        }
        XCTAssertEqual(try JSONValue.parse("-9223372036854775808").int64Value, Int64.min)
        XCTAssertEqual(try JSONValue.parse("9223372036854775807").int64Value, Int64.max)
        XCTAssertNil(try JSONValue.parse("9223372036854775808").int64Value)
        XCTAssertNil(try JSONValue.parse("1.0").int64Value)
        XCTAssertEqual(try JSONValue.parse("1e400").doubleValue, .infinity)
        XCTAssertNil(JSONNumber(literal: "+1"))
        XCTAssertNil(JSONNumber(literal: " 1"))
        XCTAssertNil(JSONNumber(literal: "01"))
        XCTAssertNotNil(JSONNumber(literal: "-0.5E+2"))
    }

    func testDoublesAreFormattedShortAndWithoutLoss() {
        let cases: [(Double, String)] = [
            (50, "50"), (0.5, "0.5"), (-3, "-3"), (0.1, "0.1"), (1e-7, "1e-07"), (123.456, "123.456"),
            (1e20, "1e+20"), (-0.0, "0"), (9_007_199_254_740_991, "9007199254740991"),
        ]
        for (value, expected) in cases {
            XCTAssertEqual(JSONNumber(value)?.literal, expected, "\(value)")
            XCTAssertEqual(Double(JSONNumber(value)!.literal), value)
        }
        XCTAssertNil(JSONNumber(Double.nan))
        XCTAssertNil(JSONNumber(Double.infinity))
        XCTAssertEqual(JSONNumber(Int64.min).literal, "-9223372036854775808")
        XCTAssertEqual(JSONNumber(0).literal, "0")
    }

    func testErrorsNameTheOffsetAndTheProblem() {
        let cases: [(String, Int, String)] = [
            ("", 0, "unexpected end of input, expected a value"),
            (#"{"a" 1}"#, 5, "expected ':' after an object key, found '1'"),
            (#"{"a":1,}"#, 7, "expected a string key, found '}'"),
            ("[1 2]", 3, "expected ',' or ']' in an array, found '2'"),
            ("01", 1, "a number may not have a leading zero"),
            ("1.", 2, "unexpected end of input, expected a digit after '.'"),
            ("{} x", 3, "unexpected 'x' after the JSON value"),
            ("\"a\u{1}\"", 2, "control character byte 0x01 in a string must be escaped"),
            (#""\x""#, 2, #"invalid escape \'x'"#),
            (#"{"k":1,"k":2}"#, 7, #"duplicate key "k""#),
            (#"["\ud800"]"#, 2, "high surrogate not followed by a low one"),
            (#""\udc00""#, 1, "lone low surrogate in a \\u escape"),
            ("tru", 3, "unexpected end of input, expected 'true'"),
            ("nul!", 3, "expected 'null', found '!'"),
            (#""abc"#, 4, "unexpected end of input inside a string"),
        ]
        for (text, offset, message) in cases {
            XCTAssertEqual(parseError(text), JSONParseError(offset: offset, message: message), text)
        }
        XCTAssertEqual(parseError("[1,]")?.description, "at byte offset 3: unexpected ']', expected a value")
        let deep = String(repeating: "[", count: 65) + String(repeating: "]", count: 65)
        XCTAssertEqual(parseError(deep)?.offset, 64)
        XCTAssertNil(parseError(String(repeating: "[", count: 64) + String(repeating: "]", count: 64)))
    }

    func testRejectsInvalidUTF8() {
        let bytes: [UInt8] = [0x22, 0x61, 0xC0, 0xAF, 0x22]
        XCTAssertThrowsError(try JSONValue.parse(bytes)) { error in
            XCTAssertEqual(error as? JSONParseError, JSONParseError(offset: 2, message: "invalid UTF-8 in a string"))
        }
        XCTAssertThrowsError(try RawJSON(validating: bytes))
    }

    func testSurrogatePairsDecode() throws {
        XCTAssertEqual(try JSONValue.parse(#""\ud83d\ude00 \u00E9""#), "😀 é")
    }

    func testRawJSONKeepsBytesAndTrimsOnlyOuterWhitespace() throws {
        let text = " \n{ \"b\" :1.50 ,\"a\":[ ] }\t "
        let raw = try RawJSON(validating: text)
        XCTAssertEqual(raw.description, "{ \"b\" :1.50 ,\"a\":[ ] }")
        XCTAssertEqual(raw.kind, .object)
        XCTAssertEqual(raw.value, ["b": .number(JSONNumber(literal: "1.50")!), "a": []])
        XCTAssertEqual(raw.members().map(\.key), ["b", "a"])
        XCTAssertEqual(raw.member("b")?.description, "1.50")
        XCTAssertEqual(raw.member("a")?.description, "[ ]")
        XCTAssertEqual(raw.member("a")?.kind, .array)
        XCTAssertNil(raw.member("c"))
        XCTAssertEqual(try RawJSON(validating: "\"s\"").members().count, 0)
        XCTAssertEqual(RawJSON(["x": [1, "y"]]).description, #"{"x":[1,"y"]}"#)
        XCTAssertThrowsError(try RawJSON(validating: "{\"a\":1} {"))
    }

    func testStringEscaping() {
        let value: JSONValue = [
            "k\"":
                "quote \" backslash \\ slash / nl \n cr \r tab \t nul \u{0} bell \u{7} us \u{1F} del \u{7F} é 😀 \u{2028}"
        ]
        let text = String(decoding: value.encoded(), as: UTF8.self)
        XCTAssertEqual(
            text,
            #"{"k\"":"quote \" backslash \\ slash / nl \n cr \r tab \t nul \u0000 bell \u0007 us \u001f del "#
                + "\u{7F} é 😀 \u{2028}\"}")
        XCTAssertEqual(try JSONValue.parse(value.encoded()), value)
        let foundation = try? JSONSerialization.jsonObject(with: Data(value.encoded())) as? [String: String]
        XCTAssertEqual(foundation?["k\""], value["k\""]?.stringValue)
    }

    func testObjectSetterKeepsOrderAndReplacesInPlace() {
        var object: JSONObject = ["a": 1, "b": 2]
        object["a"] = 3
        object["c"] = 4
        object["b"] = nil
        XCTAssertEqual(object.keys, ["a", "c"])
        XCTAssertEqual(object["a"], 3)
        XCTAssertEqual(JSONValue.object(object).description, #"{"a":3,"c":4}"#)
        var output = Array("x".utf8)
        JSONValue.object(object).append(to: &output)
        XCTAssertEqual(String(decoding: output, as: UTF8.self), #"x{"a":3,"c":4}"#)
    }
}
