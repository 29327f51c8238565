import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation

/// throughput-1c and throughput-4c: one job of a 1 KiB Live Activity payload to 500,000 tokens,
/// then h2load against the same mock with the same connections, streams, body and headers.
///
/// Each run measures the engine in both `apnsIDs` modes, the default `.apns` (no `apns-id` sent) and `.fanout` (a
/// random id per notification, sent: `--fanout-ids`), in alternating order from run to run so neither always goes
/// first, then h2load; the default mode's figures keep their plain names, the other's end in `_fanout_ids`.
func runThroughput(_ bench: BenchContext, loops: Int, connections: Int) throws {
    let scenario = connections == 1 ? "throughput-1c" : "throughput-\(connections)c"
    let tokens = bench.quick ? 20_000 : 500_000
    let streams = 1000
    let tokensFile = try bench.tokensFile(count: tokens)
    var runs: [[String: Any]] = []
    var fanoutIDRuns: [[String: Any]] = []
    var h2rates: [Double] = []
    var h2OneTokenRates: [Double] = []
    // The mock's CPU per request under each client: both send the same requests to the same tokens, so a
    // difference is what the client's way of sending costs the server (HPACK, frame and write sizes).
    var mockCPUUnderFanout: [Double] = []
    var mockCPUUnderFanoutIDs: [Double] = []
    var mockCPUUnderH2load: [Double] = []
    // h2load's own CPU per request (its process, reaped into this one's children's usage), beside Fanout's.
    var h2loadCPU: [Double] = []
    let mockPID = bench.mock.child.process.processIdentifier
    func mockMicrosecondsPerRequest(_ body: () throws -> Void) rethrows -> Double {
        let before = processCPUSeconds(mockPID)
        try body()
        return (processCPUSeconds(mockPID) - before) / Double(tokens) * 1e6
    }
    let defaultIDs = ChildOptions(
        tokens: tokens, tokensFile: tokensFile, loops: loops, connections: connections / loops, streams: streams)
    var fanoutIDs = defaultIDs
    fanoutIDs.fanoutIDs = true
    for run in 0..<bench.runs {
        func measureDefaultIDs() throws {
            mockCPUUnderFanout.append(
                try mockMicrosecondsPerRequest { runs.append(try bench.measureChild(defaultIDs)) })
        }
        func measureFanoutIDs() throws {
            mockCPUUnderFanoutIDs.append(
                try mockMicrosecondsPerRequest { fanoutIDRuns.append(try bench.measureChild(fanoutIDs)) })
        }
        if run % 2 == 0 {
            try measureDefaultIDs()
            try measureFanoutIDs()
        } else {
            try measureFanoutIDs()
            try measureDefaultIDs()
        }
        if let h2load = bench.h2load {
            let childrenBefore = childrenCPUSeconds()
            mockCPUUnderH2load.append(
                try mockMicrosecondsPerRequest {
                    h2rates.append(
                        try measureH2load(
                            h2load: h2load, work: bench.work, mock: bench.mock, requests: tokens,
                            connections: connections, streams: streams, payloadBytes: 1024, tokensFile: tokensFile))
                })
            h2loadCPU.append((childrenCPUSeconds() - childrenBefore) / Double(tokens) * 1e6)
            // A second reference, one token over and over, for comparison (less work for the mock).
            h2OneTokenRates.append(
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
    // The same figures with apnsIDs = .fanout, and that mode against the default run by run (same round).
    let idRates = spread(fanoutIDRuns, "rate")
    let idCPU = spread(fanoutIDRuns, "cpu_seconds")
    let idRSS = spread(fanoutIDRuns, "peak_rss_mb")
    let idCPUPer = Spread(fanoutIDRuns.map { number($0["cpu_seconds"]) / Double(tokens) * 1e6 })
    let idVersusDefault = Spread(zip(fanoutIDRuns, runs).map { number($0.0["rate"]) / max(number($0.1["rate"]), 1) })
    entry["apns_ids"] = "apns"
    // Round by round, in the order measured (the two modes alternate which goes first), to see the noise behind the
    // medians.
    entry["rounds"] = (0..<runs.count).map { round -> [String: Any] in
        var figures: [String: Any] = [
            "fanout_ids_first": round % 2 == 1, "rate": number(runs[round]["rate"]),
            "rate_fanout_ids": number(fanoutIDRuns[round]["rate"]),
            "cpu_us_per_notification": number(runs[round]["cpu_seconds"]) / Double(tokens) * 1e6,
            "cpu_us_per_notification_fanout_ids": number(fanoutIDRuns[round]["cpu_seconds"]) / Double(tokens) * 1e6,
            "mock_cpu_us_per_request": mockCPUUnderFanout[round],
            "mock_cpu_us_per_request_fanout_ids": mockCPUUnderFanoutIDs[round],
        ]
        if round < h2rates.count {
            figures["h2load_rate"] = h2rates[round]
            figures["mock_cpu_us_per_request_h2load"] = mockCPUUnderH2load[round]
        }
        return figures
    }
    entry["rate_fanout_ids"] = idRates.median
    entry["rate_fanout_ids_min"] = idRates.min
    entry["rate_fanout_ids_max"] = idRates.max
    entry["cpu_seconds_fanout_ids"] = idCPU.median
    entry["cpu_us_per_notification_fanout_ids"] = idCPUPer.median
    entry["cpu_us_per_notification_fanout_ids_min"] = idCPUPer.min
    entry["cpu_us_per_notification_fanout_ids_max"] = idCPUPer.max
    entry["peak_rss_mb_fanout_ids"] = idRSS.median
    entry["rate_fanout_ids_vs_default_paired"] = idVersusDefault.median
    entry["rate_fanout_ids_vs_default_paired_min"] = idVersusDefault.min
    entry["rate_fanout_ids_vs_default_paired_max"] = idVersusDefault.max
    var idLine = String(
        format:
            "%@ with apnsIDs .fanout (--fanout-ids): %.0f notifications/s [%.0f-%.0f], %.2f CPU s (%.2f "
            + "us/notification, %+.2f vs the default .apns), %.0f MB peak; rate vs the default run by run %.2f "
            + "[%.2f-%.2f]",
        scenario, idRates.median, idRates.min, idRates.max, idCPU.median, idCPUPer.median,
        idCPUPer.median - cpuPer.median, idRSS.median, idVersusDefault.median, idVersusDefault.min,
        idVersusDefault.max)
    if !h2rates.isEmpty {
        let h2 = Spread(h2rates)
        entry["h2load_rate"] = h2.median
        entry["h2load_rate_min"] = h2.min
        entry["h2load_rate_max"] = h2.max
        entry["ratio_vs_h2load"] = rates.median / h2.median
        // Each Fanout run against the h2load run of its round (just after it, or after the --fanout-ids run): on a
        // machine whose speed drifts from minute to minute, the median of these pairs moves less than the ratio of
        // the two medians.
        let paired = Spread(zip(runs, h2rates).map { number($0.0["rate"]) / max($0.1, 1) })
        entry["ratio_vs_h2load_paired"] = paired.median
        entry["ratio_vs_h2load_paired_min"] = paired.min
        entry["ratio_vs_h2load_paired_max"] = paired.max
        let oneToken = Spread(h2OneTokenRates)
        entry["h2load_one_token_rate"] = oneToken.median
        entry["ratio_vs_h2load_one_token"] = rates.median / oneToken.median
        let mockUnderFanout = Spread(mockCPUUnderFanout).median
        let mockUnderH2load = Spread(mockCPUUnderH2load).median
        let h2loadCPUPerRequest = Spread(h2loadCPU).median
        entry["mock_cpu_us_per_request"] = mockUnderFanout
        entry["mock_cpu_us_per_request_h2load"] = mockUnderH2load
        entry["h2load_cpu_us_per_request"] = h2loadCPUPerRequest
        entry["key_figure"] = String(
            format: "ratio_vs_h2load %.2f (h2load %.0f/s)", rates.median / h2.median, h2.median)
        line += String(
            format:
                "; h2load %.0f req/s [%.0f-%.0f]; ratio %.2f, run by run %.2f [%.2f-%.2f] (h2load to one token: %.0f "
                + "req/s, ratio %.2f)",
            h2.median, h2.min, h2.max, rates.median / h2.median, paired.median, paired.min, paired.max,
            oneToken.median, rates.median / oneToken.median)
        line += String(
            format: "; h2load's own CPU %.2f us/request; mock CPU per request %.2f us under Fanout, %.2f under h2load",
            h2loadCPUPerRequest, mockUnderFanout, mockUnderH2load)
        let idPaired = Spread(zip(fanoutIDRuns, h2rates).map { number($0.0["rate"]) / max($0.1, 1) })
        let mockUnderFanoutIDs = Spread(mockCPUUnderFanoutIDs).median
        entry["ratio_vs_h2load_fanout_ids"] = idRates.median / h2.median
        entry["ratio_vs_h2load_fanout_ids_paired"] = idPaired.median
        entry["ratio_vs_h2load_fanout_ids_paired_min"] = idPaired.min
        entry["ratio_vs_h2load_fanout_ids_paired_max"] = idPaired.max
        entry["mock_cpu_us_per_request_fanout_ids"] = mockUnderFanoutIDs
        idLine += String(
            format:
                "; ratio vs h2load %.2f, run by run %.2f [%.2f-%.2f] (default: %.2f, run by run %.2f); mock CPU "
                + "per request %.2f us under it (%.2f under the default, %.2f under h2load)",
            idRates.median / h2.median, idPaired.median, idPaired.min, idPaired.max, rates.median / h2.median,
            paired.median, mockUnderFanoutIDs, mockUnderFanout, mockUnderH2load)
    } else {
        entry["key_figure"] = "h2load not installed"
        line += "; h2load not installed (apt-get install nghttp2-client)"
    }
    print(line)
    print(idLine)
    bench.record(entry)
}

/// h2load against the same mock with the same connections, streams, body and headers (a pre-minted JWT), and, when
/// `tokensFile` is given, to the same tokens: the mock's work for a request depends on its token (it counts distinct
/// tokens), so h2load sending one token 500,000 times would give the mock less to do than Fanout's 500,000 tokens.
func measureH2load(
    h2load: String, work: String, mock: MockProcess, requests: Int, connections: Int, streams: Int,
    payloadBytes: Int, tokensFile: String? = nil
) throws -> Double {
    let child = try ChildProcess.start(
        h2load,
        ["-n", String(requests), "-c", String(connections), "-m", String(streams)]
            + h2loadRequestArguments(work: work, mock: mock, payloadBytes: payloadBytes, tokensFile: tokensFile),
        in: work)
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
/// pre-minted JWT), to one bench token at the mock, or to each token of `tokensFile` in turn (h2load's `-i`: every
/// connection goes through the list from its start). The URI or `-i` comes last.
func h2loadRequestArguments(work: String, mock: MockProcess, payloadBytes: Int, tokensFile: String? = nil) throws
    -> [String]
{
    let body = "\(work)/body-\(payloadBytes).json"
    _ = FileManager.default.createFile(atPath: body, contents: Data(liveActivityPayload(size: payloadBytes)))
    let key = try ES256PrivateKey(pemFilePath: "\(mock.tlsDirectory)/auth-key.p8")
    let jwt = try makeProviderToken(
        key: key, keyID: MockProcess.keyID, teamID: MockProcess.teamID, issuedAt: Int64(Date().timeIntervalSince1970))
    return [
        "-d", body, "-H", "authorization: bearer \(jwt)", "-H", "apns-topic: \(benchTopic)",
        "-H", "apns-push-type: liveactivity", "-H", "apns-priority: 10",
    ]
        + (try tokensFile.map { ["-i", try h2loadURIFile(work: work, mock: mock, tokensFile: $0)] }
            ?? ["https://127.0.0.1:\(mock.port)/3/device/\(benchToken(1))"])
}

/// A file of one request URI per token of `tokensFile` (one token per line), for h2load's `-i`; written once per mock.
private func h2loadURIFile(work: String, mock: MockProcess, tokensFile: String) throws -> String {
    let path = "\(tokensFile).\(mock.port).uris"
    if FileManager.default.fileExists(atPath: path) { return path }
    let prefix = "https://127.0.0.1:\(mock.port)/3/device/"
    var uris = ""
    for token in try String(contentsOfFile: tokensFile, encoding: .utf8).split(separator: "\n") where !token.isEmpty {
        uris += prefix
        uris += token
        uris += "\n"
    }
    try uris.write(toFile: path, atomically: true, encoding: .utf8)
    return path
}
