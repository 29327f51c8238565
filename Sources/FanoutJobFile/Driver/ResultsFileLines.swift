import Foundation

/// Reads the lines of a stretch of a results file a chunk at a time, so resuming holds one chunk and one line,
/// not the stretch (a registry job's lines can run to millions).
enum ResultsFileLines {
    static let chunkSize = 256 << 10

    /// Calls `body` with each line that ends (with `\n`) between `start` and `end` (the end of the file when nil),
    /// without its `\n`. `start` must be where a line starts.
    /// - Returns: the offset just past the last line for which `body` returned true (`start` when none did), which
    ///   is where a run that was killed mid-line is cut off.
    static func forEach(
        inFile path: String, from start: Int, to end: Int? = nil, _ body: (ArraySlice<UInt8>) -> Bool
    ) throws -> Int {
        let handle = try FileHandle(forReadingFrom: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        try handle.seek(toOffset: UInt64(start))
        var pending: [UInt8] = []
        /// The file offset of `pending`'s first byte.
        var pendingStart = start
        var kept = start
        var left = end.map { $0 - start }
        while left.map({ $0 > 0 }) ?? true {
            guard let chunk = try handle.read(upToCount: min(chunkSize, left ?? chunkSize)), !chunk.isEmpty else {
                break
            }
            left = left.map { $0 - chunk.count }
            let scanFrom = pending.count
            pending.append(contentsOf: chunk)
            var lineStart = 0
            var searchFrom = scanFrom  // the bytes before it (the start of a long line) hold no newline
            while let newline = pending[searchFrom...].firstIndex(of: UInt8(ascii: "\n")) {
                if body(pending[lineStart..<newline]) { kept = pendingStart + newline + 1 }
                lineStart = newline + 1
                searchFrom = lineStart
            }
            pending.removeFirst(lineStart)
            pendingStart += lineStart
        }
        return kept
    }
}
