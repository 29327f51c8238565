import FanoutCore
package import FanoutRedis

/// How many replicas copy the primary that holds a key, as Redis last said: `CLUSTER SLOTS` on a cluster (per slot
/// range: a failover leaves the promoted replica without one until another joins), `INFO replication`'s
/// `connected_slaves` on one server (with Sentinel: the primary's). A worker waits for one of them to acknowledge a
/// shard's completion before it acknowledges the shard on the stream (`WAIT`), and not at all where there is none
/// (it would wait out its timeout every time).
package final class FleetReplicas: Sendable {
    private struct State {
        /// Per slot range (a cluster); empty before the first read.
        var ranges: [(slots: ClosedRange<Int>, replicas: Int)] = []
        /// One server's replicas.
        var single = 0
        var readAt: ContinuousClock.Instant?
    }

    private let state = FanoutMutex(State())
    private let isCluster: Bool

    package init(isCluster: Bool) { self.isCluster = isCluster }

    /// The replicas of the primary holding `key` (0 before the first read, or when Redis did not say).
    package func replicas(forKey key: RedisArgument) -> Int {
        state.withLock { state in
            guard isCluster else { return state.single }
            let slot = RedisClusterSlot.slot(of: key.bytes)
            return state.ranges.first { $0.slots.contains(slot) }?.replicas ?? 0
        }
    }

    /// Whether the last read is older than `interval` (or there was none, or `invalidate()` was called).
    package func isStale(after interval: Duration) -> Bool {
        state.withLock { state in state.readAt.map { ContinuousClock.now - $0 >= interval } ?? true }
    }

    /// Makes the next `isStale` true: a WAIT came back short (a replica lost, or promoted).
    package func invalidate() { state.withLock { $0.readAt = nil } }

    /// Reads the replicas again. An error leaves the last reading in place.
    package func refresh(_ client: RedisClient) async throws(RedisError) {
        if isCluster {
            let reply = try await client.command(["CLUSTER", "SLOTS"])
            // [start, end, primary, replica...] per range; a failed replica is not listed.
            var ranges: [(slots: ClosedRange<Int>, replicas: Int)] = []
            for range in reply.array ?? [] {
                guard let fields = range.array, fields.count >= 3, let start = fields[0].integer,
                    let end = fields[1].integer, start <= end
                else { continue }
                ranges.append((Int(start)...Int(end), fields.count - 3))
            }
            state.withLock { state in
                state.ranges = ranges
                state.readAt = .now
            }
        } else {
            let reply = try await client.command(["INFO", "replication"])
            let text = reply.string ?? ""
            let line = text.split(whereSeparator: \.isNewline).first { $0.hasPrefix("connected_slaves:") }
            let count = line.flatMap { Int($0.dropFirst("connected_slaves:".count)) } ?? 0
            state.withLock { state in
                state.single = count
                state.readAt = .now
            }
        }
    }
}
