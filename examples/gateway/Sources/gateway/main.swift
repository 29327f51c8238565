// gateway: what a push gateway does with the Fanout library, step by step, against one APNs endpoint (mock-apns in
// scripts/gateway-example.sh). Each step prints one JSON line on stdout; the exit status says whether all of them
// came out as expected (a failure is named on stderr).
import Fanout
import Foundation

let usage = """
    usage: gateway --endpoint HOST:PORT --ca-file PEM --key P8 --key-id ID --team-id ID
                   [--deadline-endpoint HOST:PORT]

    Sends through one FanoutEngine (the library's default configuration, apart from the endpoint, credentials and
    CA file) and prints one JSON line per step:
      alert              one alert to one device (engine.send, 5 s timeout)
      live_activity_job  a Live Activity update to 10,000 tokens (engine.run)
      concurrent_sends   6,000 concurrent engine.send calls from a task group
      deadline           with --deadline-endpoint (a mock-apns that never answers, --blackhole-every 1): one send
                         with a 200 ms timeout, which must end failed/DeadlineExceeded within 400 ms
    Exits 0 when every step comes out as expected, 1 otherwise (what failed is named on stderr), 2 on bad usage.

      --endpoint HOST:PORT           the APNs endpoint (e.g. a mock-apns's "listening on" address)
      --ca-file PEM                  CA certificate to trust for it (mock-apns --tls-dir DIR writes DIR/ca.pem)
      --key P8                       the provider signing key (.p8)
      --key-id ID, --team-id ID      the key's id and the team id of the provider tokens
      --deadline-endpoint HOST:PORT  run the deadline step against this endpoint
      --help                         this text

    """

// MARK: - Command line

struct Options {
    var endpoint: APNsEndpoint
    var caFile: String
    var keyPath: String
    var keyID: String
    var teamID: String
    var deadlineEndpoint: APNsEndpoint?
}

func fail(usage message: String) -> Never {
    FileHandle.standardError.write(Data("gateway: \(message)\n\(usage)".utf8))
    exit(2)
}

/// `HOST:PORT` (`[::1]:PORT` for an IPv6 address).
func parseEndpoint(_ text: String, flag: String) -> APNsEndpoint {
    guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
        (1...65_535).contains(port)
    else { fail(usage: "\(flag) wants HOST:PORT, not \"\(text)\"") }
    var host = String(text[..<colon])
    if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
    guard !host.isEmpty else { fail(usage: "\(flag) wants HOST:PORT, not \"\(text)\"") }
    return APNsEndpoint(host: host, port: port)
}

func parseOptions(_ arguments: [String]) -> Options {
    var values: [String: String] = [:]
    var index = 0
    while index < arguments.count {
        let flag = arguments[index]
        if flag == "--help" || flag == "-h" {
            print(usage, terminator: "")
            exit(0)
        }
        let known = ["--endpoint", "--ca-file", "--key", "--key-id", "--team-id", "--deadline-endpoint"]
        guard known.contains(flag) else { fail(usage: "unknown argument \(flag)") }
        guard index + 1 < arguments.count else { fail(usage: "\(flag) needs a value") }
        values[flag] = arguments[index + 1]
        index += 2
    }
    func required(_ flag: String) -> String {
        guard let value = values[flag], !value.isEmpty else { fail(usage: "\(flag) is required") }
        return value
    }
    return Options(
        endpoint: parseEndpoint(required("--endpoint"), flag: "--endpoint"),
        caFile: required("--ca-file"),
        keyPath: required("--key"),
        keyID: required("--key-id"),
        teamID: required("--team-id"),
        deadlineEndpoint: values["--deadline-endpoint"].map { parseEndpoint($0, flag: "--deadline-endpoint") })
}

// MARK: - Output

/// A JSON value for the summary lines, whose keys keep the order they are given in.
enum Field {
    case string(String)
    case int(Int)
    /// A number with `digits` digits after the point.
    case number(Double, digits: Int)
    case null

    var json: String {
        switch self {
        case .string(let text):
            let data = try! JSONSerialization.data(withJSONObject: [text], options: [.withoutEscapingSlashes])
            return String(decoding: data.dropFirst().dropLast(), as: UTF8.self)
        case .int(let value): return String(value)
        case .number(let value, let digits): return String(format: "%.\(digits)f", value)
        case .null: return "null"
        }
    }
}

func printLine(_ fields: KeyValuePairs<String, Field>) {
    let line = "{" + fields.map { "\"\($0.key)\": \($0.value.json)" }.joined(separator: ", ") + "}\n"
    FileHandle.standardOutput.write(Data(line.utf8))
}

func milliseconds(_ duration: Duration) -> Double {
    let (seconds, attoseconds) = duration.components
    return Double(seconds) * 1_000 + Double(attoseconds) / 1e15
}

/// A device token: 64 hex digits.
func token(_ index: Int) -> String { String(format: "%064lx", index) }

var failures: [String] = []

@MainActor func expect(_ condition: Bool, _ what: @autoclosure () -> String) {
    if !condition { failures.append(what()) }
}

// MARK: - The steps

let options = parseOptions(Array(CommandLine.arguments.dropFirst()))
let credentials = ProviderCredentials(keyPath: options.keyPath, keyID: options.keyID, teamID: options.teamID)
let app = "com.example.app"

/// The library's defaults, apart from where to send and how to sign: no workspace budgets (they are opt-in), one
/// loop per core, a 30 s deadline per send.
func makeEngine(_ endpoint: APNsEndpoint) throws(FanoutError) -> FanoutEngine {
    try FanoutEngine(
        configuration: FanoutEngineConfiguration(endpoint: endpoint, credentials: credentials, caFile: options.caFile))
}

