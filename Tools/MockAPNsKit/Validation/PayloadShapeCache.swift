package import FanoutCore

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
        if filled, body.withUnsafeBufferPointer({ $0.equals(bytes) }) { return shape }
        shape = PayloadShape.inspect(bytes)
        body.removeAll(keepingCapacity: true)
        body.append(contentsOf: bytes)
        filled = true
        return shape
    }
}
