// alloc-probe: heap allocations per notification in steady state, for the allocation test
// (Tests/FanoutIntegrationTests/AllocationTests.swift) and for people cutting allocations.
//
//     alloc-probe [throughput-1c] [--small N] [--large N] [--runs N]
//
// It runs `throughput-1c`'s path: one engine with one loop and one connection of up to 1,000 streams sends a
// job of a 1 KiB Live Activity payload to the tokens of a tokens file, against mock-apns over TLS and HTTP/2.
// mock-apns runs in a child process (started here, from the directory this executable is in), so only the
// sender's allocations are counted. The counting allocator is the CAllocationCounter target, linked into this
// executable only (see its header).
//
// Steady state, as swift-nio's allocation counters measure it: after a warm-up job (connection, TLS, HPACK
// table, the pools and queues at their working size), each run sends a job of `small` tokens and then one of
// `large`; allocations per notification are (allocations(large) - allocations(small)) / (large - small), so
// whatever a job costs whatever its size (its task, its payload encoding, its summary) cancels out. The figure
// printed is the lowest of the runs: what timing adds (how many responses one socket read carries, whether the
// feeding task waits for in-flight permits, the first run after the warm-up still filling the record pools) only
// ever adds allocations, so the lowest run is the cost of the notifications themselves. Output: one JSON line.
import CAllocationCounter
import Fanout
import Foundation

struct ProbeError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

struct ProbeOptions {
    var scenario = "throughput-1c"
    var small = 2_000
    var large = 12_000
    var runs = 5

    static func parse(_ arguments: [String]) throws -> ProbeOptions {
        var options = ProbeOptions()
        var index = 0
        func count() throws -> Int {
            index += 1
            guard index < arguments.count, let value = Int(arguments[index]), value > 0 else {
                throw ProbeError("\(arguments[index - 1]) needs a positive number")
            }
            return value
        }
        while index < arguments.count {
            switch arguments[index] {
            case "--small": options.small = try count()
            case "--large": options.large = try count()
            case "--runs": options.runs = try count()
            case "throughput-1c": options.scenario = arguments[index]
            default: throw ProbeError("unknown argument \(arguments[index]); usage: \(usage)")
            }
            index += 1
        }
        guard options.large > options.small else { throw ProbeError("--large must be above --small") }
        return options
    }

    static let usage = "alloc-probe [throughput-1c] [--small N] [--large N] [--runs N]"
}

/// The counts now, as a value that subtracts.
struct Counts {
    var allocations: Int64
    var frees: Int64

    static func now() -> Counts {
        let counts = CAllocationCounter_read()
        return Counts(allocations: counts.allocations, frees: counts.frees)
    }

    static func - (left: Counts, right: Counts) -> Counts {
        Counts(allocations: left.allocations - right.allocations, frees: left.frees - right.frees)
    }
}

/// mock-apns in a child process with fresh TLS material, on a free loopback port.
final class MockChild {
    let process = Process()
    let port: Int
    let tlsDirectory: String
    static let keyID = "PROBEKEY01"
    static let teamID = "PROBETEAM1"

    init(binDirectory: String, workDirectory: String) throws {
        tlsDirectory = "\(workDirectory)/tls"
        let output = "\(workDirectory)/mock-apns.out"
        _ = FileManager.default.createFile(atPath: output, contents: nil)
        let executable = "\(binDirectory)/mock-apns"
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw ProbeError("\(executable) is missing: build it too (swift build --product mock-apns)")
        }
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = [
            "--listen", "127.0.0.1:0", "--tls-dir", tlsDirectory, "--threads", "1", "--key-id", Self.keyID,
            "--team-id", Self.teamID,
        ]
        process.standardOutput = FileHandle(forWritingAtPath: output)
        process.standardError = FileHandle(forWritingAtPath: output + ".err")
        try process.run()
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
            if let line = text.split(separator: "\n").first, line.hasPrefix("listening on "),
                let port = Int(line.split(separator: ":").last ?? "")
            {
                self.port = port
                return
            }
            if !process.isRunning { break }
            usleep(20_000)
        }
        if process.isRunning { process.terminate() }
        throw ProbeError("mock-apns did not start: \((try? String(contentsOfFile: output + ".err")) ?? "")")
    }

    func stop() {
        if process.isRunning { process.terminate() }
        process.waitUntilExit()
    }
}

