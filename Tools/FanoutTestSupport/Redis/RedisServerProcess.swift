// A real redis-server for the tests (the client's, and the fleet's): started on a free loopback port in a temporary
// directory, waited for until it answers PING, killed or restarted on demand, stopped and its directory removed by
// `discard()`. No mock. Test targets register `discard()` as a teardown (`RedisServerProcess(for: testCase)`, a
// small extension in each, since this target does not link XCTest: mock-apns and the bench link it too).
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

package struct RedisServerError: Error, CustomStringConvertible {
    package let description: String
    package init(_ description: String) { self.description = description }
}

/// One redis-server child. Not thread-safe: a test drives it from its own task.
package final class RedisServerProcess {
    package let port: Int
    /// The server's `--dir`: its AOF and its log (`redis.log`) live here.
    package let directory: String
    private let options: [String]
    private var process: Process?

    /// Starts a server. `appendOnly` turns AOF on with `appendfsync always` (every write is on disk before its
    /// reply, so a SIGKILL loses nothing acknowledged); `extra` adds options (`["--requirepass", "pw"]`).
    /// Call `discard()` when done (the test targets' `init(for:)` registers it as a teardown).
    /// `port`: that port only (a test that chose it before the server existed); by default a free one.
    package init(port chosen: Int? = nil, appendOnly: Bool = false, extra: [String] = []) throws {
        guard Self.executable != nil else {
            throw RedisServerError("redis-server is not installed (make deps-test installs it)")
        }
        directory = (NSTemporaryDirectory() as NSString).appendingPathComponent("fanout-redis-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        options =
            ["--save", "", "--appendonly", appendOnly ? "yes" : "no", "--appendfsync", "always"] + extra
        // A free port is only free until someone takes it: try a few.
        var lastError: Error = RedisServerError("no attempt")
        var started: Int?
        for _ in 0..<(chosen == nil ? 4 : 1) {
            let candidate = try chosen ?? Self.freeLoopbackPort()
            do {
                process = try Self.launch(port: candidate, directory: directory, options: options).process
                started = candidate
                break
            } catch {
                lastError = error
            }
        }
        guard let started else { throw lastError }
        port = started
    }

    /// Stops the server and removes its directory.
    package func discard() {
        stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    package var url: String { "redis://127.0.0.1:\(port)" }

    /// True between a start and `kill()` (or until the process exits on its own).
    package var isRunning: Bool { process?.isRunning ?? false }

    /// SIGKILL, and wait for the process to be gone (its sockets closed by the kernel).
    package func kill() {
        guard let process else { return }
        Glibc.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        self.process = nil
    }

    /// SIGSTOP: the server keeps its sockets and accepts connections (the kernel does), but answers nothing until
    /// `resumeAnswering()`, as a server that hangs does.
    package func stopAnswering() {
        guard let process else { return }
        Glibc.kill(process.processIdentifier, SIGSTOP)
    }

    /// SIGCONT after `stopAnswering()`: the server reads what waited on its sockets and answers.
    package func resumeAnswering() {
        guard let process else { return }
        Glibc.kill(process.processIdentifier, SIGCONT)
    }

    /// Starts the server again on the same port and directory (it reloads its AOF or RDB file), with `extra`
    /// options for this run, and waits for PING. Returns the first answer to PING (`-LOADING ...` while the dataset
    /// is still loading).
    @discardableResult
    package func restart(extra: [String] = []) throws -> String {
        precondition(process == nil, "restart() after kill() or stop()")
        let (process, answer) = try Self.launch(port: port, directory: directory, options: options + extra)
        self.process = process
        return answer
    }

    /// Ends the server at teardown: SIGKILL, since its data is thrown away with its directory (and a child started
    /// by Foundation's Process may inherit a signal mask that delays SIGTERM).
    package func stop() { kill() }

    /// The server's log, for failure messages.
    package var log: String { (try? String(contentsOfFile: directory + "/redis.log", encoding: .utf8)) ?? "" }

    private static let executable: String? = [
        "/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server",
    ]
    .first { FileManager.default.isExecutableFile(atPath: $0) }

    private static func launch(
        port: Int, directory: String, options: [String]
    ) throws -> (process: Process, firstAnswer: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable!)
        process.arguments =
            ["--port", String(port), "--bind", "127.0.0.1", "--dir", directory, "--logfile", "redis.log"] + options
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        // Ready when PING gets an answer (any: +PONG, or -NOAUTH with requirepass, or -LOADING while the AOF loads).
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline {
            if !process.isRunning { break }
            if let answer = ping(port: port) { return (process, answer) }
            usleep(10_000)
        }
        if process.isRunning { Glibc.kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        let log = (try? String(contentsOfFile: directory + "/redis.log", encoding: .utf8)) ?? ""
        throw RedisServerError("redis-server on port \(port) did not answer PING within 5 s; log:\n\(log.suffix(2000))")
    }

    /// Sends PING on a fresh socket and returns the first reply line, or nil when nothing answers within 200 ms.
    package static func ping(port: Int) -> String? {
        inline("PING", port: port, whole: false)?.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Sends one inline command on a fresh socket and returns the raw reply: its first read, or (`whole`) all that
    /// came back until 200 ms passed with nothing more. Nil when nothing answers.
    package static func inline(_ command: String, port: Int, whole: Bool) -> String? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var timeout = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = LoopbackPort.address(port: port)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { return nil }
        let request = Array((command + "\r\n").utf8)
        guard write(fd, request, request.count) == request.count else { return nil }
        var reply: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 8192)
        repeat {
            let count = read(fd, &buffer, buffer.count)
            guard count > 0 else { break }
            reply += buffer[..<count]
        } while whole
        return reply.isEmpty ? nil : String(decoding: reply, as: UTF8.self)
    }

    /// A free loopback port: `redis-server --port 0` would not listen on TCP at all, so the test picks the port.
    package static func freeLoopbackPort() throws -> Int {
        do { return try LoopbackPort.free() } catch { throw RedisServerError(error.description) }
    }
}
