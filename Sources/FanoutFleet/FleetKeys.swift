package import FanoutRedis

/// Where the fleet keeps its work in Redis. Every key of one job carries the job id as a hash tag
/// (`fanout:job:{ID}:...`), so that a job's keys share a slot on Redis Cluster and its scripts may touch them
/// together; the streams, their set and the job list are the only keys shared by every job.
///
/// | Key | Type | What |
/// |---|---|---|
/// | `fanout:shards` | stream, group `fanout-workers` | one entry per shard not yet done: `job`, `shard`, `start`,
///   `count`, `enqueue_id` (a done shard's entry is acknowledged and deleted) |
/// | `fanout:shards:P` | stream, group `fanout-workers` | the same, for partition P ≥ 1 of an enqueue with several
///   (`fanout enqueue --partitions`): each a key of its own, so their slots spread over a cluster's primaries |
/// | `fanout:shard-streams` | set | the partitions' streams beyond `fanout:shards`, which workers read too |
/// | `{S}:added:E:N` | string | the id of shard N's entry on the stream S for the enqueue E, kept an hour: the entry
///   is added once however often the enqueue tries (in the stream's slot) |
/// | `fanout:jobs` | list | job ids in enqueue order (`fanout status`) |
/// | `fanout:job:{ID}` | hash | `line` (the job line, recipients replaced by a placeholder), `now` (the parse time, so
///   every shard encodes the same default `timestamp`), `shards`, `notifications`, `enqueued_at` (Unix ms),
///   `enqueue_id` (unique to one enqueue: the id may be enqueued again once these keys are deleted) |
/// | `fanout:job:{ID}:tokens:N` | string | shard N's tokens, one per line (deleted when the shard is done) |
/// | `fanout:job:{ID}:results:N` | string | shard N's results lines, appended a batch at a time as `POSITION LINE`
///   records in the order they were written (`fanout results` sorts them by position) |
/// | `fanout:job:{ID}:marks:N` | string | one byte per position of shard N, `1` once it has a result: the shard's
///   progress record, and what keeps the first result of a position the only one (kept after the shard is done) |
/// | `fanout:job:{ID}:results` | hash | `invalid` → the job-level results line, if any (HSETNX: one per job) |
/// | `fanout:job:{ID}:counts` | hash | outcome name → count, `retries`, `payload_encodings`, `demoted`; counted in the
///   same script as the marks, only for results actually written |
/// | `fanout:job:{ID}:done` | set | the shard numbers whose every position has a result |
package struct FleetKeys: Sendable {
    /// The first stream, the only one of an enqueue with one partition (the default).
    package static let stream = "fanout:shards"
    /// The streams beyond `stream` that some enqueue wrote to: workers read them all.
    package static let streamSet = "fanout:shard-streams"
    package static let group = "fanout-workers"
    package static let jobList = "fanout:jobs"
    /// The field of the job's hash and of its shard entries that names the enqueue they belong to.
    package static let enqueueIDField = "enqueue_id"

    package let job: String

    package init(job: String) { self.job = job }

    /// The stream of partition `partition`: `fanout:shards` for 0, `fanout:shards:P` after it.
    package static func stream(partition: Int) -> String {
        partition == 0 ? stream : "\(stream):\(partition)"
    }

    /// The partition of shard `shard` of `job` among `partitions`: consecutive shards go to consecutive partitions,
    /// from one that depends on the job id, so that jobs of one shard spread too.
    package static func partition(job: String, shard: Int, of partitions: Int) -> Int {
        (Int(RedisClusterSlot.crc16(job.utf8)) + shard) % partitions
    }

    /// The marker of shard `shard`'s entry on `stream` for the enqueue `enqueueID`: the entry's id, kept an hour, so
    /// that an entry is added once however often the enqueue tries (`FleetEnqueuer.addShard`). Its hash tag is the
    /// stream's whole name, so it shares the stream's slot (the streams have no tag: a key's slot is that of its
    /// whole name).
    static func entryMarker(stream: String, _ enqueueID: String, _ shard: Int) -> RedisArgument {
        RedisArgument("{\(stream)}:added:\(enqueueID):\(shard)")
    }

    private var base: String { "fanout:job:{\(job)}" }
    package var meta: RedisArgument { RedisArgument(base) }
    package var results: RedisArgument { RedisArgument(base + ":results") }
    package var counts: RedisArgument { RedisArgument(base + ":counts") }
    package var done: RedisArgument { RedisArgument(base + ":done") }
    package func tokens(shard: Int) -> RedisArgument { RedisArgument(base + ":tokens:\(shard)") }
    package func results(shard: Int) -> RedisArgument { RedisArgument(base + ":results:\(shard)") }
    package func marks(shard: Int) -> RedisArgument { RedisArgument(base + ":marks:\(shard)") }
}

/// The field of the results hash for a job-level result (`invalid`, no token).
let jobLevelField = "invalid"
