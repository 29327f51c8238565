import Foundation

/// A child process with its output sent to files, so it can never block on a full pipe.
struct ChildProcess {
    let process: Process
    let stdoutPath: String
    let stderrPath: String

    static func start(_ executable: String, _ arguments: [String], in directory: String) throws -> ChildProcess {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let name = URL(fileURLWithPath: executable).lastPathComponent
        let stdoutPath = "\(directory)/\(name)-\(UUID().uuidString.prefix(8)).out"
        let stderrPath = stdoutPath + ".err"
        _ = FileManager.default.createFile(atPath: stdoutPath, contents: nil)
        _ = FileManager.default.createFile(atPath: stderrPath, contents: nil)
        process.standardOutput = FileHandle(forWritingAtPath: stdoutPath)
        process.standardError = FileHandle(forWritingAtPath: stderrPath)
        try process.run()
        return ChildProcess(process: process, stdoutPath: stdoutPath, stderrPath: stderrPath)
    }

    var output: String { (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "" }
    var errorOutput: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// Waits for the process to end, at most `seconds`; past that SIGTERM, and SIGKILL when that is ignored for
    /// 5 seconds (a server draining its work), so no path waits forever.
    @discardableResult
    func wait(seconds: Double) -> Int32 {
        waitSamplingPeakRSS(seconds: seconds, sample: false).status
    }

    /// `wait(seconds:)`, reading the process's peak RSS (`VmHWM`) at each poll while it runs: the last reading
    /// before it exits, in MB (its own rusage is gone once Foundation has reaped it).
    func waitSamplingPeakRSS(seconds: Double, sample: Bool = true) -> (status: Int32, peakRSSMegabytes: Double) {
        let deadline = Date().addingTimeInterval(seconds)
        var peak = 0.0
        while process.isRunning && Date() < deadline {
            if sample { peak = max(peak, peakRSSMegabytes(ofProcess: process.processIdentifier) ?? 0) }
            usleep(10_000)
        }
        if process.isRunning {
            process.terminate()
            let killAt = Date().addingTimeInterval(5)
            while process.isRunning && Date() < killAt { usleep(10_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
        return (process.terminationStatus, peak)
    }

    func stop() {
        if process.isRunning { kill(process.processIdentifier, SIGTERM) }
        wait(seconds: 10)
    }
}

/// A mock-apns subprocess on a free loopback port, with fresh TLS material.
struct MockProcess {
    let child: ChildProcess
    let port: Int
    let tlsDirectory: String
    static let keyID = "BENCHKEY01"
    static let teamID = "BENCHTEAM1"

    static func start(binDirectory: String, workDirectory: String, threads: Int, extra: [String] = []) throws
        -> MockProcess
    {
        let tls = "\(workDirectory)/tls"
        let child = try ChildProcess.start(
            "\(binDirectory)/mock-apns",
            [
                "--listen", "127.0.0.1:0", "--tls-dir", tls, "--threads", String(threads), "--key-id", keyID,
                "--team-id", teamID,
            ]
                + extra, in: workDirectory)
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            if let line = child.output.split(separator: "\n").first, line.hasPrefix("listening on "),
                let port = Int(line.split(separator: ":").last ?? "")
            {
                return MockProcess(child: child, port: port, tlsDirectory: tls)
            }
            if !child.process.isRunning { break }
            usleep(20_000)
        }
        child.stop()
        throw BenchError("mock-apns did not start: \(child.errorOutput)")
    }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// CPU seconds (user + system) and peak RSS of this process so far.
///
/// Peak RSS is `VmHWM` from /proc/self/status, not `getrusage`'s `ru_maxrss`: Linux carries
/// `ru_maxrss` across execve, so a child spawned by a large parent would report the parent's peak.
func processUsage() -> (cpuSeconds: Double, peakRSSMegabytes: Double) {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    let cpu =
        Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6 + Double(usage.ru_stime.tv_sec)
        + Double(usage.ru_stime.tv_usec) / 1e6
    return (cpu, peakRSSMegabytes(ofProcess: nil) ?? Double(usage.ru_maxrss) / 1024)
}

/// `VmHWM` (peak resident set) of process `pid` (this one when nil) in MB, from /proc; nil once it has exited.
func peakRSSMegabytes(ofProcess pid: Int32?) -> Double? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid.map(String.init) ?? "self")/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
        let kilobytes = line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first.flatMap({
            Double($0)
        })
    else { return nil }
    return kilobytes / 1024
}

/// User + system CPU seconds of a running process so far (/proc/PID/stat), 0 when it cannot be read.
func processCPUSeconds(_ pid: Int32) -> Double {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = stat.lastIndex(of: ")")
    else { return 0 }
    // After the command name: the state is field 3, utime field 14 and stime field 15.
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// The whole machine's CPU time so far, from the first line of /proc/stat (clock ticks): all of it, and the part
/// the hypervisor ran other guests on this machine's virtual CPUs ("steal"), time in which no thread here ran
/// whatever it was owed. A run's share of steal tells a latency tail this code caused from one the host caused.
struct MachineCPUTime {
    var total: Double = 0
    var steal: Double = 0

    static func now() -> MachineCPUTime {
        guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
            let line = text.split(separator: "\n").first, line.hasPrefix("cpu ")
        else { return MachineCPUTime() }
        // user nice system idle iowait irq softirq steal (guest time is already inside user and nice).
        let ticks = line.split(separator: " ").dropFirst().prefix(8).map { Double($0) ?? 0 }
        guard ticks.count == 8 else { return MachineCPUTime() }
        return MachineCPUTime(total: ticks.reduce(0, +), steal: ticks[7])
    }

    /// The percentage of the machine's CPU time between `earlier` and now that was stolen (0 when unknown).
    func stealPercent(since earlier: MachineCPUTime) -> Double {
        let total = self.total - earlier.total
        return total > 0 ? 100 * (steal - earlier.steal) / total : 0
    }
}

/// The median, minimum and maximum of some measurements.
struct Spread: Codable {
    var median: Double
    var min: Double
    var max: Double

    init(_ values: [Double]) {
        let sorted = values.sorted()
        median = sorted.isEmpty ? 0 : sorted[(sorted.count - 1) / 2]
        min = sorted.first ?? 0
        max = sorted.last ?? 0
    }
}

/// Finds a program in PATH (and the sbin directories), nil when absent.
func findTool(_ name: String) -> String? {
    let path = (ProcessInfo.processInfo.environment["PATH"] ?? "") + ":/usr/sbin:/sbin"
    for directory in path.split(separator: ":") {
        let candidate = "\(directory)/\(name)"
        if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
    }
    return nil
}

/// A 64-hex-digit token for index `i`.
func benchToken(_ index: Int) -> String {
    let hex = String(index, radix: 16)
    return "f" + String(repeating: "0", count: 63 - hex.count) + hex
}

/// A Live Activity update payload of exactly `size` bytes (padding in the content state).
func liveActivityPayload(size: Int) -> [UInt8] {
    let head = #"{"aps":{"timestamp":1764460800,"event":"update","content-state":{"score":"2-1","note":""#
    let tail = #""}}}"#
    let padding = max(0, size - head.utf8.count - tail.utf8.count)
    return Array((head + String(repeating: "x", count: padding) + tail).utf8)
}
