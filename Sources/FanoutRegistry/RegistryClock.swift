import Foundation

/// The registry's time source: Unix milliseconds. Injected so that tests can move time by hours in a line.
public struct RegistryClock: Sendable {
    private let read: @Sendable () -> Int64

    public init(_ now: @escaping @Sendable () -> Int64) {
        read = now
    }

    /// Unix milliseconds now.
    public func now() -> Int64 { read() }

    /// The wall clock.
    public static let system = RegistryClock { Int64((Date().timeIntervalSince1970 * 1000).rounded(.down)) }
}

/// The registry's settings. Durations are milliseconds.
public struct RegistryConfiguration: Sendable {
    /// How long an update token stays live after its registration: 8 hours (Braze: the Live Activity token "expires
    /// after eight hours"; a Live Activity is active for at most 8 hours).
    public var updateTokenLifetime: Int64 = 8 * 3_600_000
    /// How long an ended activity keeps its tokens when its end gives no dismissal date: 4 hours, Apple's default.
    public var defaultDismissalDelay: Int64 = 4 * 3_600_000
    /// How long the event log keeps an event before a sweep drops it: 24 hours.
    public var eventRetention: Int64 = 24 * 3_600_000
    /// How long a write waits for another process's lock before failing `busy`.
    public var busyTimeoutMilliseconds: Int32 = 5_000
    /// SQLite's page cache per connection, in KiB.
    public var cacheKiB: Int = 64 * 1024
    /// Events a slow `subscribe()` stream buffers before dropping the oldest (the event log keeps them all).
    public var subscriberBufferLimit = 100_000
    /// Times for writes that give none, and for the reads without `now`.
    public var clock: RegistryClock = .system

    public init() {}
}
