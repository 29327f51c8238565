import FanoutCore

/// The shape of the last body one loop checked. A fan-out sends one payload to every token, so most bodies are the
/// last one again, and comparing a few hundred bytes costs far less than parsing them as JSON. The same bytes give
/// the same shape, so the answers do not change. Confined to one loop.
package final class PayloadShapeCache {
    private var body: [UInt8] = []
    private var shape: PayloadShape?
    private var filled = false

    package init() {}

    /// `PayloadShape.inspect(bytes)`, from the cache when `bytes` are the last body's.
    package func shape(of bytes: UnsafeBufferPointer<UInt8>) -> PayloadShape? {
        if filled, body.withUnsafeBufferPointer({ Self.equal($0, bytes) }) { return shape }
        shape = PayloadShape.inspect(bytes)
        body.removeAll(keepingCapacity: true)
        body.append(contentsOf: bytes)
        filled = true
        return shape
    }

    /// Byte equality, eight bytes at a time.
    private static func equal(_ lhs: UnsafeBufferPointer<UInt8>, _ rhs: UnsafeBufferPointer<UInt8>) -> Bool {
        guard lhs.count == rhs.count else { return false }
        let left = UnsafeRawBufferPointer(lhs)
        let right = UnsafeRawBufferPointer(rhs)
        var offset = 0
        while offset + 8 <= left.count {
            guard
                left.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
                    == right.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
            else { return false }
            offset += 8
        }
        while offset < left.count {
            guard left[offset] == right[offset] else { return false }
            offset += 1
        }
        return true
    }
}
