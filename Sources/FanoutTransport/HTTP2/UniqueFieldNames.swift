import CNGHTTP2

/// Apple's HPACK advice for fields whose value is new in every message (`apns-id`, `apns-unique-id`,
/// `apns-request-id`): send the field with incremental indexing the first time, so that its name enters the dynamic
/// table, and as a literal that is never indexed from then on (docs/reference/apns.md, "HPACK").
///
/// nghttp2 then refers to the name by its table index instead of spelling it out, so neither side Huffman-codes the
/// name again (were it never indexed, `apns-id` would be a new-name literal in every request and every answer). nghttp2
/// finds the name in its table by itself; this only decides which message enters it. When other headers later push that
/// entry out of the 4 KiB table the name is spelled again, which is correct, only dearer.
///
/// One per session, confined to its loop.
struct UniqueFieldNames {
    /// Digests of the names entered on this session (a handful at most). A collision would only leave a name out of
    /// the table.
    private var entered: [UInt64] = []

    /// Whether a field named `name` sent now should be indexed (its name's first time on this session); records it.
    mutating func shouldIndex(_ name: UnsafeRawBufferPointer) -> Bool {
        let digest = Self.digest(name)
        if entered.contains(digest) { return false }
        entered.append(digest)
        return true
    }

    /// Lends `body` `fields`, each never-indexed field whose name is new on this session turned into an indexed one
    /// (in a copy of the entries, made only then).
    mutating func withNamesEntered<R>(
        _ fields: UnsafeBufferPointer<nghttp2_nv>, _ body: (UnsafeBufferPointer<nghttp2_nv>) -> R
    ) -> R {
        let neverIndex = UInt8(NGHTTP2_NV_FLAG_NO_INDEX.rawValue)
        var firstNew: Int?
        for index in fields.indices where fields[index].flags & neverIndex != 0 {
            if !entered.contains(Self.digest(fields[index])) {
                firstNew = index
                break
            }
        }
        guard let firstNew else { return body(fields) }
        return withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: fields.count) { copy in
            _ = copy.initialize(from: fields)
            for index in firstNew..<copy.count where copy[index].flags & neverIndex != 0 {
                let name = UnsafeRawBufferPointer(start: copy[index].name, count: copy[index].namelen)
                if shouldIndex(name) { copy[index].flags &= ~neverIndex }
            }
            return body(UnsafeBufferPointer(copy))
        }
    }

    private static func digest(_ field: nghttp2_nv) -> UInt64 {
        digest(UnsafeRawBufferPointer(start: field.name, count: field.namelen))
    }

    /// FNV-1a over the name's bytes.
    private static func digest(_ name: UnsafeRawBufferPointer) -> UInt64 {
        var hash: UInt64 = 0xCBF2_9CE4_8422_2325
        for byte in name { hash = (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01B3 }
        return hash
    }
}
