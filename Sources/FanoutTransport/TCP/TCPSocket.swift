package import CLibUV
import Foundation

/// What a TCP socket tells its owner. All calls happen on the socket's loop thread.
package protocol TCPSocketDelegate: AnyObject {
    /// Bytes arrived. The buffer is valid only during the call.
    func tcpSocket(_ socket: TCPSocket, didRead bytes: UnsafeRawBufferPointer)
    /// The peer closed its side, or the socket broke. Called at most once; the socket is closing.
    func tcpSocket(_ socket: TCPSocket, didCloseWith error: TransportError?)
    /// Queued output went out; `socket.queuedWriteBytes` went down.
    func tcpSocketDidDrainWrites(_ socket: TCPSocket)
}

/// A connected TCP stream on one loop: reads into one reused buffer, writes owned buffers.
package final class TCPSocket {
    package let loop: LoopThread
    /// Owned: allocated here; `handle.data` holds a +1 on self, released in the close callback,
    /// which also frees the handle. So the socket lives at least until libuv is done with it.
    package let handle: UnsafeMutablePointer<uv_tcp_t>
    /// Owned: freed in deinit. One buffer serves every read, since reads are delivered one at a time.
    private let readBuffer: UnsafeMutableRawBufferPointer
    /// Strong, and cleared by `close()`: a weak reference would give the delegate a side table and
    /// make every retain of it take the slow path, on the hot path.
    @exclusivity(unchecked) package var delegate: TCPSocketDelegate?
    /// Ciphertext handed to `uv_write` and not yet written.
    @exclusivity(unchecked) private(set) var queuedWriteBytes = 0
    /// Every byte given to `write` so far, written at once or queued (wrapping). With what libuv still holds, how much
    /// has left: see `bytesWritten`.
    @exclusivity(unchecked) private var bytesGiven = 0
    @exclusivity(unchecked) private(set) var isClosed = false
    @exclusivity(unchecked) private var reportedClose = false
    @exclusivity(unchecked) private var stopActionID = 0

    package static let readBufferSize = 64 * 1024

    package init(loop: LoopThread) {
        loop.assertInLoop()
        self.loop = loop
        handle = .allocate(capacity: 1)
        uv_tcp_init(loop.loop, handle)
        readBuffer = .allocate(byteCount: Self.readBufferSize, alignment: 16)
        handle.pointee.data = Unmanaged.passRetained(self).toOpaque()
        stopActionID = loop.addStopAction { [self] in fail(TransportError(.cancelled, "event loop stopped")) }
    }

    deinit {
        assert(isClosed, "TCPSocket released without close()")
        readBuffer.deallocate()
    }

    package var streamHandle: UnsafeMutablePointer<uv_stream_t> {
        UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_stream_t.self)
    }

    package var genericHandle: UnsafeMutablePointer<uv_handle_t> {
        UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_handle_t.self)
    }

    package func setNoDelay() {
        uv_tcp_nodelay(handle, 1)
    }

    package func startReading() {
        loop.assertInLoop()
        let rc = uv_read_start(streamHandle, tcpAllocCallback, tcpReadCallback)
        if rc != 0 { fail(TransportError(.connectionClosed, "read failed: \(uvErrorName(rc))")) }
    }

    /// Stops reading until `startReading` (backpressure: what the peer sends waits in the kernel, and TCP's window
    /// holds it back). Nothing is delivered meanwhile, not even the peer's close.
    package func stopReading() {
        loop.assertInLoop()
        guard !isClosed else { return }
        uv_read_stop(streamHandle)
    }

    /// How many of the bytes given to `write` have left for the kernel so far (wrapping; only differences mean
    /// anything): it moves whenever output makes progress, a queued write's partial progress included, which the
    /// write callbacks do not show.
    package var bytesWritten: Int {
        guard !isClosed else { return bytesGiven }
        return bytesGiven &- uv_stream_get_write_queue_size(streamHandle)
    }

    /// Writes `bytes`, which are only lent: what the socket takes at once is written from them (most flushes fit in
    /// the socket buffer: no request, no epoll change), and only the rest (the socket buffer was full, or earlier
    /// writes are queued) is copied into a buffer of its own and queued.
    package func write(borrowing bytes: UnsafeRawBufferPointer) {
        loop.assertInLoop()
        guard !isClosed, bytes.count > 0 else { return }
        bytesGiven &+= bytes.count
        var start = 0
        if queuedWriteBytes == 0 {
            var direct = uv_buf_t(
                base: UnsafeMutablePointer(mutating: bytes.baseAddress!.assumingMemoryBound(to: CChar.self)),
                len: bytes.count)
            let written = uv_try_write(streamHandle, &direct, 1)
            if written == Int32(bytes.count) { return }
            if written > 0 { start = Int(written) }
        }
        let rest = UnsafeRawBufferPointer(rebasing: bytes[start...])
        // Owned by the write request from here: the write callback frees it.
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: rest.count, alignment: 16)
        buffer.copyMemory(from: rest)
        queueWrite(owning: buffer)
    }

    /// Queues all of `buffer` with `uv_write`, taking ownership of it (freed in the write callback, or here if the
    /// write cannot be queued).
    private func queueWrite(owning buffer: UnsafeMutableRawBufferPointer) {
        let count = buffer.count
        let request = UnsafeMutablePointer<uv_write_t>.allocate(capacity: 1)
        // Owned by the request until the write callback frees it (with the buffer).
        let pending = UnsafeMutablePointer<PendingWrite>.allocate(capacity: 1)
        pending.initialize(to: PendingWrite(buffer: buffer, count: count))
        request.pointee.data = UnsafeMutableRawPointer(pending)
        var uvBuffer = uv_buf_t(base: buffer.baseAddress!.assumingMemoryBound(to: CChar.self), len: count)
        queuedWriteBytes += count
        let rc = uv_write(request, streamHandle, &uvBuffer, 1, tcpWriteCallback)
        if rc != 0 {
            queuedWriteBytes -= count
            buffer.deallocate()
            pending.deallocate()
            request.deallocate()
            fail(TransportError(.connectionClosed, "write failed: \(uvErrorName(rc))"))
        }
    }

    fileprivate func didWrite(count: Int, status: Int32) {
        queuedWriteBytes -= count
        if status != 0 && status != UV_ECANCELED.rawValue {
            fail(TransportError(.connectionClosed, "write failed: \(uvErrorName(status))"))
            return
        }
        if !isClosed { delegate?.tcpSocketDidDrainWrites(self) }
    }

    fileprivate func didRead(count: Int) {
        if count > 0 {
            delegate?.tcpSocket(self, didRead: UnsafeRawBufferPointer(rebasing: readBuffer[0..<count]))
        } else if count < 0 {
            if count == Int(UV_EOF.rawValue) {
                fail(TransportError(.connectionClosed, "connection closed by peer"))
            } else {
                fail(TransportError(.connectionClosed, "connection lost: \(uvErrorName(Int32(count)))"))
            }
        }
    }

    fileprivate var allocationBuffer: UnsafeMutableRawBufferPointer { readBuffer }

    /// Reports `error` to the delegate once and closes.
    package func fail(_ error: TransportError) {
        guard !reportedClose else { return }
        reportedClose = true
        let delegate = self.delegate
        close()
        delegate?.tcpSocket(self, didCloseWith: error)
    }

    /// Half-closes: the FIN goes out after the writes already queued; reading goes on. Idempotent enough: a
    /// second call fails inside libuv and is ignored.
    package func shutdownWrites() {
        loop.assertInLoop()
        guard !isClosed else { return }
        let request = UnsafeMutablePointer<uv_shutdown_t>.allocate(capacity: 1)
        // Owned by libuv until the callback (called with UV_ECANCELED if the handle closes first), which frees it.
        if uv_shutdown(request, streamHandle, tcpShutdownCallback) != 0 {
            request.deallocate()
        }
    }

    /// Closes the socket. Idempotent. Pending writes are cancelled; their buffers are freed.
    package func close() {
        guard !isClosed else { return }
        isClosed = true
        reportedClose = true
        delegate = nil
        loop.removeStopAction(stopActionID)
        uv_close(genericHandle) { raw in
            guard let raw, let data = raw.pointee.data else { return }
            Unmanaged<TCPSocket>.fromOpaque(data).release()
            raw.deallocate()
        }
    }
}

