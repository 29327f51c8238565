import Foundation

/// Streams the lines of a tokens file in chunks, so memory stays flat however long the file is.
struct TokenFileReader {
    private let handle: FileHandle
    private var buffer: [UInt8] = []
    private var position = 0
    private var atEnd = false
    /// 1-based number of the last line returned.
    private(set) var lineNumber = 0
    static let chunkSize = 256 * 1024

    init(path: String) throws(FanoutError) {
        guard let handle = FileHandle(forReadingAtPath: path) else {
            throw FanoutError(.invalidNotification, "tokens file \(path) cannot be read")
        }
        self.handle = handle
    }

    /// The next non-blank line, trimmed of spaces, tabs and CR; nil at the end of the file.
    mutating func nextLine() -> String? {
        while true {
            if let newline = buffer[position...].firstIndex(of: UInt8(ascii: "\n")) {
                let line = buffer[position..<newline]
                position = newline + 1
                lineNumber += 1
                if let text = Self.trimmed(line) { return text }
                continue
            }
            if atEnd {
                guard position < buffer.count else { return nil }
                let line = buffer[position...]
                position = buffer.count
                lineNumber += 1
                return Self.trimmed(line)
            }
            buffer.removeFirst(position)
            position = 0
            let chunk = handle.readData(ofLength: Self.chunkSize)
            if chunk.isEmpty {
                atEnd = true
                try? handle.close()
            } else {
                buffer.append(contentsOf: chunk)
            }
        }
    }

    private static func trimmed(_ line: ArraySlice<UInt8>) -> String? {
        var start = line.startIndex
        var end = line.endIndex
        func isSpace(_ byte: UInt8) -> Bool { byte == 32 || byte == 9 || byte == 13 }
        while start < end, isSpace(line[start]) { start += 1 }
        while end > start, isSpace(line[end - 1]) { end -= 1 }
        guard start < end else { return nil }
        return String(decoding: line[start..<end], as: UTF8.self)
    }
}
