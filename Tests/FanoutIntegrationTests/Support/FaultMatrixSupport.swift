// Support for the fault matrix (FaultMatrixTests): an in-process mock-apns that can be killed and
// restarted on the same port, the mock's --record file read back per token, the process's resident
// memory, and a deadline that fails a run instead of letting it hang the suite.
import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation
import MockAPNsKit
import XCTest

/// mock-apns in-process on 127.0.0.1 with a `--record` file, which can be killed (every connection
/// dropped at once, as a crashed server would) and started again on the same port with the same TLS
/// directory, so that the engine's connections die and its reconnects reach the new server.
final class RestartableMock: @unchecked Sendable {
    let directory: String
    let recordPath: String
    let material: TestTLSMaterial
    let port: Int
    private let options: MockOptions
    private let lock = NSLock()
    private var server: MockAPNsServer?
    /// Counters of the servers already stopped (one per incarnation).
    private var finished: [[String: Any]] = []
    private(set) var restarts = 0

    /// - Parameter configure: the faults and other options (host, port, TLS and record are set here).
    init(_ configure: (inout MockOptions) -> Void = { _ in }) throws {
        directory =
            FileManager.default.temporaryDirectory.appendingPathComponent("fanout-faults-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        TemporaryDirectories.removeAtExit(directory)
        recordPath = (directory as NSString).appendingPathComponent("record.txt")
        var options = MockOptions()
        configure(&options)
        options.host = "127.0.0.1"
        options.port = 0
        options.tls = .directory((directory as NSString).appendingPathComponent("tls"))
        options.recordPath = recordPath
        let first = try MockAPNsServer(options: options)
        server = first
        port = first.port
        options.port = first.port
        self.options = options
        material = first.tlsMaterial!
    }

    deinit {
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Creates a broadcast channel for `app` on the running server; nil when it is stopped.
    func createChannel(app: String) -> String? { lock.withLock { server?.channels.create(app: app) } }

    /// Distinct valid provider tokens the running server has seen.
    func distinctProviderTokens() -> Int { lock.withLock { server?.stats.distinctProviderTokens ?? 0 } }

    /// The running server's counters plus those of the servers stopped before it.
    func totals() -> MockTotals {
        lock.withLock {
            var snapshots = finished
            if let server { snapshots.append(server.stats.snapshot()) }
            return MockTotals(snapshots)
        }
    }

    /// Kills the running server (listener closed, every connection dropped) and waits at most
    /// `timeout` seconds for its threads; the record file is flushed. Idempotent.
    @discardableResult
    func stop(timeout: Double = 10) -> Bool {
        guard
            let server = lock.withLock({ () -> MockAPNsServer? in
                defer { self.server = nil }
                return self.server
            })
        else { return true }
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            server.shutdown()
            done.signal()
        }
        let stopped = done.wait(timeout: .now() + timeout) == .success
        lock.withLock { finished.append(server.stats.snapshot()) }
        return stopped
    }

    /// Kills the server and starts a new one on the same port with the same TLS material and record
    /// file (appended to). Retries the bind briefly: the old listener may take a moment to go.
    func restart() throws {
        guard stop() else { throw ProcessSupportError("mock-apns did not stop within 10 s") }
        var lastError: Error?
        for _ in 0..<100 {
            do {
                let next = try MockAPNsServer(options: options)
                lock.withLock {
                    server = next
                    restarts += 1
                }
                return
            } catch {
                lastError = error
                Thread.sleep(forTimeInterval: 0.01)
            }
        }
        throw ProcessSupportError("cannot restart mock-apns on port \(port): \(String(describing: lastError))")
    }

    /// How many times each token was accepted, from the record file (read it after `stop()`, which
    /// flushes it). Tokens are `testDeviceToken(index)`; the result is indexed by that index, and
    /// tokens of another shape are counted in `foreign`.
    func acceptedPerToken(count: Int) throws -> RecordCounts {
        let data = try Data(contentsOf: URL(fileURLWithPath: recordPath))
        var counts = [UInt16](repeating: 0, count: count)
        var foreign = 0
        var lines = 0
        data.withUnsafeBytes { (raw: UnsafeRawBufferPointer) in
            var index = 0
            var lineStart = 0
            var token: Int? = 0
            var inToken = true
            func hexValue(_ byte: UInt8) -> Int? {
                switch byte {
                case 48...57: return Int(byte - 48)
                case 97...102: return Int(byte - 87)
                case 65...70: return Int(byte - 55)
                default: return nil
                }
            }
            while index < raw.count {
                let byte = raw[index]
                if byte == 10 {
                    if index > lineStart {
                        lines += 1
                        if let value = token, value >= 0, value < count { counts[value] += 1 } else { foreign += 1 }
                    }
                    lineStart = index + 1
                    token = 0
                    inToken = true
                } else if inToken {
                    if byte == 32 {
                        inToken = false
                    } else if index == lineStart {
                        if byte != UInt8(ascii: "f") { token = nil }  // testDeviceToken starts with "f"
                    } else if let value = token, let digit = hexValue(byte), value < Int.max >> 8 {
                        token = value << 4 | digit
                    } else {
                        token = nil
                    }
                }
                index += 1
            }
        }
        return RecordCounts(perToken: counts, foreign: foreign, lines: lines)
    }
}

/// The record file, per token.
struct RecordCounts {
    var perToken: [UInt16]
    /// Lines whose token is not one of the run's.
    var foreign: Int
    var lines: Int
    /// Acceptances beyond the first, summed over tokens.
    var duplicates: Int { perToken.reduce(0) { $0 + max(0, Int($1) - 1) } }
    var distinct: Int { perToken.reduce(0) { $0 + ($1 > 0 ? 1 : 0) } }
}

/// Counters summed over a mock's incarnations.
struct MockTotals {
    var requests = 0
    var accepted = 0
    var connections = 0
    var drops = 0
    var goaways = 0
    var refused = 0
    var broadcastsStored = 0
    var streamLimitViolations = 0
    var byStatus: [String: Int] = [:]

