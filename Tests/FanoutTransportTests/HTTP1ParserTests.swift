// FanoutHTTP1's parser and decoder, and the http1-request fuzz corpus (Tests/Fuzz/Corpus/http1-request, run by
// `make fuzz` through Fuzz/HTTP1Request.swift) replayed with the outcome each input must have.
import FanoutHTTP1
import Foundation
import XCTest

final class HTTP1ParserTests: XCTestCase {
    /// What the server makes of a request stream: the head's status (200 when it parses) and, for a chunked
    /// body, the decoder's outcome with a 4 KiB limit (as in the fuzz target).
    private func replay(_ input: [UInt8]) -> (status: Int, chunked: HTTP1ChunkedDecoder.Outcome?, body: [UInt8]) {
        input.withUnsafeBytes { bytes in
            guard let end = HTTP1RequestHead.endOfHead(in: bytes, from: 0) else { return (0, nil, []) }
            switch HTTP1RequestHead.parse(UnsafeRawBufferPointer(rebasing: bytes[0..<end])) {
            case .failure(let error):
                return (error.status, nil, [])
            case .success(let head):
                guard head.framing == .chunked else { return (200, nil, []) }
                var decoder = HTTP1ChunkedDecoder(maxBodyBytes: 4096)
                var body: [UInt8] = []
                let (_, outcome) = decoder.decode(UnsafeRawBufferPointer(rebasing: bytes[end...]), into: &body)
                return (200, outcome, body)
            }
        }
    }

    /// Every seed with its outcome; a crash input `make fuzz` finds joins the corpus and this table.
    static let corpus: [String: (status: Int, chunked: HTTP1ChunkedDecoder.Outcome?)] = [
        "get-keep-alive": (200, nil),
        "post-content-length": (200, nil),
        "chunked-with-trailer": (200, .done),
        "conflicting-content-length": (400, nil),
        "content-length-and-chunked": (400, nil),
        "http10-keep-alive": (200, nil),
        "chunk-past-limit": (200, .tooLarge),
        "obsolete-line-folding": (400, nil),
        "bare-cr": (400, nil),
    ]

    func testFuzzCorpusReplaysWithTheExpectedOutcomes() throws {
        let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fuzz/Corpus/http1-request")
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        XCTAssertEqual(Set(names), Set(Self.corpus.keys), "the corpus and the table of expected outcomes differ")
        for name in names {
            let input = Array(try Data(contentsOf: directory.appendingPathComponent(name)))
            let result = replay(input)
            XCTAssertEqual(result.status, Self.corpus[name]?.status, name)
            XCTAssertEqual(result.chunked, Self.corpus[name]?.chunked, name)
        }
    }

    func testHeadFields() throws {
        let text = "GET /a?b=1 HTTP/1.1\r\nHost: h\r\nX-Dup: 1\r\nx-dup: 2\r\nConnection: close\r\n\r\n"
        let head = try Array(text.utf8).withUnsafeBytes { try HTTP1RequestHead.parse($0).get() }
        XCTAssertEqual(head.method, "GET")
        XCTAssertEqual(head.target, "/a?b=1")
        XCTAssertEqual(head.headers.map(\.name), ["host", "x-dup", "x-dup", "connection"])
        XCTAssertEqual(head.header("x-dup"), "1")
        XCTAssertFalse(head.keepAlive)
        XCTAssertEqual(head.framing, .none)
    }

    func testStatusesForRefusedHeads() {
        let cases: [(String, Int)] = [
            ("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
            ("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: h\r\nExpect: something\r\n\r\n", 417),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            ("GET / HTTP/2.0\r\nHost: a\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
        ]
        for (text, status) in cases {
            XCTAssertEqual(replay(Array(text.utf8)).status, status, text.debugDescription)
        }
        let equalLengths = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n"
        let head = try? Array(equalLengths.utf8).withUnsafeBytes { try HTTP1RequestHead.parse($0).get() }
        XCTAssertEqual(head?.framing, .contentLength(5))
    }

    func testChunkedDecoderFedByteByByteMatchesAtOnce() {
        let body = Array("5\r\nhello\r\n1;a=b\r\n \r\n0\r\nT: v\r\n\r\nNEXT".utf8)
        var whole = HTTP1ChunkedDecoder(maxBodyBytes: 100)
        var wholeBody: [UInt8] = []
        let (consumed, outcome) = body.withUnsafeBytes { whole.decode($0, into: &wholeBody) }
        XCTAssertEqual(outcome, .done)
        XCTAssertEqual(consumed, body.count - 4)
        XCTAssertEqual(String(decoding: wholeBody, as: UTF8.self), "hello ")

        var split = HTTP1ChunkedDecoder(maxBodyBytes: 100)
        var splitBody: [UInt8] = []
        var last = HTTP1ChunkedDecoder.Outcome.needMore
        for index in 0..<(body.count - 4) {
            last = body[index...index].withUnsafeBytes { split.decode($0, into: &splitBody).outcome }
        }
        XCTAssertEqual(last, .done)
        XCTAssertEqual(splitBody, wholeBody)

        var small = HTTP1ChunkedDecoder(maxBodyBytes: 4)
        var smallBody: [UInt8] = []
        XCTAssertEqual(body.withUnsafeBytes { small.decode($0, into: &smallBody).outcome }, .tooLarge)
        XCTAssertEqual(smallBody, [])
    }
}
