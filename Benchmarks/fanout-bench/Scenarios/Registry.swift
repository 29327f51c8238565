import Fanout
import FanoutRegistry
import Foundation

/// The app every registry run registers its tokens under (and the topic's bundle id).
let registryBenchApp = "com.example.bench"

/// registry: the token registry on the send path, in one run.
///
/// 1. Bulk import: `tokens` update-token JSON lines for `match-7` (each with its device id) imported with
///    `RegistryImporter` into a fresh registry, in a child process; registrations per second.
/// 2. Resolve: every live token of that activity paged out of the registry (4,096 a page, as the engine reads them),
///    in a child process; tokens per second.
/// 3. Send: one update job addressed by `activity_id` to the million tokens against mock-apns, beside a `tokens_file`
///    job to the same tokens and an `activity_id` job to a 10,000-token activity, in the same run and interleaved;
///    the activity send's rate over the tokens file's, and its peak RSS over the small activity's.
func runRegistry(_ bench: BenchContext) throws {
    let tokens = bench.quick ? 20_000 : 1_000_000
    let smallTokens = bench.quick ? 1_000 : 10_000
    let work = "\(bench.work)/registry"
    try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: work) }

    // Tokens from a hash of their index: no shared prefixes, so the registry's token index sees what real tokens give.
    let importFile = "\(work)/match-7.jsonl"
    let smallFile = "\(work)/match-small.jsonl"
    let tokensFile = "\(work)/match-7.tokens"
    try writeRegistrations(importFile, activity: "match-7", indices: 0..<tokens, tokensPath: tokensFile)
    try writeRegistrations(
        smallFile, activity: "match-small", indices: 10_000_000..<(10_000_000 + smallTokens), tokensPath: nil)

    // 1. Import into a fresh registry each run; the last one is kept for the rest.
    var imports: [[String: Any]] = []
    var database = ""
    for run in 0..<bench.runs {
        if !database.isEmpty { removeDatabase(database) }
        database = "\(work)/registry-\(run).db"
        var request = ChildOptions(mode: "registry-import", tokensFile: importFile)
        request.registry = database
        let result = try bench.measureChild(request)
        guard Int(number(result["registrations"])) == tokens else {
            throw BenchError("registry import stored \(result["registrations"] ?? "?") of \(tokens) registrations")
        }
        imports.append(result)
    }
    var smallImport = ChildOptions(mode: "registry-import", tokensFile: smallFile)
    smallImport.registry = database
    _ = try bench.measureChild(smallImport)

    // 2. Resolve.
    var resolves: [[String: Any]] = []
    for _ in 0..<bench.runs {
        var request = ChildOptions(mode: "registry-resolve")
        request.registry = database
        request.activity = "match-7"
        let result = try bench.measureChild(request)
        guard Int(number(result["tokens"])) == tokens else {
            throw BenchError("registry resolve read \(result["tokens"] ?? "?") of \(tokens) tokens")
        }
        resolves.append(result)
    }

    // 3. Sends, interleaved so that the machine's load falls on all three alike.
    var fileSends: [[String: Any]] = []
    var activitySends: [[String: Any]] = []
    var smallSends: [[String: Any]] = []
    func send(activity: String?, file: String?, count: Int) throws -> [String: Any] {
        var request = ChildOptions(
            mode: "registry-job", tokens: count, tokensFile: file, loops: 1, connections: 1, streams: 1000)
        request.registry = database
        request.activity = activity
        let result = try bench.measureChild(request)
        guard Int(number(result["delivered"])) == count else {
            throw BenchError("registry send delivered \(result["delivered"] ?? "?") of \(count)")
        }
        return result
    }
    for _ in 0..<bench.runs {
        fileSends.append(try send(activity: nil, file: tokensFile, count: tokens))
        activitySends.append(try send(activity: "match-7", file: nil, count: tokens))
        smallSends.append(try send(activity: "match-small", file: nil, count: smallTokens))
    }

    let importRate = spread(imports, "rate")
    let resolveRate = spread(resolves, "rate")
    let rate = spread(activitySends, "rate")
    let fileRate = spread(fileSends, "rate")
    let rss = spread(activitySends, "peak_rss_mb")
    let smallRSS = spread(smallSends, "peak_rss_mb")
    let fileRSS = spread(fileSends, "peak_rss_mb")
    let cpu = spread(activitySends, "cpu_seconds")
    let fileCPU = spread(fileSends, "cpu_seconds")
    let ratio = rate.median / max(fileRate.median, 1)
    let pairRatios = Spread(zip(activitySends, fileSends).map { number($0["rate"]) / max(number($1["rate"]), 1) })
    let growth = rss.median - smallRSS.median
    // Resident memory at the end of each send (before shutdown), split into anonymous and file-backed pages.
    let anon = spread(activitySends, "rss_anon_mb")
    let file = spread(activitySends, "rss_file_mb")
    let smallAnon = spread(smallSends, "rss_anon_mb")
    let smallFileRSS = spread(smallSends, "rss_file_mb")
    print(
        String(
            format:
                "registry import: %d registrations: %.0f/s [%.0f-%.0f], %.2f CPU s, %.0f MB peak (goal >= 200,000/s)",
            tokens, importRate.median, importRate.min, importRate.max, spread(imports, "cpu_seconds").median,
            spread(imports, "peak_rss_mb").median))
    print(
        String(
            format: "registry resolve: %d tokens in pages of 4096: %.0f/s [%.0f-%.0f] (goal >= 1,000,000/s)", tokens,
            resolveRate.median, resolveRate.min, resolveRate.max))
    print(
        String(
            format:
                "registry send by activity_id: %d tokens: %.0f notifications/s [%.0f-%.0f], %.2f CPU s, %.1f MB peak; "
                + "tokens_file %.0f/s [%.0f-%.0f], %.2f CPU s, %.1f MB peak; ratio %.2f [%.2f-%.2f] (goal >= 0.95)",
            tokens, rate.median, rate.min, rate.max, cpu.median, rss.median, fileRate.median, fileRate.min,
            fileRate.max, fileCPU.median, fileRSS.median, ratio, pairRatios.min, pairRatios.max))
    print(
        String(
            format: "registry peak RSS: %d-token activity %.1f MB vs %d-token activity %.1f MB: %+.1f MB (goal <= +16)",
            tokens, rss.median, smallTokens, smallRSS.median, growth))
    print(
        String(
            format: "registry resident at the end of the send: anonymous %.1f MB vs %.1f MB, file-backed "
                + "(the mapped registry) %.1f MB vs %.1f MB", anon.median, smallAnon.median, file.median,
            smallFileRSS.median))
    bench.record([
        "scenario": "registry", "notifications": tokens, "seconds": Double(tokens) / max(rate.median, 1),
        "rate": rate.median, "rate_min": rate.min, "rate_max": rate.max, "cpu_seconds": cpu.median,
        "peak_rss_mb": rss.median, "import_rate": importRate.median, "import_rate_min": importRate.min,
        "import_rate_max": importRate.max, "import_cpu_seconds": spread(imports, "cpu_seconds").median,
        "resolve_rate": resolveRate.median, "resolve_rate_min": resolveRate.min, "resolve_rate_max": resolveRate.max,
        "resolve_page_size": registryResolvePageSize, "tokens_file_rate": fileRate.median,
        "tokens_file_rate_min": fileRate.min, "tokens_file_rate_max": fileRate.max,
        "tokens_file_peak_rss_mb": fileRSS.median,
        "tokens_file_cpu_seconds": fileCPU.median, "ratio_vs_tokens_file": ratio,
        "ratio_vs_tokens_file_min": pairRatios.min, "ratio_vs_tokens_file_max": pairRatios.max,
        "small_activity_tokens": smallTokens, "small_activity_peak_rss_mb": smallRSS.median, "rss_growth_mb": growth,
        "end_rss_anon_mb": anon.median, "end_rss_file_mb": file.median,
        "small_activity_end_rss_anon_mb": smallAnon.median,
        "small_activity_end_rss_file_mb": smallFileRSS.median,
        "key_figure": String(
            format: "import %.0f/s, resolve %.2fM/s, ratio_vs_tokens_file %.2f, RSS %+.1f MB vs %d tokens",
            importRate.median, resolveRate.median / 1e6, ratio, growth, smallTokens),
    ])
}

