import FanoutCore
import Foundation
import XCTest

@testable import FanoutTransport

/// `TCPConnector` past an address that never answers: a listener whose accept queue is full drops every new SYN, as a
/// broken route does, so a connect to it hangs until given up on.
final class TCPConnectorTests: XCTestCase {
    func testAnAddressThatNeverAnswersGetsItsShareOfTheDeadlineAndTheNextOneIsTried() throws {
        let answering = try Listener(address: "127.0.0.1", port: 0, backlog: 16)
        defer { answering.close() }
        let silent = try Listener(address: "127.0.0.2", port: answering.port, backlog: 0)
        defer { silent.close() }
        let fillers = try (0..<2).map { _ in try silent.connectWithoutWaiting() }
        defer { for filler in fillers { Glibc.close(filler) } }

        let loop = LoopThread(name: "connector-test")
        defer { loop.shutdown() }
        // The socket stays on the loop thread: closed there, and only what happened crosses to the test.
        let failure = FanoutMutex<String??>(nil)
        let done = DispatchSemaphore(value: 0)
        let started = ContinuousClock.now
        try loop.execute {
            TCPConnector.connect(
                loop: loop, addresses: ["127.0.0.2", "127.0.0.1"], port: answering.port, timeoutMilliseconds: 10_000
            ) { result in
                switch result {
                case .success(let socket):
                    socket.close()
                    failure.withLock { $0 = .some(nil) }
                case .failure(let error):
                    failure.withLock { $0 = .some(error.message) }
                }
                done.signal()
            }
        }
        XCTAssertEqual(done.wait(timeout: .now() + 15), .success, "the connector never reported")
        let elapsed = ContinuousClock.now - started
        if case .some(.some(let message)) = failure.withLock({ $0 }) {
            XCTFail("the answering address was not tried in time: \(message)")
        }
        // Half the 10 s deadline each (at least 2 s) for the silent one, then the next answers at once.
        XCTAssertGreaterThanOrEqual(elapsed, .seconds(4))
        XCTAssertLessThan(elapsed, .seconds(9))
    }
}

/// A listening IPv4 TCP socket that never accepts (the kernel completes handshakes into its queue, up to `backlog`).
private struct Listener {
    let descriptor: Int32
    let port: Int

    init(address: String, port: Int, backlog: Int32) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EMFILE) }
        var address = Self.socketAddress(address, port: port)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, backlog) == 0 else {
            Glibc.close(fd)
            throw POSIXError(.EADDRINUSE)
        }
        var actual = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        descriptor = fd
        self.port = Int(UInt16(bigEndian: actual.sin_port))
    }

    /// A non-blocking connect to this listener, left to the kernel; the descriptor is the caller's to close.
    func connectWithoutWaiting() throws -> Int32 {
        let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard client >= 0 else { throw POSIXError(.EMFILE) }
        _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK)
        var bound = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &bound) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        _ = withUnsafePointer(to: &bound) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(client, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        return client
    }

    func close() { Glibc.close(descriptor) }

    private static func socketAddress(_ text: String, port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        _ = inet_pton(AF_INET, text, &address.sin_addr)
        return address
    }
}
