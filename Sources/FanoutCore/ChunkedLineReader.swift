#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A file that could not be opened or read, or a line too long to hold; the caller names the file.
package struct FileReadError: Error, Hashable, Sendable, CustomStringConvertible {
    package enum Kind: Hashable, Sendable {
        /// No such file (or a path through something that is not a directory).
        case missing
        /// It exists but cannot be opened or read, or it is a directory.
        case unreadable
        /// A line is longer than the reader's `maximumLineLength`.
        case lineTooLong
    }

    package let kind: Kind
    /// What went wrong, in words: `No such file or directory`, `is a directory`, `line 3 is longer than 2048 bytes`.
    package let reason: String

    package init(_ kind: Kind, _ reason: String) {
        self.kind = kind
        self.reason = reason
    }

    package var description: String { reason }
}

/// Streams the lines of a text file in fixed-size chunks, so memory stays flat however long the file is: only the
/// current chunk and the line being assembled are held. Job files and tokens files are read with it.
///
/// Lines end with `\n`; a `\r` before it is dropped, and so is a UTF-8 byte order mark at the start of the file. The
/// last line needs no `\n`. Blank lines (only spaces, tabs and `\r`) are skipped but counted, so `lineNumber` is what
/// an editor shows.
///
/// A reader is one open file and is not thread-safe; the file is closed at its end, after a read error, or on
/// `deinit`.
package final class ChunkedLineReader {
    package static let defaultChunkSize = 256 * 1024
    /// The longest line accepted by default: 256 MiB.
    package static let defaultMaximumLineLength = 256 * 1024 * 1024

    /// The path as given.
    package let path: String
    /// The 1-based number of the last line returned (blank lines count).
    package private(set) var lineNumber = 0
    private let chunkSize: Int
    private let maximumLineLength: Int
    private var descriptor: Int32
    private var buffer: [UInt8] = []
    /// The first byte of `buffer` not yet returned.
    private var start = 0
    /// Everything in `buffer[start..<scanned]` is known to hold no newline, so a long line is scanned only once.
    private var scanned = 0
    private var atEnd = false
    /// Follow mode: the end of the file is only where its writers have got to. A line counts once its `\n` is
    /// read; the bytes after the last one stay buffered until the rest of their line arrives.
    private let followsAppends: Bool
    /// The bytes read from the file so far (a follower compares it with the file's size to see a truncation).
    package private(set) var bytesRead = 0
    /// The bytes of the lines returned so far: the file offset where the next line starts (`bytesRead` less what is
    /// buffered and not returned yet).
    package var bytesConsumed: Int { bytesRead - (buffer.count - start) }
    /// What `fill` grows the buffer with before a read overwrites it.
    private static let zeros = [UInt8](repeating: 0, count: defaultChunkSize)
    /// Follow mode's read buffer, kept across reads: a followed file is read a line or two at a time, and growing
    /// `buffer` by a zeroed chunk for each read (as a bulk read does) would copy 256 KiB per job line.
    private var followScratch: [UInt8] = []

    /// Opens `path` for reading; throws when it does not exist, cannot be read or is a directory.
    /// - Parameter followsAppends: read complete lines only and never reach an end: `nextLine` returns nil when no
    ///   complete line has been written yet, and a later call reads what was appended meanwhile.
    package init(
        path: String, chunkSize: Int = ChunkedLineReader.defaultChunkSize,
        maximumLineLength: Int = ChunkedLineReader.defaultMaximumLineLength, followsAppends: Bool = false
    ) throws(FileReadError) {
        precondition(chunkSize > 0 && maximumLineLength > 0, "chunkSize and maximumLineLength must be positive")
        self.path = path
        self.chunkSize = chunkSize
        self.maximumLineLength = maximumLineLength
        self.followsAppends = followsAppends
        descriptor = try ReadableFile.openForReading(path)
    }

    /// Reads an open descriptor, which the reader then owns and closes (standard input's duplicate for a job file
    /// named `-`). `path` is what messages call it.
    package init(
        descriptor: Int32, path: String, chunkSize: Int = ChunkedLineReader.defaultChunkSize,
        maximumLineLength: Int = ChunkedLineReader.defaultMaximumLineLength
    ) {
        precondition(chunkSize > 0 && maximumLineLength > 0, "chunkSize and maximumLineLength must be positive")
        self.path = path
        self.chunkSize = chunkSize
        self.maximumLineLength = maximumLineLength
        self.descriptor = descriptor
        followsAppends = false
    }

    /// The open file's device and inode, and its size now; nil once it is closed. A follower compares them with
    /// what its path names now, to see the file replaced (a rotation) or truncated.
    package func openFileStatus() -> (device: UInt64, inode: UInt64, size: Int)? {
        guard descriptor >= 0 else { return nil }
        var status = stat()
        guard fstat(descriptor, &status) == 0 else { return nil }
        return (UInt64(status.st_dev), UInt64(status.st_ino), Int(status.st_size))
    }

    deinit {
        closeFile()
    }

    /// Calls `body` with the next non-blank line, without its line ending, and returns what it returns; nil at the
    /// end of the file. The bytes are valid only during the call. Throws when the file cannot be read or a line is
    /// longer than `maximumLineLength`.
    package func nextLine<R>(_ body: (UnsafeBufferPointer<UInt8>) -> R) throws(FileReadError) -> R? {
        while let range = try nextRawLine() {
            lineNumber += 1
            if let content = content(of: range) {
                return buffer.withUnsafeBufferPointer { body(UnsafeBufferPointer(rebasing: $0[content])) }
            }
        }
        return nil
    }

    /// The next non-blank line's bytes, without its line ending; nil at the end of the file.
    package func nextLine() throws(FileReadError) -> [UInt8]? {
        try nextLine { Array($0) }
    }

    // MARK: Buffering

    /// The range in `buffer` of the next line, without its `\n`; nil at the end of the file.
    private func nextRawLine() throws(FileReadError) -> Range<Int>? {
        while true {
            if let newline = findNewline() {
                let range = start..<newline
                start = newline + 1
                scanned = start
                return range
            }
            if atEnd {
                guard start < buffer.count else { return nil }
                let range = start..<buffer.count
                start = buffer.count
                scanned = start
                return range
            }
            guard try fill() || !followsAppends else { return nil }
        }
    }

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

    /// Drops the bytes already returned and appends the next chunk; marks the end of the file when nothing is left
    /// (not when following appends). False when the read found nothing.
    @discardableResult
    private func fill() throws(FileReadError) -> Bool {
        if start > 0 {
            buffer.removeSubrange(0..<start)
            scanned -= start
            start = 0
        }
        guard buffer.count <= maximumLineLength else {
            throw FileReadError(.lineTooLong, "line \(lineNumber + 1) is longer than \(maximumLineLength) bytes")
        }
        if followsAppends { return try fillFollowing() }
        let oldCount = buffer.count
        // Room for the read, zeroed from an array (one copy in any build): appending `repeatElement(0, ...)`
        // walks it an element at a time in a debug build, allocating on each, 262,144 times per chunk.
        var room = chunkSize
        while room > 0 {
            let piece = min(room, Self.zeros.count)
            buffer.append(contentsOf: Self.zeros[..<piece])
            room -= piece
        }
        let result = buffer.withUnsafeMutableBufferPointer { bytes in
            ReadableFile.readChunk(descriptor, into: UnsafeMutableBufferPointer(rebasing: bytes[oldCount...]))
        }
        switch result {
        case .success(let count):
            buffer.removeLast(chunkSize - count)
            bytesRead += count
            if count == 0 {
                if followsAppends { return false }
                atEnd = true
                closeFile()
            }
            return count > 0
        case .failure(let error):
            buffer.removeLast(chunkSize)
            closeFile()
            throw error
        }
    }

    /// `fill` in follow mode: reads into the kept scratch buffer and appends what came. False when nothing did.
    private func fillFollowing() throws(FileReadError) -> Bool {
        if followScratch.isEmpty { followScratch = [UInt8](repeating: 0, count: chunkSize) }
        switch followScratch.withUnsafeMutableBufferPointer({ ReadableFile.readChunk(descriptor, into: $0) }) {
        case .success(let count):
            buffer.append(contentsOf: followScratch[..<count])
            bytesRead += count
            return count > 0
        case .failure(let error):
            closeFile()
            throw error
        }
    }

    /// The line in `range` without its `\r` (and, on line 1, without a byte order mark); nil when it is blank.
    private func content(of range: Range<Int>) -> Range<Int>? {
        var lower = range.lowerBound
        var upper = range.upperBound
        if lineNumber == 1, upper - lower >= 3, buffer[lower] == 0xEF, buffer[lower + 1] == 0xBB,
            buffer[lower + 2] == 0xBF
        {
            lower += 3
        }
        if upper > lower, buffer[upper - 1] == UInt8(ascii: "\r") { upper -= 1 }
        let isBlank = buffer[lower..<upper].allSatisfy {
            $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") || $0 == UInt8(ascii: "\r")
        }
        return isBlank ? nil : lower..<upper
    }

    private func closeFile() {
        if descriptor >= 0 {
            _ = close(descriptor)
            descriptor = -1
        }
    }
}

