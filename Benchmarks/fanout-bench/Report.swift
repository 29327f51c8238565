import Foundation

// `--report DIR`: one self-contained HTML page (inline CSS, hand-written inline SVG, no script, nothing fetched) made
// from the same result dictionaries that `--json` writes and the summary table prints, so the three never disagree.

/// What the page says about the run itself: where, when and how it was made.
struct ReportRun {
    var date: Date
    var seconds: Double
    /// The arguments as given, program name first.
    var arguments: [String]
    var cores: Int
    var kernel: String
    var loadAverageBefore: [Double]
    var loadAverageAfter: [Double]
    /// The share of the machine's CPU time the hypervisor gave to other guests during the run (`MachineCPUTime`).
    var stealPercent: Double
    var runs: Int
}

/// Writes `directory/index.html`, creating the directory when needed; returns the file's path.
func writeReport(directory: String, results: [[String: Any]], run: ReportRun) throws -> String {
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    let path = (directory as NSString).appendingPathComponent("index.html")
    try Data(reportHTML(results: results, run: run).utf8).write(to: URL(fileURLWithPath: path))
    return path
}

/// The kernel's name and release (`uname -sr`), for the page's machine line.
func kernelDescription() -> String {
    var name = utsname()
    guard uname(&name) == 0 else { return "" }
    func field<T>(_ value: T) -> String {
        withUnsafeBytes(of: value) { bytes in
            String(decoding: bytes.prefix(while: { $0 != 0 }), as: UTF8.self)
        }
    }
    return "\(field(name.sysname)) \(field(name.release))"
}

