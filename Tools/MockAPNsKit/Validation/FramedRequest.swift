/// A request in the fuzz framing of Fuzz/RequestValidator.swift (shared by the fuzz target and the corpus
/// regression test): a method line, a path line, `name: value` lines, a blank line, then the body.
package struct FramedRequest {
    package var method = ""
    package var path = ""
    package var headers: [(name: String, value: String)] = []
    package var body: [UInt8] = []

    package init(_ bytes: some Collection<UInt8>) {
        let input = Array(bytes)
        let newline = UInt8(ascii: "\n")
        var headEnd = input.count
        var bodyStart = input.count
        var index = 0
        while index + 1 < input.count {
            if input[index] == newline, input[index + 1] == newline {
                headEnd = index
                bodyStart = index + 2
                break
            }
            index += 1
        }
        body = Array(input[bodyStart...])
        let lines = input[..<headEnd].split(separator: newline, omittingEmptySubsequences: false)
        for (number, line) in lines.enumerated() {
            let text = String(decoding: line, as: UTF8.self)
            switch number {
            case 0: method = text
            case 1: path = text
            default:
                guard let colon = line.dropFirst().firstIndex(of: UInt8(ascii: ":")) else {
                    headers.append((name: text, value: ""))
                    continue
                }
                var value = line[(colon + 1)...]
                if value.first == UInt8(ascii: " ") { value = value.dropFirst() }
                headers.append(
                    (
                        name: String(decoding: line[..<colon], as: UTF8.self),
                        value: String(decoding: value, as: UTF8.self)
                    ))
            }
        }
    }
}
