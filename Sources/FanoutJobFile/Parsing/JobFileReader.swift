import Fanout

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

/// Streams the lines of a JSON Lines job file in fixed-size chunks, so memory stays flat however long the file is.
///
/// Lines end with `\n`; a `\r` before it is dropped, and so is a UTF-8 byte order mark at the start of the file.
/// Blank lines (only spaces, tabs and `\r`) are skipped but still counted, so line numbers match what an editor
/// shows. Only the current chunk and the line being assembled are held in memory.
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

    package static let defaultChunkSize = 256 * 1024
    /// The longest line accepted: 256 MiB. A job that names more tokens than fit belongs in a `tokens_file`.
    package static let defaultMaximumLineLength = 256 * 1024 * 1024

    /// The path as given.
    package let path: String
    private let chunkSize: Int
    private let maximumLineLength: Int
    private var descriptor: Int32
    private var buffer: [UInt8] = []
    /// The first byte of `buffer` not yet returned.
    private var start = 0
    /// Everything in `buffer[start..<scanned]` is known to hold no newline, so a long line is scanned only once.
    private var scanned = 0
    private var atEnd = false
    private var linesRead = 0

    /// Opens `path` for reading. Throws, naming the path, when it does not exist, cannot be read or is a directory.
    package init(
        path: String, chunkSize: Int = JobFileReader.defaultChunkSize,
        maximumLineLength: Int = JobFileReader.defaultMaximumLineLength
    ) throws(JobFileError) {
        precondition(chunkSize > 0 && maximumLineLength > 0, "chunkSize and maximumLineLength must be positive")
        self.path = path
        self.chunkSize = chunkSize
        self.maximumLineLength = maximumLineLength
        switch JobFileIO.openForReading(path) {
        case .success(let descriptor): self.descriptor = descriptor
        case .failure(let reason): throw JobFileError(path: path, reason: reason.text)
        }
    }

    deinit {
        closeFile()
    }

    /// The directory that relative paths inside the file (`tokens_file`) are resolved against: the part of `path`
    /// before its last `/`, or `.` when it has none.
    package var directory: String { JobFileIO.directory(of: path) }

    /// The next non-blank line, or nil at the end of the file. Throws when the file cannot be read or a line is
    /// longer than `maximumLineLength`.
    package func nextLine() throws(JobFileError) -> Line? {
        while true {
            if let newline = findNewline() {
                let range = start..<newline
                start = newline + 1
                scanned = start
                linesRead += 1
                if let line = makeLine(range) { return line }
                continue
            }
            if atEnd {
                guard start < buffer.count else { return nil }
                let range = start..<buffer.count
                start = buffer.count
                scanned = start
                linesRead += 1
                return makeLine(range)
            }
            try fill()
        }
    }

    // MARK: Buffering

    private func findNewline() -> Int? {
        guard scanned < buffer.count else { return nil }
        let found = buffer.withUnsafeBufferPointer { bytes -> Int? in
            guard let base = bytes.baseAddress,
                let hit = memchr(base + scanned, Int32(UInt8(ascii: "\n")), bytes.count - scanned)
            else { return nil }
            return UnsafeRawPointer(base).distance(to: UnsafeRawPointer(hit))
        }
        if found == nil { scanned = buffer.count }
        return found
    }

    /// Drops the bytes already returned and appends the next chunk; marks the end of the file when nothing is left.
    private func fill() throws(JobFileError) {
        if start > 0 {
            buffer.removeSubrange(0..<start)
            scanned -= start
            start = 0
        }
        guard buffer.count <= maximumLineLength else {
            let number = linesRead + 1
            let reason = "line \(number) is longer than \(maximumLineLength) bytes; put its tokens in a tokens_file"
            throw JobFileError(path: path, reason: reason)
        }
        let oldCount = buffer.count
        buffer.append(contentsOf: repeatElement(0, count: chunkSize))
        let result = buffer.withUnsafeMutableBufferPointer { bytes in
            JobFileIO.read(
                descriptor,
                into: UnsafeMutableRawBufferPointer(UnsafeMutableBufferPointer(rebasing: bytes[oldCount...])))
        }
        switch result {
        case .success(let count):
            buffer.removeLast(chunkSize - count)
            if count == 0 {
                atEnd = true
                closeFile()
            }
        case .failure(let reason):
            buffer.removeLast(chunkSize)
            throw JobFileError(path: path, reason: reason.text)
        }
    }

    /// The line in `range` without its `\r` (and, on line 1, without a byte order mark); nil when it is blank.
    private func makeLine(_ range: Range<Int>) -> Line? {
        var lower = range.lowerBound
        var upper = range.upperBound
        if linesRead == 1, upper - lower >= 3, buffer[lower] == 0xEF, buffer[lower + 1] == 0xBB,
            buffer[lower + 2] == 0xBF
        {
            lower += 3
        }
        if upper > lower, buffer[upper - 1] == UInt8(ascii: "\r") { upper -= 1 }
        let isBlank = buffer[lower..<upper].allSatisfy {
            $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") || $0 == UInt8(ascii: "\r")
        }
        if isBlank { return nil }
        return Line(number: linesRead, bytes: Array(buffer[lower..<upper]))
    }

    private func closeFile() {
        if descriptor >= 0 {
            _ = close(descriptor)
            descriptor = -1
        }
    }
}