/// The few POSIX file calls the line reader needs, with errors in words.
package enum ReadableFile {
    /// Opens `path` read-only, retrying on EINTR; fails for a missing file, one that cannot be read, or a directory.
    /// `nonBlocking` keeps the open from waiting on a FIFO with no writer.
    package static func openForReading(_ path: String, nonBlocking: Bool = false) throws(FileReadError) -> Int32 {
        var flags = O_RDONLY | O_CLOEXEC
        if nonBlocking { flags |= O_NONBLOCK }
        var descriptor: Int32
        repeat {
            descriptor = open(path, flags)
        } while descriptor < 0 && errno == EINTR
        guard descriptor >= 0 else {
            let code = errno
            throw FileReadError(code == ENOENT || code == ENOTDIR ? .missing : .unreadable, errorText(code))
        }
        var status = stat()
        if fstat(descriptor, &status) == 0, (status.st_mode & S_IFMT) == S_IFDIR {
            _ = close(descriptor)
            throw FileReadError(.unreadable, "is a directory")
        }
        return descriptor
    }

    /// What `path` names, for a reader that must know whether it can read it twice: a regular file (with its size in
    /// bytes) can be, a pipe, FIFO, socket or terminal cannot. `-` is standard input. Nil when it cannot be examined.
    package static func kind(of path: String) -> (isRegular: Bool, size: Int)? {
        var status = stat()
        let result = path == "-" ? fstat(STDIN_FILENO, &status) : stat(path, &status)
        guard result == 0 else { return nil }
        return ((status.st_mode & S_IFMT) == S_IFREG, Int(status.st_size))
    }

    /// Nil when `path` names a file that can be opened for reading; why not otherwise.
    package static func checkReadable(_ path: String) -> FileReadError? {
        do {
            _ = close(try openForReading(path, nonBlocking: true))
            return nil
        } catch {
            return error
        }
    }

    /// Reads once into `buffer`, retrying on EINTR: the byte count, 0 at the end of the file.
    static func readChunk(
        _ descriptor: Int32, into buffer: UnsafeMutableBufferPointer<UInt8>
    ) -> Result<Int, FileReadError> {
        while true {
            let count = read(descriptor, buffer.baseAddress, buffer.count)
            if count >= 0 { return .success(count) }
            let code = errno
            if code != EINTR { return .failure(FileReadError(.unreadable, errorText(code))) }
        }
    }

    static func errorText(_ code: Int32) -> String {
        String(cString: strerror(code))
    }
}