/// This process's resident memory now, split as /proc/self/status gives it: anonymous (heap, stacks) and file-backed
/// (for the registry, mostly SQLite's memory-mapped database file), in MB.
func residentBreakdown() -> [String: Any] {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return [:] }
    var fields: [String: Any] = [:]
    for line in status.split(separator: "\n") {
        let parts = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
        guard parts.count >= 2, let kilobytes = Double(parts[1]) else { continue }
        switch parts[0] {
        case "RssAnon:": fields["rss_anon_mb"] = kilobytes / 1024
        case "RssFile:": fields["rss_file_mb"] = kilobytes / 1024
        default: break
        }
    }
    return fields
}

/// Removes a registry and its WAL files.
private func removeDatabase(_ path: String) {
    for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
}

private let hexDigits = Array("0123456789abcdef".utf8)

/// A 64-hex-digit token from a hash of `index` (SplitMix64 of four words): distinct, with no common prefix.
func registryBenchToken(_ index: Int, into output: inout [UInt8]) {
    for word in 0..<4 {
        var z = UInt64(truncatingIfNeeded: index) &* 4 &+ UInt64(word) &+ 0x9E37_79B9_7F4A_7C15
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        z ^= z >> 31
        var shift: UInt64 = 64
        while shift > 0 {
            shift -= 4
            output.append(hexDigits[Int((z >> shift) & 0xF)])
        }
    }
}

