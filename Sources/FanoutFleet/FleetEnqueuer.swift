package import Fanout
import FanoutCore
import FanoutJobFormat
package import FanoutRedis
import Foundation

/// `fanout enqueue`: each job line of a job file becomes shards on the fleet's stream.
///
/// - A line is parsed and validated as `fanout send` would (`JobLineParser`), once, here: what a worker reads back is
///   known to parse.
/// - Its recipients (inline `tokens`, or a `tokens_file` read here, so workers need no shared disk) are cut into
///   shards of `shardSize` tokens in job order; shard N holds positions [N × shardSize, ...). Each shard's tokens go
///   to a key of their own, then its entry to the stream (two round trips per shard, in that order, so a worker
///   that reads the entry finds the tokens; two because the job's keys and the stream are in different Redis
///   Cluster slots).
/// - The job line is stored once, with its recipients replaced by one placeholder token (a worker swaps in the
///   shard's), and with the parse time, so that every shard encodes the same default Live Activity `timestamp`.
/// - Job ids are unique in Redis: a job whose id was already enqueued is refused (HSETNX on the job's hash), never
///   merged, so a results line always belongs to one job line. Once its keys are deleted the id can be enqueued
///   again; each enqueue has an `enqueue_id` of its own, in the job's hash and in each of its shard entries, so that
///   workers never mix the two (`FleetWorker`).
/// - Jobs that address the registry (`activity_id`, `push_to_start`, `users`, `devices`) are read from the registry
///   on Redis here, page by page, with one `now` for the whole job: their audience is the tokens live at enqueue
///   time (a snapshot; a token registered later is not in this job), cut into shards like a tokens job. A job by
///   activity id first gets what `fanout send --registry` decides for it: stale content (a timestamp not newer than
///   the activity's last) is refused, new content is recorded as the activity's last; an activity bound to a
///   broadcast channel gets one more recipient after its tokens, the broadcast, in a shard of its own; an `end`
///   marks the activity ended once its tokens are read. The stored job line keeps its registry address (the worker
///   swaps in the shard's tokens, or the channel).
/// - Refused for now: broadcasts (`channel_id`) and push-to-start jobs that name their `activity_id` (the start
///   payload's attributes and the channel binding are the engine's, done while it reads the registry). `fanout send`
///   sends them.
package final class FleetEnqueuer: Sendable {
    /// What happened to one job line.
    package enum Report: Sendable {
        case enqueued(job: String, shards: Int, notifications: Int)
        case refused(line: Int, job: String?, reason: String)
    }

    /// Claims a job id. KEYS: the job's hash. ARGV: the `enqueue_id` field's name, this enqueue's id. Returns the id of
    /// the enqueue that holds the job (this one's once claimed; an empty string for a job an older version enqueued,
    /// whose hash has a line and no id).
    static let claimJob = RedisScript(
        """
        local owner = redis.call('HGET', KEYS[1], ARGV[1])
        if owner then return owner end
        if redis.call('HEXISTS', KEYS[1], 'line') == 1 then return '' end
        redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
        return ARGV[2]
        """)

    /// Adds a shard's entry to the stream once per (enqueue, shard), however often it is tried. KEYS: the stream, the
    /// entry's marker (`FleetKeys.entryMarker`, in the stream's slot). ARGV: the marker's expiry in ms, then the
    /// entry's fields and values. Returns the entry's id: the one an earlier attempt added, when one did (its answer
    /// lost), and then adds nothing.
    static let addShard = RedisScript(
        """
        local added = redis.call('GET', KEYS[2])
        if added then return added end
        local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
        redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
        return id
        """)

    /// How long an entry's marker is kept: far longer than any enqueue tries a step again (`patience`).
    static let entryMarkerMilliseconds = 3_600_000

    /// A valid device token that no device has: the recipient of the stored job line, replaced by each shard's.
    static let placeholderToken = String(repeating: "0", count: 64)

    private let client: RedisClient
    private let shardSize: Int
    /// How many streams the shards are spread over (`FleetKeys.stream(partition:)`): on a Redis Cluster, streams on
    /// several primaries, so that no one primary carries every shard's entry.
    private let partitions: Int
    /// The registry that registry-addressed jobs are read from (the one on this Redis); nil refuses them.
    private let registry: (any RegistryStore)?
    /// How long a step is tried again after Redis stops answering (a restart, a failover) before the enqueue gives up.
    private let patience: Duration
    /// One line for people each time a step is tried again (stderr, for `fanout enqueue`).
    private let log: @Sendable (String) -> Void

    package init(
        client: RedisClient, shardSize: Int, partitions: Int = 1, registry: (any RegistryStore)? = nil,
        patience: Duration = .seconds(60), log: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        precondition(shardSize > 0 && partitions > 0)
        self.client = client
        self.shardSize = shardSize
        self.partitions = partitions
        self.registry = registry
        self.patience = patience
        self.log = log
    }

    /// Runs `step` until it succeeds, again after each lost connection, timeout or unreachable Redis (the client
    /// reconnects meanwhile), for up to `patience`. A step must be safe to run again after an attempt whose answer was
    /// lost: each one looks first at what such an attempt may have done.
    private func retrying<T>(_ what: String, _ step: () async throws(RedisError) -> T) async throws(RedisError) -> T {
        let deadline = ContinuousClock.now + patience
        while true {
            do {
                return try await step()
            } catch {
                guard [.connectionLost, .timeout, .unavailable].contains(error.kind), ContinuousClock.now < deadline
                else { throw error }
                log("Redis: \(error.message) (\(what)); trying again")
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
    }

    /// Enqueues every job of `jobsPath`, calling `report` once per job line, in file order.
    /// - Throws: `FleetError` when the job file cannot be read or Redis fails (jobs reported before stay enqueued;
    ///   the failing one may be partly enqueued, and its id is then taken).
    package func enqueue(jobsPath: String, report: (Report) -> Void) async throws(FleetError) {
        let reader: JobFileReader
        do {
            reader = try JobFileReader(path: jobsPath)
        } catch {
            throw FleetError(error.description)
        }
        do {
            // Every partition's group before its first entry, and the partitions listed for the workers: a worker
            // reads `fanout:shards` and every stream of the set.
            for partition in 0..<partitions {
                try await FleetConnection.ensureGroup(client, stream: FleetKeys.stream(partition: partition))
            }
            if partitions > 1 {
                _ = try await client.command(
                    ["SADD", RedisArgument(FleetKeys.streamSet)]
                        + (1..<partitions).map { RedisArgument(FleetKeys.stream(partition: $0)) })
            }
        } catch {
            throw FleetError("cannot create the consumer group: \(error.message)")
        }
        var timestamps = JobFileTimestamps()
        while true {
            let next: JobFileReader.Line?
            do {
                next = try reader.nextLine()
            } catch {
                throw FleetError("\(error)")
            }
            guard let line = next else { break }
            let registry = self.registry
            let (parsed, now) = await timestamps.parse(
                line: line.bytes, lineNumber: line.number, jobFileDirectory: reader.directory,
                now: Int64(Date().timeIntervalSince1970),
                lastSent: { app, activityID in
                    try? await registry?.activity(app: app, activityID: activityID)?.lastContentTimestamp
                })
            switch parsed {
            case .failure(let error):
                report(.refused(line: line.number, job: error.jobID, reason: error.description))
            case .success(let parsed):
                report(try await enqueue(parsed, bytes: line.bytes, now: now))
            }
        }
    }

    private func enqueue(_ parsed: ParsedJobLine, bytes: some Collection<UInt8>, now: Int64) async throws(FleetError)
        -> Report
    {
        let job = parsed.job
        let number = parsed.lineNumber
        var inline: [String]?
        var file: String?
        var audience: RegistryAudience?
        /// A broadcast job's channel and its storage policy, when the line gives it.
        var channel: (id: String, policy: Int?)?
        let stored: [UInt8]?
        switch job.recipients {
        case .tokens(let tokens):
            inline = tokens
            stored = Self.template(bytes)
        case .file(let path):
            file = path
            stored = Self.template(bytes)
        case .activity, .pushToStart, .devices:
            switch await RegistryAudience.resolve(FanoutJob(job), registry: registry, line: number) {
            case .failure(let refusal): return .refused(line: number, job: job.id, reason: refusal.message)
            case .success(let resolved): audience = resolved
            }
            // The line as written: the worker parses it and sends the shard's tokens with it.
            stored = Self.isObject(bytes) ? Array(bytes) : nil
        case .channel(_, let id, let policy):
            // One recipient, the channel: one broadcast shard, sent as the line says (`FleetWorker`).
            channel = (id, policy)
            stored = Self.isObject(bytes) ? Array(bytes) : nil
        }
        guard let template = stored else {
            return .refused(line: number, job: job.id, reason: "line \(number): not a JSON object")
        }
        let keys = FleetKeys(job: job.id)
        // This enqueue's own id, in the job's hash and in every shard entry: an id whose keys were deleted can be
        // enqueued again, and a worker tells the enqueues apart by it (its cached line, an old entry left on the
        // stream). It is also the claim on the job id, and what tells a step tried again after a lost answer whether
        // the job is still this enqueue's.
        let enqueueID = UUID().uuidString.lowercased()
        let enqueueIDField = RedisArgument(FleetKeys.enqueueIDField)
        do {
            // The claim answers who holds the id, so after a lost answer trying again says whether it was ours.
            let claimed = try await retrying("claiming job \(job.id)") { () throws(RedisError) in
                try await client.evalScript(
                    Self.claimJob, keys: [keys.meta], arguments: [enqueueIDField, RedisArgument(enqueueID)])
                    == .bytes(Array(enqueueID.utf8))
            }
            guard claimed else {
                return .refused(
                    line: number, job: job.id,
                    reason: "line \(number): job \(job.id) is already enqueued in Redis (job ids must be unique)")
            }
            let enqueuedAt = Int(Date().timeIntervalSince1970 * 1000)
            var meta: [RedisArgument] = [
                "HSET", keys.meta, "line", RedisArgument(bytes: template), "now", RedisArgument(Int(now)),
                "enqueued_at",
                RedisArgument(enqueuedAt),
            ]
            if audience?.channel != nil, let policy = audience?.channelStoragePolicy ?? channel?.policy {
                // The bound channel's storage policy, for the broadcast shard's expiration (FleetWorker).
                meta += ["channel_policy", RedisArgument(policy)]
            }
            // The hash is set as often as tried; the job is listed once (an attempt may have listed it already, and an
            // id enqueued again after its keys were deleted keeps its first place).
            try await retrying("recording job \(job.id)") { () throws(RedisError) in
                let replies = try await client.commands([
                    meta, ["LPOS", RedisArgument(FleetKeys.jobList), RedisArgument(job.id)],
                ])
                if case .error(let message) = replies[0] { throw RedisError.server(message) }
                if replies.count == 2, replies[1] == .null {
                    _ = try await client.command(["RPUSH", RedisArgument(FleetKeys.jobList), RedisArgument(job.id)])
                }
            }
            var shards = 0
            var total = 0
            var batch: [String] = []
            batch.reserveCapacity(shardSize)
            func flush(broadcast: Bool = false) async throws(RedisError) {
                guard !batch.isEmpty else { return }
                let start = total - batch.count
                var data: [UInt8] = []
                data.reserveCapacity(batch.count * 65)
                for (index, token) in batch.enumerated() {
                    if index > 0 { data.append(10) }
                    data += token.utf8
                }
                // Two steps, each in one slot (on Redis Cluster the job's keys and the stream are in different
                // slots, and a transaction runs in one):
                // 1. the tokens and the count of shards written, one transaction on the job's keys: after a lost
                //    answer the count says whether it happened;
                // 2. the stream entry (`addShard`), once per (enqueue, shard) whatever the attempts: its marker, in
                //    the stream's slot, holds the entry's id.
                // The entry comes last, so a worker that reads it finds the tokens; the count comes first, so it is
                // never below the shards done (the job's last shard sets `finished_at`). An enqueue that dies
                // between the two leaves a shard counted with no entry: the job is not `enqueued` (the last step),
                // as when it dies anywhere else midway, and `fanout status` shows it as still being enqueued.
                let shard = shards
                let record: [[RedisArgument]] = [
                    ["MULTI"],
                    ["SET", keys.tokens(shard: shard), RedisArgument(bytes: data)],
                    ["HSET", keys.meta, "shards", RedisArgument(shard + 1), "notifications", RedisArgument(total)],
                    ["EXEC"],
                ]
                var lostAnswer = false
                try await retrying("shard \(shard) of job \(job.id)") { () throws(RedisError) in
                    if lostAnswer {
                        let state = try await client.commands([
                            ["HGET", keys.meta, enqueueIDField], ["HGET", keys.meta, "shards"],
                        ])
                        guard state.count == 2, state[0] == .bytes(Array(enqueueID.utf8)) else {
                            throw RedisError.server(
                                "job \(job.id)'s keys are gone (Redis restarted without persistence, or they were "
                                    + "deleted) while it was being enqueued")
                        }
                        if case .bytes(let written) = state[1],
                            Int(String(decoding: written, as: UTF8.self)) == shard + 1
                        {
                            return  // the lost attempt went through
                        }
                    }
                    lostAnswer = true
                    let replies = try await client.commands(record)
                    for reply in replies + (replies.last?.array ?? []) {
                        if case .error(let message) = reply { throw RedisError.server(message) }
                    }
                    if replies.last == .null { throw RedisError.server("the shard's transaction was aborted (EXEC)") }
                }
                let entry: [RedisArgument] =
                    [
                        "job", RedisArgument(job.id), "shard", RedisArgument(shard), "start", RedisArgument(start),
                        "count", RedisArgument(batch.count), enqueueIDField, RedisArgument(enqueueID),
                    ] + (broadcast ? ["broadcast", "1"] : [])
                let stream = FleetKeys.stream(
                    partition: FleetKeys.partition(job: job.id, shard: shard, of: partitions))
                _ = try await retrying("the entry of shard \(shard) of job \(job.id)") { () throws(RedisError) in
                    try await client.evalScript(
                        Self.addShard,
                        keys: [RedisArgument(stream), FleetKeys.entryMarker(stream: stream, enqueueID, shard)],
                        arguments: [RedisArgument(Self.entryMarkerMilliseconds)] + entry)
                }
                shards += 1
                batch.removeAll(keepingCapacity: true)
            }
            if let channel {
                batch.append(channel.id)
                total += 1
                try await flush(broadcast: true)
            } else if let inline {
                for token in inline {
                    batch.append(token)
                    total += 1
                    if batch.count == shardSize { try await flush() }
                }
            } else if let file {
                let reader: ChunkedLineReader
                do {
                    reader = try ChunkedLineReader(path: file)
                } catch {
                    throw FleetError("line \(number): tokens file \(file) cannot be read: \(error.reason)")
                }
                while true {
                    let token: String?
                    do {
                        token = try reader.nextLine { TokenFileReader.trimmed($0, lineNumber: reader.lineNumber) }
                    } catch {
                        throw FleetError("line \(number): tokens file \(file) cannot be read: \(error.reason)")
                    }
                    guard let token else { break }
                    batch.append(token)
                    total += 1
                    if batch.count == shardSize { try await flush() }
                }
            }
            if let audience {
                try await audience.recordContent()
                var pager = audience.pager()
                while let page = try await pager.nextPage() {
                    for token in page {
                        batch.append(token)
                        total += 1
                        if batch.count == shardSize { try await flush() }
                    }
                }
                try await flush()
                if let channel = audience.channel {
                    // The broadcast: one more recipient after every token, in a shard of its own.
                    batch.append(channel)
                    total += 1
                    try await flush(broadcast: true)
                }
                await audience.recordEnded()
            }
            try await flush()
            // `enqueued` last: until then `fanout status` shows the job as still being enqueued.
            _ = try await retrying("finishing job \(job.id)") { () throws(RedisError) in
                try await client.command([
                    "HSET", keys.meta, "shards", RedisArgument(shards), "notifications", RedisArgument(total),
                    "enqueued", "1",
                ])
            }
            return .enqueued(job: job.id, shards: shards, notifications: total)
        } catch let error as FleetError {
            throw error
        } catch let error as RegistryError {
            throw FleetError("job \(job.id) (line \(number)): registry: \(error.description)")
        } catch {
            let message = (error as? RedisError)?.message ?? "\(error)"
            throw FleetError("job \(job.id) (line \(number)): Redis: \(message)")
        }
    }

    /// Whether the line is a JSON object (a registry-addressed line is stored as written).
    static func isObject(_ bytes: some Collection<UInt8>) -> Bool {
        if case .object? = try? JSONValue.parse(bytes) { true } else { false }
    }

    /// The job line with `tokens`/`tokens_file` replaced by `"tokens": [placeholder]`; nil when it is not an object.
    static func template(_ bytes: some Collection<UInt8>) -> [UInt8]? {
        guard case .object(let object)? = try? JSONValue.parse(bytes) else { return nil }
        var members = object.members.filter { $0.key != "tokens" && $0.key != "tokens_file" }
        members.append(JSONObject.Member(key: "tokens", value: .array([.string(placeholderToken)])))
        return JSONValue.object(JSONObject(members)).encoded()
    }
}
