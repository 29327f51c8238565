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
        let alertResult = try await sendGoalAlert(engine: engine, deviceToken: testDeviceToken(7))
        await engine.shutdown()

        XCTAssertEqual(summary.counts.delivered, 500)
        XCTAssertEqual(summary.payloadEncodings, 1)
        XCTAssertEqual(mock.stats.accepted, 501)
        XCTAssertEqual(alertResult.outcome, .delivered, alertResult.reason ?? "")
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

    /// The repository's root, from this file's path.
    private static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// The library guide, docs/LIBRARY.md, whole (the README's library section moved there).
    private func librarySection() throws -> String {
        try String(contentsOf: Self.root.appendingPathComponent("docs/LIBRARY.md"), encoding: .utf8)
    }

    /// The Library section's list of outcomes names every outcome a result can have (it left out `invalid`).
    func testLibrarySectionListsEveryOutcome() throws {
        let library = try librarySection()
        let start = try XCTUnwrap(library.range(of: "- **Outcomes.**"))
        let end =
            library.range(of: "\n- **", range: start.upperBound..<library.endIndex)?.lowerBound ?? library.endIndex
        let outcomes = library[start.upperBound..<end]
        for outcome in NotificationOutcome.all {
            XCTAssertTrue(
                outcomes.contains("`\(outcome.name)`"), "docs/LIBRARY.md's Outcomes leave out `\(outcome.name)`")
        }
    }

    /// Every camelCase name the Library section gives in backticks (a property, a parameter, a method) is one the
    /// library's sources have: README named `tokenMinimumIntervalSeconds`, where the property is
    /// `tokenMinimumInterval`.
    func testLibrarySectionNamesOnlyIdentifiersTheLibraryHas() throws {
        let library = try librarySection()
        var sources = ""
        for module in ["Fanout", "FanoutCore", "FanoutPolicy", "FanoutRegistry"] {
            let directory = Self.root.appendingPathComponent("Sources/\(module)")
            let files = try XCTUnwrap(FileManager.default.enumerator(atPath: directory.path))
            for case let file as String in files where file.hasSuffix(".swift") {
                sources += try String(contentsOf: directory.appendingPathComponent(file), encoding: .utf8)
            }
        }
        let identifierBytes = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_".utf8)
        /// Whether `name` occurs in the sources as a whole identifier.
        func sourcesHave(_ name: String) -> Bool {
            var searchStart = sources.startIndex
            while let found = sources.range(of: name, range: searchStart..<sources.endIndex) {
                let before =
                    found.lowerBound == sources.startIndex
                    ? nil : sources.utf8[sources.utf8.index(before: found.lowerBound)]
                let after = found.upperBound == sources.endIndex ? nil : sources.utf8[found.upperBound]
                if !(before.map(identifierBytes.contains) ?? false) && !(after.map(identifierBytes.contains) ?? false) {
                    return true
                }
                searchStart = found.upperBound
            }
            return false
        }
        var checked = 0
        for quoted in library.split(separator: "`", omittingEmptySubsequences: false).enumerated()
        where quoted.offset % 2 == 1 {
            let name = String(quoted.element)
            guard let first = name.utf8.first, first >= UInt8(ascii: "a"), first <= UInt8(ascii: "z"),
                name.utf8.allSatisfy(identifierBytes.contains), name.contains(where: \.isUppercase)
            else { continue }
            checked += 1
            XCTAssertTrue(
                sourcesHave(name), "docs/LIBRARY.md names `\(name)`, which the library does not have")
        }
        XCTAssertGreaterThan(checked, 10, "the section's names were found")
    }
}
