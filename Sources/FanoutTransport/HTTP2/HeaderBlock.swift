import CNGHTTP2

/// A request's constant headers, encoded once and shared read-only by every stream that uses them
/// (a job's headers are the same for every token but `:path` and `apns-id`). Names and values live
/// in one buffer; `withNameValuePairs` lends nghttp2 an `nghttp2_nv` array pointing into it, with
/// the per-request `:path` and extra headers spliced in, without heap allocation.
package final class HeaderBlock: Sendable {
    /// One header: where its name and value sit in `storage`, and its HPACK flags.
    private struct Field: Sendable {
        let nameOffset: Int
        let nameLength: Int
        let valueOffset: Int
        let valueLength: Int
        let flags: UInt8
    }

    // Owned: allocated in init, freed in deinit; never written after init, so shareable. nghttp2 keeps pointers into
    // it from submit until the request's HEADERS frame is sent (`notCopied`), so whoever submits holds the block that
    // long (`HTTP2Session.holdUntilSent`).
    nonisolated(unsafe) private let storage: UnsafeMutableRawBufferPointer
    private let fields: [Field]
    /// How many leading fields are pseudo-headers (`:method`, `:scheme`, `:authority`); `:path` goes
    /// after them, because pseudo-headers must precede regular ones.
    private let pseudoCount: Int

    /// - Parameter headers: name, value and whether HPACK must never index it (`authorization`).
    ///   Must not contain `:path`, which each request supplies.
    package init(_ headers: [(name: String, value: String, neverIndex: Bool)]) {
        let ordered = headers.filter { $0.name.hasPrefix(":") } + headers.filter { !$0.name.hasPrefix(":") }
        precondition(!ordered.contains { $0.name == ":path" }, ":path is per request")
        pseudoCount = ordered.filter { $0.name.hasPrefix(":") }.count
        let total = ordered.reduce(0) { $0 + $1.name.utf8.count + $1.value.utf8.count }
        storage = .allocate(byteCount: max(total, 1), alignment: 1)
        var offset = 0
        var fields: [Field] = []
        for header in ordered {
            let nameOffset = offset
            // Lowercase, as HTTP/2 wants it: nghttp2 lowercases a name it copies, and these it does not copy.
            for byte in header.name.utf8 {
                storage[offset] = byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") ? byte | 0x20 : byte
                offset += 1
            }
            let valueOffset = offset
            for byte in header.value.utf8 {
                storage[offset] = byte
                offset += 1
            }
            let flags =
                Self.notCopied
                | (header.neverIndex ? UInt8(NGHTTP2_NV_FLAG_NO_INDEX.rawValue) : UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
            fields.append(
                Field(
                    nameOffset: nameOffset, nameLength: header.name.utf8.count, valueOffset: valueOffset,
                    valueLength: header.value.utf8.count, flags: flags))
        }
        self.fields = fields
    }

    deinit {
        storage.deallocate()
    }

    /// The value of a header, if present (for tests and logs; not on the hot path).
    package func value(of name: String) -> String? {
        for field in fields
        where String(
            decoding: UnsafeRawBufferPointer(rebasing: storage[field.nameOffset..<field.nameOffset + field.nameLength]),
            as: UTF8.self) == name
        {
            return String(
                decoding: UnsafeRawBufferPointer(
                    rebasing: storage[field.valueOffset..<field.valueOffset + field.valueLength]),
                as: UTF8.self)
        }
        return nil
    }

    /// nghttp2 copies neither the names nor the values of the block's headers (the same bytes for every request of a
    /// job: copying them, and lowercasing the names, would be about 2% of the loop thread's time): it reads them when
    /// it sends the HEADERS frame, after `nghttp2_submit_request` returns, so the block must live until then.
    /// `HTTP2Session` holds it until nghttp2's outbound queue is empty.
    private static let notCopied = UInt8(NGHTTP2_NV_FLAG_NO_COPY_NAME.rawValue | NGHTTP2_NV_FLAG_NO_COPY_VALUE.rawValue)

    /// Lends `body` an nghttp2 header array: the block's pseudo-headers, `:path`, the block's other
    /// headers, then `extra` (a per-request header such as `apns-id`: never indexed unless `indexed`, see
    /// `UniqueFieldNames`). nghttp2 copies the values of `:path` and `extra` when the request is submitted; it keeps
    /// pointers to the block's own bytes and to the static names (see `notCopied`).
    func withNameValuePairs<R>(
        path: UnsafeRawBufferPointer, extra: (name: StaticString, value: UnsafeRawBufferPointer, indexed: Bool)?,
        _ body: (UnsafePointer<nghttp2_nv>, Int) -> R
    ) -> R {
        let count = fields.count + 1 + (extra == nil ? 0 : 1)
        return withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: count) { nva in
            let base = storage.baseAddress!.assumingMemoryBound(to: UInt8.self)
            var index = 0
            func field(_ field: Field) {
                nva[index] = nghttp2_nv(
                    name: base + field.nameOffset, value: base + field.valueOffset, namelen: field.nameLength,
                    valuelen: field.valueLength, flags: field.flags)
                index += 1
            }
            for position in 0..<pseudoCount { field(fields[position]) }
            nva[index] = nghttp2_nv(
                name: UnsafeMutablePointer(mutating: HeaderBlock.pathName.utf8Start), value: mutablePointer(path),
                namelen: 5, valuelen: path.count,
                flags: UInt8(NGHTTP2_NV_FLAG_NO_INDEX.rawValue | NGHTTP2_NV_FLAG_NO_COPY_NAME.rawValue))
            index += 1
            for position in pseudoCount..<fields.count { field(fields[position]) }
            if let extra {
                nva[index] = nghttp2_nv(
                    name: UnsafeMutablePointer(mutating: extra.name.utf8Start), value: mutablePointer(extra.value),
                    namelen: extra.name.utf8CodeUnitCount, valuelen: extra.value.count,
                    flags: UInt8(
                        (extra.indexed ? NGHTTP2_NV_FLAG_NONE.rawValue : NGHTTP2_NV_FLAG_NO_INDEX.rawValue)
                            | NGHTTP2_NV_FLAG_NO_COPY_NAME.rawValue))
                index += 1
            }
            return body(UnsafePointer(nva.baseAddress!), index)
        }
    }

    private static let pathName: StaticString = ":path"
}

