package import Foundation

/// Loopback TCP ports for tests that start servers which cannot report the port they bound (nghttpd,
/// `redis-server`, whose `--port 0` disables TCP).
package enum LoopbackPort {
    package struct Failure: Error, CustomStringConvertible {
        package let description: String
    }

    /// A TCP port that was free on 127.0.0.1 a moment ago (bind port 0, read it, close). Another process may take
    /// it before the caller binds it: callers retry.
    package static func free() throws(Failure) -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket(): errno \(errno)") }
        defer { close(fd) }
        var address = address(port: 0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0 else { throw Failure(description: "bind(127.0.0.1:0): errno \(errno)") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0 else { throw Failure(description: "getsockname(): errno \(errno)") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// True when a TCP connection to 127.0.0.1:`port` succeeds (the connection is closed at once).
    package static func canConnect(port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = address(port: port)
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        return rc == 0
    }

    /// 127.0.0.1:`port` as a socket address.
    package static func address(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        return address
    }
}