/// A tokens file of `count` distinct 64-hex-digit tokens.
func writeTokensFile(_ path: String, count: Int) throws {
    var text = ""
    text.reserveCapacity(count * 65)
    for index in 0..<count {
        let hex = String(index, radix: 16)
        text += "a" + String(repeating: "0", count: 63 - hex.count) + hex + "\n"
    }
    try text.write(toFile: path, atomically: true, encoding: .utf8)
}

/// A Live Activity update payload of exactly `size` bytes, as throughput-1c sends.
func liveActivityPayload(size: Int) -> [UInt8] {
    let head = #"{"aps":{"timestamp":1764460800,"event":"update","content-state":{"score":"2-1","note":""#
    let tail = #""}}}"#
    return Array((head + String(repeating: "x", count: max(0, size - head.utf8.count - tail.utf8.count)) + tail).utf8)
}

func probe(_ options: ProbeOptions) async throws -> String {
    guard CAllocationCounter_isActive() else { throw ProbeError("the counting allocator needs glibc") }
    let executable = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
    let binDirectory = URL(fileURLWithPath: executable).deletingLastPathComponent().path
    let work = NSTemporaryDirectory() + "alloc-probe-\(getpid())"
    try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let mock = try MockChild(binDirectory: binDirectory, workDirectory: work)
    defer { mock.stop() }
    let smallFile = "\(work)/tokens-small.txt"
    let largeFile = "\(work)/tokens-large.txt"
    try writeTokensFile(smallFile, count: options.small)
    try writeTokensFile(largeFile, count: options.large)

    // throughput-1c's engine: one loop, one connection, 1,000 streams, the default workspace budget.
    var configuration = FanoutEngineConfiguration(
        endpoint: APNsEndpoint(host: "localhost", port: mock.port),
        credentials: ProviderCredentials(
            keyPath: "\(mock.tlsDirectory)/auth-key.p8", keyID: MockChild.keyID, teamID: MockChild.teamID),
        caFile: "\(mock.tlsDirectory)/ca.pem")
    configuration.loops = 1
    configuration.connectionsPerLoop = 1
    configuration.maxConcurrentStreams = 1000
    let engine = try FanoutEngine(configuration: configuration)
    let headers = NotificationHeaders(
        pushType: .liveactivity, topic: "com.example.bench.push-type.liveactivity", priority: 10)
    let payload = liveActivityPayload(size: 1024)
    func send(_ path: String, expecting count: Int) async throws {
        let job = FanoutJob(id: "probe", headers: headers, payload: .raw(payload), recipients: .file(path: path))
        let summary = try await engine.run(job) { _ in }
        guard summary.counts.delivered == count else {
            throw ProbeError("\(summary.counts.delivered) of \(count) notifications delivered: \(summary.counts)")
        }
    }

    try await send(largeFile, expecting: options.large)  // warm-up
    var allocationsPer: [Double] = []
    var freesPer: [Double] = []
    for _ in 0..<options.runs {
        let start = Counts.now()
        try await send(smallFile, expecting: options.small)
        let middle = Counts.now()
        try await send(largeFile, expecting: options.large)
        let end = Counts.now()
        let small = middle - start
        let large = end - middle
        let extra = Double(options.large - options.small)
        allocationsPer.append(Double(large.allocations - small.allocations) / extra)
        freesPer.append(Double(large.frees - small.frees) / extra)
    }
    await engine.shutdown()
    func figure(_ value: Double) -> String { String(format: "%.3f", value) }
    #if DEBUG
        let build = "debug"
    #else
        let build = "release"
    #endif
    return "{\"scenario\":\"\(options.scenario)\",\"build\":\"\(build)\","
        + "\"allocations_per_notification\":\(figure(allocationsPer.min()!)),"
        + "\"frees_per_notification\":\(figure(freesPer.min()!)),"
        + "\"runs\":[\(allocationsPer.map(figure).joined(separator: ","))],"
        + "\"small\":\(options.small),\"large\":\(options.large)}"
}

do {
    let options = try ProbeOptions.parse(Array(CommandLine.arguments.dropFirst()))
    print(try await probe(options))
} catch {
    FileHandle.standardError.write(Data("alloc-probe: \(error)\n".utf8))
    exit(1)
}
