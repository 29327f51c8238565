import Foundation
import XCTest

@testable import FanoutCore

/// The line reader behind job files and tokens files.
final class ChunkedLineReaderTests: XCTestCase {
    private var directory: URL!

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("fanout-lines-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws {
        try FileManager.default.removeItem(at: directory)
    }

    /// A file holding `bytes`.
    private func file(_ bytes: [UInt8], name: String = "lines.txt") throws -> String {
        let url = directory.appendingPathComponent(name)
        try Data(bytes).write(to: url)
        return url.path
    }

    /// Every line the reader returns, with its number.
    private func lines(
        _ path: String, chunkSize: Int = ChunkedLineReader.defaultChunkSize,
        maximumLineLength: Int = ChunkedLineReader.defaultMaximumLineLength
    ) throws -> [(number: Int, text: String)] {
        let reader = try ChunkedLineReader(path: path, chunkSize: chunkSize, maximumLineLength: maximumLineLength)
        var lines: [(number: Int, text: String)] = []
        while let text = try reader.nextLine({ String(decoding: $0, as: UTF8.self) }) {
            lines.append((reader.lineNumber, text))
        }
        XCTAssertNil(try reader.nextLine(), "the end stays the end")
        return lines
    }

    func testLinesSplitAcrossChunkBoundariesAreWhole() throws {
        let text = "alpha\nbravo charlie\r\n\n  \t\r\ndelta\n\u{FEFF}echo\r\nfoxtrot"
        let path = try file(Array(("\u{FEFF}" + text).utf8))
        let expected = [
            (1, "alpha"), (2, "bravo charlie"), (5, "delta"), (6, "\u{FEFF}echo"), (7, "foxtrot"),
        ]
        // Every chunk size from one byte (every line straddles) to larger than the file.
        for chunkSize in 1...80 {
            let read = try lines(path, chunkSize: chunkSize)
            XCTAssertEqual(read.map(\.number), expected.map(\.0), "chunk size \(chunkSize)")
            XCTAssertEqual(read.map(\.text), expected.map(\.1), "chunk size \(chunkSize)")
        }
    }

    func testLineEndings() throws {
        XCTAssertEqual(try lines(try file(Array("a\r\nb\r\n".utf8))).map(\.text), ["a", "b"], "CRLF")
        XCTAssertEqual(try lines(try file(Array("a\nb".utf8))).map(\.text), ["a", "b"], "no newline at the end")
        XCTAssertEqual(try lines(try file(Array("a\nb\r".utf8))).map(\.text), ["a", "b"], "a CR at the very end")
        XCTAssertEqual(try lines(try file(Array("a\r\r\n".utf8))).map(\.text), ["a\r"], "only one CR is the ending")
        XCTAssertEqual(try lines(try file(Array(" a \n".utf8))).map(\.text), [" a "], "spaces inside are kept")
    }

    func testEmptyAndBlankLinesAreSkippedButCounted() throws {
        XCTAssertTrue(try lines(try file([])).isEmpty, "an empty file")
        XCTAssertTrue(try lines(try file(Array("\n\r\n \t \n \r".utf8))).isEmpty, "blank lines only")
        XCTAssertTrue(try lines(try file([0xEF, 0xBB, 0xBF])).isEmpty, "a byte order mark alone")
        let read = try lines(try file(Array("\n\nthird\n\n\nsixth\n\n".utf8)), chunkSize: 3)
        XCTAssertEqual(read.map(\.number), [3, 6])
        XCTAssertEqual(read.map(\.text), ["third", "sixth"])
    }

    func testALineLongerThanAChunk() throws {
        let long = String(repeating: "0123456789", count: 1000)
        let path = try file(Array("short\n\(long)\r\nlast\n".utf8))
        for chunkSize in [7, 1024, 9_999, 10_000, 10_001, 65_536] {
            let read = try lines(path, chunkSize: chunkSize)
            XCTAssertEqual(read.map(\.text), ["short", long, "last"], "chunk size \(chunkSize)")
            XCTAssertEqual(read.map(\.number), [1, 2, 3])
        }
    }

    func testALineLongerThanTheMaximumIsAnError() throws {
        let path = try file(Array(("ok\n" + String(repeating: "x", count: 5000) + "\n").utf8))
        let reader = try ChunkedLineReader(path: path, chunkSize: 1024, maximumLineLength: 2048)
        XCTAssertEqual(try reader.nextLine(), Array("ok".utf8))
        XCTAssertThrowsError(try reader.nextLine()) { error in
            XCTAssertEqual(error as? FileReadError, FileReadError(.lineTooLong, "line 2 is longer than 2048 bytes"))
        }
    }

    func testFilesThatCannotBeRead() throws {
        let missing = directory.appendingPathComponent("nope.txt").path
        XCTAssertThrowsError(try ChunkedLineReader(path: missing)) { error in
            XCTAssertEqual((error as? FileReadError)?.kind, .missing)
            XCTAssertEqual("\(error)", "No such file or directory")
        }
        XCTAssertEqual(ReadableFile.checkReadable(missing)?.kind, .missing)
        XCTAssertThrowsError(try ChunkedLineReader(path: directory.path)) { error in
            XCTAssertEqual(error as? FileReadError, FileReadError(.unreadable, "is a directory"))
        }
        XCTAssertEqual(ReadableFile.checkReadable(directory.path)?.reason, "is a directory")
        XCTAssertNil(ReadableFile.checkReadable(try file([])))
    }
}
