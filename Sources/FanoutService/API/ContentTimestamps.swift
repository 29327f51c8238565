import Foundation
import Synchronization

/// The `timestamp` of each Live Activity push the API accepts, strictly increasing per activity.
///
/// iOS, and the engine's latest-wins rule, drop an update whose timestamp is not newer than the last one. Callers
/// send an update and the end in the same second, so "now" in seconds is not enough: each activity gets
/// `max(now, last + 1)`, with the last one sent (from the registry, which survives restarts) as a floor. Entries
/// older than a few seconds are forgotten: past them "now" is newer anyway.
final class ContentTimestamps: Sendable {
    private let assigned = Mutex<[String: Int64]>([:])

    func next(app: String, activityID: String, now: Int64, lastSent: Int64?) -> Int64 {
        let key = app + "\u{0}" + activityID
        return assigned.withLock { assigned in
            let floor = max(assigned[key] ?? .min, lastSent ?? .min)
            let timestamp = floor == .min ? now : max(now, floor + 1)
            if assigned.count > 10_000 { assigned = assigned.filter { $0.value > now - 5 } }
            assigned[key] = timestamp
            return timestamp
        }
    }
}
