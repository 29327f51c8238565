import FanoutCore

/// The job lines a worker has parsed, so that a job's many shards parse its line once; at most `capacity` of them,
/// the least recently used dropped first.
///
/// Keyed by the job id and the enqueue's own id (`enqueue_id`, `FleetEnqueuer`), not the job id alone: a job whose keys
/// were deleted can be enqueued again under its id, and a worker that kept the first line by id alone would send the
/// second job with it (its priority, its payload). Bounded, because a worker runs for days through any number of jobs,
/// and a line read again costs one `HMGET` and a parse per job, not per shard.
final class FleetJobCache<Value: Sendable>: Sendable {
    struct Key: Hashable, Sendable {
        var job: String
        var enqueueID: String
    }

    private struct Entry {
        var value: Value
        /// `State.uses` at its last read or insert: the smallest is the least recently used.
        var lastUse: UInt64
    }

    private struct State {
        var entries: [Key: Entry] = [:]
        var uses: UInt64 = 0
    }

    /// A worker holds a few jobs' shards at a time (`concurrentShards`), so a small cache already hits on nearly every
    /// shard; dropping the least recently used is a linear scan over this many.
    static var defaultCapacity: Int { 64 }

    let capacity: Int
    private let state = FanoutMutex(State())

    init(capacity: Int = defaultCapacity) {
        precondition(capacity > 0)
        self.capacity = capacity
    }

    var count: Int { state.withLock { $0.entries.count } }

    func value(for key: Key) -> Value? {
        state.withLock { state in
            guard state.entries[key] != nil else { return nil }
            state.uses += 1
            state.entries[key]?.lastUse = state.uses
            return state.entries[key]?.value
        }
    }

    func insert(_ value: Value, for key: Key) {
        state.withLock { state in
            state.uses += 1
            state.entries[key] = Entry(value: value, lastUse: state.uses)
            while state.entries.count > capacity,
                let oldest = state.entries.min(by: { $0.value.lastUse < $1.value.lastUse })?.key
            {
                state.entries.removeValue(forKey: oldest)
            }
        }
    }

    /// Drops every entry of `job` (its hash is gone from Redis).
    func removeAll(job: String) {
        state.withLock { state in
            state.entries = state.entries.filter { $0.key.job != job }
        }
    }
}
