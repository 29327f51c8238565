import FanoutCore
import Synchronization

/// A set of metrics rendered together in the Prometheus text exposition format (version 0.0.4).
///
/// Registration takes a lock and is meant for start-up; updates are lock-free atomics on the handles it returns
/// (`MetricCounter`, `MetricGauge`, `MetricHistogram`), so they are cheap enough to call once per notification. A labeled family
/// finds a child under a short lock: keep the handle when the labels are known in advance.
///
/// Registering a name again with the same type, label names (and, for a histogram, the same buckets) returns the
/// family already registered, so that two users of one registry (two `FanoutMetrics`, one per engine) share it and
/// their counts add up; the first registration's HELP text stays. Registering a name again with another type,
/// other label names or other buckets is a programming error and traps, naming the metric.
package final class MetricsRegistry: Sendable {
    private let families = FanoutMutex<[any ExpositionFamily]>([])

    package init() {}

    /// Registers an unlabeled counter.
    package func counter(_ name: String, help: String) -> MetricCounter {
        counter(name, help: help, labelNames: []).labels([])
    }

    /// Registers a counter family with these label names.
    package func counter(_ name: String, help: String, labelNames: [String], maxLabelSets: Int = 1000)
        -> MetricFamily<MetricCounter>
    {
        register(
            MetricFamily(
                name: name, help: help, type: "counter", labelNames: labelNames, maxLabelSets: maxLabelSets,
                make: { MetricCounter() },
                render: { counter, name, labels, output in
                    output += "\(name)\(labels) \(counter.value)\n"
                }))
    }

    /// Registers an unlabeled gauge.
    package func gauge(_ name: String, help: String) -> MetricGauge {
        gauge(name, help: help, labelNames: []).labels([])
    }

    /// Registers a gauge family with these label names.
    package func gauge(_ name: String, help: String, labelNames: [String], maxLabelSets: Int = 1000)
        -> MetricFamily<MetricGauge>
    {
        register(
            MetricFamily(
                name: name, help: help, type: "gauge", labelNames: labelNames, maxLabelSets: maxLabelSets,
                make: { MetricGauge() },
                render: { gauge, name, labels, output in
                    output += "\(name)\(labels) \(gauge.value)\n"
                }))
    }

    /// Registers an unlabeled histogram with these bucket upper bounds (finite, ascending; `+Inf` is implicit).
    package func histogram(_ name: String, help: String, buckets: [Double]) -> MetricHistogram {
        histogram(name, help: help, buckets: buckets, labelNames: []).labels([])
    }

    /// Registers a histogram family with these bucket upper bounds and label names.
    package func histogram(
        _ name: String, help: String, buckets: [Double], labelNames: [String], maxLabelSets: Int = 1000
    ) -> MetricFamily<MetricHistogram> {
        precondition(!labelNames.contains("le"), "histogram label `le` is reserved")
        return register(
            MetricFamily(
                name: name, help: help, type: "histogram", labelNames: labelNames, maxLabelSets: maxLabelSets,
                buckets: buckets, make: { MetricHistogram(buckets: buckets) },
                render: { histogram, name, labels, output in
                    histogram.appendExposition(name: name, labels: labels, to: &output)
                }))
    }

    private func register<Family: ExpositionFamily>(_ family: Family) -> Family {
        families.withLock { families in
            if let existing = families.first(where: { $0.name == family.name }) {
                guard let same = existing as? Family, existing.shape == family.shape else {
                    preconditionFailure(
                        "metric \(family.name) registered twice, as \(existing.shape) and as \(family.shape)")
                }
                return same
            }
            families.append(family)
            return family
        }
    }

    /// Every family, in registration order, in the Prometheus text format.
    package func exposition() -> String {
        let families = self.families.withLock { $0 }
        var output = ""
        output.reserveCapacity(families.count * 256)
        for family in families { family.appendExposition(to: &output) }
        return output
    }
}

/// A metric that only goes up. Thread-safe and lock-free.
package final class MetricCounter: Sendable {
    private let storage = Atomic<Int>(0)

    package init() {}

    package func increment(by amount: Int = 1) {
        precondition(amount >= 0, "a counter only goes up")
        storage.wrappingAdd(amount, ordering: .relaxed)
    }

    package var value: Int { storage.load(ordering: .relaxed) }
}

/// A metric that goes up and down. Thread-safe and lock-free.
package final class MetricGauge: Sendable {
    private let storage = Atomic<Int>(0)

    package init() {}

    package func increment(by amount: Int = 1) {
        storage.wrappingAdd(amount, ordering: .relaxed)
    }

    package func decrement(by amount: Int = 1) {
        storage.wrappingSubtract(amount, ordering: .relaxed)
    }

    package func set(_ value: Int) {
        storage.store(value, ordering: .relaxed)
    }

    package var value: Int { storage.load(ordering: .relaxed) }
}

