/// Decodes a `Transfer-Encoding: chunked` body (RFC 9112 section 7.1) as bytes arrive, with the body's total
/// bounded: a chunk that would take it past `maxBodyBytes` is refused before any of it is kept. Strict: chunk
/// lines end in CRLF, sizes are hex digits, extensions and trailer lines hold no control bytes and are bounded in
/// length; trailers are read and dropped.
package struct HTTP1ChunkedDecoder: Sendable {
    /// What `decode` reached.
    package enum Outcome: Sendable, Equatable {
        /// Every byte given was used; the body goes on.
        case needMore
        /// The body ended (last chunk, trailers and the blank line): bytes after `consumed` belong to the next
        /// request.
        case done
        /// The body is larger than `maxBodyBytes` (answer 413).
        case tooLarge
        /// Not chunked framing (answer 400).
        case malformed(String)
    }

    private enum State: Sendable {
        case size
        case sizeExtension
        case sizeLF
        case data(remaining: Int)
        case dataCR
        case dataLF
        case trailerLineStart
        case trailerLine
        case trailerLF
        case finalLF
        case done
        case failed
    }

    package let maxBodyBytes: Int
    /// The longest chunk-size line (extensions included) or trailer line.
    package static let maxLineBytes = 4096
    /// The most trailer bytes taken in all.
    package static let maxTrailerBytes = 16 * 1024
    /// Body bytes decoded so far.
    package private(set) var bodyCount = 0
    private var state = State.size
    private var size = 0
    private var digits = 0
    private var lineBytes = 0
    private var trailerBytes = 0

    package init(maxBodyBytes: Int) {
        self.maxBodyBytes = maxBodyBytes
    }

    /// Decodes what it can of `input`, appending chunk data to `body`. Returns how many bytes of `input` it used
    /// and what it reached; after `done`, `tooLarge` or `malformed` it takes nothing more.
    package mutating func decode(
        _ input: UnsafeRawBufferPointer, into body: inout [UInt8]
    ) -> (consumed: Int, outcome: Outcome) {
        var index = 0
        let count = input.count
        func fail(_ message: String) -> (Int, Outcome) {
            state = .failed
            return (index, .malformed(message))
        }
        while index < count {
            let byte = input[index]
            switch state {
            case .size:
                if let digit = Self.hexValue(byte) {
                    digits += 1
                    lineBytes += 1
                    // The body's bound caps the value long before it could overflow.
                    size = size * 16 + digit
                    if size > maxBodyBytes - bodyCount {
                        state = .failed
                        return (index, .tooLarge)
                    }
                } else if digits > 0 && (byte == UInt8(ascii: ";") || byte == 0x20 || byte == 0x09) {
                    lineBytes += 1
                    state = .sizeExtension
                } else if digits > 0 && byte == 0x0D {
                    state = .sizeLF
                } else {
                    return fail("malformed chunk size")
                }
            case .sizeExtension:
                lineBytes += 1
                if lineBytes > Self.maxLineBytes { return fail("chunk extension too long") }
                if byte == 0x0D {
                    state = .sizeLF
                } else if byte != 0x09 && (byte < 0x20 || byte == 0x7F) {
                    return fail("control byte in chunk extension")
                }
            case .sizeLF:
                guard byte == 0x0A else { return fail("chunk size line without CRLF") }
                lineBytes = 0
                digits = 0
                if size == 0 {
                    state = .trailerLineStart
                } else {
                    state = .data(remaining: size)
                    size = 0
                }
            case .data(let remaining):
                let take = min(remaining, count - index)
                body.append(contentsOf: UnsafeRawBufferPointer(rebasing: input[index..<(index + take)]))
                bodyCount += take
                index += take
                state = remaining == take ? .dataCR : .data(remaining: remaining - take)
                continue
            case .dataCR:
                guard byte == 0x0D else { return fail("chunk data longer than its size") }
                state = .dataLF
            case .dataLF:
                guard byte == 0x0A else { return fail("chunk data without CRLF") }
                state = .size
            case .trailerLineStart:
                if byte == 0x0D {
                    state = .finalLF
                } else {
                    guard HTTP1RequestHead.isTokenByte(byte) else { return fail("malformed trailer field") }
                    lineBytes = 1
                    trailerBytes += 1
                    state = .trailerLine
                }
            case .trailerLine:
                lineBytes += 1
                trailerBytes += 1
                if lineBytes > Self.maxLineBytes || trailerBytes > Self.maxTrailerBytes {
                    return fail("trailer section too long")
                }
                if byte == 0x0D {
                    state = .trailerLF
                } else if byte != 0x09 && (byte < 0x20 || byte == 0x7F) {
                    return fail("control byte in trailer field")
                }
            case .trailerLF:
                guard byte == 0x0A else { return fail("trailer line without CRLF") }
                state = .trailerLineStart
            case .finalLF:
                guard byte == 0x0A else { return fail("chunked body not ended by CRLF") }
                state = .done
                return (index + 1, .done)
            case .done:
                return (index, .done)
            case .failed:
                return (index, .malformed("chunked body already refused"))
            }
            index += 1
        }
        return (index, .needMore)
    }

    private static func hexValue(_ byte: UInt8) -> Int? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): Int(byte - UInt8(ascii: "0"))
        case UInt8(ascii: "a")...UInt8(ascii: "f"): Int(byte - UInt8(ascii: "a")) + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): Int(byte - UInt8(ascii: "A")) + 10
        default: nil
        }
    }
}
