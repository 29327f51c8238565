import Fanout
import Foundation
import XCTest

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
        let summary = try await sendScoreUpdate(
            engine: engine, tokensFile: file, home: 2, away: 1, at: Int64(Date().timeIntervalSince1970))
        await engine.shutdown()

        XCTAssertEqual(summary.counts.delivered, 500)
        XCTAssertEqual(summary.payloadEncodings, 1)
        XCTAssertEqual(mock.stats.accepted, 500)
    }

    func testReadmeShowsThisExampleVerbatim() throws {
        let examplePath = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent(
            "ReadmeExample.swift")
        let source = try String(contentsOfFile: examplePath.path, encoding: .utf8)
        let begin = try XCTUnwrap(source.range(of: "// README-EXAMPLE-BEGIN\n"))
        let end = try XCTUnwrap(source.range(of: "// README-EXAMPLE-END"))
        let example = String(source[begin.upperBound..<end.lowerBound])
        let readmePath = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("README.md").path
        let readme = try String(contentsOfFile: readmePath, encoding: .utf8)
        XCTAssertTrue(readme.contains(example), "README.md must show the example of ReadmeExample.swift verbatim")
    }
}
