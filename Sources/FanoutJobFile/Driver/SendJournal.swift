import Fanout
import FanoutCore
import FanoutJobLines
import Foundation

/// The checkpoint that makes `fanout send --resume` possible without reading the whole results
/// file: rewritten (atomically, after the results it describes are on disk) at every flush.
///
/// It says how many bytes of the results file are covered, which job lines are finished (as
/// ranges, so a file of many jobs stays small), and for each job in progress how far its
/// recipients are done: every position below `prefix`, plus the few finished out of order. On
/// resume only the results written after `resultsOffset` (at most one flush's worth) are read,
/// except for a job addressed through the registry (see `PartialJob.tokensFrom`).
struct SendJournal: Codable, Equatable {
    struct PartialJob: Codable, Equatable {
        var job: String
        var prefix: Int
        var beyond: [Int]
        /// For a job that reads its recipients from the registry: the results offset at or before its first line.
        /// Positions do not identify such a job's recipients across runs (the registry changes between them: the
        /// tokens APNs invalidated are removed, others expire or are added), so a resumed run skips the tokens
        /// that have lines from here on instead. Nil for a job whose recipients keep their positions (inline
        /// tokens, a tokens file, a channel), and in a journal written before this field existed.
        var tokensFrom: Int? = nil
    }

    /// 2 since inline tokens are de-duplicated and repeated job ids refused: a version 1 journal's positions and
    /// job keys may not match what this version reads from the same file, so `--resume` refuses it.
    static let currentVersion = 2
    var version = SendJournal.currentVersion
    /// Identity of the job file this journal belongs to (resuming another file is refused).
    var jobsFile: String
    var jobsFileSize: Int
    /// Bytes of the results file that the state below accounts for.
    var resultsOffset: Int
    /// Finished job lines, as inclusive ranges `[first, last]`.
    var finishedLines: [[Int]]
    /// Jobs in progress, by line number.
    var partial: [String: PartialJob]
    var counts: SendCounts
    /// With `--follow`: the file being read (`FollowedJobFile.identity`) and the line number its first line follows
    /// (a rotation's new file continues the old one's numbering). Nil for a job file read once.
    var followed: FollowedFile? = nil

    struct FollowedFile: Codable, Equatable {
        var file: String
        var lineNumberBase: Int
    }

    /// The highest job line the journal knows of, finished or in progress.
    var highestLine: Int {
        max(finishedLines.last?.last ?? 0, partial.keys.compactMap { Int($0) }.max() ?? 0)
    }

    static func path(forResults results: String) -> String { results + ".journal" }

    static func load(from path: String) throws -> SendJournal? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        return try JSONDecoder().decode(SendJournal.self, from: data)
    }

    /// The journal as JSON with the keys `Codable` reads back (`load`), written straight into bytes: `JSONEncoder`
    /// takes about a microsecond per out-of-order position, and a running job has thousands of them, five times a
    /// second (3% of a 500,000-token `fanout send`'s CPU). Only the small `counts` go through `JSONEncoder`.
    func encoded() throws -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(512 + partial.values.reduce(0) { $0 + 8 * $1.beyond.count })
        func literal(_ text: StaticString) {
            output.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
        }
        func integer(_ value: Int) { ResultLine.appendDecimal(Int64(value), to: &output) }
        func integers(_ values: [Int]) {
            literal("[")
            for (index, value) in values.enumerated() {
                if index > 0 { literal(",") }
                integer(value)
            }
            literal("]")
        }
        literal("{\"version\":")
        integer(version)
        literal(",\"jobsFile\":")
        JSONStringEscaping.appendString(jobsFile, to: &output)
        literal(",\"jobsFileSize\":")
        integer(jobsFileSize)
        literal(",\"resultsOffset\":")
        integer(resultsOffset)
        literal(",\"finishedLines\":[")
        for (index, range) in finishedLines.enumerated() {
            if index > 0 { literal(",") }
            integers(range)
        }
        literal("],\"partial\":{")
        for (index, (line, job)) in partial.sorted(by: { $0.key < $1.key }).enumerated() {
            if index > 0 { literal(",") }
            JSONStringEscaping.appendString(line, to: &output)
            literal(":{\"job\":")
            JSONStringEscaping.appendString(job.job, to: &output)
            literal(",\"prefix\":")
            integer(job.prefix)
            literal(",\"beyond\":")
            integers(job.beyond)
            if let tokensFrom = job.tokensFrom {
                literal(",\"tokensFrom\":")
                integer(tokensFrom)
            }
            literal("}")
        }
        literal("},\"counts\":")
        output.append(contentsOf: try JSONEncoder().encode(counts))
        if let followed {
            literal(",\"followed\":{\"file\":")
            JSONStringEscaping.appendString(followed.file, to: &output)
            literal(",\"lineNumberBase\":")
            integer(followed.lineNumberBase)
            literal("}")
        }
        literal("}")
        return output
    }

    /// Writes to a temporary file, syncs it, and renames it over the journal.
    func write(to path: String) throws {
        let data = try encoded()
        let temporary = path + ".tmp"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        guard descriptor >= 0 else { throw SendError("cannot write the journal \(temporary)") }
        defer { close(descriptor) }
        let written = data.withUnsafeBytes { Foundation.write(descriptor, $0.baseAddress, $0.count) }
        guard written == data.count, fsync(descriptor) == 0, rename(temporary, path) == 0 else {
            throw SendError("cannot write the journal \(path)")
        }
    }

    func isFinished(line: Int) -> Bool {
        finishedLines.contains { $0[0] <= line && line <= $0[1] }
    }
}

/// Finished job lines as sorted, merged inclusive ranges.
struct LineRanges: Equatable {
    private(set) var ranges: [[Int]] = []

    init(_ ranges: [[Int]] = []) {
        self.ranges = ranges
    }

    mutating func insert(_ line: Int) {
        // Lines mostly finish in order: look from the end.
        var index = ranges.count
        while index > 0 && ranges[index - 1][0] > line { index -= 1 }
        if index > 0 && ranges[index - 1][1] >= line { return }
        let joinsLeft = index > 0 && ranges[index - 1][1] == line - 1
        let joinsRight = index < ranges.count && ranges[index][0] == line + 1
        switch (joinsLeft, joinsRight) {
        case (true, true):
            ranges[index - 1][1] = ranges[index][1]
            ranges.remove(at: index)
        case (true, false): ranges[index - 1][1] = line
        case (false, true): ranges[index][0] = line
        case (false, false): ranges.insert([line, line], at: index)
        }
    }
}

/// A `fanout send` failure with its one-line message.
package struct SendError: Error, CustomStringConvertible, Sendable {
    package let description: String
    init(_ description: String) { self.description = description }
}
