import CommandLineSupport
import Fanout
import FanoutCore
import FanoutPolicy
import Foundation

// MARK: Child mode: one measured run in a clean process

/// What one child run does: `fanout-bench --child MODE --port N ...`. Modes:
/// - `job`: one job to `tokens` tokens (or the tokens file).
/// - `many-jobs`: `jobs` jobs of `tokens` tokens each, distinct payloads, `inFlightJobs` at a time.
/// - `load`: open loop at `rate` notifications per second for `duration` seconds.
/// - `single-send`: `engine.send` of one notification each, from a task of its own, at `rate` per second for
///   `duration` seconds.
/// - `registry-import`, `registry-resolve`, `registry-job`: the registry scenario's runs (Scenarios/Registry.swift).
///
/// The child prints one JSON line with its figures, CPU seconds and peak RSS.
struct ChildOptions {
    var mode = "job"
    var port = 0
    var caFile = ""
    var keyFile = ""
    var tokens = 0
    var tokensFile: String?
    var loops = 1
    var connections = 1
    var streams = 1000
    var payloadBytes = 1024
    var jobs = 0
    var inFlightJobs = 64
    var rate = 0.0
    var duration = 0.0
    /// Exit 0 even when some notifications did not end `delivered` (the faults scenario).
    var allowFailures = false
    /// single-send: start each send's task with the engine's `sendExecutor()` as its preference (on a loop thread).
    var onLoop = false
    /// The registry file (the registry modes).
    var registry: String?
    /// The activity whose tokens are read or sent to (the registry modes).
    var activity: String?
    /// `apnsIDs = .fanout`: the engine gives each notification a random id and sends it (the old behaviour), instead
    /// of the default `.apns` (no `apns-id` sent, APNs assigns one). throughput-1c and -4c measure both.
    var fanoutIDs = false

    func arguments() -> [String] {
        var arguments = [
            mode, "--port", String(port), "--ca", caFile, "--key", keyFile, "--tokens", String(tokens), "--loops",
            String(loops), "--connections", String(connections), "--streams", String(streams), "--payload-bytes",
            String(payloadBytes), "--jobs", String(jobs), "--in-flight-jobs", String(inFlightJobs), "--rate",
            String(rate), "--duration", String(duration),
        ]
        if let tokensFile { arguments += ["--tokens-file", tokensFile] }
        if allowFailures { arguments.append("--allow-failures") }
        if onLoop { arguments.append("--on-loop") }
        if let registry { arguments += ["--registry", registry] }
        if let activity { arguments += ["--activity", activity] }
        if fanoutIDs { arguments.append("--fanout-ids") }
        return arguments
    }

    static func parse(_ arguments: [String]) throws(UsageError) -> ChildOptions {
        var options = ChildOptions()
        guard let mode = arguments.first else { throw UsageError("--child needs a mode") }
        options.mode = mode
        var cursor = ArgumentCursor(Array(arguments.dropFirst()))
        while let flag = try cursor.nextFlag() {
            switch flag {
            case "--port": options.port = try cursor.int(in: 1...65535)
            case "--ca": options.caFile = try cursor.string()
            case "--key": options.keyFile = try cursor.string()
            case "--tokens": options.tokens = try cursor.int(in: 0...Int.max)
            case "--tokens-file": options.tokensFile = try cursor.string()
            case "--loops": options.loops = try cursor.int(in: 1...64)
            case "--connections": options.connections = try cursor.int(in: 1...64)
            case "--streams": options.streams = try cursor.int(in: 1...100_000)
            case "--payload-bytes": options.payloadBytes = try cursor.int(in: 0...4096)
            case "--jobs": options.jobs = try cursor.int(in: 0...Int.max)
            case "--in-flight-jobs": options.inFlightJobs = try cursor.int(in: 1...100_000)
            case "--rate": options.rate = try cursor.double(in: 0...1e9)
            case "--duration": options.duration = try cursor.double(in: 0...1e6)
            case "--allow-failures": options.allowFailures = true
            case "--on-loop": options.onLoop = true
            case "--registry": options.registry = try cursor.string()
            case "--activity": options.activity = try cursor.string()
            case "--fanout-ids": options.fanoutIDs = true
            default: throw UsageError("--child: unknown option \(flag)")
            }
        }
        return options
    }

