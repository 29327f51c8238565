import CommandLineSupport
import Fanout
import FanoutCore
import FanoutPolicy
import FanoutTransport
import Foundation

let usage = """
    fanout-bench: measures Fanout against mock-apns, beside h2load against the same mock.

    usage: fanout-bench [--scenario NAME]... [--json FILE] [--quick] [--runs N]

      --scenario NAME   run this scenario (repeatable; default: all). Scenarios:
                          throughput-1c    one job, 1 KiB Live Activity payload, 1 loop, 1 connection, vs h2load -c 1
                          throughput-4c    the same with 2 loops and 4 connections, vs h2load -c 4
                          fanout-scaling   one job from a tokens file of 10,000, 100,000 and 1,000,000 tokens:
                                           rate, CPU microseconds per notification, peak RSS, growth ratios
                          ratelimit        workspace rate-limiter decisions per second on one core
      --json FILE       also write the results as JSON
      --quick           small sizes (seconds, not minutes), for CI
      --runs N          runs per measurement; the median is reported (default 3, 1 with --quick)

    Each run of Fanout happens in a fresh child process, so CPU seconds and peak RSS are its own.
    The remaining scenarios of the benchmark issue (many-jobs, encode, faults, load,
    peer-aioapns) are not written yet.
    """

let allScenarios = ["throughput-1c", "throughput-4c", "fanout-scaling", "ratelimit"]

// MARK: Child mode: one measured run in a clean process

/// `fanout-bench --child PORT CA KEY TOKENS LOOPS CONNECTIONS STREAMS PAYLOAD_BYTES [TOKENS_FILE]`: sends one
/// job and prints one JSON line with its rate, CPU seconds and peak RSS.
func runChild(_ arguments: [String]) async -> Int32 {
    guard arguments.count >= 8, let port = Int(arguments[0]), let count = Int(arguments[3]),
        let loops = Int(arguments[4]),
        let connections = Int(arguments[5]), let streams = Int(arguments[6]), let payloadBytes = Int(arguments[7])
    else {
        FileHandle.standardError.write(Data("fanout-bench --child: bad arguments\n".utf8))
        return 2
    }
    var configuration = FanoutEngineConfiguration(
        endpoint: APNsEndpoint(host: "localhost", port: port),
        credentials: ProviderCredentials(keyPath: arguments[2], keyID: MockProcess.keyID, teamID: MockProcess.teamID),
        caFile: arguments[1])
    configuration.loops = loops
    configuration.connectionsPerLoop = connections
    configuration.maxConcurrentStreams = streams
    let recipients: Recipients =
        arguments.count > 8 ? .file(path: arguments[8]) : .tokens((0..<count).map(benchToken))
    let job = FanoutJob(
        id: "bench",
        headers: NotificationHeaders(
            pushType: .liveactivity, topic: "com.example.bench.push-type.liveactivity", priority: 10),
        payload: .raw(liveActivityPayload(size: payloadBytes)), recipients: recipients)
    do {
        let engine = try FanoutEngine(configuration: configuration)
        let before = processUsage()
        let start = DispatchTime.now()
        let summary = try await engine.run(job) { _ in }
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds) / 1e9
        let after = processUsage()
        await engine.shutdown()
        let line: [String: Any] = [
            "notifications": summary.notifications, "delivered": summary.counts.delivered, "seconds": seconds,
            "rate": Double(summary.counts.delivered) / seconds, "cpu_seconds": after.cpuSeconds - before.cpuSeconds,
            "peak_rss_mb": after.peakRSSMegabytes, "payload_encodings": summary.payloadEncodings,
        ]
        print(String(decoding: try JSONSerialization.data(withJSONObject: line, options: [.sortedKeys]), as: UTF8.self))
        return summary.counts.delivered == summary.notifications ? 0 : 1
    } catch {
        FileHandle.standardError.write(Data("fanout-bench --child: \(error)\n".utf8))
        return 1
    }
}

