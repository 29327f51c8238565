import Foundation
import XCTest

@testable import FanoutTransport

/// `FileChangeWatcher` on a real file and directory (inotify through libuv): appends are reported, and with a
/// coalescing interval a burst is reported once, after the interval, while a change after a quiet spell is reported
/// at once.
final class FileChangeWatcherTests: XCTestCase {
    private var directory = ""
    private var path: String { "\(directory)/queue.jsonl" }

    override func setUpWithError() throws {
        directory = NSTemporaryDirectory() + "fanout-watch-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: nil))
        let directory = self.directory
        addTeardownBlock { try? FileManager.default.removeItem(atPath: directory) }
    }

    private func append(_ text: String) throws {
        let handle = try XCTUnwrap(FileHandle(forWritingAtPath: path))
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(text.utf8))
    }

    private static func seconds(since start: ContinuousClock.Instant) -> Double {
        let elapsed = ContinuousClock.now - start
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    }

    /// Three appends right after a reported change make one report, no sooner than the interval after it; the wait
    /// after that sees no change left over (it ends at the recheck tick, false).
    func testABurstWithinTheIntervalIsReportedOnceAfterIt() async throws {
        let watcher = FileChangeWatcher(path: path, recheckInterval: .seconds(2), coalescing: .milliseconds(600))
        defer { watcher.close() }
        XCTAssertTrue(watcher.isWatching)
        try append("a\n")
        let first = await watcher.waitForChange()
        XCTAssertTrue(first)
        let reported = ContinuousClock.now
        try append("b\n")
        try append("c\n")
        try append("d\n")
        let second = await watcher.waitForChange()
        XCTAssertTrue(second)
        // Without the hold it would come in a few milliseconds.
        XCTAssertGreaterThanOrEqual(Self.seconds(since: reported), 0.5, "the burst was held for the interval")
        let third = await watcher.waitForChange()
        XCTAssertFalse(third, "the burst's appends were reported once")
        // The watch runs again after the hold: a later append is reported.
        try append("e\n")
        let fourth = await watcher.waitForChange()
        XCTAssertTrue(fourth)
    }

    /// A change after a quiet spell longer than the interval is reported at once, not held.
    func testAChangeAfterAQuietSpellIsReportedAtOnce() async throws {
        let watcher = FileChangeWatcher(path: path, recheckInterval: .seconds(30), coalescing: .milliseconds(1_500))
        defer { watcher.close() }
        try append("a\n")
        let first = await watcher.waitForChange()
        XCTAssertTrue(first)
        // The quiet spell: longer than the interval.
        try await Task.sleep(for: .milliseconds(1_600))
        let waiting = Task { await watcher.waitForChange() }
        let appended = ContinuousClock.now
        try append("b\n")
        let second = await waiting.value
        XCTAssertTrue(second)
        // Held for the interval, it would come 1.5 s after the append; the recheck tick is 30 s away.
        XCTAssertLessThan(Self.seconds(since: appended), 1.4, "reported at once")
    }

    /// Without coalescing, each change is reported as it comes; a change with no wait in progress ends the next wait
    /// at once.
    func testWithoutCoalescingEachChangeIsReported() async throws {
        let watcher = FileChangeWatcher(path: path, recheckInterval: .seconds(30))
        defer { watcher.close() }
        for line in ["a\n", "b\n", "c\n"] {
            try append(line)
            let changed = await watcher.waitForChange()
            XCTAssertTrue(changed)
        }
        watcher.close()
        let afterClose = await watcher.waitForChange()
        XCTAssertFalse(afterClose)
    }
}
