package import Foundation

/// Loopback TCP ports for tests that start servers which cannot report the port they bound (nghttpd,
/// `redis-server`, whose `--port 0` disables TCP).
package enum LoopbackPort {
    package struct Failure: Error, CustomStringConvertible {
        package let description: String
    }

    /// A TCP port that was free on 127.0.0.1 a moment ago (bind it, read it, close). Another process may take
    /// it before the caller binds it: callers retry.
    ///
    /// With `FANOUT_TEST_PORTS=LOW-HIGH` in the environment, a port of that range, tried at random; otherwise one the
    /// kernel picks (port 0). `scripts/run-tests.sh` gives each of its two test processes a range of its own, below
    /// the kernel's ephemeral ports: a port one process's test freed by killing its server (a Redis primary its
    /// sentinels still watch, a cluster node) is then never taken by a server of the other process's tests, which
    /// those sentinels would turn into a replica of theirs.
    package static func free() throws(Failure) -> Int {
        guard let range = configuredRange else { return try bound(port: 0) }
        var lastError = Failure(description: "no attempt")
        for _ in 0..<256 {
            do {
                return try bound(port: Int.random(in: range))
            } catch {
                lastError = error
            }
        }
        throw Failure(description: "no free port in FANOUT_TEST_PORTS \(range): \(lastError.description)")
    }

    /// `FANOUT_TEST_PORTS`, when it names a range of ports.
    private static let configuredRange: ClosedRange<Int>? = {
        guard let text = ProcessInfo.processInfo.environment["FANOUT_TEST_PORTS"] else { return nil }
        let bounds = text.split(separator: "-").compactMap { Int($0) }
        guard bounds.count == 2, 1024 <= bounds[0], bounds[0] <= bounds[1], bounds[1] <= 65_535 else {
            fatalError("FANOUT_TEST_PORTS must be LOW-HIGH, two ports from 1024 to 65535: \(text)")
        }
        return bounds[0]...bounds[1]
    }()

    /// Binds 127.0.0.1:`port` (0: the kernel's choice), reads the port bound, closes.
    private static func bound(port: Int) throws(Failure) -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket(): errno \(errno)") }
        defer { close(fd) }
        var address = address(port: port)
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard rc == 0 else { throw Failure(description: "bind(127.0.0.1:\(port)): errno \(errno)") }
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
