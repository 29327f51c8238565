import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation

/// throughput-1c and throughput-4c: one job of a 1 KiB Live Activity payload to 500,000 tokens,
/// then h2load against the same mock with the same connections, streams, body and headers.
func runThroughput(_ bench: BenchContext, loops: Int, connections: Int) throws {
    let scenario = connections == 1 ? "throughput-1c" : "throughput-\(connections)c"
    let tokens = bench.quick ? 20_000 : 500_000
    let streams = 1000
    let tokensFile = try bench.tokensFile(count: tokens)
    var runs: [[String: Any]] = []
    var h2rates: [Double] = []
    for _ in 0..<bench.runs {
        runs.append(
            try bench.measureChild(
                ChildOptions(
                    tokens: tokens, tokensFile: tokensFile, loops: loops, connections: connections / loops,
                    streams: streams)))
        if let h2load = bench.h2load {
            h2rates.append(
                try measureH2load(
                    h2load: h2load, work: bench.work, mock: bench.mock, requests: tokens, connections: connections,
                    streams: streams, payloadBytes: 1024))
        }
    }
    let rates = spread(runs, "rate")
    let cpu = spread(runs, "cpu_seconds")
    let rss = spread(runs, "peak_rss_mb")
    let cpuPer = Spread(runs.map { number($0["cpu_seconds"]) / Double(tokens) * 1e6 })
    if connections == 1 { bench.throughput1cCPUPerNotification = cpuPer.median }
    var entry: [String: Any] = [
        "scenario": scenario, "notifications": tokens, "rate": rates.median, "rate_min": rates.min,
        "rate_max": rates.max, "cpu_seconds": cpu.median, "cpu_us_per_notification": cpuPer.median,
        "cpu_us_per_notification_min": cpuPer.min, "cpu_us_per_notification_max": cpuPer.max,
        "peak_rss_mb": rss.median,
        "seconds": Double(tokens) / max(rates.median, 1), "loops": loops, "connections": connections,
        "streams": streams,
    ]
    var line = String(
        format: "%@: %.0f notifications/s [%.0f-%.0f], %.2f CPU s (%.2f us/notification), %.0f MB peak", scenario,
        rates.median, rates.min, rates.max, cpu.median, cpuPer.median, rss.median)
    if !h2rates.isEmpty {
        let h2 = Spread(h2rates)
        entry["h2load_rate"] = h2.median
        entry["h2load_rate_min"] = h2.min
        entry["h2load_rate_max"] = h2.max
        entry["ratio_vs_h2load"] = rates.median / h2.median
        entry["key_figure"] = String(
            format: "ratio_vs_h2load %.2f (h2load %.0f/s)", rates.median / h2.median, h2.median)
        line += String(
            format: "; h2load %.0f req/s [%.0f-%.0f]; ratio %.2f", h2.median, h2.min, h2.max, rates.median / h2.median)
    } else {
        entry["key_figure"] = "h2load not installed"
        line += "; h2load not installed (apt-get install nghttp2-client)"
    }
    print(line)
    bench.record(entry)
}

/// h2load against the same mock with the same connections, streams, body and headers (a pre-minted JWT).
func measureH2load(
    h2load: String, work: String, mock: MockProcess, requests: Int, connections: Int, streams: Int,
    payloadBytes: Int
) throws -> Double {
    let child = try ChildProcess.start(
        h2load,
        ["-n", String(requests), "-c", String(connections), "-m", String(streams)]
            + h2loadRequestArguments(work: work, mock: mock, payloadBytes: payloadBytes), in: work)
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

/// h2load's arguments for the requests Fanout sends: the same body, headers and provider token (a
/// pre-minted JWT), to one bench token at the mock. The URI comes last.
func h2loadRequestArguments(work: String, mock: MockProcess, payloadBytes: Int) throws -> [String] {
    let body = "\(work)/body-\(payloadBytes).json"
    _ = FileManager.default.createFile(atPath: body, contents: Data(liveActivityPayload(size: payloadBytes)))
    let key = try ES256PrivateKey(pemFilePath: "\(mock.tlsDirectory)/auth-key.p8")
    let jwt = try makeProviderToken(
        key: key, keyID: MockProcess.keyID, teamID: MockProcess.teamID, issuedAt: Int64(Date().timeIntervalSince1970))
    return [
        "-d", body, "-H", "authorization: bearer \(jwt)", "-H", "apns-topic: \(benchTopic)",
        "-H", "apns-push-type: liveactivity", "-H", "apns-priority: 10",
        "https://127.0.0.1:\(mock.port)/3/device/\(benchToken(1))",
    ]
}
