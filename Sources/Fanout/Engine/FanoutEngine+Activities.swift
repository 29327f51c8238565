import FanoutCore
import FanoutRegistry
import Foundation

/// Per-activity decisions for jobs addressed by activity id: latest-wins coalescing and the
/// priority-10 guard.
final class ActivityLedger: Sendable {
    private struct Latest {
        var timestamp: Int64
        weak var run: FanoutRun?
        /// Monotonic seconds when it was claimed.
        var claimedAt: Int64
        /// Its job sent none of it (refused by the rate limit, cancelled or stopped before its first notification
        /// went out): a job with the same timestamp, its retry, may claim it again (`release`).
        var released = false
    }
    private struct State {
        /// The newest content accepted per activity, and the job sending it.
        var latest: [String: Latest] = [:]
        /// Monotonic seconds of the priority-10 updates sent per activity in the last hour.
        var priority10: [String: [Int64]] = [:]
        /// How many entries the two maps may hold before the next `forgetQuietActivities`.
        var forgetAt = ActivityLedger.minimumForgetThreshold
    }
    private let state = FanoutMutex(State())

    /// An activity's entry: its app and id (a NUL keeps `a` + `b/c` apart from `a/b` + `c`).
    static func key(app: String, activityID: String) -> String { app + "\u{0}" + activityID }

    /// Activities are forgotten only past this many entries, so a small engine never sweeps.
    static let minimumForgetThreshold = 4096

    /// Drops what an activity quiet for an hour no longer needs, so that a long-running engine (`fanout serve`) does
    /// not keep an entry for every activity it ever updated: its latest content once the job sending it is gone (the
    /// registry's `lastContentTimestamp`, written at each claim, still orders a later job) and its priority-10 sends
    /// once they are all an hour old. Runs when the maps have doubled since the last time, so its cost is spread.
    private static func forgetQuietActivities(_ state: inout State, nowSeconds: Int64) {
        guard state.latest.count + state.priority10.count > state.forgetAt else { return }
        state.latest = state.latest.filter { $0.value.run != nil || nowSeconds - $0.value.claimedAt < 3600 }
        state.priority10 = state.priority10.filter { $0.value.contains { nowSeconds - $0 < 3600 } }
        state.forgetAt = max(minimumForgetThreshold, 2 * (state.latest.count + state.priority10.count))
    }

    /// How many activities the ledger holds an entry for (for tests).
    var activityCount: Int { state.withLock { Set($0.latest.keys).union($0.priority10.keys).count } }

    /// What a job's content is to its activity.
    enum Claim {
        /// Newer than everything sent or being sent: it goes out; older jobs still sending are superseded.
        case latest
        /// Not newer than what was already sent (or is sending): it is superseded without sending.
        case stale
    }

    /// Records `run`'s content as the newest for the activity unless something newer, or as new,
    /// was sent already (here, or by any process, per `persistedTimestamp`). A resumed job may equal
    /// the persisted timestamp: that is its own earlier run.
    func claim(
        key: String, timestamp: Int64, persistedTimestamp: Int64?, resuming: Bool, run: FanoutRun,
        nowSeconds: Int64 = Int64(ProcessInfo.processInfo.systemUptime)
    ) -> Claim {
        let older = state.withLock { state -> (Claim, FanoutRun?) in
            Self.forgetQuietActivities(&state, nowSeconds: nowSeconds)
            // The same content again after its job sent none of it (its retry after a 429, say) is not stale.
            let retry = state.latest[key].map { $0.released && $0.timestamp == timestamp } ?? false
            if let persistedTimestamp,
                resuming || retry ? persistedTimestamp > timestamp : persistedTimestamp >= timestamp
            {
                return (.stale, nil)
            }
            // A resumed job (a dispatch run again after a failure, in this process) equals its own earlier run here
            // as well as in the registry.
            if let latest = state.latest[key], latest.run !== run,
                resuming || retry ? latest.timestamp > timestamp : latest.timestamp >= timestamp
            {
                return (.stale, nil)
            }
            let previous = state.latest[key]?.run
            state.latest[key] = Latest(timestamp: timestamp, run: run, claimedAt: nowSeconds)
            return (.latest, previous === run ? nil : previous)
        }
        older.1?.markSuperseded()
        return older.0
    }

