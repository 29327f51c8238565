import Foundation

/// What every scenario shares: where the binaries are, a scratch directory, the mock-apns all
/// scenarios but `faults` send to, and the results so far.
final class BenchContext {
    let options: Options
    let bin: String
    let work: String
    let runs: Int
    let h2load: String?
    let mock: MockProcess
    private(set) var results: [[String: Any]] = []
    /// throughput-1c's median CPU microseconds per notification in this run: what single-send and
    /// many-jobs compare their own against.
    var throughput1cCPUPerNotification: Double?

    var quick: Bool { options.quick }

    init(options: Options) throws {
        self.options = options
        bin = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent().path
        work = FileManager.default.temporaryDirectory.appendingPathComponent("fanout-bench-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        runs = options.runs ?? (options.quick ? 1 : 5)
        h2load = findTool("h2load")
        do {
            mock = try MockProcess.start(binDirectory: bin, workDirectory: work, threads: 2)
        } catch {
            try? FileManager.default.removeItem(atPath: work)
            throw error
        }
    }

    func close() {
        mock.child.stop()
        try? FileManager.default.removeItem(atPath: work)
    }

    func record(_ entry: [String: Any]) { results.append(entry) }

    /// A file of `count` bench tokens in the scratch directory, written once.
    func tokensFile(count: Int) throws -> String {
        let path = "\(work)/tokens-\(count).txt"
        if !FileManager.default.fileExists(atPath: path) { try writeTokensFile(path, count: count) }
        return path
    }

    /// Runs one child measurement against `mock` (default: the shared one); returns its JSON line, with the share of the
    /// machine's CPU time the hypervisor took meanwhile (`steal_percent`).
    func measureChild(_ request: ChildOptions, mock: MockProcess? = nil, timeout: Double = 900) throws -> [String: Any]
    {
        let mock = mock ?? self.mock
        var request = request
        request.port = mock.port
        request.caFile = "\(mock.tlsDirectory)/ca.pem"
        request.keyFile = "\(mock.tlsDirectory)/auth-key.p8"
        let cpuBefore = MachineCPUTime.now()
        let child = try ChildProcess.start("\(bin)/fanout-bench", ["--child"] + request.arguments(), in: work)
        let status = child.wait(seconds: timeout)
        guard status == 0, let line = child.output.split(separator: "\n").last,
            var object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
        else {
            throw BenchError("fanout \(request.mode) run failed (exit \(status)): \(child.errorOutput.suffix(2000))")
        }
        object["steal_percent"] = MachineCPUTime.now().stealPercent(since: cpuBefore)
        return object
    }
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

/// The median, minimum and maximum of one numeric field over several child runs.
func spread(_ runs: [[String: Any]], _ key: String) -> Spread {
    Spread(runs.map { number($0[key]) })
}

/// A JSON number (or anything else: 0).
func number(_ value: Any?) -> Double {
    switch value {
    case let double as Double: return double
    case let int as Int: return Double(int)
    case let number as NSNumber: return number.doubleValue
    default: return 0
    }
}

/// The end-of-run table's columns: the ones every scenario has, then its key figure.
let summaryHeader = ["scenario", "notifications", "rate/s (median [min-max])", "CPU s", "peak RSS MB", "key figure"]

/// The end-of-run table's rows, one per scenario (the terminal table and the HTML report both show these).
func summaryRows(_ results: [[String: Any]]) -> [[String]] {
    var rows: [[String]] = []
    for entry in results {
        let rate = number(entry["rate"])
        var rateText = rate >= 1e6 ? String(format: "%.2fM", rate / 1e6) : String(format: "%.0f", rate)
        if let low = entry["rate_min"], let high = entry["rate_max"], number(low) != number(high) {
            rateText +=
                rate >= 1e6
                ? String(format: " [%.2fM-%.2fM]", number(low) / 1e6, number(high) / 1e6)
                : String(format: " [%.0f-%.0f]", number(low), number(high))
        }
        rows.append([
            entry["scenario"] as? String ?? "?", String(Int(number(entry["notifications"]))), rateText,
            String(format: "%.2f", number(entry["cpu_seconds"])), String(format: "%.1f", number(entry["peak_rss_mb"])),
            entry["key_figure"] as? String ?? "",
        ])
    }
    return rows
}

/// The end-of-run table: one row per scenario, the columns every scenario has, then its key figure.
func printSummaryTable(_ results: [[String: Any]]) {
    guard !results.isEmpty else { return }
    let header = summaryHeader
    let rows = summaryRows(results)
    var widths = header.map(\.count)
    for row in rows {
        for (column, cell) in row.enumerated() { widths[column] = max(widths[column], cell.count) }
    }
    func line(_ cells: [String]) -> String {
        cells.enumerated().map { column, cell in
            column == cells.count - 1 ? cell : cell.padding(toLength: widths[column], withPad: " ", startingAt: 0)
        }.joined(separator: " | ")
    }
    print("")
    print(line(header))
    print(widths.map { String(repeating: "-", count: $0) }.joined(separator: "-|-"))
    for row in rows { print(line(row)) }
}
