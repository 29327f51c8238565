// alloc-probe: heap allocations per notification in steady state, for the allocation test
// (Tests/FanoutIntegrationTests/AllocationTests.swift) and for people cutting allocations.
//
//     alloc-probe [throughput-1c|single-send] [--small N] [--large N] [--runs N]
//
// `throughput-1c` runs that scenario's path: one engine with one loop and one connection of up to 1,000 streams
// sends a job of a 1 KiB Live Activity payload to the tokens of a tokens file, against mock-apns over TLS and
// HTTP/2. `single-send` runs `engine.send`'s, as the single-send scenario and a gateway call it: the same engine
// and payload, one notification per call, each awaited before the next (so what is counted is one call's own
// cost, not what a queue of waiting calls holds); `--small` and `--large` count calls (default 200 and 1,200).
// `single-send --held N` measures instead what each of N calls started at once holds while it waits (the mock
// answers after 4 s, and all but the in-flight limit wait for room): bytes allocated and not yet freed per call,
// after one warm-up send. Output: one JSON line.
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
    var small: Int?
    var large: Int?
    var runs = 5
    /// single-send only: start this many calls at once and report what each holds while waiting.
    var held: Int?

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
            case "--held": options.held = try count()
            case "throughput-1c", "single-send": options.scenario = arguments[index]
            default: throw ProbeError("unknown argument \(arguments[index]); usage: \(usage)")
            }
            index += 1
        }
        guard options.largeCount > options.smallCount else { throw ProbeError("--large must be above --small") }
        guard options.held == nil || options.scenario == "single-send" else {
            throw ProbeError("--held is single-send's")
        }
        return options
    }

    /// Tokens in the small job, or calls in the small series for single-send (each call is a round trip).
    var smallCount: Int { small ?? (scenario == "single-send" ? 200 : 2_000) }
    var largeCount: Int { large ?? (scenario == "single-send" ? 1_200 : 12_000) }

    static let usage = "alloc-probe [throughput-1c|single-send] [--small N] [--large N] [--runs N] [--held N]"
}

/// The counts now, as a value that subtracts.
struct Counts {
    var allocations: Int64
    var frees: Int64
    var bytes: Int64

    static func now() -> Counts {
        let counts = CAllocationCounter_read()
        return Counts(allocations: counts.allocations, frees: counts.frees, bytes: counts.bytes)
    }

    static func - (left: Counts, right: Counts) -> Counts {
        Counts(
            allocations: left.allocations - right.allocations, frees: left.frees - right.frees,
            bytes: left.bytes - right.bytes)
    }
}

/// mock-apns in a child process with fresh TLS material, on a free loopback port.
final class MockChild {
    let process = Process()
    let port: Int
    let tlsDirectory: String
    static let keyID = "PROBEKEY01"
    static let teamID = "PROBETEAM1"

    /// - Parameter extraArguments: more mock-apns flags (`--latency-ms` for `--held`).
    init(binDirectory: String, workDirectory: String, extraArguments: [String] = []) throws {
        tlsDirectory = "\(workDirectory)/tls"
        let output = "\(workDirectory)/mock-apns.out"
        _ = FileManager.default.createFile(atPath: output, contents: nil)
        let executable = "\(binDirectory)/mock-apns"
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw ProbeError("\(executable) is missing: build it too (swift build --product mock-apns)")
        }
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments =
            [
                "--listen", "127.0.0.1:0", "--tls-dir", tlsDirectory, "--threads", "1", "--key-id", Self.keyID,
                "--team-id", Self.teamID,
            ] + extraArguments
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
        throw ProbeError(
            "mock-apns did not start: \((try? String(contentsOfFile: output + ".err", encoding: .utf8)) ?? "")")
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
    for index in 0..<count { text += probeToken(index, first: "a") + "\n" }
    try text.write(toFile: path, atomically: true, encoding: .utf8)
}

