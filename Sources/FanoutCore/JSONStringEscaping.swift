/// The one piece of JSON writing FanoutCore needs itself: a string literal with the escapes RFC 8259 requires.
package enum JSONStringEscaping {
    /// Appends `string` as a quoted JSON string: `"` and `\` escaped, control characters as `\uXXXX` (or their short
    /// forms), everything else as its UTF-8 bytes.
    package static func appendString(_ string: String, to output: inout [UInt8]) {
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

    /// `string` as a quoted JSON string literal.
    package static func quoted(_ string: String) -> String {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(string.utf8.count + 2)
        appendString(string, to: &bytes)
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The UTF-8 value of string contents (between the quotes) with their escapes resolved; a lone
    /// surrogate becomes U+FFFD. Shared by the request validator's scanner and the payload parser.
    package static func unescape(_ raw: UnsafeBufferPointer<UInt8>) -> [UInt8] {
        var output = [UInt8]()
        output.reserveCapacity(raw.count)
        var index = 0
        while index < raw.count {
            let byte = raw[index]
            guard byte == UInt8(ascii: "\\") else {
                output.append(byte)
                index += 1
                continue
            }
            let escape = raw[index + 1]
            index += 2
            switch escape {
            case UInt8(ascii: "b"): output.append(0x08)
            case UInt8(ascii: "f"): output.append(0x0C)
            case UInt8(ascii: "n"): output.append(0x0A)
            case UInt8(ascii: "r"): output.append(0x0D)
            case UInt8(ascii: "t"): output.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = hex4(raw, at: index)
                index += 4
                if (0xD800..<0xDC00).contains(scalar), index + 5 < raw.count, raw[index] == UInt8(ascii: "\\"),
                    raw[index + 1] == UInt8(ascii: "u")
                {
                    let low = hex4(raw, at: index + 2)
                    if (0xDC00..<0xE000).contains(low) {
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                        index += 6
                    }
                }
                let unicodeScalar = Unicode.Scalar(scalar) ?? "\u{FFFD}"
                output.append(contentsOf: UTF8.encode(unicodeScalar)!)
            default: output.append(escape)  // \" \\ \/
            }
        }
        return output
    }

    /// The value of four hex digits known to be valid.
    private static func hex4(_ raw: UnsafeBufferPointer<UInt8>, at index: Int) -> UInt32 {
        var value: UInt32 = 0
        for offset in 0..<4 {
            value = value << 4 | UInt32(ASCIIBytes.hexValue(raw[index + offset]) ?? 0)
        }
        return value
    }
}