// MARK: Parent mode

struct Options {
    var scenarios: [String] = []
    var jsonPath: String?
    var quick = false
    var runs: Int?
}

func parse(_ arguments: [String]) throws(UsageError) -> Options? {
    var options = Options()
    var cursor = ArgumentCursor(arguments)
    while let flag = try cursor.nextFlag() {
        switch flag {
        case "--help", "-h": return nil
        case "--scenario":
            let name = try cursor.string()
            guard allScenarios.contains(name) else {
                throw UsageError("unknown scenario '\(name)' (have: \(allScenarios.joined(separator: ", ")))")
            }
            options.scenarios.append(name)
        case "--json": options.jsonPath = try cursor.string()
        case "--quick": options.quick = true
        case "--runs": options.runs = try cursor.int(in: 1...50)
        default: throw UsageError("unknown option \(flag) (see fanout-bench --help)")
        }
    }
    if options.scenarios.isEmpty { options.scenarios = allScenarios }
    return options
}

/// Runs one child measurement; returns its JSON line.
func measureFanout(
    bin: String, work: String, mock: MockProcess, tokens: Int, loops: Int, connections: Int, streams: Int,
    payloadBytes: Int, tokensFile: String? = nil
) throws -> [String: Any] {
    var arguments = [
        "--child", String(mock.port), "\(mock.tlsDirectory)/ca.pem", "\(mock.tlsDirectory)/auth-key.p8", String(tokens),
        String(loops), String(connections), String(streams), String(payloadBytes),
    ]
    if let tokensFile { arguments.append(tokensFile) }
    let child = try ChildProcess.start("\(bin)/fanout-bench", arguments, in: work)
    let status = child.wait(seconds: 900)
    guard status == 0, let line = child.output.split(separator: "\n").last,
        let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
    else { throw BenchError("fanout run failed (exit \(status)): \(child.errorOutput)") }
    return object
}

