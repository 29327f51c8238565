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

    /// The bit of a header APNs reads (for the duplicate check), nil for any other name. Sorted by length first, so
    /// most names are told apart without looking at their bytes.
    private static func bit(of name: UnsafeBufferPointer<UInt8>) -> UInt16? {
        switch name.count {
        case 5: return name.equals(APNsHeaderName.path) ? 1 << 9 : nil
        case 7:
            if name.equals(APNsHeaderName.apnsID) { return 1 << 5 }
            if name.equals(APNsHeaderName.method) { return 1 << 7 }
            return name.equals(APNsHeaderName.scheme) ? 1 << 8 : nil
        case 10:
            if name.equals(APNsHeaderName.topic) { return 1 << 1 }
            return name.equals(APNsHeaderName.authority) ? 1 << 10 : nil
        case 13:
            if name.equals(APNsHeaderName.priority) { return 1 << 2 }
            return name.equals(APNsHeaderName.authorization) ? 1 << 6 : nil
        case 14: return name.equals(APNsHeaderName.pushType) ? 1 << 0 : nil
        case 15: return name.equals(APNsHeaderName.expiration) ? 1 << 3 : nil
        case 16: return name.equals(APNsHeaderName.collapseID) ? 1 << 4 : nil
        default: return nil
        }
    }
}

extension UnsafeBufferPointer<UInt8> {
    /// Whether these bytes are `text`'s UTF-8, byte for byte.
    @inline(__always)
    func equals(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { $0.count == count && $0.elementsEqual(self) }
    }
}
