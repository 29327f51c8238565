import FanoutCore
import Foundation

/// The `timestamp` of each Live Activity push the API accepts, strictly increasing per activity.
///
/// iOS, and the engine's latest-wins rule, drop an update whose timestamp is not newer than the last one. Callers
/// send an update and the end in the same second, so "now" in seconds is not enough: each activity gets
/// `max(now, last + 1)`, with the last one sent (from the registry, which survives restarts) as a floor. Entries
/// older than a few seconds are forgotten: past them "now" is newer anyway.
final class ContentTimestamps: Sendable {
    private let assigned = FanoutMutex<[String: Int64]>([:])

    /// Gives the activity its next timestamp and runs `commit` with it under the same lock, so that of two
    /// concurrent requests the one with the later timestamp is also committed (and so sent) later. The lock is held
    /// for one SQLite commit, which SQLite's write lock serializes anyway.
    func assign<T>(
        app: String, activityID: String, now: Int64, lastSent: Int64?, commit: (Int64) throws(APIError) -> T
    ) throws(APIError) -> T {
        let key = app + "\u{0}" + activityID
        return try assigned.withLock { assigned throws(APIError) -> T in
            // A floor past the latest date a content may carry (a registry written before such dates were refused)
            // counts as that date: the next timestamp is then refused as too late, where floor + 1 would overflow.
            let floor = min(max(assigned[key] ?? .min, lastSent ?? .min), LiveActivityContent.latestDate)
            let timestamp = floor == .min ? now : max(now, floor + 1)
            let result = try commit(timestamp)
            if assigned.count > 10_000 { assigned = assigned.filter { $0.value > now - 5 } }
            assigned[key] = timestamp
            return result
        }
    }
}
