/// The one piece of JSON writing FanoutCore needs itself: a string literal with the escapes RFC 8259 requires.
enum JSONStringEscaping {
    /// Appends `string` as a quoted JSON string: `"` and `\` escaped, control characters as `\uXXXX` (or their short
    /// forms), everything else as its UTF-8 bytes.
    static func appendString(_ string: String, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "\""))
        for byte in string.utf8 {
            switch byte {
            case UInt8(ascii: "\""): output.append(contentsOf: #"\""#.utf8)
            case UInt8(ascii: "\\"): output.append(contentsOf: #"\\"#.utf8)
            case 0x0A: output.append(contentsOf: #"\n"#.utf8)
            case 0x0D: output.append(contentsOf: #"\r"#.utf8)
            case 0x09: output.append(contentsOf: #"\t"#.utf8)
            case 0..<0x20:
                output.append(contentsOf: #"\u00"#.utf8)
                output.append(ASCIIBytes.lowercaseHexDigits[Int(byte >> 4)])
                output.append(ASCIIBytes.lowercaseHexDigits[Int(byte & 0x0F)])
            default: output.append(byte)
            }
        }
        output.append(UInt8(ascii: "\""))
    }
}
