import FanoutCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A job file that cannot be opened or read, with its path.
package struct JobFileError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The path as it was given.
    package let path: String
    /// What went wrong, for example `No such file or directory`.
    package let reason: String

    package init(path: String, reason: String) {
        self.path = path
        self.reason = reason
    }

    /// `cannot read job file jobs.jsonl: No such file or directory`.
    package var description: String { "cannot read job file \(path): \(reason)" }
}

/// Streams the non-blank lines of a JSON Lines job file with their line numbers (`ChunkedLineReader`: fixed-size
/// chunks, `\r\n` and a byte order mark handled, blank lines skipped but counted).
///
/// A reader is a reference to one open file and is not thread-safe; the file is closed at the end or on `deinit`.
package final class JobFileReader {
    /// One non-blank line: its 1-based number in the file and its bytes (without the line ending).
    package struct Line: Hashable, Sendable {
        package let number: Int
        package let bytes: [UInt8]

        package init(number: Int, bytes: [UInt8]) {
            self.number = number
            self.bytes = bytes
        }
    }

    package static let defaultChunkSize = ChunkedLineReader.defaultChunkSize
    /// The longest line accepted: 256 MiB. A job that names more tokens than fit belongs in a `tokens_file`.
    package static let defaultMaximumLineLength = ChunkedLineReader.defaultMaximumLineLength

    private let lines: ChunkedLineReader
    /// Added to the file's own line numbers: a followed job file's later files continue the numbering.
    private let lineNumberBase: Int

    /// Opens `path` for reading; `-` is standard input. Throws, naming the path, when it does not exist, cannot be
    /// read or is a directory. A pipe, FIFO or standard input is read until its writer closes it, however long the
    /// writer pauses between lines.
    /// With `followsAppends`, only complete lines are returned and `nextLine` returns nil when none has been written
    /// yet (`ChunkedLineReader`'s follow mode); line numbers then start after `lineNumberBase`.
    package init(
        path: String, chunkSize: Int = JobFileReader.defaultChunkSize,
        maximumLineLength: Int = JobFileReader.defaultMaximumLineLength, followsAppends: Bool = false,
        lineNumberBase: Int = 0
    ) throws(JobFileError) {
        self.lineNumberBase = lineNumberBase
        if path == JobFileReader.standardInput {
            let descriptor = dup(STDIN_FILENO)
            guard descriptor >= 0 else {
                throw JobFileError(path: path, reason: "standard input: " + String(cString: strerror(errno)))
            }
            lines = ChunkedLineReader(
                descriptor: descriptor, path: path, chunkSize: chunkSize, maximumLineLength: maximumLineLength)
            return
        }
        do {
            lines = try ChunkedLineReader(
                path: path, chunkSize: chunkSize, maximumLineLength: maximumLineLength, followsAppends: followsAppends)
        } catch {
            throw JobFileError(path: path, reason: error.reason)
        }
    }

    /// The job file name that means standard input.
    package static let standardInput = "-"

    /// The path as given.
    package var path: String { lines.path }

    /// The number of the last line returned (blank lines count), after `lineNumberBase`.
    package var lineNumber: Int { lineNumberBase + lines.lineNumber }

    /// The bytes read from the file so far.
    package var bytesRead: Int { lines.bytesRead }

    /// The bytes of the lines returned so far: where the next line starts.
    package var bytesConsumed: Int { lines.bytesConsumed }

    /// The open file's device, inode and size (`ChunkedLineReader.openFileStatus`).
    package func openFileStatus() -> (device: UInt64, inode: UInt64, size: Int)? { lines.openFileStatus() }

    /// The directory that relative paths inside the file (`tokens_file`) are resolved against: the part of `path`
    /// before its last `/` (`/` for a file at the root), or `.` when it has none.
    package var directory: String {
        guard let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")) else { return "." }
        if slash == path.utf8.startIndex { return "/" }
        return String(path[..<slash])
    }

    /// The next non-blank line, or nil at the end of the file. Throws when the file cannot be read or a line is
    /// longer than `maximumLineLength`.
    package func nextLine() throws(JobFileError) -> Line? {
        do {
            guard let bytes = try lines.nextLine() else { return nil }
            return Line(number: lineNumberBase + lines.lineNumber, bytes: bytes)
        } catch {
            let reason = error.kind == .lineTooLong ? error.reason + "; put its tokens in a tokens_file" : error.reason
            throw JobFileError(path: path, reason: reason)
        }
    }
}
