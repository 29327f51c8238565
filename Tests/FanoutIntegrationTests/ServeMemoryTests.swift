// `fanout serve` after a burst of connections: once they are closed, the process's memory comes back near where it
// was before, instead of staying at the burst's peak in glibc's free lists.
import Foundation
import XCTest

final class ServeMemoryTests: XCTestCase {
    /// Idle connections per flood.
    private static let connections = 2_000
    /// How far above its resident size before the floods the server may stay once they are over.
    private static let slackKiB = 12 * 1_024

    /// Two floods of 2,000 idle connections, each closed again: the server's resident size (`VmRSS` in
    /// `/proc/PID/status`) returns to within `slackKiB` of what it was before the first, as its descriptors do.
    func testMemoryOfAFloodOfIdleConnectionsIsGivenBackOnceTheyClose() throws {
        let mock = try MockHarness()
        let serve = try ServeHarness(testCase: self, mock: mock)
        try serve.start()
        defer {
            serve.stop()
            mock.stop()
        }
        let pid = try XCTUnwrap(serve.process?.process.processIdentifier)
        XCTAssertEqual(try serve.curl("GET", "/healthz").status, 200)
        let baseline = try Self.residentKiB(pid)
        let descriptors = try Self.openDescriptors(pid)

        var peak = baseline
        for _ in 0..<2 {
            var sockets: [Int32] = []
            defer { for fd in sockets { close(fd) } }
            for _ in 0..<Self.connections { sockets.append(try connect(port: serve.port)) }
            try Self.wait("the server holds the connections") {
                try Self.openDescriptors(pid) >= descriptors + Self.connections
            }
            peak = max(peak, try Self.residentKiB(pid))
            for fd in sockets { close(fd) }
            sockets.removeAll()
            try Self.wait("the server closed the connections") { try Self.openDescriptors(pid) <= descriptors }
        }
        // Given back within seconds of the last close (a trim waits at most 10 s after the one before).
        var resident = try Self.residentKiB(pid)
        let deadline = Date().addingTimeInterval(15)
        while resident > baseline + Self.slackKiB && Date() < deadline {
            usleep(100_000)
            resident = try Self.residentKiB(pid)
        }
        print("serve memory: \(baseline) KiB before, \(peak) KiB at the peak, \(resident) KiB after")
        XCTAssertGreaterThan(peak, baseline + Self.slackKiB, "the floods cost memory (else this test shows nothing)")
        XCTAssertLessThanOrEqual(
            resident, baseline + Self.slackKiB, "before \(baseline) KiB, peak \(peak) KiB, after \(resident) KiB")
        // The server still answers.
        XCTAssertEqual(try serve.curl("GET", "/healthz").status, 200)
    }

    private static func residentKiB(_ pid: Int32) throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
            let kib = Int(line.split(separator: " ", omittingEmptySubsequences: true)[1])
        else { throw ProcessSupportError("no VmRSS in /proc/\(pid)/status") }
        return kib
    }

    private static func openDescriptors(_ pid: Int32) throws -> Int {
        try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count
    }

    private static func wait(_ what: String, timeout: TimeInterval = 30, until condition: () throws -> Bool) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while try !condition() {
            guard Date() < deadline else { throw ProcessSupportError("\(what): not within \(timeout) s") }
            usleep(20_000)
        }
    }

    /// A plain TCP connection to the server on 127.0.0.1 that sends nothing.
    private func connect(port: Int) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw ProcessSupportError("socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Foundation.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard rc == 0 else {
            close(fd)
            throw ProcessSupportError("connect: errno \(errno)")
        }
        return fd
    }
}
