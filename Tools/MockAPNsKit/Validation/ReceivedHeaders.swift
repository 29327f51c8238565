import FanoutCore

/// The request headers APNs reads, picked out of a request's head in one pass, as ranges of the head's bytes (no
/// `String` per header), with duplicates detected. Names are compared as bytes.
struct ReceivedHeaders {
    var pushType: Range<Int>?
    var topic: Range<Int>?
    var priority: Range<Int>?
    var expiration: Range<Int>?
    var collapseID: Range<Int>?
    var apnsID: Range<Int>?
    var authorization: Range<Int>?

    /// - Parameter bytes: `head.bytes`.
    static func collect(_ head: HeaderView, bytes: UnsafeBufferPointer<UInt8>) -> Result<ReceivedHeaders, APNsRejection>
    {
        var collected = ReceivedHeaders()
        var seen: UInt16 = 0
        for field in head.fields {
            guard let bit = bit(of: UnsafeBufferPointer(rebasing: bytes[field.name])) else { continue }
            guard seen & bit == 0 else { return .failure(APNsRejection(.duplicateHeaders)) }
            seen |= bit
            switch bit {
            case 1 << 0: collected.pushType = field.value
            case 1 << 1: collected.topic = field.value
            case 1 << 2: collected.priority = field.value
            case 1 << 3: collected.expiration = field.value
            case 1 << 4: collected.collapseID = field.value
            case 1 << 5: collected.apnsID = field.value
            case 1 << 6: collected.authorization = field.value
            default: break
            }
        }
        return .success(collected)
    }

    /// The bit of a header APNs reads (for the duplicate check), nil for any other name. A name is compared as its
    /// length and two 8-byte words (its first and last eight bytes, or its bytes packed when shorter), against the
    /// same for each name APNs reads: no byte loop per candidate.
    private static func bit(of name: UnsafeBufferPointer<UInt8>) -> UInt16? {
        guard name.count <= 16 else { return nil }
        let key = NameKey(name, bit: 0)
        for known in knownNames where known.count == key.count && known.first == key.first && known.last == key.last {
            return known.bit
        }
        return nil
    }

    /// A name of at most 16 bytes as its length and two words, which are equal exactly when the bytes are.
    private struct NameKey {
        let count: Int
        let first: UInt64
        let last: UInt64
        let bit: UInt16

        init(_ bytes: UnsafeBufferPointer<UInt8>, bit: UInt16) {
            count = bytes.count
            self.bit = bit
            let raw = UnsafeRawBufferPointer(bytes)
            if raw.count >= 8 {
                first = raw.loadUnaligned(as: UInt64.self)
                last = raw.loadUnaligned(fromByteOffset: raw.count - 8, as: UInt64.self)
            } else {
                var packed: UInt64 = 0
                for (index, byte) in raw.enumerated() { packed |= UInt64(byte) << (8 * UInt64(index)) }
                first = packed
                last = 0
            }
        }

        init(_ name: String, bit: UInt16) {
            var name = name
            self = name.withUTF8 { NameKey($0, bit: bit) }
        }
    }

    /// The names APNs reads, with their bits.
    private static let knownNames: [NameKey] = [
        NameKey(APNsHeaderName.pushType, bit: 1 << 0), NameKey(APNsHeaderName.topic, bit: 1 << 1),
        NameKey(APNsHeaderName.priority, bit: 1 << 2), NameKey(APNsHeaderName.expiration, bit: 1 << 3),
        NameKey(APNsHeaderName.collapseID, bit: 1 << 4), NameKey(APNsHeaderName.apnsID, bit: 1 << 5),
        NameKey(APNsHeaderName.authorization, bit: 1 << 6), NameKey(APNsHeaderName.method, bit: 1 << 7),
        NameKey(APNsHeaderName.scheme, bit: 1 << 8), NameKey(APNsHeaderName.path, bit: 1 << 9),
        NameKey(APNsHeaderName.authority, bit: 1 << 10),
    ]
}

extension UnsafeBufferPointer<UInt8> {
    /// Whether these bytes are `text`'s UTF-8, byte for byte (see `equals(_:)` over bytes).
    @inline(__always)
    func equals(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { equals($0) }
    }

    /// Whether these bytes are `other`'s, byte for byte: compared eight bytes at a time (the generic
    /// `elementsEqual`, a byte at a time, showed in mock-apns's profile).
    @inline(__always)
    func equals(_ other: UnsafeBufferPointer<UInt8>) -> Bool {
        guard other.count == count else { return false }
        let mine = UnsafeRawBufferPointer(self)
        let theirs = UnsafeRawBufferPointer(other)
        var offset = 0
        while offset + 8 <= mine.count {
            guard
                mine.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
                    == theirs.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
            else { return false }
            offset += 8
        }
        while offset < mine.count {
            guard mine[offset] == theirs[offset] else { return false }
            offset += 1
        }
        return true
    }
}
