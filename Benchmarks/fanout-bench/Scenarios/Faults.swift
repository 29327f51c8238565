import Foundation

/// The fault mix of the policies issue, plus a GOAWAY every 20,000 requests and a dropped
/// connection every 50,000.
let faultMix = [
    "--fail", "0.05:503:ServiceUnavailable", "--fail", "0.01:429:TooManyRequests", "--fail",
    "0.01:500:InternalServerError", "--goaway-every", "20000", "--drop-every", "50000",
]

/// faults: one job of 200,000 notifications against a mock-apns of its own with that fault mix,
/// restarted for each run (so every run meets the same faults). Reports the rate, the outcome
/// counts, retries, and, from the mock's --record file, the notifications it accepted twice.
/// Duplicates are legitimate only for streams in flight on a dropped connection (their answers
/// were lost, so they are retried), so they must stay within drops x streams per connection.
func runFaults(_ bench: BenchContext) throws {
    let tokens = bench.quick ? 20_000 : 200_000
    let streams = 1000
    let tokensFile = try bench.tokensFile(count: tokens)
    var runs: [[String: Any]] = []
    for run in 0..<bench.runs {
        let record = "\(bench.work)/faults-record-\(run).txt"
        let stats = "\(bench.work)/faults-stats-\(run).json"
        let mock = try MockProcess.start(
            binDirectory: bench.bin, workDirectory: bench.work, threads: 2,
            extra: faultMix + ["--record", record, "--stats", stats])
        var result: [String: Any]
        do {
            result = try bench.measureChild(
                ChildOptions(
                    tokens: tokens, tokensFile: tokensFile, loops: 1, connections: 2, streams: streams,
                    allowFailures: true),
                mock: mock)
        } catch {
            mock.child.stop()
            throw error
        }
        mock.child.stop()  // SIGTERM: the mock flushes --record and writes --stats
        let accepted = try recordedTokenCounts(record)
        result["mock_accepted"] = accepted.lines
        result["duplicates"] = accepted.duplicateTokens
        result["duplicate_acceptances"] = accepted.lines - accepted.distinct
        if let data = FileManager.default.contents(atPath: stats),
            let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
        {
            result["mock_requests"] = object["requests"]
            result["connections_dropped"] = object["connections_dropped"]
            result["goaways_sent"] = object["goaways_sent"]
            result["mock_connections"] = object["connections"]
            result["mock_by_status"] = object["by_status"]
        }
        try? FileManager.default.removeItem(atPath: record)
        runs.append(result)
    }
    // The run with the median rate gives the counts (they vary little between runs).
    let rates = spread(runs, "rate")
    let median = runs.min { abs(number($0["rate"]) - rates.median) < abs(number($1["rate"]) - rates.median) }!
    let drops = Int(number(median["connections_dropped"]))
    let duplicates = Int(number(median["duplicates"]))
    let bound = drops * streams
    var entry: [String: Any] = [
        "scenario": "faults", "notifications": tokens, "rate": rates.median, "rate_min": rates.min,
        "rate_max": rates.max, "seconds": spread(runs, "seconds").median,
        "cpu_seconds": spread(runs, "cpu_seconds").median, "peak_rss_mb": spread(runs, "peak_rss_mb").median,
        "fault_mix": faultMix.joined(separator: " "), "duplicates_within_bound": duplicates <= bound,
        "duplicate_bound": bound, "duplicates_max": Int(spread(runs, "duplicates").max),
    ]
    for key in [
        "delivered", "rejected", "unregistered", "failed", "expired", "rate_limited", "invalid", "retries",
        "duplicates", "duplicate_acceptances", "mock_accepted", "mock_requests", "connections_dropped",
        "goaways_sent", "mock_connections", "mock_by_status",
    ] {
        if let value = median[key] { entry[key] = value }
    }
    let outcomes = String(
        format: "delivered %d, failed %d, rejected %d, unregistered %d, expired %d", Int(number(median["delivered"])),
        Int(number(median["failed"])), Int(number(median["rejected"])), Int(number(median["unregistered"])),
        Int(number(median["expired"])))
    entry["key_figure"] =
        outcomes + String(format: ", retries %d, duplicates %d", Int(number(median["retries"])), duplicates)
    print(
        String(
            format:
                "faults: %d notifications under 5%% 503, 1%% 429, 1%% 500, GOAWAY/20,000, drop/50,000: %.0f notifications/s "
                + "[%.0f-%.0f], %.2f CPU s; %@; retries %d; mock accepted %d, tokens accepted twice %d "
                + "(%d dropped connections x %d streams allow %d)%@",
            tokens, rates.median, rates.min, rates.max, spread(runs, "cpu_seconds").median, outcomes,
            Int(number(median["retries"])), Int(number(median["mock_accepted"])), duplicates, drops, streams, bound,
            duplicates <= bound ? "" : " MORE THAN DROPPED STREAMS EXPLAIN"))
    bench.record(entry)
}

/// Lines, distinct tokens, and tokens seen more than once in a mock-apns `--record` file
/// (`token apns-id` per line).
func recordedTokenCounts(_ path: String) throws -> (lines: Int, distinct: Int, duplicateTokens: Int) {
    guard let data = FileManager.default.contents(atPath: path) else {
        throw BenchError("mock-apns wrote no --record file at \(path)")
    }
    var counts: [Substring: Int] = [:]
    var lines = 0
    let text = String(decoding: data, as: UTF8.self)
    for line in text.split(separator: "\n") {
        guard let token = line.split(separator: " ").first else { continue }
        lines += 1
        counts[token, default: 0] += 1
    }
    return (lines, counts.count, counts.values.filter { $0 > 1 }.count)
}
