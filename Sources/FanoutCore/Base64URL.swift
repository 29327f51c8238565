/// Base64url without padding (RFC 4648 section 5, as JWTs use it per RFC 7515 section 2).
///
/// Fanout encodes its JWT once every 40-50 minutes and mock-apns decodes one per connection, so this is written for
/// clarity over a lookup table rather than for speed; it still avoids Foundation, whose `Data` base64 is not url-safe.
package enum Base64URL {
    private static let alphabet: [UInt8] = Array(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// The alphabet's inverse: 0...63 for a base64url character, 0xFF for anything else (including `=`, `+`, `/`).
    private static let decodingTable: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (value, character) in alphabet.enumerated() {
            table[Int(character)] = UInt8(value)
        }
        return table
    }()

    /// Encodes `bytes` with the url-safe alphabet and no `=` padding.
    package static func encode(_ bytes: some Collection<UInt8>) -> String {
        let input = Array(bytes)
        var output = [UInt8]()
        output.reserveCapacity((input.count * 4 + 2) / 3)
        var index = 0
        while index + 3 <= input.count {
            let group = UInt32(input[index]) << 16 | UInt32(input[index + 1]) << 8 | UInt32(input[index + 2])
            output.append(alphabet[Int(group >> 18 & 0x3F)])
            output.append(alphabet[Int(group >> 12 & 0x3F)])
            output.append(alphabet[Int(group >> 6 & 0x3F)])
            output.append(alphabet[Int(group & 0x3F)])
            index += 3
        }
        switch input.count - index {
        case 1:
            let group = UInt32(input[index]) << 16
            output.append(alphabet[Int(group >> 18 & 0x3F)])
            output.append(alphabet[Int(group >> 12 & 0x3F)])
        case 2:
            let group = UInt32(input[index]) << 16 | UInt32(input[index + 1]) << 8
            output.append(alphabet[Int(group >> 18 & 0x3F)])
            output.append(alphabet[Int(group >> 12 & 0x3F)])
            output.append(alphabet[Int(group >> 6 & 0x3F)])
        default:
            break
        }
        return String(decoding: output, as: UTF8.self)
    }

    /// Encodes the UTF-8 bytes of `string` (a JWT header or claims JSON).
    package static func encode(_ string: String) -> String {
        encode(Array(string.utf8))
    }

    /// Decodes unpadded base64url. Nil when any character is outside the url-safe alphabet (padding included, since
    /// JWTs never carry it), when the length leaves a single dangling character, which cannot encode a byte, or when
    /// the unused low bits of the last character are not zero: only the canonical encoding of a byte string is
    /// accepted, so a JWT has exactly one spelling.
    package static func decode(_ text: some StringProtocol) -> [UInt8]? {
        decode(utf8: text.utf8)
    }

    /// Decodes unpadded base64url given as UTF-8 bytes (a JWT part split out of a header value without a `String`).
    package static func decode(utf8 input: some Collection<UInt8>) -> [UInt8]? {
        guard input.count % 4 != 1 else { return nil }
        var output = [UInt8]()
        output.reserveCapacity(input.count * 3 / 4)
        var accumulator: UInt32 = 0
        var bits = 0
        for character in input {
            let value = decodingTable[Int(character)]
            guard value != 0xFF else { return nil }
            accumulator = accumulator << 6 | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                output.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
            }
        }
        guard accumulator & ((1 << UInt32(bits)) - 1) == 0 else { return nil }
        return output
    }
}