    /// The engine configuration every mode shares. `unlimitedJobs` swaps the default workspace budget
    /// (250,000 jobs an hour, a 60-second burst) for one no bench run reaches, so the limiter still
    /// decides every job but never refuses one.
    func engineConfiguration(unlimitedJobs: Bool) throws -> FanoutEngineConfiguration {
        var configuration = FanoutEngineConfiguration(
            endpoint: APNsEndpoint(host: "localhost", port: port),
            credentials: ProviderCredentials(keyPath: keyFile, keyID: MockProcess.keyID, teamID: MockProcess.teamID),
            caFile: caFile)
        configuration.loops = loops
        configuration.connectionsPerLoop = connections
        configuration.maxConcurrentStreams = streams
        if fanoutIDs { configuration.apnsIDs = .fanout }
        if unlimitedJobs {
            configuration.rateLimits = try RateLimiterRegistry(
                defaultBudget: RateBudget(requestsPerHour: 1_000_000_000))
        }
        return configuration
    }
}

let benchTopic = "com.example.bench.push-type.liveactivity"
let benchHeaders = NotificationHeaders(pushType: .liveactivity, topic: benchTopic, priority: 10)

func runChild(_ arguments: [String]) async -> Int32 {
    do {
        let options = try ChildOptions.parse(arguments)
        let line: [String: Any]
        var ok: Bool
        switch options.mode {
        case "job": (line, ok) = try await childJob(options)
        case "many-jobs": (line, ok) = try await childManyJobs(options)
        case "load": (line, ok) = try await childLoad(options)
        case "single-send": (line, ok) = try await childSingleSend(options)
        case "registry-import": (line, ok) = try await childRegistryImport(options)
        case "registry-resolve": (line, ok) = try await childRegistryResolve(options)
        case "registry-job": (line, ok) = try await childRegistryJob(options)
        default: throw UsageError("--child: unknown mode \(options.mode)")
        }
        if options.allowFailures { ok = true }
        print(String(decoding: try JSONSerialization.data(withJSONObject: line, options: [.sortedKeys]), as: UTF8.self))
        return ok ? 0 : 1
    } catch {
        FileHandle.standardError.write(Data("fanout-bench --child: \(error)\n".utf8))
        return 1
    }
}

/// Outcome counts as JSON fields.
func countFields(_ counts: OutcomeCounts) -> [String: Any] {
    [
        "delivered": counts.delivered, "rejected": counts.rejected, "unregistered": counts.unregistered,
        "failed": counts.failed, "expired": counts.expired, "rate_limited": counts.rateLimited,
        "invalid": counts.invalid, "retries": counts.retries,
    ]
}

func addCounts(_ total: inout OutcomeCounts, _ counts: OutcomeCounts) {
    total.delivered += counts.delivered
    total.rejected += counts.rejected
    total.unregistered += counts.unregistered
    total.failed += counts.failed
    total.expired += counts.expired
    total.rateLimited += counts.rateLimited
    total.invalid += counts.invalid
    total.retries += counts.retries
}

func seconds(since start: DispatchTime) -> Double {
    Double(DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds) / 1e9
}

/// One job to all its tokens (throughput, scaling, faults, the Fanout side of peer-aioapns).
func childJob(_ options: ChildOptions) async throws -> ([String: Any], Bool) {
    let recipients: Recipients =
        options.tokensFile.map { .file(path: $0) } ?? .tokens((0..<options.tokens).map(benchToken))
    let job = FanoutJob(
        id: "bench", headers: benchHeaders, payload: .raw(liveActivityPayload(size: options.payloadBytes)),
        recipients: recipients)
    let engine = try FanoutEngine(configuration: options.engineConfiguration(unlimitedJobs: false))
    let before = processUsage()
    let start = DispatchTime.now()
    let summary = try await engine.run(job) { _ in }
    let elapsed = seconds(since: start)
    let after = processUsage()
    await engine.shutdown()
    var line: [String: Any] = [
        "notifications": summary.notifications, "seconds": elapsed,
        "rate": Double(summary.counts.delivered) / elapsed, "cpu_seconds": after.cpuSeconds - before.cpuSeconds,
        "peak_rss_mb": after.peakRSSMegabytes, "payload_encodings": summary.payloadEncodings,
    ]
    line.merge(countFields(summary.counts)) { $1 }
    return (line, summary.counts.delivered == summary.notifications)
}