    init(_ snapshots: [[String: Any]]) {
        for snapshot in snapshots {
            requests += snapshot["requests"] as? Int ?? 0
            accepted += snapshot["accepted"] as? Int ?? 0
            connections += snapshot["connections"] as? Int ?? 0
            drops += snapshot["connections_dropped"] as? Int ?? 0
            goaways += snapshot["goaways_sent"] as? Int ?? 0
            refused += snapshot["streams_refused"] as? Int ?? 0
            broadcastsStored += snapshot["broadcasts_stored"] as? Int ?? 0
            streamLimitViolations += snapshot["stream_limit_violations"] as? Int ?? 0
            for (status, count) in snapshot["by_status"] as? [String: Int] ?? [:] {
                byStatus[status, default: 0] += count
            }
        }
    }
}

/// Whether SIGPIPE is ignored or caught, rather than left to its default action (ending the
/// process).
func sigpipeIsHandled() -> Bool {
    var action = sigaction()
    guard sigaction(SIGPIPE, nil, &action) == 0 else { return false }
    return unsafeBitCast(action.__sigaction_handler.sa_handler, to: Int.self) != 0
}

/// This process's resident set (VmRSS) and its high-water mark (VmHWM), in bytes, from
/// /proc/self/status; nil where there is no procfs.
func processMemory() -> (resident: Int, peak: Int)? {
    guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return nil }
    var resident: Int?
    var peak: Int?
    for line in text.split(separator: "\n") {
        let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
        guard fields.count >= 2, let kilobytes = Int(fields[1]) else { continue }
        if fields[0] == "VmRSS:" { resident = kilobytes * 1024 }
        if fields[0] == "VmHWM:" { peak = kilobytes * 1024 }
    }
    guard let resident, let peak else { return nil }
    return (resident, peak)
}

/// Runs `body` and returns its result, or nil when it has not finished after `limit`. On time-out
/// `onTimeout` runs (e.g. to shut the engine down so the body can end) and the body is left to
/// finish on its own: an engine that never answers cannot hang the suite, because nothing awaits
/// it past the deadline.
func withDeadline<T: Sendable>(
    _ limit: Duration, onTimeout: @escaping @Sendable () async -> Void = {},
    _ body: @escaping @Sendable () async throws -> T
) async throws -> T? {
    let gate = DeadlineGate<T>()
    let outcome: Result<T, Error>? = await withCheckedContinuation { continuation in
        gate.arm(continuation)
        Task {
            let result: Result<T, Error>
            do { result = .success(try await body()) } catch { result = .failure(error) }
            gate.resume(result)
        }
        Task {
            try? await Task.sleep(for: limit)
            gate.resume(nil)
        }
    }
    guard let outcome else {
        await onTimeout()
        return nil
    }
    return try outcome.get()
}

/// Resumes a `withDeadline` caller once: with the body's result or, first, with nil at the deadline.
private final class DeadlineGate<T: Sendable>: Sendable {
    private let continuation = FanoutMutex<CheckedContinuation<Result<T, Error>?, Never>?>(nil)

    func arm(_ continuation: CheckedContinuation<Result<T, Error>?, Never>) {
        self.continuation.withLock { $0 = continuation }
    }

    func resume(_ outcome: Result<T, Error>?) {
        continuation.withLock { $0.take() }?.resume(returning: outcome)
    }
}

/// Writes `count` tokens (`testDeviceToken(0..<count)`), one per line, to a new file in `directory`.
func writeTestTokens(count: Int, directory: String) throws -> String {
    let path = (directory as NSString).appendingPathComponent("tokens-\(count).txt")
    var text = ""
    text.reserveCapacity(count * 65)
    for index in 0..<count {
        text += testDeviceToken(index)
        text += "\n"
    }
    try text.write(toFile: path, atomically: false, encoding: .utf8)
    return path
}
