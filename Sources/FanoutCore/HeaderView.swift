/// A request's head as byte ranges in one buffer: `:method`, `:path` and the regular header fields in arrival order
/// (duplicates kept). A server appends each field as nghttp2 hands it over, one copy of its bytes and no `String`;
/// mock-apns's validator reads names and values from the buffer. Emptied with `removeAll`, it keeps its capacity, so
/// a stream's buffer is reused by the next stream without allocating.
package struct HeaderView: Sendable {
    /// One header field: its name's bytes at `start`, its value's right after them.
    package struct Field: Sendable, Equatable {
        package var start: Int
        package var nameCount: Int
        package var valueCount: Int

        package var name: Range<Int> { start..<start + nameCount }
        package var value: Range<Int> { start + nameCount..<start + nameCount + valueCount }
    }

    /// Every name and value, back to back.
    package private(set) var bytes: [UInt8] = []
    /// The regular (non-pseudo) header fields, in arrival order.
    package private(set) var fields: [Field] = []
    /// Where `:method`'s and `:path`'s values sit in `bytes` (empty when absent).
    package private(set) var method: Range<Int> = 0..<0
    package private(set) var path: Range<Int> = 0..<0

    package init() {}

    /// A head built from strings (tests, the fuzz framing, the HTTP server's string view).
    package init(method: String, path: String, headers: [(name: String, value: String)]) {
        self.method = append(method.utf8)
        self.path = append(path.utf8)
        for header in headers {
            let start = bytes.count
            bytes.append(contentsOf: header.name.utf8)
            bytes.append(contentsOf: header.value.utf8)
            fields.append(Field(start: start, nameCount: header.name.utf8.count, valueCount: header.value.utf8.count))
        }
    }

    /// Room for a typical request head without growing (an APNs request's head is a few hundred bytes).
    package mutating func reserveCapacity(bytes byteCount: Int, fields fieldCount: Int) {
        bytes.reserveCapacity(byteCount)
        fields.reserveCapacity(fieldCount)
    }

    /// Appends a regular header field.
    package mutating func append(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        let start = bytes.count
        bytes.append(contentsOf: name)
        bytes.append(contentsOf: value)
        fields.append(Field(start: start, nameCount: name.count, valueCount: value.count))
    }

    package mutating func setMethod(_ value: UnsafeRawBufferPointer) { method = append(value) }
    package mutating func setPath(_ value: UnsafeRawBufferPointer) { path = append(value) }

    /// Empties the head, keeping its storage for the next request.
    package mutating func removeAll() {
        bytes.removeAll(keepingCapacity: true)
        fields.removeAll(keepingCapacity: true)
        method = 0..<0
        path = 0..<0
    }

    private mutating func append(_ value: some Collection<UInt8>) -> Range<Int> {
        let start = bytes.count
        bytes.append(contentsOf: value)
        return start..<bytes.count
    }

    /// `bytes[range]` as a string.
    package func string(_ range: Range<Int>) -> String {
        bytes.withUnsafeBufferPointer { String(decoding: UnsafeBufferPointer(rebasing: $0[range]), as: UTF8.self) }
    }

    package var methodString: String { string(method) }
    package var pathString: String { string(path) }

    /// The regular header fields as strings, in arrival order.
    package var pairs: [(name: String, value: String)] {
        fields.map { (name: string($0.name), value: string($0.value)) }
    }

    /// The value of the first field named `name` (lowercase), as a string.
    package func value(of name: String) -> String? {
        var name = name
        return name.withUTF8 { wanted in
            bytes.withUnsafeBufferPointer { buffer in
                for field in fields where UnsafeBufferPointer(rebasing: buffer[field.name]).elementsEqual(wanted) {
                    return String(decoding: UnsafeBufferPointer(rebasing: buffer[field.value]), as: UTF8.self)
                }
                return nil
            }
        }
    }
}
