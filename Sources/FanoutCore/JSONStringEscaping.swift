/// FanoutCore's one JSON string escaper. Payloads, APNs error bodies, provider-token headers, the results and
/// invalid-tokens files and log lines all write their strings through it; `JSONParser` reads them back.
package enum JSONStringEscaping {
    /// Which characters besides `"` and `\` are escaped.
    package enum Controls: Sendable {
        /// What RFC 8259 requires: U+0000 to U+001F (`\n`, `\r` and `\t` in their short forms, the others as
        /// `\u00XX`). Everything else is written as its UTF-8 bytes, so payloads stay as short as they can be.
        case required
        /// Also DEL, the C1 controls (U+0080 to U+009F) and the line and paragraph separators (U+2028, U+2029):
        /// anything that could break a line or drive a terminal. For log lines.
        case all
    }

    /// Appends `string` as a quoted JSON string.
    package static func appendString(_ string: String, to output: inout [UInt8], controls: Controls = .required) {
        output.append(UInt8(ascii: "\""))
        appendContents(string, to: &output, controls: controls)
        output.append(UInt8(ascii: "\""))
    }

    /// `string` as a quoted JSON string literal.
    package static func quoted(_ string: String, controls: Controls = .required) -> String {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(string.utf8.count + 2)
        appendString(string, to: &bytes, controls: controls)
        return String(decoding: bytes, as: UTF8.self)
    }

    /// `string` with its controls escaped and no quotes around it; `"` and `\` are escaped only when
    /// `quotesAndBackslashes` is true (the text log format leaves them alone in messages, which are never quoted).
    package static func escaped(_ string: String, controls: Controls, quotesAndBackslashes: Bool = true) -> String {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(string.utf8.count)
        appendContents(string, to: &bytes, controls: controls, quotesAndBackslashes: quotesAndBackslashes)
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Appends the escaped contents of `string`, without the quotes.
    package static func appendContents(
        _ string: String, to output: inout [UInt8], controls: Controls, quotesAndBackslashes: Bool = true
    ) {
        var string = string
        string.withUTF8 { bytes in
            var index = 0
            while index < bytes.count {
                let byte = bytes[index]
                index += 1
                switch byte {
                case UInt8(ascii: "\"") where quotesAndBackslashes: output.append(contentsOf: #"\""#.utf8)
                case UInt8(ascii: "\\") where quotesAndBackslashes: output.append(contentsOf: #"\\"#.utf8)
                case 0x0A: output.append(contentsOf: #"\n"#.utf8)
                case 0x0D: output.append(contentsOf: #"\r"#.utf8)
                case 0x09: output.append(contentsOf: #"\t"#.utf8)
                case 0..<0x20: appendUnicodeEscape(UInt32(byte), to: &output)
                case 0x7F where controls == .all: appendUnicodeEscape(0x7F, to: &output)
                // U+0080 to U+009F are C2 80 to C2 9F in UTF-8.
                case 0xC2 where controls == .all && index < bytes.count && (0x80...0x9F).contains(bytes[index]):
                    appendUnicodeEscape(UInt32(bytes[index]), to: &output)
                    index += 1
                // U+2028 and U+2029 are E2 80 A8 and E2 80 A9.
                case 0xE2
                where controls == .all && index + 1 < bytes.count && bytes[index] == 0x80
                    && (bytes[index + 1] == 0xA8 || bytes[index + 1] == 0xA9):
                    appendUnicodeEscape(bytes[index + 1] == 0xA8 ? 0x2028 : 0x2029, to: &output)
                    index += 2
                default: output.append(byte)
                }
            }
        }
    }

    /// `\uXXXX` with lowercase hex digits.
    private static func appendUnicodeEscape(_ value: UInt32, to output: inout [UInt8]) {
        output.append(contentsOf: #"\u"#.utf8)
        for shift in stride(from: 12, through: 0, by: -4) {
            output.append(ASCIIBytes.lowercaseHexDigits[Int((value >> UInt32(shift)) & 0x0F)])
        }
    }
}