/// The command line as a shell would take it back: arguments with anything but safe characters single-quoted.
func shellQuoted(_ arguments: [String]) -> String {
    let safe = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+%@")
    return arguments.map { argument in
        !argument.isEmpty && argument.allSatisfy(safe.contains)
            ? argument : "'" + argument.replacingOccurrences(of: "'", with: #"'\''"#) + "'"
    }.joined(separator: " ")
}

/// Text made safe for HTML and SVG content and attribute values (both are XML-ish here).
func escapeHTML(_ text: String) -> String {
    var out = ""
    out.reserveCapacity(text.utf8.count)
    for character in text {
        switch character {
        case "&": out += "&amp;"
        case "<": out += "&lt;"
        case ">": out += "&gt;"
        case "\"": out += "&quot;"
        case "'": out += "&#39;"
        default: out.append(character)
        }
    }
    return out
}

// MARK: The page

/// The whole page for `results` (the scenarios in the order they ran; scenarios that did not run are absent).
func reportHTML(results: [[String: Any]], run: ReportRun) -> String {
    let dateFormatter = ISO8601DateFormatter()
    dateFormatter.formatOptions = [.withInternetDateTime]
    func loads(_ values: [Double]) -> String { values.map { String(format: "%.2f", $0) }.joined(separator: " ") }
    var body = ""
    body += "<h1>fanout-bench report</h1>\n"
    body += "<dl class=\"run\">\n"
    body += "<dt>date</dt><dd>\(escapeHTML(dateFormatter.string(from: run.date)))"
    body += String(format: " (%.0f s)", run.seconds) + "</dd>\n"
    body += "<dt>machine</dt><dd>\(run.cores) cores, \(escapeHTML(run.kernel))</dd>\n"
    body += "<dt>load average (1, 5, 15 min)</dt><dd>before \(loads(run.loadAverageBefore)), "
    body += "after \(loads(run.loadAverageAfter))</dd>\n"
    body += "<dt>CPU time stolen by the hypervisor</dt><dd>" + String(format: "%.1f%%", run.stealPercent)
    body += " of the run (/proc/stat)</dd>\n"
    // One unbreakable span per argument, so a line wraps between arguments and never inside `--report`.
    let command = run.arguments.map { "<span class=\"arg\">\(escapeHTML(shellQuoted([$0])))</span>" }
    body += "<dt>command</dt><dd><code>\(command.joined(separator: " "))</code></dd>\n"
    body += "<dt>runs per measurement</dt><dd>\(run.runs): bars are medians, whiskers span min to max</dd>\n"
    body += "</dl>\n"

    let comparisons = results.compactMap(comparisonChart)
    if !comparisons.isEmpty {
        body += "<h2>Throughput beside its reference</h2>\n"
        body += "<p>Notifications (or requests) per second, the same mock, connections, streams and body.</p>\n"
        for (title, note, bars) in comparisons {
            body += "<figure><figcaption>\(escapeHTML(title))"
            if !note.isEmpty { body += " <span class=\"note\">\(escapeHTML(note))</span>" }
            body += "</figcaption>\n\(barChartSVG(bars, unit: "/s"))</figure>\n"
        }
    }
    if let load = results.first(where: { $0["scenario"] as? String == "load" }) {
        body += "<h2>Latency under load</h2>\n"
        body += "<p>\(escapeHTML(loadCaption(load)))</p>\n"
        body += "<figure>\(latencySVG(load))</figure>\n"
    }
    if let scaling = results.first(where: { $0["scenario"] as? String == "fanout-scaling" }),
        let sizes = scaling["sizes"] as? [[String: Any]], !sizes.isEmpty
    {
        body += "<h2>Cost against the number of tokens (fanout-scaling)</h2>\n"
        body += "<p>One job from a tokens file, 1 loop, 2 connections, 1000 streams.</p>\n"
        body += "<div class=\"pair\">"
        body +=
            "<figure><figcaption>CPU microseconds per notification</figcaption>"
            + "\(lineChartSVG(sizes, key: "cpu_us_per_notification", format: "%.2f"))</figure>"
        body +=
            "<figure><figcaption>peak RSS, MB</figcaption>"
            + "\(lineChartSVG(sizes, key: "peak_rss_mb", format: "%.1f"))</figure>"
        body += "</div>\n"
    }
    if !results.isEmpty {
        body += "<h2>Every scenario</h2>\n<table>\n<tr>"
        for cell in summaryHeader { body += "<th>\(escapeHTML(cell))</th>" }
        body += "</tr>\n"
        for row in summaryRows(results) {
            body += "<tr>"
            for (column, cell) in row.enumerated() {
                body += column == 0 || column == row.count - 1 ? "<td>" : "<td class=\"n\">"
                body += "\(escapeHTML(cell))</td>"
            }
            body += "</tr>\n"
        }
        body += "</table>\n"
    } else {
        body += "<p>No scenario ran.</p>\n"
    }
    return """
        <!DOCTYPE html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <title>fanout-bench report</title>
        <style>
        body { font: 14px/1.45 system-ui, sans-serif; color: #222; max-width: 1000px; margin: 2em auto; padding: 0 1em; }
        h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; }
        dl.run { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
        dl.run dt { color: #666; } dl.run dd { margin: 0; }
        figure { margin: 1em 0; } figcaption { font-weight: 600; margin-bottom: 0.3em; }
        .note { font-weight: normal; color: #666; }
        .pair { display: flex; flex-wrap: wrap; gap: 2em; }
        table { border-collapse: collapse; width: 100%; font-size: 13px; }
        th, td { border-bottom: 1px solid #e4e4e4; padding: 0.3em 0.5em; text-align: left; vertical-align: top; }
        td:first-child, th { white-space: nowrap; } .arg { white-space: nowrap; }
        td.n { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
        svg text { font: 12px system-ui, sans-serif; fill: #222; }
        svg .axis { stroke: #999; } svg .grid { stroke: #e6e6e6; }
        svg .fanout { fill: #2b6cb0; } svg .reference { fill: #a0aec0; } svg .mock { fill: #ed8936; }
        svg .whisker { stroke: #111; stroke-width: 1.5; } svg .line { fill: none; stroke: #2b6cb0; stroke-width: 2; }
        svg .dot { fill: #2b6cb0; }
        </style>
        </head>
        <body>
        \(body)</body>
        </html>

        """
}

// MARK: Throughput comparisons

/// One bar: a label, its median and (when runs differed) its min and max; `reference` draws it in the reference colour.
struct ReportBar {
    var label: String
    var median: Double
    var min: Double?
    var max: Double?
    var reference: Bool
}

/// Reads `key`, `key_min` and `key_max` from an entry as a bar; nil when the entry has no `key`.
func reportBar(_ entry: [String: Any], _ key: String, label: String, reference: Bool) -> ReportBar? {
    guard entry[key] != nil else { return nil }
    return ReportBar(
        label: label, median: number(entry[key]), min: entry[key + "_min"].map { number($0) },
        max: entry[key + "_max"].map { number($0) }, reference: reference)
}

/// The comparison chart a scenario has (title, note, bars), nil for scenarios without a reference to compare with.
func comparisonChart(_ entry: [String: Any]) -> (String, String, [ReportBar])? {
    guard let scenario = entry["scenario"] as? String else { return nil }
    var bars: [ReportBar?]
    var note = ""
    switch scenario {
    case "throughput-1c", "throughput-4c":
        bars = [
            reportBar(entry, "rate", label: "Fanout", reference: false),
            reportBar(entry, "rate_fanout_ids", label: "Fanout, fanout ids", reference: false),
            reportBar(entry, "h2load_rate", label: "h2load", reference: true),
        ]
        if let ratio = entry["ratio_vs_h2load"] { note = String(format: "ratio vs h2load %.2f", number(ratio)) }
        if let paired = entry["ratio_vs_h2load_paired"] { note += String(format: " (run by run %.2f)", number(paired)) }
        if let ratio = entry["ratio_vs_h2load_fanout_ids"] {
            note += String(format: "; with apnsIDs .fanout %.2f", number(ratio))
            if let paired = entry["ratio_vs_h2load_fanout_ids_paired"] {
                note += String(format: " (run by run %.2f)", number(paired))
            }
        }
        note += note.isEmpty ? "" : "; "
        note += "\(Int(number(entry["connections"]))) connection(s), \(Int(number(entry["streams"]))) streams"
    case "peer-aioapns":
        bars = [
            reportBar(entry, "rate", label: "Fanout", reference: false),
            reportBar(entry, "aioapns_rate", label: "aioapns", reference: true),
        ]
        if let ratio = entry["ratio_vs_aioapns"] { note = String(format: "ratio vs aioapns %.1f", number(ratio)) }
    case "registry":
        bars = [
            reportBar(entry, "rate", label: "activity_id job", reference: false),
            reportBar(entry, "tokens_file_rate", label: "tokens_file job", reference: true),
        ]
        if let ratio = entry["ratio_vs_tokens_file"] {
            note = String(format: "ratio vs tokens_file %.2f", number(ratio))
        }
    case "serve":
        bars = [
            reportBar(entry, "rate", label: "fanout serve (API)", reference: false),
            reportBar(entry, "send_rate", label: "fanout send", reference: true),
        ]
        if let ratio = entry["ratio_vs_send"] { note = String(format: "ratio vs fanout send %.2f", number(ratio)) }
    case "fleet":
        bars = (1...3).map { reportBar(entry, "workers_\($0)_rate", label: "fleet, \($0) worker(s)", reference: false) }
        bars.append(reportBar(entry, "send_rate", label: "fanout send", reference: true))
        note = "from enqueue to the last result"
    case "fleet-cluster":
        bars = [
            reportBar(entry, "one_redis_rate", label: "fleet, 3 workers, one Redis", reference: false),
            reportBar(entry, "cluster_rate", label: "fleet, 3 workers, cluster of 3", reference: false),
            reportBar(entry, "send_rate", label: "fanout send", reference: true),
        ]
        note = "from enqueue to the last result"
    default:
        return nil
    }
    let present = bars.compactMap { $0 }
    guard present.count >= 2 else { return nil }
    return (scenario, note, present)
}

/// A horizontal bar chart on a linear axis from zero, with min–max whiskers and the median written beside each bar.
func barChartSVG(_ bars: [ReportBar], unit: String) -> String {
    let width = 760.0
    let left = 170.0
    let right = 120.0
    let rowHeight = 30.0
    let top = 10.0
    let plot = width - left - right
    let height = top + rowHeight * Double(bars.count) + 30
    let top0 = bars.map { Swift.max($0.median, $0.max ?? 0) }.max() ?? 1
    let axisMax = niceCeiling(top0 > 0 ? top0 : 1)
    func x(_ value: Double) -> Double { left + plot * Swift.max(0, value) / axisMax }
    var svg = svgOpen(width: width, height: height, label: "bar chart")
    let ticks = niceTickCount(axisMax)
    for tick in 0...ticks {
        let value = axisMax * Double(tick) / Double(ticks)
        let position = x(value)
        svg += svgLine(position, top, position, height - 25, class: "grid")
        svg += svgText(position, height - 10, formatQuantity(value), anchor: "middle")
    }
    for (index, bar) in bars.enumerated() {
        let y = top + rowHeight * Double(index)
        svg += svgText(left - 8, y + rowHeight / 2 + 4, bar.label, anchor: "end")
        svg += svgRect(left, y + 5, x(bar.median) - left, rowHeight - 10, class: bar.reference ? "reference" : "fanout")
        if let low = bar.min, let high = bar.max, low != high {
            svg += svgWhisker(x(low), x(high), y + rowHeight / 2, cap: 6)
        }
        let labelX = Swift.max(x(bar.median), x(bar.max ?? 0)) + 6
        svg += svgText(labelX, y + rowHeight / 2 + 4, formatQuantity(bar.median) + unit, anchor: "start")
    }
    svg += svgLine(left, top, left, height - 25, class: "axis")
    return svg + "</svg>\n"
}

// MARK: Load latency

let latencyPercentiles = [("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p999", "p99.9"), ("max", "max")]

func loadCaption(_ load: [String: Any]) -> String {
    var caption = String(
        format: "Open loop at %.0f/s (%@) for %.0f s, 1 connection: achieved %.0f/s, shortfall %.1f%%. ",
        number(load["target_rate"]), load["target_rate_source"] as? String ?? "?", number(load["duration"]),
        number(load["rate"]), number(load["shortfall_percent"]))
    caption += "Fanout's latency runs from each notification's intended send time to its answer"
    caption += String(
        format: ", once one notification has opened the connection (%.1f ms, not counted). ", number(load["warmup_ms"]))
    if let method = load["mock_latency_method"] as? String {
        caption += "The mock alone: \(method). "
    } else {
        caption += "The mock alone was not measured (h2load not installed). "
    }
    if let pairs = load["runs_p99_steal"] as? [[Double]], !pairs.isEmpty {
        caption += "Each run's p99 with the share of CPU time the hypervisor took meanwhile: "
        caption += pairs.map { String(format: "%.2f ms at %.1f%%", $0[0], $0[1]) }.joined(separator: ", ") + ". "
    }
    caption += "Milliseconds, log scale; whiskers span min to max over the runs."
    return caption
}

/// Fanout's latency percentiles beside the mock's own, as grouped horizontal bars on a log axis.
func latencySVG(_ load: [String: Any]) -> String {
    struct Series {
        var prefix: String
        var label: String
        var cssClass: String
    }
    let series = [
        Series(prefix: "latency_ms_", label: "Fanout", cssClass: "fanout"),
        Series(prefix: "mock_latency_ms_", label: "mock alone", cssClass: "mock"),
    ].filter { load[$0.prefix + "p50"] != nil }
    var values: [Double] = []
    for item in series {
        for (key, _) in latencyPercentiles {
            for suffix in ["", "_min", "_max"] {
                if let value = load[item.prefix + key + suffix] { values.append(number(value)) }
            }
        }
    }
    let positive = values.filter { $0 > 0 }
    let low = pow(10, floor(log10(positive.min() ?? 0.01)))
    let high = pow(10, ceil(log10(Swift.max(positive.max() ?? 1, low * 10))))
    let width = 760.0
    let left = 70.0
    let right = 110.0
    let top = 28.0
    let barHeight = 12.0
    let groupHeight = barHeight * Double(Swift.max(series.count, 1)) + 14
    let plot = width - left - right
    let height = top + groupHeight * Double(latencyPercentiles.count) + 30
    func x(_ value: Double) -> Double {
        let clamped = Swift.min(Swift.max(value, low), high)
        return left + plot * log10(clamped / low) / log10(high / low)
    }
    var svg = svgOpen(width: width, height: height, label: "latency percentiles, log scale")
    var decade = low
    while decade <= high * 1.0001 {
        svg += svgLine(x(decade), top, x(decade), height - 25, class: "grid")
        svg += svgText(x(decade), height - 10, formatMilliseconds(decade) + " ms", anchor: "middle")
        decade *= 10
    }
    for (index, item) in series.enumerated() {
        let legendX = left + Double(index) * 130
        svg += svgRect(legendX, 6, 12, 12, class: item.cssClass)
        svg += svgText(legendX + 18, 16, item.label, anchor: "start")
    }
    for (group, (key, name)) in latencyPercentiles.enumerated() {
        let groupTop = top + groupHeight * Double(group)
        svg += svgText(left - 8, groupTop + groupHeight / 2, name, anchor: "end")
        for (index, item) in series.enumerated() {
            guard let median = load[item.prefix + key].map({ number($0) }) else { continue }
            let y = groupTop + 4 + barHeight * Double(index)
            svg += svgRect(left, y, x(median) - left, barHeight - 2, class: item.cssClass)
            let lowValue = load[item.prefix + key + "_min"].map { number($0) }
            let highValue = load[item.prefix + key + "_max"].map { number($0) }
            if let lowValue, let highValue, lowValue != highValue {
                svg += svgWhisker(x(lowValue), x(highValue), y + (barHeight - 2) / 2, cap: 4)
            }
            svg += svgText(
                Swift.max(x(median), x(highValue ?? 0)) + 6, y + barHeight - 3, formatMilliseconds(median) + " ms",
                anchor: "start")
        }
    }
    svg += svgLine(left, top, left, height - 25, class: "axis")
    return svg + "</svg>\n"
}

// MARK: fanout-scaling

/// `key` of each size row against its number of tokens: points joined by a line, x spaced by the sizes' order (they
/// are decades), y linear from zero.
func lineChartSVG(_ sizes: [[String: Any]], key: String, format: String) -> String {
    let width = 440.0
    let height = 260.0
    let left = 50.0
    let right = 30.0
    let top = 20.0
    let bottom = 40.0
    let plotWidth = width - left - right
    let plotHeight = height - top - bottom
    let values = sizes.map { number($0[key]) }
    let axisMax = niceCeiling(Swift.max(values.max() ?? 1, 1e-9) * 1.1)
    func x(_ index: Int) -> Double {
        sizes.count == 1 ? left + plotWidth / 2 : left + 20 + (plotWidth - 40) * Double(index) / Double(sizes.count - 1)
    }
    func y(_ value: Double) -> Double { top + plotHeight * (1 - value / axisMax) }
    var svg = svgOpen(width: width, height: height, label: key)
    let ticks = niceTickCount(axisMax)
    for tick in 0...ticks {
        let value = axisMax * Double(tick) / Double(ticks)
        svg += svgLine(left, y(value), width - right, y(value), class: "grid")
        svg += svgText(left - 6, y(value) + 4, formatQuantity(value), anchor: "end")
    }
    svg += svgLine(left, top, left, top + plotHeight, class: "axis")
    svg += svgLine(left, top + plotHeight, width - right, top + plotHeight, class: "axis")
    let points = values.enumerated().map { String(format: "%.1f,%.1f", x($0.offset), y($0.element)) }
    svg += "<polyline class=\"line\" points=\"\(points.joined(separator: " "))\"/>\n"
    for (index, value) in values.enumerated() {
        svg += String(format: "<circle class=\"dot\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\"/>\n", x(index), y(value))
        svg += svgText(x(index), y(value) - 9, String(format: format, value), anchor: "middle")
        svg += svgText(
            x(index), top + plotHeight + 18, formatQuantity(number(sizes[index]["tokens"])) + " tokens",
            anchor: "middle")
    }
    return svg + "</svg>\n"
}

// MARK: SVG pieces

func svgOpen(width: Double, height: Double, label: String) -> String {
    String(
        format: "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
            + "role=\"img\" aria-label=\"%@\">\n", width, height, width, height, escapeHTML(label))
}

func svgLine(_ x1: Double, _ y1: Double, _ x2: Double, _ y2: Double, class cssClass: String) -> String {
    String(format: "<line class=\"%@\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", cssClass, x1, y1, x2, y2)
}

func svgRect(_ x: Double, _ y: Double, _ width: Double, _ height: Double, class cssClass: String) -> String {
    String(
        format: "<rect class=\"%@\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", cssClass, x, y,
        Swift.max(0, width), Swift.max(0, height))
}

func svgText(_ x: Double, _ y: Double, _ content: String, anchor: String) -> String {
    String(format: "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%@\">", x, y, anchor) + escapeHTML(content) + "</text>\n"
}

/// A horizontal min–max whisker with end caps.
func svgWhisker(_ x1: Double, _ x2: Double, _ y: Double, cap: Double) -> String {
    svgLine(x1, y, x2, y, class: "whisker") + svgLine(x1, y - cap / 2, x1, y + cap / 2, class: "whisker")
        + svgLine(x2, y - cap / 2, x2, y + cap / 2, class: "whisker")
}

/// The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten at or above `value`: a round axis end.
func niceCeiling(_ value: Double) -> Double {
    guard value > 0, value.isFinite else { return 1 }
    let magnitude = pow(10, floor(log10(value)))
    for step in [1.0, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10] where step * magnitude >= value * 0.999_999 {
        return step * magnitude
    }
    return 10 * magnitude
}

/// How many equal steps split an axis ending at `niceCeiling`'s value into round numbers (80k in 4 of 20k, not 5 of
/// 16k).
func niceTickCount(_ axisMax: Double) -> Int {
    guard axisMax > 0, axisMax.isFinite else { return 4 }
    let lead = axisMax / pow(10, floor(log10(axisMax)))
    switch (lead * 10).rounded() {
    case 15, 30, 60: return 3
    case 20, 40, 80: return 4
    default: return 5
    }
}

/// 1234567 as "1.23M", 45600 as "45.6k", 12 as "12", 0.5 as "0.5".
func formatQuantity(_ value: Double) -> String {
    let magnitude = abs(value)
    if magnitude >= 1e6 { return trimmed(String(format: "%.2f", value / 1e6)) + "M" }
    if magnitude >= 1e4 { return trimmed(String(format: "%.1f", value / 1e3)) + "k" }
    if magnitude >= 100 || magnitude == 0 { return String(format: "%.0f", value) }
    return trimmed(String(format: "%.2f", value))
}

func formatMilliseconds(_ value: Double) -> String {
    value >= 100
        ? String(format: "%.0f", value)
        : value >= 1
            ? trimmed(String(format: "%.2f", value))
            : trimmed(String(format: "%.3f", value))
}

/// "1.50" as "1.5", "2.00" as "2".
func trimmed(_ text: String) -> String {
    guard text.contains(".") else { return text }
    var result = text
    while result.hasSuffix("0") { result.removeLast() }
    if result.hasSuffix(".") { result.removeLast() }
    return result
}