/// Padding for `liveActivityContent`, made once: `String(repeating:count:)` of a String appends it one copy at a
/// time (16 µs for 850 bytes), which many-jobs paid for every job and counted as Fanout's CPU (1.6 µs of its 7 µs per
/// notification).
private let contentPadding = String(repeating: "x", count: 4096)

/// A Live Activity update whose content state makes the encoded payload about `size` bytes, distinct per `index`.
func liveActivityContent(index: Int, size: Int) throws -> LiveActivityContent {
    let head = #"{"score":"\#(index)-\#(index % 7)","note":""#
    // The aps wrapper, timestamp, event and alert take about 150 bytes.
    let padding = String(decoding: contentPadding.utf8.prefix(max(0, size - 150 - head.utf8.count - 2)), as: UTF8.self)
    return LiveActivityContent(
        event: .update, timestamp: 1_764_460_800 + Int64(index),
        contentState: try RawJSON(validating: head + padding + #""}"#),
        alert: LiveActivityAlert(title: "Goal!", body: .plain("update \(index)"), sound: "default"))
}

/// Many small jobs with distinct payloads, a bounded number in flight.
func childManyJobs(_ options: ChildOptions) async throws -> ([String: Any], Bool) {
    let engine = try FanoutEngine(configuration: options.engineConfiguration(unlimitedJobs: true))
    let pool = (0..<10_000).map(benchToken)
    let perJob = options.tokens
    let jobCount = options.jobs
    let payloadBytes = options.payloadBytes
    @Sendable func makeJob(_ index: Int) throws -> FanoutJob {
        let first = (index * perJob) % pool.count
        let tokens = (0..<perJob).map { pool[(first + $0) % pool.count] }
        return FanoutJob(
            id: "job-\(index)", headers: benchHeaders,
            payload: .liveActivity(try liveActivityContent(index: index, size: payloadBytes)),
            recipients: .tokens(tokens))
    }
    let before = processUsage()
    let start = DispatchTime.now()
    var counts = OutcomeCounts()
    var notifications = 0
    var encodings = 0
    var errors = 0
    await withTaskGroup(of: JobSummary?.self) { group in
        var next = 0
        while next < min(options.inFlightJobs, jobCount) {
            let index = next
            group.addTask { try? await engine.run(makeJob(index)) { _ in } }
            next += 1
        }
        while let summary = await group.next() {
            if let summary {
                addCounts(&counts, summary.counts)
                notifications += summary.notifications
                encodings += summary.payloadEncodings
            } else {
                errors += 1
            }
            if next < jobCount {
                let index = next
                group.addTask { try? await engine.run(makeJob(index)) { _ in } }
                next += 1
            }
        }
    }
    let elapsed = seconds(since: start)
    let after = processUsage()
    let engineEncodings = engine.payloadEncodings
    await engine.shutdown()
    let cpu = after.cpuSeconds - before.cpuSeconds
    var line: [String: Any] = [
        "jobs": jobCount, "tokens_per_job": perJob, "notifications": notifications, "seconds": elapsed,
        "rate": Double(counts.delivered) / elapsed, "jobs_per_second": Double(jobCount) / elapsed,
        "cpu_seconds": cpu, "cpu_us_per_notification": cpu / Double(max(notifications, 1)) * 1e6,
        "peak_rss_mb": after.peakRSSMegabytes, "payload_encodings": engineEncodings,
        "job_payload_encodings": encodings, "job_errors": errors,
    ]
    line.merge(countFields(counts)) { $1 }
    // A wrong encoding count is reported (the parent says so), not fatal.
    return (line, errors == 0 && counts.delivered == jobCount * perJob)
}

/// When each notification of the load run finished, by its index in the schedule. Each slot is
/// written once, by the loop thread that finished it, and read after every job has returned.
final class CompletionLog: @unchecked Sendable {
    let slots: UnsafeMutableBufferPointer<UInt64>

    init(count: Int) {
        slots = .allocate(capacity: max(count, 1))
        slots.initialize(repeating: 0)
    }

    deinit { slots.deallocate() }

    func finished(_ index: Int) {
        record(index, DispatchTime.now().uptimeNanoseconds)
    }

    /// Sets entry `index` to `value` (nanoseconds).
    func record(_ index: Int, _ value: UInt64) {
        if index >= 0 && index < slots.count { slots[index] = value }
    }

    /// Each finished entry's latency from its due time, in milliseconds, sorted; and the last finish (or `start`).
    func latencies(since start: UInt64, due: (Int) -> UInt64) -> (sorted: [Double], last: UInt64) {
        var latencies: [Double] = []
        latencies.reserveCapacity(slots.count)
        var last = start
        for index in 0..<slots.count where slots[index] != 0 {
            let finished = slots[index]
            last = max(last, finished)
            latencies.append(Double(Int64(bitPattern: finished &- due(index))) / 1e6)
        }
        latencies.sort()
        return (latencies, last)
    }
}

/// Open-loop load: notification `k` is due at `start + k / rate`. A scheduler thread wakes every
/// half millisecond and submits everything due as one small job, whatever the earlier jobs are
/// doing; latency is each notification's completion minus its due time, so a stall shows up in
/// the percentiles instead of slowing the schedule (no coordinated omission).
///
/// The schedule starts once one notification has been delivered: it opens the connection (TLS, the first provider
/// token, the mock's stream limit lifted by its first SETTINGS), which a running gateway did once, long before, and
/// which is not load. Its time is reported apart (`warmup_ms`), as the mock's own figure leaves out h2load's connect.
func childLoad(_ options: ChildOptions) async throws -> ([String: Any], Bool) {
    let engine = try FanoutEngine(configuration: options.engineConfiguration(unlimitedJobs: true))
    let total = max(1, Int(options.rate * options.duration))
    let rate = options.rate
    let pool = (0..<65_536).map(benchToken)
    let payload = liveActivityPayload(size: options.payloadBytes)
    let warmupStart = DispatchTime.now().uptimeNanoseconds
    let warmup = try await engine.run(
        FanoutJob(id: "load-warmup", headers: benchHeaders, payload: .raw(payload), recipients: .tokens([pool[0]]))
    ) { _ in }
    guard warmup.counts.delivered == 1 else { throw BenchError("load: the warm-up notification was not delivered") }
    let warmupMilliseconds = Double(DispatchTime.now().uptimeNanoseconds - warmupStart) / 1e6
    let log = CompletionLog(count: total)
    // Where each notification's latency went: when the scheduler submitted its job, and when the job's task started
    // (`engine.run` called); the rest, to the result, is the engine's and the mock's.
    let submitted = CompletionLog(count: total)
    let taskStarted = CompletionLog(count: total)
    // And the engine's own measure of its part on the wire: first sent to answered, on the loop's clock (whole
    // milliseconds, libuv's uv_now), +1 ns so that an answer within the same millisecond still counts as recorded.
    let onWire = CompletionLog(count: total)
    let tick: UInt64 = 500_000
    let before = processUsage()
    let start = DispatchTime.now().uptimeNanoseconds
    @Sendable func due(_ index: Int) -> UInt64 { start + UInt64(Double(index) * 1e9 / rate) }
    // Each job's summary comes back through this stream (holding the Task handles instead would keep
    // every finished task's memory until the end).
    let (summaries, summaryInput) = AsyncStream<JobSummary?>.makeStream(bufferingPolicy: .unbounded)
    let (jobs, maxLag) = await withCheckedContinuation {
        (continuation: CheckedContinuation<(Int, UInt64), Never>) in
        Thread.detachNewThread {
            var jobs = 0
            var sent = 0
            var maxLag: UInt64 = 0
            var wake = start
            while sent < total {
                let now = DispatchTime.now().uptimeNanoseconds
                let dueNow = min(total, Int(Double(now - start) * rate / 1e9) + 1)
                if dueNow > sent {
                    let scheduled = due(sent)
                    if now > scheduled { maxLag = max(maxLag, now - scheduled) }
                    let base = sent
                    let job = FanoutJob(
                        id: "load-\(base)", headers: benchHeaders, payload: .raw(payload),
                        recipients: .tokens((base..<dueNow).map { pool[$0 & 0xFFFF] }))
                    for index in base..<dueNow { submitted.finished(index) }
                    Task {
                        for index in base..<dueNow { taskStarted.finished(index) }
                        summaryInput.yield(
                            try? await engine.run(job) { result in
                                log.finished(base + result.position)
                                onWire.record(base + result.position, UInt64(result.latencyNanoseconds) + 1)
                            })
                    }
                    jobs += 1
                    sent = dueNow
                }
                wake += tick
                let after = DispatchTime.now().uptimeNanoseconds
                if wake > after { usleep(UInt32((wake - after) / 1000)) } else { wake = after }
            }
            continuation.resume(returning: (jobs, maxLag))
        }
    }
    var counts = OutcomeCounts()
    var notifications = 0
    var received = 0
    for await summary in summaries {
        if let summary {
            addCounts(&counts, summary.counts)
            notifications += summary.notifications
        }
        received += 1
        if received == jobs { break }
    }
    let after = processUsage()
    await engine.shutdown()
    let (latencies, last) = log.latencies(since: start, due: due)
    func percentile(_ p: Double) -> Double { nearestRank(latencies, p) }
    // The parts of the latency, each sorted on its own (so they do not add up to the total's percentiles): the
    // scheduler's lag (due to submitted; its 0.5 ms tick is part of it), the task's start (submitted to `run`
    // called: a cooperative thread's wake-up), and the engine with the mock (`run` called to the result).
    let lag = submitted.latencies(since: start, due: due).sorted
    let toTask = taskStarted.latencies(since: start) { submitted.slots[$0] }.sorted
    let inEngine = log.latencies(since: start) { taskStarted.slots[$0] }.sorted
    let wire = onWire.latencies(since: start) { _ in 1 }.sorted
    var parts: [String: Any] = [:]
    for (name, values) in [("scheduler", lag), ("task_start", toTask), ("engine", inEngine), ("wire", wire)] {
        parts["part_\(name)_ms_p50"] = nearestRank(values, 50)
        parts["part_\(name)_ms_p99"] = nearestRank(values, 99)
        parts["part_\(name)_ms_p999"] = nearestRank(values, 99.9)
    }
    let elapsed = Double(last - start) / 1e9
    // The schedule spans (total - 1) / rate seconds; achieved rate counts completions over the time
    // from the first due time to the last completion.
    let achieved = Double(counts.delivered) / max(elapsed, 1e-9)
    var line: [String: Any] = [
        "target_rate": rate, "duration": options.duration, "notifications": notifications, "seconds": elapsed,
        "rate": achieved, "shortfall_percent": max(0, (1 - achieved / rate) * 100),
        "cpu_seconds": after.cpuSeconds - before.cpuSeconds, "peak_rss_mb": after.peakRSSMegabytes,
        "latency_ms_p50": percentile(50), "latency_ms_p90": percentile(90), "latency_ms_p99": percentile(99),
        "latency_ms_p999": percentile(99.9), "latency_ms_max": latencies.last ?? 0,
        "generator_max_lag_ms": Double(maxLag) / 1e6, "jobs": jobs, "completed": latencies.count,
        "warmup_ms": warmupMilliseconds,
    ]
    line.merge(countFields(counts)) { $1 }
    line.merge(parts) { $1 }
    return (line, counts.delivered == total)
}

/// The `p`th percentile of sorted `values` by nearest rank (0 when empty).
func nearestRank(_ sorted: [Double], _ p: Double) -> Double {
    sorted.isEmpty ? 0 : sorted[max(0, min(sorted.count - 1, Int((p / 100 * Double(sorted.count)).rounded(.up)) - 1))]
}

/// CPU seconds the calling thread has used.
func threadCPUSeconds() -> Double {
    var time = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
    return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
}

/// How the single sends ended: how many finished and were delivered, and the waiter for the last one.
final class SendTally: Sendable {
    private struct State {
        var finished = 0
        var delivered = 0
        var refused = 0
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let state = FanoutMutex(State())
    let total: Int

    init(total: Int) { self.total = total }

    /// `refused`: the engine turned the call away (`.overloaded`: `maxPendingSends` calls were under way).
    func finished(delivered: Bool, refused: Bool = false) {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.finished += 1
            if delivered { state.delivered += 1 }
            if refused { state.refused += 1 }
            guard state.finished == total else { return nil }
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    /// Returns once every send has finished.
    func allFinished() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = state.withLock { state -> Bool in
                if state.finished == total { return true }
                state.waiter = continuation
                return false
            }
            if done { continuation.resume() }
        }
    }

    var delivered: Int { state.withLock { $0.delivered } }
    var refused: Int { state.withLock { $0.refused } }
}

/// Single sends as a gateway makes them: notification `k` is due at `start + k / rate`. A scheduler
/// thread sleeps until each one is due and starts a task for it, whatever the earlier sends are doing;
/// the task calls `engine.send` with one notification and notes when it returned. Latency is that
/// return minus the due time (no coordinated omission). CPU covers the whole process, the scheduler
/// thread included (its own share is reported apart).
func childSingleSend(_ options: ChildOptions) async throws -> ([String: Any], Bool) {
    let engine = try FanoutEngine(configuration: options.engineConfiguration(unlimitedJobs: true))
    let total = max(1, Int(options.rate * options.duration))
    let rate = options.rate
    let pool = (0..<65_536).map(benchToken)
    let payload = liveActivityPayload(size: options.payloadBytes)
    let log = CompletionLog(count: total)
    let tally = SendTally(total: total)
    let before = processUsage()
    let start = DispatchTime.now().uptimeNanoseconds
    @Sendable func due(_ index: Int) -> UInt64 { start + UInt64(Double(index) * 1e9 / rate) }
    let (maxLag, schedulerCPU) = await withCheckedContinuation {
        (continuation: CheckedContinuation<(UInt64, Double), Never>) in
        Thread.detachNewThread {
            let cpuBefore = threadCPUSeconds()
            var maxLag: UInt64 = 0
            var sent = 0
            while sent < total {
                let now = DispatchTime.now().uptimeNanoseconds
                while sent < total && due(sent) <= now {
                    let index = sent
                    maxLag = max(maxLag, now - due(index))
                    let notification = PushNotification(
                        deviceToken: pool[index & 0xFFFF], headers: benchHeaders, payload: payload)
                    @Sendable func sendOne() async {
                        do throws(FanoutError) {
                            let result = try await engine.send(notification)
                            log.finished(index)
                            tally.finished(delivered: result.outcome == .delivered)
                        } catch {
                            // A refused call is answered at once: left out of the latencies, counted apart.
                            if error.kind != .overloaded { log.finished(index) }
                            tally.finished(delivered: false, refused: error.kind == .overloaded)
                        }
                    }
                    // A plain task as a gateway starts one, not `Task(executorPreference: nil)`: that one still
                    // carries a preference record, which the runtime then looks up under the task's status lock
                    // at every hop (getPreferredTaskExecutor, 5.7% of the process's CPU at 40,000 sends/s).
                    if options.onLoop {
                        Task(executorPreference: engine.sendExecutor()) { await sendOne() }
                    } else {
                        Task { await sendOne() }
                    }
                    sent += 1
                }
                guard sent < total else { break }
                let next = due(sent)
                let after = DispatchTime.now().uptimeNanoseconds
                if next > after { usleep(UInt32((next - after) / 1000)) }
            }
            continuation.resume(returning: (maxLag, threadCPUSeconds() - cpuBefore))
        }
    }
    await tally.allFinished()
    let after = processUsage()
    await engine.shutdown()
    let (latencies, last) = log.latencies(since: start, due: due)
    let elapsed = Double(last - start) / 1e9
    let delivered = tally.delivered
    let refused = tally.refused
    let cpu = after.cpuSeconds - before.cpuSeconds
    let achieved = Double(delivered) / max(elapsed, 1e-9)
    let line: [String: Any] = [
        "target_rate": rate, "duration": options.duration, "notifications": total, "delivered": delivered,
        "seconds": elapsed, "rate": achieved, "shortfall_percent": max(0, (1 - achieved / rate) * 100),
        "cpu_seconds": cpu, "cpu_us_per_notification": cpu / Double(total) * 1e6,
        "scheduler_cpu_us_per_notification": schedulerCPU / Double(total) * 1e6,
        "engine_cpu_us_per_notification": (cpu - schedulerCPU) / Double(total) * 1e6,
        "peak_rss_mb": after.peakRSSMegabytes, "latency_ms_p50": nearestRank(latencies, 50),
        "latency_ms_p90": nearestRank(latencies, 90), "latency_ms_p99": nearestRank(latencies, 99),
        "latency_ms_p999": nearestRank(latencies, 99.9), "latency_ms_max": latencies.last ?? 0,
        "generator_max_lag_ms": Double(maxLag) / 1e6, "completed": latencies.count, "refused": refused,
    ]
    // Calls the engine refused (past `maxPendingSends`, at rates it cannot take) are its protection, not a failure.
    return (line, delivered + refused == total)
}
