/// Why a request head or a chunked body was refused, with the status the server answers before closing.
package struct HTTP1ParseError: Error, Sendable, Equatable {
    /// 400 (malformed), 413 (body too large), 417 (an expectation other than 100-continue), 501 (a transfer
    /// coding we do not implement).
    package var status: Int
    package var message: String

    package init(_ status: Int, _ message: String) {
        self.status = status
        self.message = message
    }
}

/// An HTTP/1.x request head (RFC 9112 sections 2-7), parsed strictly: anything that could be read two ways (two
/// different Content-Lengths, Content-Length with Transfer-Encoding, a bare CR, whitespace before a colon, line
/// folding) is refused, since a proxy in front might have read it the other way (request smuggling).
package struct HTTP1RequestHead: Sendable {
    /// How the body is delimited.
    package enum Framing: Sendable, Equatable {
        case none
        case contentLength(Int)
        case chunked
    }

    package var method: String
    /// Path and query as sent (origin form), or `*`.
    package var target: String
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    package var minorVersion: Int
    /// Names lowercase, in arrival order, duplicates kept; values without surrounding whitespace.
    package var headers: [(name: String, value: String)]
    package var framing: Framing
    /// Whether the connection stays open after the response: HTTP/1.1 unless `Connection: close`, HTTP/1.0 only
    /// with `Connection: keep-alive`.
    package var keepAlive: Bool
    /// HTTP/1.1 `Expect: 100-continue`: the client waits for `100 Continue` before sending the body.
    package var expectsContinue: Bool

    /// The index just past the blank line that ends the head (`CRLF CRLF`, or with bare LFs), searching from
    /// `start` (pass where the previous search stopped, less 3, to scan each byte about once).
    package static func endOfHead(in bytes: UnsafeRawBufferPointer, from start: Int) -> Int? {
        var index = max(start, 0)
        let count = bytes.count
        while index < count {
            if bytes[index] == 0x0A {
                if index + 1 < count, bytes[index + 1] == 0x0A { return index + 2 }
                if index + 2 < count, bytes[index + 1] == 0x0D, bytes[index + 2] == 0x0A { return index + 3 }
            }
            index += 1
        }
        return nil
    }

    /// Parses a complete head, its blank line included (what `endOfHead` delimits). One leading empty line is
    /// ignored (RFC 9112 section 2.2); lines end in CRLF or a bare LF; a bare CR anywhere is refused.
    package static func parse(_ bytes: UnsafeRawBufferPointer) -> Result<HTTP1RequestHead, HTTP1ParseError> {
        var lines = LineCursor(bytes: bytes)
        guard var requestLine = lines.next() else { return .failure(HTTP1ParseError(400, "empty request")) }
        if requestLine.isEmpty, let next = lines.next() { requestLine = next }
        if lines.bareCR { return .failure(HTTP1ParseError(400, "bare CR in request head")) }
        guard !requestLine.isEmpty else { return .failure(HTTP1ParseError(400, "empty request")) }

        // request-line = method SP request-target SP HTTP-version
        guard let firstSpace = requestLine.firstIndex(of: 0x20) else {
            return .failure(HTTP1ParseError(400, "malformed request line"))
        }
        let method = requestLine[requestLine.startIndex..<firstSpace]
        let rest = requestLine[(firstSpace + 1)...]
        guard let secondSpace = rest.firstIndex(of: 0x20) else {
            return .failure(HTTP1ParseError(400, "malformed request line"))
        }
        let target = rest[rest.startIndex..<secondSpace]
        let version = rest[(secondSpace + 1)...]
        guard !method.isEmpty, method.allSatisfy(isTokenByte) else {
            return .failure(HTTP1ParseError(400, "malformed method"))
        }
        guard let first = target.first,
            first == UInt8(ascii: "/") || (target.count == 1 && first == UInt8(ascii: "*")),
            target.allSatisfy({ $0 > 0x20 && $0 < 0x7F })
        else {
            return .failure(HTTP1ParseError(400, "malformed request target"))
        }
        let minorVersion: Int
        if equals(version, "HTTP/1.1") {
            minorVersion = 1
        } else if equals(version, "HTTP/1.0") {
            minorVersion = 0
        } else {
            // HTTP/2.0 on an HTTP/1 connection included: a client speaking anything else is lost here.
            return .failure(HTTP1ParseError(400, "unsupported HTTP version"))
        }

        var head = HTTP1RequestHead(
            method: String(decoding: method, as: UTF8.self), target: String(decoding: target, as: UTF8.self),
            minorVersion: minorVersion, headers: [], framing: .none, keepAlive: minorVersion == 1,
            expectsContinue: false)
        head.headers.reserveCapacity(16)
        var hosts = 0
        var contentLength: Int?
        var transferEncoding: [UInt8]?
        var connectionClose = false
        var connectionKeepAlive = false
        while let line = lines.next() {
            if lines.bareCR { return .failure(HTTP1ParseError(400, "bare CR in request head")) }
            if line.isEmpty { break }
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else {
                return .failure(HTTP1ParseError(400, "malformed header line"))
            }
            let name = line[line.startIndex..<colon]
            // No whitespace before the colon, no obsolete line folding (RFC 9112 sections 5.1, 5.2).
            guard !name.isEmpty, name.allSatisfy(isTokenByte) else {
                return .failure(HTTP1ParseError(400, "malformed header name"))
            }
            var value = line[(colon + 1)...]
            while let byte = value.first, byte == 0x20 || byte == 0x09 { value = value.dropFirst() }
            while let byte = value.last, byte == 0x20 || byte == 0x09 { value = value.dropLast() }
            guard value.allSatisfy({ $0 == 0x09 || ($0 >= 0x20 && $0 != 0x7F) }) else {
                return .failure(HTTP1ParseError(400, "malformed header value"))
            }
            if equalsIgnoringCase(name, "host") {
                hosts += 1
            } else if equalsIgnoringCase(name, "content-length") {
                // A list of equal values is one length (RFC 9110 section 8.6); different ones are an attack.
                for element in value.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false) {
                    guard let length = parseLength(trimmed(element)) else {
                        return .failure(HTTP1ParseError(400, "malformed Content-Length"))
                    }
                    if let contentLength, contentLength != length {
                        return .failure(HTTP1ParseError(400, "conflicting Content-Length values"))
                    }
                    contentLength = length
                }
            } else if equalsIgnoringCase(name, "transfer-encoding") {
                if transferEncoding == nil {
                    transferEncoding = Array(value)
                } else {
                    transferEncoding! += Array(", ".utf8) + Array(value)
                }
            } else if equalsIgnoringCase(name, "connection") {
                for option in value.split(separator: UInt8(ascii: ",")) {
                    let option = trimmed(option)
                    if equalsIgnoringCase(option, "close") { connectionClose = true }
                    if equalsIgnoringCase(option, "keep-alive") { connectionKeepAlive = true }
                }
            } else if equalsIgnoringCase(name, "expect") {
                guard equalsIgnoringCase(value, "100-continue") else {
                    return .failure(HTTP1ParseError(417, "unsupported expectation"))
                }
                head.expectsContinue = minorVersion == 1
            }
            head.headers.append((lowercased(name), String(decoding: value, as: UTF8.self)))
        }
        if minorVersion == 1 && hosts != 1 {
            return .failure(HTTP1ParseError(400, "an HTTP/1.1 request needs exactly one Host header"))
        }
        if let transferEncoding {
            guard contentLength == nil else {
                return .failure(HTTP1ParseError(400, "both Content-Length and Transfer-Encoding"))
            }
            guard minorVersion == 1 else {
                return .failure(HTTP1ParseError(400, "Transfer-Encoding in an HTTP/1.0 request"))
            }
            let codings = transferEncoding.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false)
                .map { trimmed($0[...]) }
            guard let last = codings.last, equalsIgnoringCase(last, "chunked") else {
                return .failure(HTTP1ParseError(400, "Transfer-Encoding does not end in chunked"))
            }
            guard codings.count == 1 else {
                return .failure(HTTP1ParseError(501, "transfer coding not implemented"))
            }
            head.framing = .chunked
        } else if let contentLength, contentLength > 0 {
            head.framing = .contentLength(contentLength)
        }
        if connectionClose {
            head.keepAlive = false
        } else if minorVersion == 0 {
            head.keepAlive = connectionKeepAlive
        }
        if head.framing == .none { head.expectsContinue = false }
        return .success(head)
    }

    /// The first value of header `name` (lowercase), if any.
    package func header(_ name: String) -> String? {
        headers.first { $0.name == name }?.value
    }

    // MARK: Byte helpers

    /// Lines of a head: CRLF or LF ends one. Notes a CR not followed by LF.
    private struct LineCursor {
        let bytes: UnsafeRawBufferPointer
        var index = 0
        var bareCR = false

        mutating func next() -> Slice<UnsafeRawBufferPointer>? {
            guard index < bytes.count else { return nil }
            let start = index
            while index < bytes.count && bytes[index] != 0x0A { index += 1 }
            guard index < bytes.count else { return nil }  // no LF: not a complete line
            var end = index
            index += 1
            if end > start && bytes[end - 1] == 0x0D { end -= 1 }
            let line = bytes[start..<end]
            if line.contains(0x0D) { bareCR = true }
            return line
        }
    }

    /// `tchar` of RFC 9110 section 5.6.2.
    static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
            UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
            UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            return true
        default:
            return false
        }
    }

    private static func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }

    private static func equals<C: Collection<UInt8>>(_ bytes: C, _ literal: StaticString) -> Bool {
        let expected = UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount)
        return bytes.elementsEqual(expected)
    }

    static func equalsIgnoringCase<C: Collection<UInt8>>(_ bytes: C, _ lowercaseLiteral: StaticString) -> Bool {
        let expected = UnsafeBufferPointer(start: lowercaseLiteral.utf8Start, count: lowercaseLiteral.utf8CodeUnitCount)
        guard bytes.count == expected.count else { return false }
        return zip(bytes, expected).allSatisfy { lower($0) == $1 }
    }

    private static func lower(_ byte: UInt8) -> UInt8 {
        byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") ? byte | 0x20 : byte
    }

    private static func lowercased(_ name: Slice<UnsafeRawBufferPointer>) -> String {
        String(unsafeUninitializedCapacity: name.count) { buffer in
            for (index, byte) in name.enumerated() { buffer[index] = lower(byte) }
            return name.count
        }
    }

    private static func trimmed<C: BidirectionalCollection<UInt8>>(_ bytes: C) -> C.SubSequence {
        var slice = bytes[...]
        while let byte = slice.first, byte == 0x20 || byte == 0x09 { slice = slice.dropFirst() }
        while let byte = slice.last, byte == 0x20 || byte == 0x09 { slice = slice.dropLast() }
        return slice
    }

    /// 1*DIGIT, at most 18 digits (no overflow).
    private static func parseLength<C: Collection<UInt8>>(_ digits: C) -> Int? {
        guard !digits.isEmpty, digits.count <= 18 else { return nil }
        var value = 0
        for byte in digits {
            guard isDigit(byte) else { return nil }
            value = value * 10 + Int(byte - UInt8(ascii: "0"))
        }
        return value
    }
}