/// Token `index` of a series: `first`, then the index in hex, zero-padded to 64 digits.
func probeToken(_ index: Int, first: Character) -> String {
    let hex = String(index, radix: 16)
    return String(first) + String(repeating: "0", count: 63 - hex.count) + hex
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
    let mock = try MockChild(
        binDirectory: binDirectory, workDirectory: work,
        extraArguments: options.held == nil ? [] : ["--latency-ms", String(heldAnswerDelayMilliseconds)])
    defer { mock.stop() }
    let smallFile = "\(work)/tokens-small.txt"
    let largeFile = "\(work)/tokens-large.txt"
    try writeTokensFile(smallFile, count: options.smallCount)
    try writeTokensFile(largeFile, count: options.largeCount)

    // throughput-1c's engine: one loop, one connection, 1,000 streams, the default workspace budget.
    var configuration = FanoutEngineConfiguration(
        endpoint: APNsEndpoint(host: "localhost", port: mock.port),
        credentials: ProviderCredentials(
            keyPath: "\(mock.tlsDirectory)/auth-key.p8", keyID: MockChild.keyID, teamID: MockChild.teamID),
        caFile: "\(mock.tlsDirectory)/ca.pem")
    configuration.loops = 1
    configuration.connectionsPerLoop = 1
    configuration.maxConcurrentStreams = 1000
    if options.scenario == "single-send" {
        // Each call is a job, and the default budget (250,000 jobs an hour, a 60-second burst) would refuse
        // some: a budget no probe reaches, so the limiter still decides every call but never refuses one.
        configuration.rateLimits = try RateLimiterRegistry(defaultBudget: RateBudget(requestsPerHour: 1_000_000_000))
        // `--held` measures what each of N waiting calls holds, so all N must be let in (the default refuses calls
        // past 16,384 under way).
        if let held = options.held { configuration.maxPendingSends = held + 1 }
    }
    let engine = try FanoutEngine(configuration: configuration)
    let headers = NotificationHeaders(
        pushType: .liveactivity, topic: "com.example.bench.push-type.liveactivity", priority: 10)
    let payload = liveActivityPayload(size: 1024)
    let tokens = (0..<options.largeCount).map { probeToken($0, first: "b") }
    /// Sends `count` notifications: one job of a tokens file of that many, or `count` calls of `engine.send`.
    func send(_ count: Int) async throws {
        var delivered = 0
        if options.scenario == "single-send" {
            for token in tokens.prefix(count) {
                let result = try await engine.send(
                    PushNotification(deviceToken: token, headers: headers, payload: payload))
                if result.outcome == .delivered { delivered += 1 }
            }
        } else {
            let path = count == options.smallCount ? smallFile : largeFile
            let job = FanoutJob(id: "probe", headers: headers, payload: .raw(payload), recipients: .file(path: path))
            delivered = try await engine.run(job) { _ in }.counts.delivered
        }
        guard delivered == count else { throw ProbeError("\(delivered) of \(count) notifications delivered") }
    }

    if let held = options.held {
        try await send(1)  // the connection, TLS and the pools (one round trip of 4 s)
        let figures = try await measureHeld(held, engine: engine) { index in
            PushNotification(deviceToken: tokens[index % tokens.count], headers: headers, payload: payload)
        }
        await engine.shutdown(gracePeriod: .zero)
        return figures
    }
    try await send(options.largeCount)  // warm-up
    var allocationsPer: [Double] = []
    var freesPer: [Double] = []
    var bytesPer: [Double] = []
    for _ in 0..<options.runs {
        let start = Counts.now()
        try await send(options.smallCount)
        let middle = Counts.now()
        try await send(options.largeCount)
        let end = Counts.now()
        let small = middle - start
        let large = end - middle
        let extra = Double(options.largeCount - options.smallCount)
        allocationsPer.append(Double(large.allocations - small.allocations) / extra)
        freesPer.append(Double(large.frees - small.frees) / extra)
        bytesPer.append(Double(large.bytes - small.bytes) / extra)
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
        + "\"bytes_per_notification\":\(Int(bytesPer.min()!.rounded())),"
        + "\"runs\":[\(allocationsPer.map(figure).joined(separator: ","))],"
        + "\"small\":\(options.smallCount),\"large\":\(options.largeCount)}"
}

/// How long the mock waits before each answer with `--held`: long enough that every call is still waiting when the
/// counts are read.
let heldAnswerDelayMilliseconds = 4_000

/// Starts `count` calls of `engine.send` at once, each from a task of its own as a gateway makes them, waits until
/// they have all started and stopped to wait (for an answer, or for room in flight), and reports per call the bytes
/// allocated meanwhile (no call has finished, so this is what they hold, plus temporaries already freed: the live
/// allocation count tells them apart) and the growth of the process's resident memory.
func measureHeld(
    _ count: Int, engine: FanoutEngine, notification: @escaping @Sendable (Int) -> PushNotification
) async throws -> String {
    func residentBytes() -> Int {
        let fields = ((try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8)) ?? "").split(separator: " ")
        return fields.count > 1 ? (Int(fields[1]) ?? 0) * Int(sysconf(Int32(_SC_PAGESIZE))) : 0
    }
    let residentBefore = residentBytes()
    let before = Counts.now()
    var tasks: [Task<Void, Never>] = []
    tasks.reserveCapacity(count)
    for index in 0..<count {
        tasks.append(Task { _ = try? await engine.send(notification(index)) })
    }
    // Every call has started and is waiting once the counts stop moving (well before the first answer at 4 s).
    var last = Counts.now()
    for _ in 0..<40 {
        try await Task.sleep(for: .milliseconds(50))
        let now = Counts.now()
        if now.allocations == last.allocations && now.bytes == last.bytes { break }
        last = now
    }
    let held = Counts.now() - before
    let resident = residentBytes() - residentBefore
    let inFlight = engine.inFlight
    guard inFlight > 0 else { throw ProbeError("no call was in flight: the mock answered before the count") }
    for task in tasks { task.cancel() }
    func figure(_ value: Double) -> String { String(format: "%.1f", value) }
    return "{\"scenario\":\"single-send\",\"held\":\(count),\"in_flight\":\(inFlight),"
        + "\"bytes_allocated_per_call\":\(held.bytes / Int64(count)),"
        + "\"live_allocations_per_call\":\(figure(Double(held.allocations - held.frees) / Double(count))),"
        + "\"resident_bytes_per_call\":\(resident / count)}"
}

do {
    let options = try ProbeOptions.parse(Array(CommandLine.arguments.dropFirst()))
    print(try await probe(options))
} catch {
    FileHandle.standardError.write(Data("alloc-probe: \(error)\n".utf8))
    exit(1)
}