let engine: FanoutEngine
do {
    engine = try makeEngine(options.endpoint)
} catch {
    FileHandle.standardError.write(Data("gateway: cannot make the engine: \(error.kind): \(error)\n".utf8))
    exit(1)
}

// 1. One alert to one device.
do {
    let clock = ContinuousClock()
    let started = clock.now
    do {
        let alert = try PushNotification.alert(AlertPayload(title: "Goal!", body: "2-1"), to: token(1), app: app)
        let result = try await engine.send(alert, timeout: .seconds(5))
        let took = clock.now - started
        printLine([
            "step": .string("alert"), "outcome": .string(result.outcome.name),
            "reason": result.reason.map(Field.string) ?? .null,
            "latency_ms": .number(result.latency / .milliseconds(1), digits: 2),
            "call_ms": .number(milliseconds(took), digits: 1),
        ])
        expect(
            result.outcome == .delivered,
            "alert: \(result.outcome) (\(result.reason ?? "no reason")), not delivered")
    } catch {
        printLine(["step": .string("alert"), "error": .string("\(error.kind): \(error)")])
        failures.append("alert: threw \(error.kind): \(error)")
    }
}

// 2. A Live Activity update to 10,000 tokens, as one job.
do {
    let count = 10_000
    let job = FanoutJob.liveActivity(
        id: "match-7-update-1", bundleID: app,
        content: LiveActivityContent(
            event: .update, timestamp: Int64(Date().timeIntervalSince1970),
            contentState: try! RawJSON(validating: #"{"home":2,"away":1}"#),
            alert: LiveActivityAlert(title: "Goal!", body: "2-1")),
        priority: 10, recipients: .tokens((0..<count).map { token(10_000 + $0) }))
    do {
        let summary = try await engine.run(job) { _ in }
        let counts = summary.counts
        printLine([
            "step": .string("live_activity_job"), "notifications": .int(summary.notifications),
            "delivered": .int(counts.delivered), "other": .int(counts.total - counts.delivered),
            "payload_encodings": .int(summary.payloadEncodings), "seconds": .number(summary.seconds, digits: 3),
        ])
        expect(
            summary.notifications == count && counts.delivered == count,
            "live_activity_job: \(counts.delivered) of \(summary.notifications) delivered, not \(count) of \(count)")
    } catch {
        printLine(["step": .string("live_activity_job"), "error": .string("\(error.kind): \(error)")])
        failures.append("live_activity_job: threw \(error.kind): \(error)")
    }
}

// 3. 6,000 single sends at once, as a gateway's concurrent requests would make them.
do {
    let count = 6_000
    let clock = ContinuousClock()
    let started = clock.now
    let outcomes = await withTaskGroup(of: String.self) { group in
        for index in 0..<count {
            group.addTask {
                do throws(FanoutError) {
                    let alert = try PushNotification.alert(
                        AlertPayload(title: "Goal!", body: "2-1"), to: token(20_000 + index), app: app)
                    return try await engine.send(alert).outcome.name
                } catch {
                    return "threw \(error.kind)"
                }
            }
        }
        var counts: [String: Int] = [:]
        for await outcome in group { counts[outcome, default: 0] += 1 }
        return counts
    }
    let took = clock.now - started
    let delivered = outcomes["delivered", default: 0]
    let rateLimited = outcomes["rate_limited", default: 0]
    printLine([
        "step": .string("concurrent_sends"), "sends": .int(count), "delivered": .int(delivered),
        "rate_limited": .int(rateLimited), "other": .int(count - delivered - rateLimited),
        "seconds": .number(milliseconds(took) / 1_000, digits: 3),
    ])
    let others = outcomes.filter { $0.key != "delivered" }.sorted { $0.key < $1.key }
    expect(
        delivered == count,
        "concurrent_sends: \(delivered) of \(count) delivered; "
            + others.map { "\($0.value) \($0.key)" }.joined(separator: ", "))
}

await engine.shutdown()

// 4. A send to a server that never answers: its own deadline ends it.
if let deadlineEndpoint = options.deadlineEndpoint {
    do {
        let deadlineEngine = try makeEngine(deadlineEndpoint)
        let alert = try PushNotification.alert(AlertPayload(title: "Goal!", body: "2-1"), to: token(2), app: app)
        let clock = ContinuousClock()
        let started = clock.now
        let result = try await deadlineEngine.send(alert, timeout: .milliseconds(200))
        let took = milliseconds(clock.now - started)
        let inFlight = deadlineEngine.inFlight
        await deadlineEngine.shutdown(gracePeriod: .zero)
        printLine([
            "step": .string("deadline"), "outcome": .string(result.outcome.name),
            "reason": result.reason.map(Field.string) ?? .null, "ms": .number(took, digits: 1),
            "in_flight": .int(inFlight),
        ])
        expect(
            result.outcome == .failed && result.reason == "DeadlineExceeded",
            "deadline: \(result.outcome) (\(result.reason ?? "no reason")), not failed (DeadlineExceeded)")
        expect(took < 400, "deadline: the send took \(String(format: "%.1f", took)) ms, not under 400 ms")
    } catch {
        printLine(["step": .string("deadline"), "error": .string("\(error.kind): \(error)")])
        failures.append("deadline: threw \(error.kind): \(error)")
    }
}

if failures.isEmpty { exit(0) }
for failure in failures { FileHandle.standardError.write(Data("gateway: FAILED: \(failure)\n".utf8)) }
exit(1)