/// Writes one registration JSON line per index (`{"app":…,"activity_id":…,"token":…,"device":"d<i>"}`) and, when
/// `tokensPath` is given, the same tokens one per line, in chunks.
func writeRegistrations(_ path: String, activity: String, indices: Range<Int>, tokensPath: String?) throws {
    func open(_ path: String) throws -> FileHandle {
        guard FileManager.default.createFile(atPath: path, contents: nil),
            let handle = FileHandle(forWritingAtPath: path)
        else { throw BenchError("cannot write \(path)") }
        return handle
    }
    let lines = try open(path)
    defer { try? lines.close() }
    let tokens = try tokensPath.map(open)
    defer { try? tokens?.close() }
    let head = Array(#"{"app":"\#(registryBenchApp)","activity_id":"\#(activity)","token":""#.utf8)
    var lineChunk: [UInt8] = []
    var tokenChunk: [UInt8] = []
    var token: [UInt8] = []
    for index in indices {
        token.removeAll(keepingCapacity: true)
        registryBenchToken(index, into: &token)
        lineChunk += head
        lineChunk += token
        lineChunk += Array(#"","device":"d\#(index)"}"#.utf8)
        lineChunk.append(UInt8(ascii: "\n"))
        if tokens != nil {
            tokenChunk += token
            tokenChunk.append(UInt8(ascii: "\n"))
        }
        if lineChunk.count >= 1 << 20 {
            lines.write(Data(lineChunk))
            tokens?.write(Data(tokenChunk))
            lineChunk.removeAll(keepingCapacity: true)
            tokenChunk.removeAll(keepingCapacity: true)
        }
    }
    lines.write(Data(lineChunk))
    tokens?.write(Data(tokenChunk))
}

// MARK: Child modes

/// Tokens per page when resolving, the engine's own page size (`RegistryPager.pageSize`).
let registryResolvePageSize = 4096

/// `registry-import`: imports the JSON lines in `tokensFile` into the registry at `registry` (defining the app first).
func childRegistryImport(_ options: ChildOptions) async throws -> ([String: Any], Bool) {
    guard let path = options.registry, let file = options.tokensFile else {
        throw BenchError("registry-import needs --registry and --tokens-file")
    }
    let store = try SQLiteRegistryStore(path: path)
    defer { store.close() }
    try await store.defineApps([RegistryApp(bundleID: registryBenchApp)])
    let before = processUsage()
    let start = DispatchTime.now()
    let summary = try await RegistryImporter().run(path: file, into: store)
    let elapsed = seconds(since: start)
    let after = processUsage()
    var line: [String: Any] = [
        "registrations": summary.registrations, "added": summary.added, "invalid": summary.invalid,
        "seconds": elapsed, "rate": Double(summary.registrations) / elapsed,
        "cpu_seconds": after.cpuSeconds - before.cpuSeconds, "peak_rss_mb": after.peakRSSMegabytes,
    ]
    line.merge(residentBreakdown()) { $1 }
    return (line, summary.invalid == 0)
}

/// `registry-resolve`: pages every live update token of `activity` out of the registry.
func childRegistryResolve(_ options: ChildOptions) async throws -> ([String: Any], Bool) {
    guard let path = options.registry, let activity = options.activity else {
        throw BenchError("registry-resolve needs --registry and --activity")
    }
    let store = try SQLiteRegistryStore(path: path)
    defer { store.close() }
    let now = store.clock.now()
    let before = processUsage()
    let start = DispatchTime.now()
    var total = 0
    var bytes = 0
    var cursor: RegistryCursor?
    repeat {
        let page = try await store.liveUpdateTokens(
            app: registryBenchApp, activityID: activity, after: cursor, limit: registryResolvePageSize, now: now)
        total += page.items.count
        for item in page.items { bytes &+= item.token.utf8.count }
        cursor = page.next
    } while cursor != nil
    let elapsed = seconds(since: start)
    let after = processUsage()
    var line: [String: Any] = [
        "tokens": total, "token_bytes": bytes, "seconds": elapsed, "rate": Double(total) / elapsed,
        "cpu_seconds": after.cpuSeconds - before.cpuSeconds, "peak_rss_mb": after.peakRSSMegabytes,
    ]
    line.merge(residentBreakdown()) { $1 }
    return (line, true)
}

/// `registry-job`: one Live Activity update to `activity`'s tokens through the registry, or to `tokensFile` (the
/// same engine configuration, registry included, and the same payload either way).
func childRegistryJob(_ options: ChildOptions) async throws -> ([String: Any], Bool) {
    guard let path = options.registry else { throw BenchError("registry-job needs --registry") }
    let store = try SQLiteRegistryStore(path: path)
    defer { store.close() }
    let recipients: Recipients
    if let activity = options.activity {
        recipients = .activity(app: registryBenchApp, id: activity)
    } else if let file = options.tokensFile {
        recipients = .file(path: file)
    } else {
        throw BenchError("registry-job needs --activity or --tokens-file")
    }
    // A fresh content timestamp (same width as the fixed one) for every run, so no run is older than the last.
    var payload = liveActivityPayload(size: options.payloadBytes)
    if let range = payload.firstRange(of: Array("1764460800".utf8)) {
        payload.replaceSubrange(range, with: Array(String(Int(Date().timeIntervalSince1970)).utf8))
    }
    let job = FanoutJob(id: "bench", headers: benchHeaders, payload: .raw(payload), recipients: recipients)
    var configuration = try options.engineConfiguration(unlimitedJobs: false)
    configuration.registry = store
    let engine = try FanoutEngine(configuration: configuration)
    let before = processUsage()
    let start = DispatchTime.now()
    let summary = try await engine.run(job) { _ in }
    let elapsed = seconds(since: start)
    let after = processUsage()
    let resident = residentBreakdown()
    await engine.shutdown()
    var line: [String: Any] = [
        "notifications": summary.notifications, "seconds": elapsed,
        "rate": Double(summary.counts.delivered) / elapsed, "cpu_seconds": after.cpuSeconds - before.cpuSeconds,
        "peak_rss_mb": after.peakRSSMegabytes, "payload_encodings": summary.payloadEncodings,
    ]
    line.merge(countFields(summary.counts)) { $1 }
    line.merge(resident) { $1 }
    return (line, summary.counts.delivered == summary.notifications)
}
