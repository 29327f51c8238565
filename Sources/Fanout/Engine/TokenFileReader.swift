import FanoutCore

/// Streams the tokens of a tokens file, one per line (`ChunkedLineReader`: fixed-size chunks, so memory stays flat
/// however long the file is; blank lines skipped).
package struct TokenFileReader {
    private let lines: ChunkedLineReader
    /// Why reading stopped early, when it did: `nextLine()` then returns nil as at the end of the file, and the
    /// caller must check this before treating the job as complete.
    private(set) var failure: FanoutError?

    /// 1-based number of the last line returned.
    var lineNumber: Int { lines.lineNumber }

    init(path: String) throws(FanoutError) {
        do {
            lines = try ChunkedLineReader(path: path)
        } catch {
            throw FanoutError(.invalidNotification, "tokens file \(path) cannot be read: \(error.reason)")
        }
    }

    /// The next non-blank line, trimmed of spaces, tabs and CR; nil at the end of the file or when reading fails
    /// (see `failure`). A line of 64 lowercase hex digits is kept as its bytes, with no String (`RecipientToken`).
    /// A line that is not hex digits is not returned as it is (`shown`).
    mutating func nextToken() -> RecipientToken? {
        do {
            let token = try lines.nextLine { RecipientToken(utf8: UnsafeRawBufferPointer(Self.trimmedBytes($0))) }
            guard case .text(let text) = token else { return token }
            return .text(Self.shown(text, lineNumber: lines.lineNumber))
        } catch {
            failure = FanoutError(.invalidNotification, "tokens file \(lines.path) cannot be read: \(error.reason)")
            return nil
        }
    }

    /// A tokens-file line as a token: spaces, tabs and CR trimmed, and `shown` (how `fanout enqueue` reads one).
    package static func trimmed(_ line: UnsafeBufferPointer<UInt8>, lineNumber: Int) -> String {
        shown(String(decoding: trimmedBytes(line), as: UTF8.self), lineNumber: lineNumber)
    }

    /// A line as the token its result names: itself when it is hex digits (a token of the wrong length or case is
    /// what the reader of the results wants to find), else `line N (not hex, not shown)`. `tokens_file` takes any
    /// path, and every line that is no token is copied into the results (and, through `fanout enqueue`, into
    /// Redis): a file of something else, a signing key say, must not be.
    package static func shown(_ line: String, lineNumber: Int) -> String {
        let isHex = line.utf8.count <= 512 && line.utf8.allSatisfy { ASCIIBytes.isHexDigit($0) }
        return isHex ? line : "line \(lineNumber) (not hex, not shown)"
    }

    /// The bytes of `line` without its leading and trailing spaces, tabs and CR.
    private static func trimmedBytes(_ line: UnsafeBufferPointer<UInt8>) -> UnsafeBufferPointer<UInt8> {
        var start = 0
        var end = line.count
        func isSpace(_ byte: UInt8) -> Bool { byte == 32 || byte == 9 || byte == 13 }
        while start < end, isSpace(line[start]) { start += 1 }
        while end > start, isSpace(line[end - 1]) { end -= 1 }
        return UnsafeBufferPointer(rebasing: line[start..<end])
    }
}