/// The few POSIX file calls the job file needs, with errors as text.
enum JobFileIO {
    struct Failure: Error {
        let text: String
        let isMissing: Bool
    }

    /// Opens `path` read-only; fails for a missing file, one that cannot be read, or a directory.
    static func openForReading(_ path: String, nonBlocking: Bool = false) -> Result<Int32, Failure> {
        var flags = O_RDONLY | O_CLOEXEC
        if nonBlocking { flags |= O_NONBLOCK }
        var descriptor: Int32
        repeat {
            descriptor = open(path, flags)
        } while descriptor < 0 && errno == EINTR
        guard descriptor >= 0 else {
            let code = errno
            return .failure(Failure(text: errorText(code), isMissing: code == ENOENT || code == ENOTDIR))
        }
        var status = stat()
        if fstat(descriptor, &status) == 0, (status.st_mode & S_IFMT) == S_IFDIR {
            _ = close(descriptor)
            return .failure(Failure(text: "is a directory", isMissing: false))
        }
        return .success(descriptor)
    }

    /// Reads once into `buffer`, retrying on EINTR: the byte count, 0 at the end of the file.
    static func read(_ descriptor: Int32, into buffer: UnsafeMutableRawBufferPointer) -> Result<Int, Failure> {
        while true {
            #if canImport(Glibc)
                let count = Glibc.read(descriptor, buffer.baseAddress, buffer.count)
            #elseif canImport(Musl)
                let count = Musl.read(descriptor, buffer.baseAddress, buffer.count)
            #else
                let count = Darwin.read(descriptor, buffer.baseAddress, buffer.count)
            #endif
            if count >= 0 { return .success(count) }
            let code = errno
            if code != EINTR { return .failure(Failure(text: errorText(code), isMissing: false)) }
        }
    }

    /// Whether `path` names a file that can be opened for reading; the reason when not.
    static func checkReadable(_ path: String) -> Failure? {
        switch openForReading(path, nonBlocking: true) {
        case .success(let descriptor):
            _ = close(descriptor)
            return nil
        case .failure(let failure):
            return failure
        }
    }

    /// The part of `path` before its last `/` (`/` for a file at the root), or `.` when it has no `/`.
    static func directory(of path: String) -> String {
        guard let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")) else { return "." }
        if slash == path.utf8.startIndex { return "/" }
        return String(path[..<slash])
    }

    static func errorText(_ code: Int32) -> String {
        String(cString: strerror(code))
    }
}
