// libFuzzer target `http1-request`: how `HTTPServer` reads an HTTP/1.1 request (FanoutHTTP1's head parser and
// chunked-body decoder).
//
// Input: the bytes a client sends, as they arrive: a head, then (for a chunked request) the body.
//
// Properties, beyond not crashing:
// - `endOfHead` finds the same end whether it scans from the start or resumes from any earlier point (the server
//   resumes where the last read stopped).
// - A head that parses is well formed: a token method, a target starting with `/` (or `*`), lowercase header
//   names, Content-Length and chunked never both, keep-alive off for a `Connection: close`.
// - The chunked decoder reaches the same outcome and the same body whether it is fed everything at once or one byte
//   at a time, never takes bytes past the end of the body, and never keeps more than `maxBodyBytes`.
import FanoutHTTP1

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHTTP1Request(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let input = UnsafeRawBufferPointer(start: data, count: size)
    guard let end = HTTP1RequestHead.endOfHead(in: input, from: 0) else { return 0 }
    for resume in [1, 7, end / 2, end - 3] where resume > 0 && resume < end {
        let again = HTTP1RequestHead.endOfHead(in: input, from: max(0, resume - 3))
        require(again == end, "endOfHead from \(resume) found \(String(describing: again)), not \(end)")
    }
    guard case .success(let head) = HTTP1RequestHead.parse(UnsafeRawBufferPointer(rebasing: input[0..<end])) else {
        return 0
    }
    require(!head.method.isEmpty && !head.method.utf8.contains(0x20), "method \(head.method.debugDescription)")
    require(head.target.hasPrefix("/") || head.target == "*", "target \(head.target.debugDescription)")
    for header in head.headers {
        require(header.name == header.name.lowercased(), "header name \(header.name.debugDescription) not lowercase")
        require(!header.value.utf8.contains(0x0D) && !header.value.utf8.contains(0x0A), "CR or LF in a value")
    }
    let contentLengths = head.headers.filter { $0.name == "content-length" }.count
    if head.framing == .chunked { require(contentLengths == 0, "chunked with a Content-Length") }
    if head.headers.contains(where: { $0.name == "connection" && $0.value.lowercased() == "close" }) {
        require(!head.keepAlive, "keep-alive despite Connection: close")
    }

    guard head.framing == .chunked else { return 0 }
    let rest = UnsafeRawBufferPointer(rebasing: input[end...])
    let limit = 4096
    var whole = HTTP1ChunkedDecoder(maxBodyBytes: limit)
    var wholeBody: [UInt8] = []
    let (consumed, outcome) = whole.decode(rest, into: &wholeBody)
    require(consumed <= rest.count && wholeBody.count <= limit, "decoder overran")
    if outcome == .needMore { require(consumed == rest.count, "needMore with input left") }

    var split = HTTP1ChunkedDecoder(maxBodyBytes: limit)
    var splitBody: [UInt8] = []
    var splitConsumed = 0
    var splitOutcome = HTTP1ChunkedDecoder.Outcome.needMore
    while splitConsumed < rest.count && splitOutcome == .needMore {
        let (used, reached) = split.decode(
            UnsafeRawBufferPointer(rebasing: rest[splitConsumed..<(splitConsumed + 1)]), into: &splitBody)
        splitConsumed += used
        splitOutcome = reached
    }
    require(sameKind(splitOutcome, outcome), "byte by byte \(splitOutcome) vs at once \(outcome)")
    require(splitBody == wholeBody, "byte by byte decoded a different body")
    if outcome == .done { require(splitConsumed == consumed, "the body ends at \(splitConsumed) vs \(consumed)") }
    return 0
}

private func sameKind(_ a: HTTP1ChunkedDecoder.Outcome, _ b: HTTP1ChunkedDecoder.Outcome) -> Bool {
    switch (a, b) {
    case (.needMore, .needMore), (.done, .done), (.tooLarge, .tooLarge), (.malformed, .malformed): true
    default: false
    }
}