/// h2load against the same mock with the same connections, streams, body and headers (a pre-minted JWT).
func measureH2load(
    h2load: String, work: String, mock: MockProcess, requests: Int, connections: Int, streams: Int,
    payloadBytes: Int
) throws -> Double {
    let body = "\(work)/body.json"
    _ = FileManager.default.createFile(atPath: body, contents: Data(liveActivityPayload(size: payloadBytes)))
    let key = try ES256PrivateKey(pemFilePath: "\(mock.tlsDirectory)/auth-key.p8")
    let jwt = try makeProviderToken(
        key: key, keyID: MockProcess.keyID, teamID: MockProcess.teamID, issuedAt: Int64(Date().timeIntervalSince1970))
    let child = try ChildProcess.start(
        h2load,
        [
            "-n", String(requests), "-c", String(connections), "-m", String(streams), "-d", body,
            "-H", "authorization: bearer \(jwt)", "-H", "apns-topic: com.example.bench.push-type.liveactivity",
            "-H", "apns-push-type: liveactivity", "-H", "apns-priority: 10",
            "https://127.0.0.1:\(mock.port)/3/device/\(benchToken(1))",
        ], in: work)
    child.wait(seconds: 900)
    let output = child.output
    guard let range = output.range(of: #"finished in [^,]*, ([0-9.]+) req/s"#, options: .regularExpression) else {
        throw BenchError("h2load printed no rate: \(output.suffix(500))")
    }
    let match = String(output[range])
    let rate = match.split(separator: " ").dropLast().last.flatMap { Double($0) } ?? 0
    // h2load opens up to 100 streams before it sees the server's first SETTINGS; mock-apns, like
    // APNs, allows one stream until the first valid token and refuses the rest, which h2load counts
    // as failed and does not retry. So all but that first burst must succeed.
    guard let succeededRange = output.range(of: #"([0-9]+) succeeded"#, options: .regularExpression),
        let succeeded = Int(output[succeededRange].split(separator: " ")[0]), succeeded >= requests - 100 * connections
    else {
        throw BenchError("h2load requests did not succeed: \(output.suffix(500))")
    }
    return rate
}

/// Writes `count` tokens, one per line, in chunks (the parent stays small, so nothing it holds
/// colours the children's measurements).
func writeTokensFile(_ path: String, count: Int) throws {
    _ = FileManager.default.createFile(atPath: path, contents: nil)
    guard let handle = FileHandle(forWritingAtPath: path) else { throw BenchError("cannot write \(path)") }
    defer { try? handle.close() }
    var chunk = ""
    for index in 0..<count {
        chunk += benchToken(index)
        chunk += "\n"
        if chunk.utf8.count >= 1 << 20 {
            handle.write(Data(chunk.utf8))
            chunk = ""
        }
    }
    handle.write(Data(chunk.utf8))
}

func runParent(_ options: Options) throws -> Int32 {
    let bin = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent().path
    let work = FileManager.default.temporaryDirectory.appendingPathComponent("fanout-bench-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let runs = options.runs ?? (options.quick ? 1 : 3)
    let h2load = findTool("h2load")
    let mock = try MockProcess.start(binDirectory: bin, workDirectory: work, threads: 2)
    defer { mock.child.stop() }
    var results: [[String: Any]] = []
    print("cores: \(ProcessInfo.processInfo.activeProcessorCount), runs per measurement: \(runs) (median [min-max])")

    for scenario in options.scenarios {
        switch scenario {
        case "throughput-1c", "throughput-4c":
            let (loops, connections) = scenario == "throughput-1c" ? (1, 1) : (2, 4)
            let tokens = options.quick ? 20_000 : 500_000
            let streams = 1000
            let tokensFile = "\(work)/tokens-throughput-\(tokens).txt"
            if !FileManager.default.fileExists(atPath: tokensFile) { try writeTokensFile(tokensFile, count: tokens) }
            var rates: [Double] = []
            var cpu: [Double] = []
            var rss: [Double] = []
            var h2rates: [Double] = []
            for _ in 0..<runs {
                let run = try measureFanout(
                    bin: bin, work: work, mock: mock, tokens: tokens, loops: loops, connections: connections / loops,
                    streams: streams, payloadBytes: 1024, tokensFile: tokensFile)
                rates.append(run["rate"] as? Double ?? 0)
                cpu.append(run["cpu_seconds"] as? Double ?? 0)
                rss.append(run["peak_rss_mb"] as? Double ?? 0)
                if let h2load {
                    h2rates.append(
                        try measureH2load(
                            h2load: h2load, work: work, mock: mock, requests: tokens, connections: connections,
                            streams: streams, payloadBytes: 1024))
                }
            }
            var entry: [String: Any] = [
                "scenario": scenario, "notifications": tokens, "rate": Spread(rates).median,
                "rate_min": Spread(rates).min, "rate_max": Spread(rates).max, "cpu_seconds": Spread(cpu).median,
                "peak_rss_mb": Spread(rss).median, "seconds": Double(tokens) / max(Spread(rates).median, 1),
                "loops": loops, "connections": connections, "streams": streams,
            ]
            var line = String(
                format: "%@: %.0f notifications/s [%.0f-%.0f], %.2f CPU s, %.0f MB peak", scenario,
                Spread(rates).median,
                Spread(rates).min, Spread(rates).max, Spread(cpu).median, Spread(rss).median)
            if !h2rates.isEmpty {
                let h2 = Spread(h2rates)
                entry["h2load_rate"] = h2.median
                entry["h2load_rate_min"] = h2.min
                entry["h2load_rate_max"] = h2.max
                entry["ratio_vs_h2load"] = Spread(rates).median / h2.median
                line += String(
                    format: "; h2load %.0f req/s [%.0f-%.0f]; ratio %.2f", h2.median, h2.min, h2.max,
                    Spread(rates).median / h2.median)
            } else {
                line += "; h2load not installed (apt-get install nghttp2-client)"
            }
            print(line)
            results.append(entry)
        case "fanout-scaling":
            let sizes = options.quick ? [1_000, 10_000] : [10_000, 100_000, 1_000_000]
            var rows: [[String: Any]] = []
            for size in sizes {
                let file = "\(work)/tokens-\(size).txt"
                try writeTokensFile(file, count: size)
                var rates: [Double] = []
                var cpuPer: [Double] = []
                var rss: [Double] = []
                for _ in 0..<runs {
                    let run = try measureFanout(
                        bin: bin, work: work, mock: mock, tokens: size, loops: 1, connections: 2, streams: 1000,
                        payloadBytes: 1024, tokensFile: file)
                    rates.append(run["rate"] as? Double ?? 0)
                    cpuPer.append((run["cpu_seconds"] as? Double ?? 0) / Double(size) * 1e6)
                    rss.append(run["peak_rss_mb"] as? Double ?? 0)
                }
                try? FileManager.default.removeItem(atPath: file)
                let row: [String: Any] = [
                    "tokens": size, "rate": Spread(rates).median, "cpu_us_per_notification": Spread(cpuPer).median,
                    "peak_rss_mb": Spread(rss).median,
                ]
                print(
                    String(
                        format:
                            "fanout-scaling %d tokens: %.0f notifications/s, %.2f CPU us/notification, %.1f MB peak RSS",
                        size,
                        Spread(rates).median, Spread(cpuPer).median, Spread(rss).median))
                rows.append(row)
            }
            let first = rows.first!
            let last = rows.last!
            let rssGrowth = (last["peak_rss_mb"] as! Double) / (first["peak_rss_mb"] as! Double)
            let cpuGrowth = (last["cpu_us_per_notification"] as! Double) / (first["cpu_us_per_notification"] as! Double)
            print(
                String(
                    format: "fanout-scaling growth %d -> %d tokens: peak RSS x%.2f, CPU per notification x%.2f",
                    sizes.first!, sizes.last!, rssGrowth, cpuGrowth))
            results.append([
                "scenario": "fanout-scaling", "sizes": rows, "rss_growth": rssGrowth,
                "cpu_per_notification_growth": cpuGrowth,
                "notifications": sizes.reduce(0, +), "rate": last["rate"] as! Double,
                "peak_rss_mb": last["peak_rss_mb"] as! Double,
                "seconds": 0, "cpu_seconds": 0,
            ])
        case "ratelimit":
            let count = options.quick ? 1_000_000 : 30_000_000
            let rates = (0..<runs).map { _ in WorkspaceRateLimiter.benchmarkDecisions(count: count) }
            let spread = Spread(rates)
            print(
                String(
                    format: "ratelimit: %.1f million decisions/s [%.1f-%.1f] on one core (saturated workspace)",
                    spread.median / 1e6, spread.min / 1e6, spread.max / 1e6))
            results.append([
                "scenario": "ratelimit", "notifications": count, "rate": spread.median, "rate_min": spread.min,
                "rate_max": spread.max, "seconds": Double(count) / spread.median,
                "cpu_seconds": Double(count) / spread.median,
                "peak_rss_mb": processUsage().peakRSSMegabytes,
            ])
        default:
            break
        }
    }
    if let path = options.jsonPath {
        let data = try JSONSerialization.data(withJSONObject: results, options: [.prettyPrinted, .sortedKeys])
        _ = FileManager.default.createFile(atPath: path, contents: data)
    }
    return 0
}

signal(SIGPIPE, SIG_IGN)
let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "--child" {
    exit(await runChild(Array(arguments.dropFirst())))
}
do {
    guard let options = try parse(arguments) else {
        print(usage)
        exit(0)
    }
    exit(try runParent(options))
} catch let error as UsageError {
    FileHandle.standardError.write(Data("fanout-bench: \(error.message)\n".utf8))
    exit(2)
} catch {
    FileHandle.standardError.write(Data("fanout-bench: \(error)\n".utf8))
    exit(1)
}