package func uvErrorName(_ code: Int32) -> String {
    "\(String(cString: uv_err_name(code))) (\(String(cString: uv_strerror(code))))"
}

private func tcpAllocCallback(
    _ handle: UnsafeMutablePointer<uv_handle_t>?, _ suggested: Int, _ buffer: UnsafeMutablePointer<uv_buf_t>?
) {
    guard let handle, let buffer, let data = handle.pointee.data else { preconditionFailure("alloc without owner") }
    let socket = Unmanaged<TCPSocket>.fromOpaque(data).takeUnretainedValue()
    let storage = socket.allocationBuffer
    buffer.pointee = uv_buf_t(base: storage.baseAddress!.assumingMemoryBound(to: CChar.self), len: storage.count)
}

private func tcpReadCallback(
    _ stream: UnsafeMutablePointer<uv_stream_t>?, _ count: Int, _ buffer: UnsafePointer<uv_buf_t>?
) {
    guard let stream, let data = stream.pointee.data else { preconditionFailure("read without owner") }
    Unmanaged<TCPSocket>.fromOpaque(data).takeUnretainedValue().didRead(count: count)
}

/// What a `uv_write_t` carries until its callback: the owned buffer and its used length.
private struct PendingWrite {
    package let buffer: UnsafeMutableRawBufferPointer
    package let count: Int
}

private func tcpWriteCallback(_ request: UnsafeMutablePointer<uv_write_t>?, _ status: Int32) {
    guard let request, let data = request.pointee.data else { preconditionFailure("write callback without request") }
    let pending = data.assumingMemoryBound(to: PendingWrite.self)
    let written = pending.pointee.count
    pending.pointee.buffer.deallocate()
    pending.deallocate()
    let stream = request.pointee.handle
    request.deallocate()
    guard let stream, let owner = stream.pointee.data else { return }
    Unmanaged<TCPSocket>.fromOpaque(owner).takeUnretainedValue().didWrite(count: written, status: status)
}

private func tcpShutdownCallback(_ request: UnsafeMutablePointer<uv_shutdown_t>?, _ status: Int32) {
    request?.deallocate()
}