    /// `run`'s job sent none of the content it claimed (rate-limited, cancelled or stopped before its first
    /// notification went out): a later job with the same timestamp (its retry) may claim it again, in this process.
    /// (The registry keeps the timestamp as sent: another process still takes the retry for stale.)
    func release(key: String, run: FanoutRun) {
        state.withLock { state in
            guard state.latest[key]?.run === run else { return }
            state.latest[key]?.released = true
        }
    }

    /// Whether a priority-10 update to the activity is over `limit` for the last hour (then it is sent
    /// at priority 5); counts it when it is not.
    func overPriority10Limit(key: String, limit: Int, nowSeconds: Int64) -> Bool {
        state.withLock { state in
            var sent = state.priority10[key, default: []]
            sent.removeAll { nowSeconds - $0 >= 3600 }
            let over = sent.count >= limit
            if !over { sent.append(nowSeconds) }
            state.priority10[key] = sent
            return over
        }
    }
}

extension FanoutEngine {
    /// After an `end` by activity id has read all its recipients: the registry marks the activity ended and
    /// keeps its tokens until the dismissal date (Apple's 4 hours when none is given), then removes them with
    /// reason `ended`. Not before reading: a dismissal date already past removes the tokens at once.
    func recordActivityEnded(_ job: FanoutJob) async {
        guard let registry = configuration.registry, let (app, id, content) = Self.activityContent(of: job),
            content.event == .end
        else { return }
        do throws(RegistryError) {
            _ = try await registry.apply([
                .endActivity(app: app, activityID: id, dismissalDate: content.dismissalDateMilliseconds)
            ])
        } catch {
            // The end was sent; the tokens then expire on their own (8 hours after registration).
        }
    }

    /// A job by activity id that sent none of its content (nothing was handed to a loop) gives its claim back, so
    /// that its retry with the same timestamp is not superseded (`ActivityLedger.release`).
    func releaseActivityClaim(_ job: FanoutJob, run: FanoutRun) {
        guard let (app, id, _) = Self.activityContent(of: job) else { return }
        activities.release(key: ActivityLedger.key(app: app, activityID: id), run: run)
    }

    /// The activity a job updates or ends, with its content's timestamp; nil for any other job.
    static func activityContent(of job: FanoutJob) -> (app: String, id: String, content: LiveActivityContent)? {
        guard case .activity(let app, let id) = job.recipients, case .liveActivity(let content) = job.payload,
            content.event == .update || content.event == .end
        else { return nil }
        return (app, id, content)
    }

    /// For a job by activity id: whether it is stale (superseded before sending), and the prepared job
    /// to send (at priority 5 when the priority-10 guard says so).
    func applyActivityRules(_ job: FanoutJob, prepared: PreparedJob, run: FanoutRun) async
        -> (stale: Bool, send: PreparedJob, demotedByGuard: Bool)
    {
        guard let (app, id, content) = Self.activityContent(of: job) else { return (false, prepared, false) }
        let key = ActivityLedger.key(app: app, activityID: id)
        var persisted: Int64?
        if let registry = configuration.registry {
            do throws(RegistryError) {
                persisted = try await registry.activity(app: app, activityID: id)?.lastContentTimestamp
            } catch {
                // Without the registry's record, this process's own ledger still orders its jobs.
                persisted = nil
            }
        }
        let claim = activities.claim(
            key: key, timestamp: content.timestamp, persistedTimestamp: persisted, resuming: job.alreadyDone != nil,
            run: run)
        guard case .latest = claim else { return (true, prepared, false) }
        if let registry = configuration.registry {
            do throws(RegistryError) {
                _ = try await registry.apply([.contentSent(app: app, activityID: id, timestamp: content.timestamp)])
            } catch {
                // The send goes on; only another process's view of "latest" is older.
            }
        }
        if let limit = configuration.priority10UpdatesPerHour[app], job.headers.effectivePriority == 10,
            content.event == .update, content.alert == nil,
            activities.overPriority10Limit(
                key: key, limit: limit, nowSeconds: Int64(ProcessInfo.processInfo.systemUptime))
        {
            return (false, PreparedJob(demoting: prepared, to: 5), true)
        }
        return (false, prepared, false)
    }
}