/// nghttp2's `nghttp2_nv` takes mutable pointers but only reads through them.
/// An empty value may come without a base address; nghttp2 wants a pointer anyway.
private func mutablePointer(_ bytes: UnsafeRawBufferPointer) -> UnsafeMutablePointer<UInt8> {
    guard let base = bytes.baseAddress else { return UnsafeMutablePointer(mutating: emptyStaticString.utf8Start) }
    return UnsafeMutablePointer(mutating: base.assumingMemoryBound(to: UInt8.self))
}

private let emptyStaticString: StaticString = ""

/// A request or response body shared read-only by every stream that sends it: a job's payload is
/// encoded once and each stream's data provider reads from it, with no copy per request.
package final class SharedBody: Sendable {
    // Owned: allocated in init, freed in deinit; never written after init.
    nonisolated(unsafe) private let storage: UnsafeMutableRawBufferPointer
    package let count: Int

    package init(_ bytes: some Collection<UInt8>) {
        count = bytes.count
        storage = .allocate(byteCount: max(count, 1), alignment: 16)
        // One memcpy for contiguous bytes (an encoded payload is an array); `initializeMemory(as:from:)` walks any
        // collection a byte at a time, through its generic iterator, which showed in the profile of one-token jobs.
        let copied: Void? = bytes.withContiguousStorageIfAvailable { source in
            if let base = source.baseAddress { storage.baseAddress!.copyMemory(from: base, byteCount: source.count) }
        }
        if copied == nil { _ = storage.initializeMemory(as: UInt8.self, from: bytes) }
    }

    deinit {
        storage.deallocate()
    }

    /// The bytes; valid while `self` is alive.
    package var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: storage[0..<count]) }
}
