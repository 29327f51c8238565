import FanoutCore
import Foundation

/// Directories a test run made under the system's temporary directory (a mock's TLS material, a child process's
/// output files) and removes when the test process exits. Their owners cannot remove them when they stop: a test may
/// still read them (a child's stderr after it exited, a CA file for a client that must fail to connect), and XCTest
/// keeps test cases alive to the end of the run. Left behind, every `make test` added about 250 of them (30,000 seen
/// on one machine).
package enum TemporaryDirectories {
    private static let registered = FanoutMutex<(paths: [String], hooked: Bool)>(([], false))

    /// Removes `path` (and what it holds) when the process exits normally.
    package static func removeAtExit(_ path: String) {
        let hook = registered.withLock { state -> Bool in
            state.paths.append(path)
            defer { state.hooked = true }
            return !state.hooked
        }
        if hook { atexit { TemporaryDirectories.removeAll() } }
    }

    private static func removeAll() {
        for path in registered.withLock({ $0.paths }) { try? FileManager.default.removeItem(atPath: path) }
    }
}
