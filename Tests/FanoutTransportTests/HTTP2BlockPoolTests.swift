import CNGHTTP2
import XCTest

@testable import FanoutTransport

/// The allocator nghttp2 sessions use, through the `nghttp2_mem` nghttp2 gets: blocks keep their bytes across
/// `realloc`, `calloc` zeroes a reused block, and a freed block is handed out again for its size class.
final class HTTP2BlockPoolTests: XCTestCase {
    func testBlocksAreReusedAndKeepTheirContract() throws {
        let pool = HTTP2BlockPool()
        let mem = pool.nghttp2Allocator()
        let user = mem.mem_user_data
        // Every size class, the edges of each, and sizes past the largest class.
        let sizes = [0, 1, 31, 32, 33, 64, 100, 255, 256, 511, 1000, 2048, 4095, 4096, 4097, 70_000]
        var blocks: [(UnsafeMutableRawPointer, Int)] = []
        for (index, size) in sizes.enumerated() {
            let block = try XCTUnwrap(mem.malloc(size, user))
            XCTAssertEqual(Int(bitPattern: block) % 16, 0, "blocks are 16-byte aligned")
            block.initializeMemory(as: UInt8.self, repeating: UInt8(index), count: size)
            blocks.append((block, size))
        }
        for (index, (block, size)) in blocks.enumerated() {
            let bytes = block.assumingMemoryBound(to: UInt8.self)
            XCTAssertTrue((0..<size).allSatisfy { bytes[$0] == UInt8(index) }, "block \(index) kept its bytes")
        }
        // A freed small block comes back for the next request of its class, zeroed by calloc.
        let (small, _) = blocks[4]  // 33 bytes: the 64-byte class
        mem.free(small, user)
        let again = try XCTUnwrap(mem.calloc(6, 10, user))
        XCTAssertEqual(again, small)
        XCTAssertTrue((0..<60).allSatisfy { again.load(fromByteOffset: $0, as: UInt8.self) == 0 })
        // realloc keeps the bytes: in place within the class, moved past it.
        let grown = try XCTUnwrap(mem.realloc(again, 64, user))
        XCTAssertEqual(grown, again)
        grown.storeBytes(of: 0xAB, toByteOffset: 63, as: UInt8.self)
        let moved = try XCTUnwrap(mem.realloc(grown, 5000, user))
        XCTAssertEqual(moved.load(fromByteOffset: 63, as: UInt8.self), 0xAB)
        mem.free(moved, user)
        XCTAssertNotNil(mem.realloc(nil, 10, user).map { mem.free($0, user) })
        mem.free(nil, user)
        for (index, (block, _)) in blocks.enumerated() where index != 4 { mem.free(block, user) }
    }

    /// Each size goes to the smallest class (32, 64, ..., 4096 bytes) that holds it, and past 4096 to none.
    func testSizeClassIsTheSmallestThatFits() {
        for size in 0...10_000 {
            let expected = (0..<8).first { 32 << $0 >= size } ?? -1
            XCTAssertEqual(HTTP2BlockPool.sizeClass(for: size), expected, "size \(size)")
        }
    }

    func testASessionCarriesManyStreamsThroughThePool() throws {
        // nghttp2's own use: a client session submitting requests and freeing them on delete.
        let pool = HTTP2BlockPool()
        var mem = pool.nghttp2Allocator()
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        var session: OpaquePointer?
        XCTAssertEqual(nghttp2_session_client_new3(&session, callbacks, nil, nil, &mem), 0)
        let name: StaticString = ":path"
        let value: StaticString = "/3/device/0123"
        for _ in 0..<500 {
            var header = nghttp2_nv(
                name: UnsafeMutablePointer(mutating: name.utf8Start),
                value: UnsafeMutablePointer(mutating: value.utf8Start), namelen: name.utf8CodeUnitCount,
                valuelen: value.utf8CodeUnitCount, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
            XCTAssertGreaterThan(nghttp2_submit_request(session, nil, &header, 1, nil, nil), 0)
        }
        var data: UnsafePointer<UInt8>?
        while nghttp2_session_mem_send(session, &data) > 0 {}
        nghttp2_session_del(session)
    }
}