/// Counts observations into fixed buckets and sums them. Thread-safe and lock-free.
package final class MetricHistogram: Sendable {
    /// The finite upper bounds, ascending; a last bucket (`+Inf`) takes the rest.
    package let upperBounds: [Double]
    /// One count per bucket (not cumulative), `upperBounds.count + 1` of them.
    private let counts: [AtomicCount]
    /// The bit pattern of the sum of observations, updated by compare-and-exchange.
    private let sumBits = Atomic<UInt64>(0)

    package init(buckets: [Double]) {
        precondition(buckets.allSatisfy { $0.isFinite }, "histogram bounds must be finite (+Inf is implicit)")
        precondition(zip(buckets, buckets.dropFirst()).allSatisfy { $0 < $1 }, "histogram bounds must ascend")
        upperBounds = buckets
        counts = (0...buckets.count).map { _ in AtomicCount() }
    }

    /// Records one observation. NaN is ignored.
    package func observe(_ value: Double) {
        guard !value.isNaN else { return }
        var index = 0
        while index < upperBounds.count && value > upperBounds[index] { index += 1 }
        counts[index].storage.wrappingAdd(1, ordering: .relaxed)
        var current = sumBits.load(ordering: .relaxed)
        while true {
            let next = (Double(bitPattern: current) + value).bitPattern
            let (exchanged, original) = sumBits.compareExchange(
                expected: current, desired: next, ordering: .relaxed)
            if exchanged { return }
            current = original
        }
    }

    /// Records a duration in seconds.
    package func observe(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        observe(Double(seconds) + Double(attoseconds) * 1e-18)
    }

    /// A consistent-enough copy: cumulative counts per bound (the last is `+Inf`, equal to `count`), and the sum.
    package struct Snapshot: Sendable {
        package var upperBounds: [Double]
        package var cumulativeCounts: [Int]
        package var sum: Double
        package var count: Int { cumulativeCounts.last ?? 0 }
    }

    package func snapshot() -> Snapshot {
        var running = 0
        let cumulative = counts.map { cell -> Int in
            running += cell.storage.load(ordering: .relaxed)
            return running
        }
        return Snapshot(
            upperBounds: upperBounds, cumulativeCounts: cumulative,
            sum: Double(bitPattern: sumBits.load(ordering: .relaxed)))
    }

    fileprivate func appendExposition(name: String, labels: String, to output: inout String) {
        // `_count` is the `+Inf` bucket of the same snapshot, so the two always agree.
        let snapshot = snapshot()
        let bounds = upperBounds.map(PrometheusText.formatDouble) + ["+Inf"]
        // `labels` is `{a="x",b="y"}` or empty; `le` goes last inside the braces.
        let prefix = labels.isEmpty ? "{" : String(labels.dropLast()) + ","
        for (bound, count) in zip(bounds, snapshot.cumulativeCounts) {
            output += "\(name)_bucket\(prefix)le=\"\(bound)\"} \(count)\n"
        }
        output += "\(name)_sum\(labels) \(PrometheusText.formatDouble(snapshot.sum))\n"
        output += "\(name)_count\(labels) \(snapshot.count)\n"
    }
}

/// An `Atomic` in a class, so that an array can hold several.
private final class AtomicCount: Sendable {
    let storage = Atomic<Int>(0)
}

/// One metric name with its HELP, TYPE and label names, and one child metric per set of label values.
package final class MetricFamily<Metric: AnyObject & Sendable>: Sendable {
    package let name: String
    package let help: String
    package let labelNames: [String]
    let type: String
    /// A histogram's bucket bounds; empty for the other types.
    let buckets: [Double]
    /// Past this many distinct label sets, new ones share one child whose values are all `_overflow`, so that a
    /// caller passing unbounded values (workspace names) cannot grow memory without end.
    let maxLabelSets: Int
    private let make: @Sendable () -> Metric
    private let render: @Sendable (Metric, String, String, inout String) -> Void
    private let children = FanoutMutex<[[String]: Metric]>([:])

    /// The label value that stands for every label set past `maxLabelSets`.
    package static var overflowLabelValue: String { "_overflow" }

    init(
        name: String, help: String, type: String, labelNames: [String], maxLabelSets: Int, buckets: [Double] = [],
        make: @escaping @Sendable () -> Metric,
        render: @escaping @Sendable (Metric, String, String, inout String) -> Void
    ) {
        precondition(PrometheusText.isValidMetricName(name), "invalid metric name \(name)")
        for label in labelNames {
            precondition(PrometheusText.isValidLabelName(label), "invalid label name \(label) on \(name)")
        }
        precondition(Set(labelNames).count == labelNames.count, "duplicate label names on \(name)")
        precondition(maxLabelSets >= 1)
        self.name = name
        self.help = help
        self.type = type
        self.labelNames = labelNames
        self.maxLabelSets = maxLabelSets
        self.buckets = buckets
        self.make = make
        self.render = render
        // An unlabeled metric exists (at zero) from the start, so that it is scraped before its first update.
        if labelNames.isEmpty { _ = labels([]) }
    }

    /// The child for these label values (one per label name, in order), made on first use.
    package func labels(_ values: String...) -> Metric {
        labels(values)
    }

    /// The child for these label values (one per label name, in order), made on first use.
    package func labels(_ values: [String]) -> Metric {
        precondition(values.count == labelNames.count, "\(name) takes \(labelNames.count) label values")
        return children.withLock { children in
            if let existing = children[values] { return existing }
            var key = values
            if children.count >= maxLabelSets {
                key = Array(repeating: Self.overflowLabelValue, count: values.count)
                if let overflow = children[key] { return overflow }
            }
            let metric = make()
            children[key] = metric
            return metric
        }
    }
}

