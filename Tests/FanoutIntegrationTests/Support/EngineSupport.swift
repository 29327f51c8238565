import Fanout
import FanoutCore
import FanoutTestSupport
import Foundation
import XCTest

/// An engine pointed at `mock` with its CA and signing key; `configure` adjusts the rest.
func makeEngine(
    for mock: MockHarness, loops: Int = 2, connections: Int = 2,
    configure: (inout FanoutEngineConfiguration) -> Void = { _ in }
) throws -> FanoutEngine {
    try makeEngine(
        port: mock.port, material: mock.material, loops: loops, connections: connections, configure: configure)
}

/// An engine pointed at any server on `host:port` whose CA and signing key are `material`'s.
func makeEngine(
    host: String = "localhost", port: Int, material: TestTLSMaterial, loops: Int = 2, connections: Int = 2,
    configure: (inout FanoutEngineConfiguration) -> Void = { _ in }
) throws -> FanoutEngine {
    var configuration = FanoutEngineConfiguration(
        endpoint: APNsEndpoint(host: host, port: port),
        credentials: ProviderCredentials(keyPath: material.authKeyP8Path, keyID: "KEYID12345", teamID: "TEAMID1234"),
        caFile: material.caPEMPath)
    configuration.loops = loops
    configuration.connectionsPerLoop = connections
    configure(&configuration)
    return try FanoutEngine(configuration: configuration)
}

/// A Live Activity update of a score to `tokens`.
func scoreUpdateJob(id: String, tokens: [String]) -> FanoutJob {
    FanoutJob.liveActivity(
        id: id, bundleID: "com.example.app",
        content: LiveActivityContent(
            event: .update, timestamp: 1_764_460_800, contentState: try! RawJSON(validating: #"{"home":2,"away":1}"#)),
        recipients: .tokens(tokens))
}

/// Results collected from any thread: how many results each token got, and the count per outcome
/// (kept lean: it runs on the engine's threads for every result).
final class ResultLog: Sendable {
    private struct State {
        var resultsPerToken: [String: Int] = [:]
        var counts: [String: Int] = [:]
    }
    private let state = FanoutMutex(State())

    func add(_ result: NotificationResult) {
        state.withLock { state in
            state.resultsPerToken[result.token ?? "-", default: 0] += 1
            state.counts[result.outcome.name, default: 0] += 1
        }
    }

    func count(_ outcome: NotificationOutcome) -> Int { state.withLock { $0.counts[outcome.name] ?? 0 } }
    var total: Int { state.withLock { $0.counts.values.reduce(0, +) } }
    var tokensWithResults: Int { state.withLock { $0.resultsPerToken.count } }
    var tokensWithMoreThanOneResult: Int { state.withLock { $0.resultsPerToken.values.filter { $0 > 1 }.count } }
    var outcomeNames: Set<String> { state.withLock { Set($0.counts.keys) } }
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes; returns whether it held.
func eventually(timeout: Duration = .seconds(10), _ condition: () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(10))
    }
    return condition()
}

/// Open file descriptors of this process.
func openFileDescriptorCount() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
}

/// This process's open file descriptors, each with what it refers to (`socket:[…]`, `anon_inode:[timerfd]`, a path),
/// for naming the ones a leak test found. One that closed while being listed (the listing's own) is left out.
func openFileDescriptors() -> [Int: String] {
    let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    var descriptors: [Int: String] = [:]
    for name in names {
        guard let fd = Int(name),
            let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + name)
        else { continue }
        descriptors[fd] = target
    }
    return descriptors
}
