import CNGHTTP2
import Foundation

/// nghttp2's allocator for one session: blocks of up to 4 KiB that nghttp2 frees are kept on free lists, one per
/// size class, and handed out again. Without it nghttp2 makes about eight heap allocations per request (the copy
/// of the request's headers, the outbound HEADERS and DATA items, the stream, the decoded response headers); with
/// it a session in steady state makes none.
///
/// A block is a 16-byte header (its size class, or -1 for a block too large for any class, and its usable size)
/// followed by what nghttp2 gets, so `free` and `realloc` know where it belongs. Each class keeps at most
/// `cachedBytesPerClass` of free blocks; past that, blocks go back to malloc.
///
/// Confined to the session's loop thread, like the session that uses it: no lock.
final class HTTP2BlockPool {
    /// Usable sizes of the classes: 32, 64, ..., 4096 bytes.
    private static let classCount = 8
    private static let smallestClass = 32
    private static let headerSize = 16
    private static let cachedBytesPerClass = 1024 * 1024

    /// Owned: allocated in init, freed in deinit. The head of each class's free list (a free block's first word
    /// is the next one) and how many blocks each holds.
    private let heads: UnsafeMutablePointer<UnsafeMutableRawPointer?>
    private let counts: UnsafeMutablePointer<Int>

    init() {
        heads = .allocate(capacity: Self.classCount)
        heads.initialize(repeating: nil, count: Self.classCount)
        counts = .allocate(capacity: Self.classCount)
        counts.initialize(repeating: 0, count: Self.classCount)
    }

    /// Frees the cached blocks. Only once nghttp2 has freed everything it took (after `nghttp2_session_del`).
    deinit {
        for index in 0..<Self.classCount {
            var block = heads[index]
            while let current = block {
                block = current.load(as: UnsafeMutableRawPointer?.self)
                free(current - Self.headerSize)
            }
        }
        heads.deallocate()
        counts.deallocate()
    }

    /// An `nghttp2_mem` whose user data is this pool, unretained: the session's owner keeps the pool alive until
    /// the nghttp2 session is deleted. nghttp2 copies the struct when the session is made.
    func nghttp2Allocator() -> nghttp2_mem {
        nghttp2_mem(
            mem_user_data: Unmanaged.passUnretained(self).toOpaque(), malloc: nghttp2PoolMallocCallback,
            free: nghttp2PoolFreeCallback, calloc: nghttp2PoolCallocCallback, realloc: nghttp2PoolReallocCallback)
    }

    /// The smallest class that holds `size` bytes, -1 for none: log2 of `size` rounded up, less log2 of 32, from
    /// the leading zeros (a loop over the classes would be a branch per class for every nghttp2 allocation).
    static func sizeClass(for size: Int) -> Int {
        guard size > smallestClass else { return 0 }
        let index = Int.bitWidth - (size - 1).leadingZeroBitCount - smallestClass.trailingZeroBitCount
        return index < classCount ? index : -1
    }

    fileprivate func allocate(_ size: Int) -> UnsafeMutableRawPointer? {
        let index = Self.sizeClass(for: size)
        if index >= 0, let block = heads[index] {
            heads[index] = block.load(as: UnsafeMutableRawPointer?.self)
            counts[index] -= 1
            return block
        }
        let capacity = index >= 0 ? Self.smallestClass << index : size
        guard let raw = malloc(Self.headerSize + capacity) else { return nil }
        raw.storeBytes(of: index, as: Int.self)
        raw.storeBytes(of: capacity, toByteOffset: MemoryLayout<Int>.size, as: Int.self)
        return raw + Self.headerSize
    }

    fileprivate func release(_ block: UnsafeMutableRawPointer?) {
        guard let block else { return }
        let raw = block - Self.headerSize
        let index = raw.load(as: Int.self)
        if index >= 0, counts[index] < Self.cachedBytesPerClass / (Self.smallestClass << index) {
            block.storeBytes(of: heads[index], as: UnsafeMutableRawPointer?.self)
            heads[index] = block
            counts[index] += 1
        } else {
            free(raw)
        }
    }

    fileprivate func reallocate(_ block: UnsafeMutableRawPointer?, _ size: Int) -> UnsafeMutableRawPointer? {
        guard let block else { return allocate(size) }
        let capacity = (block - Self.headerSize).load(fromByteOffset: MemoryLayout<Int>.size, as: Int.self)
        if size <= capacity { return block }
        guard let moved = allocate(size) else { return nil }
        moved.copyMemory(from: block, byteCount: capacity)
        release(block)
        return moved
    }
}

// MARK: nghttp2_mem thunks
//
// Each recovers the pool from nghttp2's mem_user_data (an unretained pointer, valid while the session lives).

/// Lends `body` the pool without a retain and release around the call (`_withUnsafeGuaranteedRef`: the session holds
/// the pool for as long as nghttp2 can call these; a retain pair per call would be 1% of the sender's loop thread).
private func withPool<R>(_ userData: UnsafeMutableRawPointer?, _ body: (HTTP2BlockPool) -> R) -> R {
    guard let userData else { preconditionFailure("nghttp2 allocator without user data") }
    return Unmanaged<HTTP2BlockPool>.fromOpaque(userData)._withUnsafeGuaranteedRef(body)
}

private func nghttp2PoolMallocCallback(_ size: Int, _ userData: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    withPool(userData) { $0.allocate(size) }
}

private func nghttp2PoolFreeCallback(_ block: UnsafeMutableRawPointer?, _ userData: UnsafeMutableRawPointer?) {
    withPool(userData) { $0.release(block) }
}

private func nghttp2PoolCallocCallback(_ count: Int, _ size: Int, _ userData: UnsafeMutableRawPointer?)
    -> UnsafeMutableRawPointer?
{
    let (total, overflow) = count.multipliedReportingOverflow(by: size)
    guard !overflow, let block = withPool(userData, { $0.allocate(total) }) else { return nil }
    block.initializeMemory(as: UInt8.self, repeating: 0, count: total)
    return block
}

private func nghttp2PoolReallocCallback(
    _ block: UnsafeMutableRawPointer?, _ size: Int, _ userData: UnsafeMutableRawPointer?
) -> UnsafeMutableRawPointer? {
    withPool(userData) { $0.reallocate(block, size) }
}
