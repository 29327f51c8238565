/// One HTTP/2 header as Fanout hands it to the HPACK encoder.
///
/// `neverIndex` asks for a literal that is never added to the dynamic table: APNs keeps only a small table, and Apple
/// asks senders not to index values that change on every request (`:path`, `apns-id`) or that must not be cached by
/// intermediaries (`authorization`). The transport maps it to nghttp2's `NGHTTP2_NV_FLAG_NO_INDEX`.
package struct HeaderField: Hashable, Sendable, CustomStringConvertible {
    package var name: String
    package var value: String
    package var neverIndex: Bool

    package init(name: String, value: String, neverIndex: Bool = false) {
        self.name = name
        self.value = value
        self.neverIndex = neverIndex
    }

    package var description: String { "\(name): \(value)" }
}
