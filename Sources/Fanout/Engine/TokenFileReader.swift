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
    mutating func nextToken() -> RecipientToken? {
        do {
            return try lines.nextLine { RecipientToken(utf8: UnsafeRawBufferPointer(Self.trimmedBytes($0))) }
        } catch {
            failure = FanoutError(.invalidNotification, "tokens file \(lines.path) cannot be read: \(error.reason)")
            return nil
        }
    }

    /// A tokens-file line as a token: spaces, tabs and CR trimmed (also how `fanout enqueue` reads one).
    package static func trimmed(_ line: UnsafeBufferPointer<UInt8>) -> String {
        String(decoding: trimmedBytes(line), as: UTF8.self)
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
