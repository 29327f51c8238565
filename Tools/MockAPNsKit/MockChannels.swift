import FanoutCore
import Foundation

/// The broadcast channels of one mock process, which is one APNs environment: per app, each channel's storage
/// policy. The management listener creates, reads, lists and deletes them; the push listener looks them up for
/// broadcast sends. Tests of other components use it directly (`MockAPNsServer.channels`) to set up channels
/// without going through HTTP.
package final class MockChannels: Sendable {
    private struct State {
        /// App (bundle id) → channel id → policy.
        var byApp: [String: [String: ChannelStoragePolicy]] = [:]
        /// Every id ever issued, deleted ones included: APNs never reissues a channel id.
        var issued = Set<String>()
        var count = 0
    }

    package let environment: MockEnvironment
    /// Creating one more channel for an app that has this many fails (`CannotCreateChannelConfig`).
    package let maxPerApp: Int
    private let state = FanoutMutex(State())
    private let stats: MockStats?

    package init(environment: MockEnvironment = .development, maxPerApp: Int = 10_000, stats: MockStats? = nil) {
        self.environment = environment
        self.maxPerApp = maxPerApp
        self.stats = stats
    }

    /// Creates a channel for `app` and returns its new id (24 base64 characters of 16 random bytes, never issued
    /// before); nil when the app already has `maxPerApp` channels.
    @discardableResult
    package func create(app: String, policy: ChannelStoragePolicy = .mostRecentMessageStored) -> String? {
        state.withLock { state -> String? in
            guard (state.byApp[app]?.count ?? 0) < maxPerApp else { return nil }
            var id: String
            repeat {
                var bytes = [UInt8](repeating: 0, count: 16)
                var generator = SystemRandomNumberGenerator()
                for index in bytes.indices { bytes[index] = generator.next() }
                id = Data(bytes).base64EncodedString()
            } while !state.issued.insert(id).inserted
            state.byApp[app, default: [:]][id] = policy
            state.count += 1
            // Under the lock, so that the stats never keep an older count (lock order: channels, then stats).
            stats?.recordChannelCount(state.count)
            return id
        }
    }

    /// The policy of channel `channel` of `app`; nil when it does not exist (never created, or deleted).
    package func policy(app: String, channel: String) -> ChannelStoragePolicy? {
        state.withLock { $0.byApp[app]?[channel] }
    }

    package func exists(app: String, channel: String) -> Bool { policy(app: app, channel: channel) != nil }

    /// Deletes a channel; false when it did not exist. Its id is never issued again.
    @discardableResult
    package func delete(app: String, channel: String) -> Bool {
        state.withLock { state in
            guard state.byApp[app]?.removeValue(forKey: channel) != nil else { return false }
            state.count -= 1
            stats?.recordChannelCount(state.count)
            return true
        }
    }

    /// The ids of `app`'s channels, sorted (Apple documents no order).
    package func list(app: String) -> [String] {
        state.withLock { ($0.byApp[app]?.keys).map { $0.sorted() } ?? [] }
    }

    /// Channels that exist, over all apps.
    package var count: Int { state.withLock { $0.count } }
}
