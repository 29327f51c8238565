import Fanout
import FanoutCore
import Foundation
import XCTest

// README-EXAMPLE-BEGIN
/// Sends a score update to every Live Activity token in a file, and drops the tokens APNs says are gone.
func sendScoreUpdate(engine: FanoutEngine, tokensFile: String, home: Int, away: Int) async throws -> JobSummary {
    let job = FanoutJob.liveActivity(
        id: "match-7-update-12",
        bundleID: "com.acme.app",
        content: LiveActivityContent(
            event: .update,
            timestamp: Int64(Date().timeIntervalSince1970),
            contentState: try RawJSON(validating: #"{"home":\#(home),"away":\#(away)}"#),
            alert: LiveActivityAlert(title: "Goal!", body: .plain("\(home)-\(away)"))),
        priority: 10,
        recipients: .file(path: tokensFile))
    return try await engine.run(job) { result in
        if result.outcome == .unregistered, let token = result.token {
            print("forget token", token)  // e.g. delete it from your token store
        }
    }
}
// README-EXAMPLE-END

/// The README's library example, compiled here and run against mock-apns.
final class ReadmeExampleTests: XCTestCase {
    func testReadmeExampleRunsAgainstMockAPNs() async throws {
        let mock = try MockHarness()
        defer { mock.stop() }
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("readme-\(UUID().uuidString)").path
        try (0..<500).map { testDeviceToken($0) }.joined(separator: "\n").write(
            toFile: file, atomically: true, encoding: .utf8)

        var configuration = FanoutEngineConfiguration(
            endpoint: APNsEndpoint(host: "localhost", port: mock.port),
            credentials: ProviderCredentials(
                keyPath: mock.material.authKeyP8Path, keyID: "ABC123DEFG", teamID: "DEF123GHIJ"),
            caFile: mock.material.caPEMPath)
        configuration.loops = 2
        let engine = try FanoutEngine(configuration: configuration)
        let summary = try await sendScoreUpdate(engine: engine, tokensFile: file, home: 2, away: 1)
        await engine.shutdown()

        XCTAssertEqual(summary.counts.delivered, 500)
        XCTAssertEqual(summary.payloadEncodings, 1)
        XCTAssertEqual(mock.stats.accepted, 500)
    }

    func testReadmeShowsThisExampleVerbatim() throws {
        let source = try String(contentsOfFile: #filePath, encoding: .utf8)
        let begin = try XCTUnwrap(source.range(of: "// README-EXAMPLE-BEGIN\n"))
        let end = try XCTUnwrap(source.range(of: "// README-EXAMPLE-END"))
        let example = String(source[begin.upperBound..<end.lowerBound])
        let readmePath = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("README.md").path
        let readme = try String(contentsOfFile: readmePath, encoding: .utf8)
        XCTAssertTrue(readme.contains(example), "README.md must show the example of ReadmeExampleTests.swift verbatim")
    }
}
