import FanoutCore
import Foundation
import Synchronization

/// follow: `fanout send --follow` (the real binary) reading its job file as a queue, against the shared mock-apns.
///
/// Each run:
///
/// 1. **Following.** `fanout send --jobs FILE --follow` starts on an empty job file, its results on standard output
///    (a pipe the bench reads on a thread of its own, timestamping each read as it returns). One warm-up job opens
///    the connection (TLS, the first provider token), as a sender running for hours did long before; its time is
///    reported apart (`warmup_ms`). Then a producer thread of the bench appends one-token alert jobs at `rate` per
///    second for `duration` seconds: job `i` is due at `start + i / rate` (a fixed schedule, so a stall of the
///    producer or the machine counts against the latency instead of slowing the schedule), each line written with
///    one `write(2)` on an `O_APPEND` descriptor, its time recorded once the write returns. Latency is from each
///    job's due time to the arrival of its results line (p50, p99, p99.9, max; goal p99 <= 10 ms); beside it the
///    latency from the write's return, the producer's lag, and the engine's own wire time (`latency_ms` of the
///    results line: first sent to answered, on the loop's millisecond clock). Once every job's results line has
///    arrived, SIGTERM: the sender must finish and exit 0 with the summary as its last line. Its CPU time (user +
///    system, from `wait4`'s rusage of that child) per job, and the same read from /proc between the schedule's
///    start and the last result (the steady state, without start-up and warm-up).
/// 2. **A finished file.** `fanout send --jobs FILE` (no `--follow`) of the same jobs, the same file once complete,
///    its results to a pipe read the same way: its CPU per job, and `cpu_vs_file` (goal <= 2).
/// 3. **Each line at once.** Step 1 again with `--follow-linger 0` (the default, 5 ms, reads a burst's lines
///    together): its latency and CPU per job, `*_linger0` in the JSON, for the trade the default makes.
///
/// Both senders run 1 loop x 2 connections (as serve, broadcast and fleet), 16 jobs in flight (the default), with a
/// budget of 10^9 jobs an hour: the default (250,000 an hour, a burst of 60 seconds of it) would hold priority-10
/// jobs back after about 3,300 of them, at 1,000 a second, and the latency would be the budget's. --quick: 1 s.
func runFollow(_ bench: BenchContext) throws {
    let rate = 1_000.0
    let duration = bench.quick ? 1.0 : 10.0
    let jobs = Int(rate * duration)
    let loops = 1
    let connections = 2
    let fanout = "\(bench.bin)/fanout"
    guard FileManager.default.isExecutableFile(atPath: fanout) else {
        throw BenchError("follow needs the fanout binary beside fanout-bench (swift build --product fanout)")
    }
    let work = "\(bench.work)/follow"
    // The job files in a directory of their own: the sender watches the job file's directory.
    let queues = "\(work)/queue"
    try FileManager.default.createDirectory(atPath: queues, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let loadBefore = loadAverage()

    let configPath = "\(work)/send.json"
    _ = FileManager.default.createFile(
        atPath: configPath,
        contents: Data(#"{"rate_limits": {"default": {"requests_per_hour": 1000000000, "burst_seconds": 60}}}"#.utf8))
    let mock = bench.mock
    let arguments = [
        "--config", configPath, "--endpoint", "localhost:\(mock.port)", "--ca-file", "\(mock.tlsDirectory)/ca.pem",
        "--key", "\(mock.tlsDirectory)/auth-key.p8", "--key-id", MockProcess.keyID, "--team-id", MockProcess.teamID,
        "--loops", String(loops), "--connections", String(connections), "--progress", "never",
    ]
    let lines = FollowJobLines(jobs: jobs)
    let timeout: Double = bench.quick ? 30 : 120

    var follows: [[String: Any]] = []
    var files: [[String: Any]] = []
    var eachAtOnce: [[String: Any]] = []
    for run in 0..<bench.runs {
        let queue = "\(queues)/queue-\(run).jsonl"
        follows.append(
            try measureFollow(
                fanout: fanout, arguments: arguments, queue: queue, lines: lines, rate: rate, work: work, run: run,
                timeout: timeout))
        files.append(
            try measureFinishedFile(
                fanout: fanout, arguments: arguments, jobsFile: queue, jobs: jobs + 1, work: work, run: run,
                timeout: timeout))
        try? FileManager.default.removeItem(atPath: queue)
        eachAtOnce.append(
            try measureFollow(
                fanout: fanout, arguments: arguments + ["--follow-linger", "0"], queue: queue, lines: lines,
                rate: rate, work: work, run: run, timeout: timeout))
        try? FileManager.default.removeItem(atPath: queue)
    }
    let loadAfter = loadAverage()

    let p50 = spread(follows, "latency_ms_p50")
    let p99 = spread(follows, "latency_ms_p99")
    let p999 = spread(follows, "latency_ms_p999")
    let maxLatency = spread(follows, "latency_ms_max")
    let writeP50 = spread(follows, "write_latency_ms_p50")
    let writeP99 = spread(follows, "write_latency_ms_p99")
    let lagP99 = spread(follows, "producer_lag_ms_p99")
    let lagMax = spread(follows, "producer_lag_ms_max")
    let wireP50 = spread(follows, "wire_ms_p50")
    let wireP99 = spread(follows, "wire_ms_p99")
    let outsideP50 = spread(follows, "outside_wire_ms_p50")
    let outsideP99 = spread(follows, "outside_wire_ms_p99")
    let achieved = spread(follows, "rate")
    let cpu = spread(follows, "cpu_us_per_job")
    let cpuSchedule = spread(follows, "schedule_cpu_us_per_job")
    let fileCPU = spread(files, "cpu_us_per_job")
    let fileSeconds = spread(files, "wall_seconds")
    let fileRate = spread(files, "rate")
    let ratio = cpu.median / max(fileCPU.median, 1e-9)
    let pairRatios = Spread(
        zip(follows, files).map { number($0["cpu_us_per_job"]) / max(number($1["cpu_us_per_job"]), 1e-9) })
    let atOnceP99 = spread(eachAtOnce, "latency_ms_p99")
    let atOnceCPU = spread(eachAtOnce, "cpu_us_per_job")
    let atOnceRatio = atOnceCPU.median / max(fileCPU.median, 1e-9)
    let cores = ProcessInfo.processInfo.activeProcessorCount
    print(
        String(
            format: "follow: %d cores, load average %.2f %.2f %.2f before, %.2f %.2f %.2f after; fanout send "
                + "--follow, %d loop(s) x %d connection(s); %d one-token alert jobs appended at %.0f/s for %.0f s",
            cores, loadBefore[0], loadBefore[1], loadBefore[2], loadAfter[0], loadAfter[1], loadAfter[2], loops,
            connections, jobs, rate, duration))
    print(
        String(
            format: "follow latency, scheduled append to results line: p50 %.2f ms [%.2f-%.2f], p99 %.2f ms "
                + "[%.2f-%.2f] (goal p99 <= 10 ms), p99.9 %.2f ms [%.2f-%.2f], max %.2f ms [%.2f-%.2f]; "
                + "%.0f jobs/s [%.0f-%.0f] to the last result", p50.median, p50.min, p50.max, p99.median, p99.min,
            p99.max, p999.median, p999.min, p999.max, maxLatency.median, maxLatency.min, maxLatency.max,
            achieved.median, achieved.min, achieved.max))
    print(
        String(
            format: "follow latency, where it went: from the write's return p50 %.2f ms, p99 %.2f ms; producer lag "
                + "p99 %.3f ms, max %.2f ms; the engine's wire time (sent to answered, whole ms) p50 %.0f ms, "
                + "p99 %.0f ms; the rest (file wake-up, read, parse, job start, results write, pipe, the bench's "
                + "read) p50 %.2f ms, p99 %.2f ms; warm-up job %.1f ms; SIGTERM to exit %.1f ms",
            writeP50.median, writeP99.median, lagP99.median, lagMax.median, wireP50.median, wireP99.median,
            outsideP50.median, outsideP99.median, spread(follows, "warmup_ms").median,
            spread(follows, "drain_ms").median))
    print(
        String(
            format: "follow CPU: %.1f us per job [%.1f-%.1f] for the whole process (%.2f CPU s, %.1f us per job "
                + "during the schedule, start-up and warm-up left out); a finished file (fanout send --jobs, "
                + "no --follow): %.1f us per job [%.1f-%.1f], %.2f s spawn to exit (%.0f jobs/s); cpu_vs_file %.2f "
                + "[%.2f-%.2f pair by pair] (goal <= 2); follow peak RSS %.0f MB", cpu.median, cpu.min, cpu.max,
            spread(follows, "cpu_seconds").median, cpuSchedule.median, fileCPU.median, fileCPU.min, fileCPU.max,
            fileSeconds.median, fileRate.median, ratio, pairRatios.min, pairRatios.max,
            spread(follows, "peak_rss_mb").median))
    print(
        String(
            format: "follow with --follow-linger 0 (each line read at once; the default lingers 5 ms): p99 %.2f ms "
                + "[%.2f-%.2f], %.1f us per job [%.1f-%.1f], cpu_vs_file %.2f", atOnceP99.median, atOnceP99.min,
            atOnceP99.max, atOnceCPU.median, atOnceCPU.min, atOnceCPU.max, atOnceRatio))
    bench.record([
        "scenario": "follow", "notifications": jobs, "jobs": jobs, "target_rate": rate, "duration": duration,
        "seconds": spread(follows, "seconds").median, "rate": achieved.median, "rate_min": achieved.min,
        "rate_max": achieved.max, "cpu_seconds": spread(follows, "cpu_seconds").median,
        "peak_rss_mb": spread(follows, "peak_rss_mb").median, "cores": cores, "load_average_before": loadBefore,
        "load_average_after": loadAfter, "loops": loops, "connections": connections,
        "latency_ms_p50": p50.median, "latency_ms_p50_min": p50.min, "latency_ms_p50_max": p50.max,
        "latency_ms_p99": p99.median, "latency_ms_p99_min": p99.min, "latency_ms_p99_max": p99.max,
        "latency_ms_p999": p999.median, "latency_ms_p999_min": p999.min, "latency_ms_p999_max": p999.max,
        "latency_ms_max": maxLatency.median, "latency_ms_max_min": maxLatency.min,
        "latency_ms_max_max": maxLatency.max, "write_latency_ms_p50": writeP50.median,
        "write_latency_ms_p99": writeP99.median, "producer_lag_ms_p99": lagP99.median,
        "producer_lag_ms_max": lagMax.median, "wire_ms_p50": wireP50.median, "wire_ms_p99": wireP99.median,
        "outside_wire_ms_p50": outsideP50.median, "outside_wire_ms_p99": outsideP99.median,
        "warmup_ms": spread(follows, "warmup_ms").median, "drain_ms": spread(follows, "drain_ms").median,
        "cpu_us_per_job": cpu.median, "cpu_us_per_job_min": cpu.min, "cpu_us_per_job_max": cpu.max,
        "schedule_cpu_us_per_job": cpuSchedule.median, "file_cpu_us_per_job": fileCPU.median,
        "file_cpu_us_per_job_min": fileCPU.min, "file_cpu_us_per_job_max": fileCPU.max,
        "file_seconds": fileSeconds.median, "file_rate": fileRate.median, "cpu_vs_file": ratio,
        "cpu_vs_file_min": pairRatios.min, "cpu_vs_file_max": pairRatios.max,
        "latency_ms_p99_linger0": atOnceP99.median,
        "latency_ms_p50_linger0": spread(eachAtOnce, "latency_ms_p50").median,
        "cpu_us_per_job_linger0": atOnceCPU.median, "cpu_vs_file_linger0": atOnceRatio,
        "key_figure": String(
            format: "p99 %.2f ms (goal <= 10), CPU x%.2f of a finished file (goal <= 2)", p99.median, ratio),
    ])
}

// MARK: One run following the queue

/// One `fanout send --follow` run: the warm-up job, the schedule, every result, SIGTERM and the exit.
private func measureFollow(
    fanout: String, arguments: [String], queue: String, lines: FollowJobLines, rate: Double, work: String, run: Int,
    timeout: Double
) throws -> [String: Any] {
    let jobs = lines.jobs
    _ = FileManager.default.createFile(atPath: queue, contents: nil)
    let descriptor = open(queue, O_WRONLY | O_APPEND)
    guard descriptor >= 0 else { throw BenchError("follow: cannot open \(queue) for appending") }
    defer { close(descriptor) }

    let child = try PipedChild(
        fanout, ["send", "--jobs", queue, "--follow"] + arguments, stderrPath: "\(work)/follow-\(run).err")
    let reader = FollowResultsReader(jobs: jobs)
    reader.start(descriptor: child.stdout)
    // However the run ends, the child is gone and its output read to the end before this returns.
    var exited: PipedChild.Exit?
    defer {
        if exited == nil {
            kill(child.pid, SIGKILL)
            _ = child.wait(timeout: 10)
        }
        reader.waitForEnd(timeout: 10)
    }
    func failure(_ what: String) -> BenchError {
        BenchError("follow: \(what); fanout send --follow said: \(child.errorOutput.suffix(1500))")
    }

    // The warm-up job opens the connection; the schedule starts once its result is in.
    let warmupWritten = monotonicNanoseconds()
    try lines.write(lines.warmup, to: descriptor)
    guard reader.waitForWarmup(timeout: 30) else { throw failure("no result for the warm-up job within 30 s") }
    let warmupMilliseconds = Double(reader.warmupArrival &- warmupWritten) / 1e6

    let cpuBefore = processCPUSeconds(child.pid)
    let appended = CompletionLog(count: jobs)
    // A millisecond's lead, so that the first job is not already late when the thread starts.
    let start = monotonicNanoseconds() + 1_000_000
    let interval = 1e9 / rate
    @Sendable func due(_ index: Int) -> UInt64 { start + UInt64((Double(index) * interval).rounded()) }
    let produced = DispatchSemaphore(value: 0)
    let producerError = FanoutMutex<String?>(nil)
    Thread.detachNewThread {
        defer { produced.signal() }
        for index in 0..<jobs {
            sleepUntil(due(index))
            do {
                try lines.write(index, to: descriptor)
            } catch {
                producerError.withLock { $0 = "\(error)" }
                return
            }
            appended.finished(index)
        }
    }
    produced.wait()
    if let error = producerError.withLock({ $0 }) { throw failure("the producer stopped: \(error)") }
    guard reader.waitForResults(timeout: timeout) else {
        throw failure(
            "\(reader.received) of \(jobs) results lines within \(Int(timeout)) s of the last append")
    }
    let lastResult = reader.lastArrival
    let scheduleCPU = processCPUSeconds(child.pid) - cpuBefore
    let peakRSS = peakRSSMegabytes(ofProcess: child.pid) ?? 0

    // SIGTERM: the jobs started finish (all have), the summary is the last line, exit 0.
    let terminated = monotonicNanoseconds()
    kill(child.pid, SIGTERM)
    exited = child.wait(timeout: 30)
    let drainMilliseconds = Double(monotonicNanoseconds() - terminated) / 1e6
    guard reader.waitForEnd(timeout: 10) else { throw failure("its standard output was not closed at exit") }
    guard let exit = exited, exit.status == 0 else {
        throw failure("exit \(exited.map { String($0.status) } ?? "none") after SIGTERM")
    }
    try reader.check(jobs: jobs + 1, label: "fanout send --follow")

    let latencies = reader.arrivals.latencies(since: start, due: due).sorted
    let fromWrite = reader.arrivals.latencies(since: start) { appended.slots[$0] }.sorted
    let lag = appended.latencies(since: start, due: due).sorted
    let wire = reader.wire.latencies(since: 0) { _ in 1 }.sorted
    // Per job, the latency from the write's return less the engine's own wire time: the sender's reading and
    // writing, the hops between its threads, the pipe and the bench's read.
    var outside: [Double] = []
    outside.reserveCapacity(jobs)
    for index in 0..<jobs where reader.arrivals.slots[index] != 0 && reader.wire.slots[index] != 0 {
        let total = Double(Int64(bitPattern: reader.arrivals.slots[index] &- appended.slots[index])) / 1e6
        outside.append(total - Double(reader.wire.slots[index] - 1) / 1e6)
    }
    outside.sort()
    let seconds = Double(lastResult &- start) / 1e9
    return [
        "jobs": jobs, "seconds": seconds, "rate": Double(jobs) / max(seconds, 1e-9),
        "latency_ms_p50": nearestRank(latencies, 50), "latency_ms_p99": nearestRank(latencies, 99),
        "latency_ms_p999": nearestRank(latencies, 99.9), "latency_ms_max": latencies.last ?? 0,
        "write_latency_ms_p50": nearestRank(fromWrite, 50), "write_latency_ms_p99": nearestRank(fromWrite, 99),
        "producer_lag_ms_p99": nearestRank(lag, 99), "producer_lag_ms_max": lag.last ?? 0,
        "wire_ms_p50": nearestRank(wire, 50), "wire_ms_p99": nearestRank(wire, 99),
        "outside_wire_ms_p50": nearestRank(outside, 50), "outside_wire_ms_p99": nearestRank(outside, 99),
        "warmup_ms": warmupMilliseconds, "drain_ms": drainMilliseconds, "cpu_seconds": exit.cpuSeconds,
        "cpu_us_per_job": exit.cpuSeconds / Double(jobs + 1) * 1e6,
        "schedule_cpu_us_per_job": scheduleCPU / Double(jobs) * 1e6, "peak_rss_mb": peakRSS,
    ]
}

/// `fanout send --jobs FILE` of the finished job file (no `--follow`), its results to a pipe read as the followed
/// run's are: spawn to exit, and its CPU.
private func measureFinishedFile(
    fanout: String, arguments: [String], jobsFile: String, jobs: Int, work: String, run: Int, timeout: Double
) throws -> [String: Any] {
    let started = monotonicNanoseconds()
    let child = try PipedChild(fanout, ["send", "--jobs", jobsFile] + arguments, stderrPath: "\(work)/file-\(run).err")
    let reader = FollowResultsReader(jobs: jobs)
    reader.start(descriptor: child.stdout)
    let exit = child.wait(timeout: timeout, samplePeakRSS: true)
    let wall = Double(monotonicNanoseconds() - started) / 1e9
    guard reader.waitForEnd(timeout: 10), exit.status == 0 else {
        throw BenchError(
            "follow: fanout send --jobs of the finished file failed (exit \(exit.status)): "
                + "\(child.errorOutput.suffix(1500))")
    }
    try reader.check(jobs: jobs, label: "fanout send --jobs (finished file)")
    return [
        "wall_seconds": wall, "rate": Double(jobs) / max(wall, 1e-9), "cpu_seconds": exit.cpuSeconds,
        "cpu_us_per_job": exit.cpuSeconds / Double(jobs) * 1e6, "peak_rss_mb": exit.peakRSSMegabytes,
    ]
}

// MARK: The job lines

/// Every job line of a run, made before the schedule starts (the producer only writes): `f-0` ... `f-(jobs-1)`,
/// each a one-token alert, and the warm-up job `f-warmup`.
private struct FollowJobLines {
    let jobs: Int
    private let bytes: [UInt8]
    /// Where line `i` starts in `bytes`; line `jobs` is the warm-up job.
    private let offsets: [Int]

    var warmup: Int { jobs }

    init(jobs: Int) {
        self.jobs = jobs
        var bytes: [UInt8] = []
        var offsets: [Int] = []
        for index in 0...jobs {
            offsets.append(bytes.count)
            let id = index == jobs ? "f-warmup" : "f-\(index)"
            bytes += Array(
                (#"{"id": "\#(id)", "topic": "com.example.bench", "push_type": "alert", "#
                    + #""payload": {"aps": {"alert": "x"}}, "tokens": ["\#(benchToken(index))"]}"# + "\n").utf8)
        }
        offsets.append(bytes.count)
        self.bytes = bytes
        self.offsets = offsets
    }

    /// Appends line `index` with one write(2) (`descriptor` is open with `O_APPEND`).
    func write(_ index: Int, to descriptor: Int32) throws {
        let count = offsets[index + 1] - offsets[index]
        let written = bytes.withUnsafeBytes { Foundation.write(descriptor, $0.baseAddress! + offsets[index], count) }
        guard written == count else {
            throw BenchError("write of job line \(index): \(written < 0 ? String(cString: strerror(errno)) : "short")")
        }
    }
}

// MARK: The results on the child's standard output

/// Reads a sender's standard output on a thread of its own until EOF: the arrival time of each job's results line
/// (the time its read returned), the engine's wire time from it, its outcome, and the other lines (the summary).
private final class FollowResultsReader: @unchecked Sendable {
    // @unchecked Sendable: everything but the atomics is written by the reading thread only, and read after `ended`
    // is signalled (or, for `arrivals` and `warmupArrival`, after the atomic count says they are written).
    let jobs: Int
    /// By job index: when its results line arrived (monotonic nanoseconds).
    let arrivals: CompletionLog
    /// By job index: the results line's `latency_ms`, in nanoseconds + 1 (so 0 ms is still recorded).
    let wire: CompletionLog
    private(set) var warmupArrival: UInt64 = 0
    private(set) var lastArrival: UInt64 = 0
    private var results = 0
    private var delivered = 0
    private var duplicates = 0
    private var otherLines: [String] = []
    private var firstProblem: String?
    private let receivedCount = Atomic<Int>(0)
    private let warmupSeen = Atomic<Bool>(false)
    private let ended = DispatchSemaphore(value: 0)
    private let endedFlag = Atomic<Bool>(false)

    init(jobs: Int) {
        self.jobs = jobs
        arrivals = CompletionLog(count: jobs)
        wire = CompletionLog(count: jobs)
    }

    /// Job results lines received so far (the warm-up job's included).
    var received: Int { receivedCount.load(ordering: .acquiring) }

    func start(descriptor: Int32) {
        Thread.detachNewThread { [self] in
            defer {
                close(descriptor)
                endedFlag.store(true, ordering: .releasing)
                ended.signal()
            }
            var chunk = [UInt8](repeating: 0, count: 1 << 16)
            var pending: [UInt8] = []
            while true {
                let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress!, $0.count) }
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { break }
                let now = monotonicNanoseconds()
                pending.append(contentsOf: chunk[0..<count])
                var lineStart = 0
                while let newline = pending[lineStart...].firstIndex(of: UInt8(ascii: "\n")) {
                    take(pending[lineStart..<newline], at: now)
                    lineStart = newline + 1
                }
                pending.removeFirst(lineStart)
            }
            if !pending.isEmpty { otherLines.append(String(decoding: pending, as: UTF8.self)) }
        }
    }

    private static let resultPrefix = Array(#"{"job":"f-"#.utf8)

    private func take(_ line: ArraySlice<UInt8>, at now: UInt64) {
        guard line.starts(with: Self.resultPrefix) else {
            otherLines.append(String(decoding: line, as: UTF8.self))
            return
        }
        let text = String(decoding: line, as: UTF8.self)
        results += 1
        if text.contains(#""outcome":"delivered""#) {
            delivered += 1
        } else if firstProblem == nil {
            firstProblem = text
        }
        var cursor = line.startIndex + Self.resultPrefix.count
        var index = 0
        var digits = 0
        while cursor < line.endIndex, line[cursor] >= UInt8(ascii: "0"), line[cursor] <= UInt8(ascii: "9") {
            index = index * 10 + Int(line[cursor] - UInt8(ascii: "0"))
            digits += 1
            cursor += 1
        }
        if digits == 0 {
            warmupArrival = now
            warmupSeen.store(true, ordering: .releasing)
        } else if index < jobs {
            if arrivals.slots[index] != 0 { duplicates += 1 }
            arrivals.record(index, now)
            if let range = text.range(of: #""latency_ms":"#) {
                let number = text[range.upperBound...].prefix { $0.isNumber || $0 == "." }
                wire.record(index, UInt64((Double(number) ?? 0) * 1e6) + 1)
            }
        }
        lastArrival = now
        receivedCount.wrappingAdd(1, ordering: .releasing)
    }

    func waitForWarmup(timeout: Double) -> Bool {
        poll(timeout: timeout) { warmupSeen.load(ordering: .acquiring) }
    }

    /// Waits until the warm-up job's and `jobs` more results lines are in.
    func waitForResults(timeout: Double) -> Bool {
        poll(timeout: timeout) { received >= jobs + 1 }
    }

    private func poll(timeout: Double, _ done: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while !done() {
            if endedFlag.load(ordering: .acquiring) || Date() >= deadline { return done() }
            usleep(1_000)
        }
        return true
    }

    /// Waits for the end of the output (the child gone, the pipe closed).
    @discardableResult
    func waitForEnd(timeout: Double) -> Bool {
        if endedFlag.load(ordering: .acquiring) { return true }
        guard ended.wait(timeout: .now() + timeout) == .success else { return false }
        ended.signal()
        return true
    }

    /// After the end: one delivered results line per job, no duplicate, and the summary as the last line, counting
    /// `jobs` delivered.
    func check(jobs: Int, label: String) throws {
        if let firstProblem { throw BenchError("\(label): a job not delivered: \(firstProblem)") }
        guard results == jobs, delivered == jobs, duplicates == 0 else {
            throw BenchError(
                "\(label): \(results) results lines, \(delivered) delivered, \(duplicates) duplicate(s), for \(jobs) "
                    + "jobs")
        }
        guard let last = otherLines.last, otherLines.count == 1,
            let object = try? JSONSerialization.jsonObject(with: Data(last.utf8)) as? [String: Any],
            Int(number(object["delivered"])) == jobs, Int(number(object["jobs"])) == jobs
        else {
            throw BenchError(
                "\(label): want the summary (\(jobs) jobs delivered) as the one line after the results, have "
                    + "\(otherLines.suffix(3))")
        }
    }
}

// MARK: A child with its standard output on a pipe

/// A child started with `posix_spawn`, its standard output a pipe (`stdout`, the read end) and its standard error a
/// file; reaped with `wait4`, so that its own CPU time is known (Foundation's `Process` reaps its children itself).
private struct PipedChild {
    struct Exit {
        /// The exit code; 128 + the signal when a signal ended it.
        var status: Int32
        var cpuSeconds: Double
        var peakRSSMegabytes: Double
    }

    let pid: pid_t
    let stdout: Int32
    let stderrPath: String

    init(_ executable: String, _ arguments: [String], stderrPath: String) throws {
        var pipeEnds: [Int32] = [-1, -1]
        guard pipe(&pipeEnds) == 0 else { throw BenchError("pipe: \(String(cString: strerror(errno)))") }
        // Neither end leaks into other children; dup2 onto 1 clears the flag there.
        for end in pipeEnds { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, pipeEnds[1], 1)
        posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        // Default dispositions and no blocked signal (the bench ignores SIGPIPE, and a thread may block others).
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var all = sigset_t()
        sigfillset(&all)
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid = pid_t()
        let result = posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
        close(pipeEnds[1])
        guard result == 0 else {
            close(pipeEnds[0])
            throw BenchError("cannot start \(executable): \(String(cString: strerror(result)))")
        }
        self.pid = pid
        stdout = pipeEnds[0]
        self.stderrPath = stderrPath
    }

    var errorOutput: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// Reaps the child (SIGKILL past `timeout`): its exit status, CPU seconds (user + system, its rusage) and, with
    /// `samplePeakRSS`, its peak RSS read at each 5 ms poll while it runs.
    func wait(timeout: Double, samplePeakRSS: Bool = false) -> Exit {
        let deadline = Date().addingTimeInterval(timeout)
        var peak = 0.0
        var status: Int32 = 0
        var usage = rusage()
        var killed = false
        while true {
            let reaped = wait4(pid, &status, WNOHANG, &usage)
            if reaped == pid { break }
            if reaped < 0 && errno != EINTR {
                return Exit(status: -1, cpuSeconds: 0, peakRSSMegabytes: peak)
            }
            if samplePeakRSS { peak = max(peak, peakRSSMegabytes(ofProcess: pid) ?? 0) }
            if !killed && Date() >= deadline {
                kill(pid, SIGKILL)
                killed = true
            }
            usleep(5_000)
        }
        let cpu =
            Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6 + Double(usage.ru_stime.tv_sec)
            + Double(usage.ru_stime.tv_usec) / 1e6
        let signal = status & 0x7f
        return Exit(
            status: signal == 0 ? (status >> 8) & 0xff : 128 + signal, cpuSeconds: cpu, peakRSSMegabytes: peak)
    }
}

// MARK: Time

/// CLOCK_MONOTONIC in nanoseconds: every time of this scenario (the schedule, the writes, the arrivals).
private func monotonicNanoseconds() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

/// Sleeps until `deadline` (monotonic nanoseconds); returns at once when it has passed.
private func sleepUntil(_ deadline: UInt64) {
    var time = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
    while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &time, nil) == EINTR {}
}
