import CLibUV
import Foundation

/// A listening TCP socket on one loop. Several loops may listen on the same address: the socket is
/// opened with SO_REUSEPORT so that the kernel spreads connections across them (h2load's and
/// nginx's worker model); bind the first with port 0, then the others with the port it got.
package final class TCPListener {
    package let loop: LoopThread
    /// Owned: `handle.data` holds a +1 on self, released in the close callback that frees the handle.
    private let handle: UnsafeMutablePointer<uv_tcp_t>
    private let onAccept: (TCPSocket) -> Void
    private var isClosed = false
    private var stopActionID = 0
    /// The port actually bound.
    package private(set) var port = 0

    /// Binds and listens on `host:port` (numeric IPv4 or IPv6 address). Throws with a clear message.
    package init(
        loop: LoopThread, host: String, port: Int, backlog: Int32 = 1024, onAccept: @escaping (TCPSocket) -> Void
    )
        throws(TransportError)
    {
        loop.assertInLoop()
        self.loop = loop
        self.onAccept = onAccept
        handle = .allocate(capacity: 1)
        uv_tcp_init(loop.loop, handle)
        handle.pointee.data = Unmanaged.passRetained(self).toOpaque()
        stopActionID = loop.addStopAction { [self] in close() }

        var storage = sockaddr_storage()
        let isIPv6 = host.contains(":")
        let parsed: Int32 = withUnsafeMutablePointer(to: &storage) { pointer in
            if isIPv6 {
                return pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                    uv_ip6_addr(host, Int32(port), $0)
                }
            }
            return pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { uv_ip4_addr(host, Int32(port), $0) }
        }
        guard parsed == 0 else {
            close()
            throw TransportError(.connectFailed, "cannot listen on \(host):\(port): not a numeric IP address")
        }
        let fd = socket(isIPv6 ? AF_INET6 : AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let length = socklen_t(isIPv6 ? MemoryLayout<sockaddr_in6>.size : MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        if bound != 0 {
            let reason = String(cString: strerror(errno))
            Foundation.close(fd)
            close()
            throw TransportError(.connectFailed, "cannot listen on \(host):\(port): \(reason)")
        }
        uv_tcp_open(handle, fd)
        let rc = uv_listen(
            UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_stream_t.self), backlog, tcpListenCallback)
        if rc != 0 {
            close()
            throw TransportError(.connectFailed, "cannot listen on \(host):\(port): \(uvErrorName(rc))")
        }
        var bound6 = sockaddr_storage()
        var boundLength = Int32(MemoryLayout<sockaddr_storage>.size)
        withUnsafeMutablePointer(to: &bound6) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = uv_tcp_getsockname(handle, $0, &boundLength) }
        }
        let family = Int32(bound6.ss_family)
        self.port = withUnsafePointer(to: &bound6) { pointer -> Int in
            if family == AF_INET6 {
                return pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                    Int(UInt16(bigEndian: $0.pointee.sin6_port))
                }
            }
            return pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                Int(UInt16(bigEndian: $0.pointee.sin_port))
            }
        }
    }

    fileprivate func acceptOne() {
        let client = TCPSocket(loop: loop)
        let rc = uv_accept(
            UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_stream_t.self), client.streamHandle)
        guard rc == 0 else {
            client.close()
            return
        }
        client.setNoDelay()
        onAccept(client)
    }

    /// Stops listening. Idempotent.
    package func close() {
        guard !isClosed else { return }
        isClosed = true
        loop.removeStopAction(stopActionID)
        uv_close(UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_handle_t.self)) { raw in
            guard let raw, let data = raw.pointee.data else { return }
            Unmanaged<TCPListener>.fromOpaque(data).release()
            raw.deallocate()
        }
    }
}

private func tcpListenCallback(_ server: UnsafeMutablePointer<uv_stream_t>?, _ status: Int32) {
    guard let server, let data = server.pointee.data else { preconditionFailure("listen without owner") }
    guard status == 0 else { return }
    Unmanaged<TCPListener>.fromOpaque(data).takeUnretainedValue().acceptOne()
}
