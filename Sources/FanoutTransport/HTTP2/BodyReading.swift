import CNGHTTP2

/// The body of an nghttp2 data provider's read callback, shared by client requests and server
/// responses: copies the next bytes of `body` from `offset` into nghttp2's frame buffer and sets
/// EOF at the end. Returns the byte count, as the callback must.
package func readBody(
    _ body: UnsafeRawBufferPointer, offset: inout Int, into buffer: UnsafeMutablePointer<UInt8>, length: Int,
    flags: UnsafeMutablePointer<UInt32>
) -> Int {
    let take = min(length, body.count - offset)
    if take > 0 {
        UnsafeMutableRawPointer(buffer).copyMemory(from: body.baseAddress! + offset, byteCount: take)
        offset += take
    }
    if offset == body.count { flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
    return take
}