/// What the registry needs of a family to render it, whatever its metric type.
protocol ExpositionFamily: AnyObject, Sendable {
    var name: String { get }
    /// What a second registration of the name must match to share the family.
    var shape: FamilyShape { get }
    func appendExposition(to output: inout String)
}

/// A family's type, label names and buckets: two registrations of one name with the same shape share a family.
struct FamilyShape: Equatable, CustomStringConvertible {
    var type: String
    var labelNames: [String]
    var buckets: [Double]

    var description: String {
        let labels = "labels [\(labelNames.joined(separator: ", "))]"
        return buckets.isEmpty ? "\(type) with \(labels)" : "\(type) with \(labels) and buckets \(buckets)"
    }
}

extension MetricFamily: ExpositionFamily {
    var shape: FamilyShape { FamilyShape(type: type, labelNames: labelNames, buckets: buckets) }

    func appendExposition(to output: inout String) {
        let children = self.children.withLock { $0 }
        output += "# HELP \(name) \(PrometheusText.escapeHelp(help))\n"
        output += "# TYPE \(name) \(type)\n"
        // Sorted, so that scrapes are stable and diffable.
        let sorted = children.sorted { $0.key.lexicographicallyPrecedes($1.key) }
        for (values, metric) in sorted {
            render(metric, name, PrometheusText.labelSet(names: labelNames, values: values), &output)
        }
    }
}

/// The spelling rules of the Prometheus text format.
enum PrometheusText {
    /// `[a-zA-Z_:][a-zA-Z0-9_:]*`
    static func isValidMetricName(_ name: String) -> Bool {
        guard let first = name.utf8.first, isLetterOrUnderscore(first) || first == UInt8(ascii: ":") else {
            return false
        }
        return name.utf8.allSatisfy { isLetterOrUnderscore($0) || isDigit($0) || $0 == UInt8(ascii: ":") }
    }

    /// `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__` (reserved).
    static func isValidLabelName(_ name: String) -> Bool {
        guard let first = name.utf8.first, isLetterOrUnderscore(first), !name.hasPrefix("__") else { return false }
        return name.utf8.allSatisfy { isLetterOrUnderscore($0) || isDigit($0) }
    }

    private static func isLetterOrUnderscore(_ byte: UInt8) -> Bool {
        (byte | 0x20) >= UInt8(ascii: "a") && (byte | 0x20) <= UInt8(ascii: "z") || byte == UInt8(ascii: "_")
    }

    private static func isDigit(_ byte: UInt8) -> Bool {
        byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")
    }

    /// `{a="x",b="y"}`, or empty with no labels.
    static func labelSet(names: [String], values: [String]) -> String {
        guard !names.isEmpty else { return "" }
        let pairs = zip(names, values).map { "\($0)=\"\(escapeLabelValue($1))\"" }
        return "{\(pairs.joined(separator: ","))}"
    }

    /// Label values escape backslash, double quote and line feed.
    static func escapeLabelValue(_ value: String) -> String {
        guard value.contains(where: { $0 == "\\" || $0 == "\"" || $0 == "\n" }) else { return value }
        var escaped = ""
        for character in value {
            switch character {
            case "\\": escaped += "\\\\"
            case "\"": escaped += "\\\""
            case "\n": escaped += "\\n"
            default: escaped.append(character)
            }
        }
        return escaped
    }

    /// HELP text escapes backslash and line feed.
    static func escapeHelp(_ help: String) -> String {
        help.replacingAll("\\", with: "\\\\").replacingAll("\n", with: "\\n")
    }

    /// Go's float syntax, which Prometheus parses: `+Inf`, `-Inf`, `NaN`, else Swift's shortest round-trip form.
    static func formatDouble(_ value: Double) -> String {
        if value.isNaN { return "NaN" }
        if value == .infinity { return "+Inf" }
        if value == -.infinity { return "-Inf" }
        return value.description
    }
}

extension String {
    fileprivate func replacingAll(_ target: Character, with replacement: String) -> String {
        guard contains(target) else { return self }
        var result = ""
        for character in self {
            if character == target { result += replacement } else { result.append(character) }
        }
        return result
    }
}
