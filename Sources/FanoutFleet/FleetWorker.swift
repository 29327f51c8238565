package import Fanout
import FanoutCore
package import FanoutJobFormat
import FanoutJobLines
package import FanoutRedis
import Foundation

/// How a `FleetWorker` reads, claims and writes.
package struct FleetWorkerOptions: Sendable {
    /// The consumer name in the group (`--name`; default host-pid). A worker restarted under the same name takes
    /// back its own pending shards at once.
    package var name: String
    /// A shard pending this long without a heartbeat belongs to a dead worker and is claimed (`--claim-idle`). At
    /// least `minimumClaimIdle`: the heartbeat must reset a live worker's shards several times within it.
    package var claimIdle: Duration = .seconds(30)
    /// Shards sent at the same time, so the engine stays busy across a shard's start and end.
    package var concurrentShards = 4
    /// How long one XREADGROUP waits for new shards.
    package var block: Duration = .seconds(1)
    /// A shard's results are written to Redis once this many are buffered (one script call, a handful of Redis
    /// commands, whatever the batch's size), and at least every `flushInterval`, and when the shard ends.
    package var flushBatch = 2_500
    /// The longest a result waits in the shard's buffer (so `fanout status` moves while a shard sends).
    package var flushInterval: Duration = .seconds(1)
    /// After `stop()`, shards still sending get this long to finish; then they are cancelled, what they finished is
    /// written, and they are left pending (unacknowledged) for another worker.
    package var stopGrace: Duration = .seconds(10)
    /// After the grace period, how long the cancelled shards get to write what they finished. A Redis call still
    /// waiting then (Redis hung) is no longer waited for, so a stop ends by `stopGrace` plus this, whatever Redis
    /// does; what was not written is sent again by the worker that claims the shard.
    package var stopWriteWindow: Duration = .seconds(1)
    /// Where the primary holding a job's keys has replicas: how long a shard's completion waits for one of them to
    /// acknowledge it (`WAIT`) before the shard is acknowledged on the stream, which may be on another primary. A
    /// replica that does not answer in time (lagging, or gone) does not hold the shard up longer: it is acknowledged
    /// anyway, and the worker reads the replicas again.
    package var replicaWait: Duration = .milliseconds(500)
    /// How often the replicas of the primaries are read again (`FleetReplicas`).
    package var replicaRefresh: Duration = .seconds(5)

    package init(name: String) { self.name = name }

    /// Heartbeats per `claimIdle`: a live worker resets its shards' idle time this often before another may claim
    /// them, so one late or slow heartbeat does not hand them over.
    package static let heartbeatsPerClaimIdle = 3
    /// The heartbeat runs every `claimIdle / heartbeatsPerClaimIdle`, but not more often than this.
    package static let shortestHeartbeatInterval: Duration = .milliseconds(100)
    /// The shortest `claimIdle` the heartbeat keeps up with: `heartbeatsPerClaimIdle` heartbeats at their shortest
    /// interval (0.3 s). Below it a live worker's shards pass for a dead one's (0.05 s sent 8,720 of 50,000 twice).
    package static var minimumClaimIdle: Duration { shortestHeartbeatInterval * heartbeatsPerClaimIdle }

    /// How often the heartbeat runs.
    var heartbeatInterval: Duration { max(Self.shortestHeartbeatInterval, claimIdle / Self.heartbeatsPerClaimIdle) }

    /// `host-pid`.
    package static var defaultName: String {
        "\(ProcessInfo.processInfo.hostName)-\(ProcessInfo.processInfo.processIdentifier)"
    }
}

/// What a worker did, for its last log line.
package struct FleetWorkerStats: Sendable {
    package var shardsCompleted = 0
    package var shardsClaimed = 0
    package var shardsLeft = 0
    package var resultsWritten = 0
    /// Another worker took this worker's name while its hold had expired (it could not reach Redis for `claimIdle`):
    /// it stopped, since two live workers under one name send each other's shards.
    package var nameTaken = false
}

/// `fanout worker`: reads shards from the fleet's stream with a consumer group, sends each with the engine, writes
/// every result to Redis, and acknowledges the shard once all its results are written.
///
/// The life of a shard (docs/ARCHITECTURE.md, "The fleet"):
/// 1. **Read** with `XREADGROUP ... BLOCK` on the reading client (its own connection: a blocked read holds it), or
///    **claimed** with `XAUTOCLAIM` once pending longer than `claimIdle` (its worker died, or was cut off).
/// 2. **Heartbeat.** Every `claimIdle / 3`, one script resets the idle time of the shards this worker still owns,
///    so no live worker's shard is claimed.
/// 3. **Resume.** The shard's marks are its progress record: the positions of the shard without a mark are the ones
///    sent; a fresh shard has them all, a claimed one only what its dead worker had not recorded.
/// 4. **Send and record.** Results are buffered and written by one script per `flushBatch` results (or per
///    `flushInterval`): the new lines appended to the shard's results, their positions marked, the counts added. `cancelled` results (a stop past the grace period) are not written,
///    so those positions are sent by whoever resumes the shard.
/// 5. **Complete.** After the last write: the shard joins the job's done set (its engine counts are added, once, and
///    its tokens key is deleted) if its marks still hold every result this worker saw recorded (else a failover lost
///    some: the shard is sent again from its marks); where the job's primary has replicas, one acknowledges that
///    (`WAIT`); then `XACK` and `XDEL`. A worker that dies anywhere before the XACK leaves the shard pending, and step 1 gives it to
///    another: only notifications in flight or not yet written are sent twice, and they still get one result line.
package final class FleetWorker: Sendable {
    /// Which engine sends a job: `fanout worker`'s one, or (`fanout serve`) the engine of the job's app's team.
    package typealias EngineRouter = @Sendable (ParsedJob) -> FanoutEngine?

    private let engineFor: EngineRouter
    private let reader: RedisClient
    private let writer: RedisClient
    private let options: FleetWorkerOptions
    private let log: @Sendable (String) -> Void
    /// The hold on `options.name` (`FleetWorkerName`): given by the CLI, which claims it before anything else, or taken
    /// by `run()`.
    private let nameHold: FanoutMutex<FleetWorkerName?>

    private struct State {
        /// When `stop()` was called: the grace period runs from here, whatever the reading loop was waiting on.
        var stoppedAt: ContinuousClock.Instant?
        var abandoning = false
        /// The entries of the shards being sent, for the heartbeat and so a claim does not start one twice.
        var held: Set<ShardRef> = []
        /// The engine runs, cancelled when the stop's grace period is over.
        var runs: [ShardRef: Task<JobSummary?, Never>] = [:]
        var stats = FleetWorkerStats()
    }

    private let state = FanoutMutex(State())
    /// Fired by `stop()`: the reading loop's Redis calls and backoffs are raced against it, so that a stop does not
    /// wait for a call in progress (with Redis hung, up to its deadline: 11 s for the blocked read).
    private let stopping = StopSignal()
    /// Fired when the grace period and `stopWriteWindow` after it are over: the shards' Redis calls are raced
    /// against it, so a shard still waiting on Redis then is left pending instead of holding up the stop.
    private let cutOff = StopSignal()
    /// Yields once on `stop()`: a child task of `run()`'s group waits on it, so that a loop waiting for a slot (every
    /// shard still sending) wakes at the stop instead of when a shard ends, which with a hung APNs would be only after
    /// the request timeouts and retries, long past the grace period.
    private let stopRequests = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
    /// Parsed job lines by job id and enqueue id (a job's shards share one), the least recently used dropped.
    private let jobs = FleetJobCache<Result<ParsedJob, FleetError>>()
    /// The replicas of the primaries holding the jobs' keys, for the WAIT before a shard's acknowledgement.
    private let replicas: FleetReplicas

    /// - Parameters:
    ///   - reader: the client for XREADGROUP (blocked reads hold its connection); its command timeout must exceed
    ///     `options.block`.
    ///   - writer: the client for everything else.
    ///   - name: the hold on `options.name`, already claimed; nil: `run()` claims it.
    package convenience init(
        engine: FanoutEngine, reader: RedisClient, writer: RedisClient, options: FleetWorkerOptions,
        name: FleetWorkerName? = nil, log: @escaping @Sendable (String) -> Void
    ) {
        self.init(engines: { _ in engine }, reader: reader, writer: writer, options: options, name: name, log: log)
    }

    /// A worker whose jobs go to the engine `engines` gives each (nil: none here sends its app: the job gets one
    /// `invalid` result saying so, as a line this version cannot parse does).
    package init(
        engines: @escaping EngineRouter, reader: RedisClient, writer: RedisClient, options: FleetWorkerOptions,
        name: FleetWorkerName? = nil, log: @escaping @Sendable (String) -> Void
    ) {
        nameHold = FanoutMutex(name)
        engineFor = engines
        self.reader = reader
        self.writer = writer
        self.options = options
        self.log = log
        replicas = FleetReplicas(isCluster: writer.configuration.url.isCluster)
    }

    /// Stop reading; shards being sent get `stopGrace` from now to finish, then `stopWriteWindow` to write what they
    /// finished. `run()` then returns, soon when nothing is being sent: it waits for the read or claim in progress
    /// until `options.block` and half a second after its start (what it brings is sent), and for no other Redis call
    /// (see `StopSignal`), so a hung Redis does not hold a stop up.
    package func stop() {
        let first = state.withLock { state in
            guard state.stoppedAt == nil else { return false }
            state.stoppedAt = .now
            return true
        }
        if first {
            stopping.fire()
            stopRequests.continuation.yield()
            stopRequests.continuation.finish()
        }
    }

    private var isStopping: Bool { state.withLock { $0.stoppedAt != nil } }

    /// What a child task of `run()`'s group reports when it ends.
    private enum GroupEvent {
        /// A shard's task ended (its slot is free).
        case shardEnded
        /// `stop()` was called.
        case stopRequested
        /// The grace period's timer ended (it had cancelled the shards still sending, or was itself cancelled).
        case graceOver
    }

    /// Runs until `stop()`.
    /// - Throws: `FleetError` when another live worker has this worker's name, or the consumer group cannot be created.
    package func run() async throws(FleetError) -> FleetWorkerStats {
        if nameHold.withLock({ $0 == nil }) {
            let hold = try await FleetWorkerName.claim(options.name, expiry: options.claimIdle, client: writer)
            nameHold.withLock { $0 = hold }
        }
        do {
            try await FleetConnection.ensureGroup(writer)
        } catch {
            throw FleetError("cannot create the consumer group: \(error.message)")
        }
        try? await replicas.refresh(writer)
        let heartbeat = Task { await heartbeatLoop() }
        defer { heartbeat.cancel() }
        await withTaskGroup(of: GroupEvent.self) { group in
            let stopRequests = self.stopRequests.stream
            group.addTask {
                // Ends at the stop, or when the group is cancelled (`run()` is returning).
                for await _ in stopRequests { break }
                return .stopRequested
            }
            var running = 0
            // The streams read: `fanout:shards`, and the partitions enqueues listed (`FleetKeys.streamSet`), found
            // again at each claim check. Each is read in turn.
            var streams = [FleetKeys.stream]
            var next = 0
            // Per stream: our own pending shards first (a restart under the same name), then new ones ("0", then
            // ">"; absent is "0"); the XAUTOCLAIM cursor (absent is "0-0").
            var readIDs: [String: String] = [:]
            var claimCursors: [String: String] = [:]
            // XAUTOCLAIM is tried at most every `claimCheck` (a dead worker's shards wait `claimIdle` anyway), not on
            // every turn, where it would be one more Redis call per shard.
            let claimCheck = min(options.claimIdle / 4, .seconds(1))
            var lastClaim: ContinuousClock.Instant?
            var failures = 0
            // The read or claim a stop did not wait for: Redis may still hand it shards, pending under this worker's
            // name, after the stop.
            var unfinishedFetch: (task: Task<Result<Fetched, RedisError>, Never>, started: ContinuousClock.Instant)?
            while !isStopping {
                if running >= options.concurrentShards {
                    // Wakes when a shard ends or at the stop, whichever comes first.
                    if await group.next() == .shardEnded { running -= 1 }
                    continue
                }
                let free = options.concurrentShards - running
                let entries: [ShardEntry]
                do throws(RedisError) {
                    var claimed: [ShardEntry] = []
                    if lastClaim.map({ ContinuousClock.now - $0 >= claimCheck }) ?? true {
                        let (known, cursors) = (streams, claimCursors)
                        let fetch = startFetch { () async throws(RedisError) in
                            try await self.claimPass(count: free, known: known, cursors: cursors)
                        }
                        unfinishedFetch = (fetch, .now)
                        let fetched = try await stopping.call { () async throws(RedisError) in
                            try await fetch.value.get()
                        }
                        claimed = fetched.entries
                        claimCursors = fetched.cursors
                        if let found = fetched.streams { streams = found }
                        // Found some: look again on the next turn (more may be waiting).
                        lastClaim = claimed.isEmpty ? ContinuousClock.now : nil
                    }
                    if !claimed.isEmpty {
                        state.withLock { $0.stats.shardsClaimed += claimed.count }
                        log("claimed \(claimed.count) shard(s) left pending over \(options.claimIdle)")
                    } else {
                        let stream = streams[next % streams.count]
                        next = (next + 1) % streams.count
                        let id = readIDs[stream] ?? "0"
                        // Reading "0" returns the held shards first: ask for enough to see past them.
                        let held = id == "0" ? state.withLock { $0.held.count(where: { $0.stream == stream }) } : 0
                        // Several streams share the blocked wait, so a new shard on any is seen within `block`.
                        let block = streams.count == 1 ? options.block : options.block / streams.count
                        let fetch = startFetch { () async throws(RedisError) in
                            try await self.read(stream: stream, count: free + held, id: id, block: block)
                        }
                        unfinishedFetch = (fetch, .now)
                        claimed = try await stopping.call { () async throws(RedisError) in
                            try await fetch.value.get().entries
                        }
                        // "0" reads this consumer's own pending entries (a restart under the same name) without
                        // blocking; once it offers nothing new, only new entries ('>').
                        if id == "0"
                            && state.withLock({ state in claimed.allSatisfy { state.held.contains($0.ref) } })
                        {
                            readIDs[stream] = ">"
                        }
                    }
                    entries = claimed
                    unfinishedFetch = nil
                    failures = 0
                } catch {
                    if isStopping { break }
                    unfinishedFetch = nil
                    failures += 1
                    log("Redis: \(error.message); retrying")
                    // A read whose reply was lost (the connection dropped, a restart) may still have given us shards:
                    // Redis keeps them pending under our name. Read our own pending entries again before new ones.
                    readIDs.removeAll()
                    if error.kind == .server && error.message.hasPrefix("NOGROUP") {
                        // The group is gone (a restart without AOF, a flush): make it again, from the stream's start.
                        let (writer, known) = (self.writer, streams)
                        _ = try? await stopping.call { () async throws(RedisError) in
                            for stream in known { try await FleetConnection.ensureGroup(writer, stream: stream) }
                        }
                    }
                    await stopping.sleep(for: .milliseconds(min(2000, 100 * failures)))
                    continue
                }
                var started = 0
                for entry in entries where started < free {
                    let isNew = state.withLock { $0.held.insert(entry.ref).inserted }
                    guard isNew else { continue }
                    started += 1
                    running += 1
                    group.addTask {
                        await self.process(entry)
                        return .shardEnded
                    }
                }
                // `running` counts shards not yet reaped: a finished one frees its slot when the group is next
                // awaited (at once, when the slots are full).
            }
            // Shards a read or claim brought after the stop are this worker's as much as those it was sending: sent
            // within the grace period, not left pending for another worker to claim `claimIdle` later. A healthy
            // Redis answers a blocked read within `options.block` of its start; a hung one is not waited for longer.
            if let fetch = unfinishedFetch,
                case .success(let fetched)? = await StopSignal.race(
                    within: fetch.started + options.block + .milliseconds(500) - .now, { await fetch.task.value })
            {
                for entry in fetched.entries where state.withLock({ $0.held.insert(entry.ref).inserted }) {
                    running += 1
                    group.addTask {
                        await self.process(entry)
                        return .shardEnded
                    }
                }
            }
            let (sending, stoppedAt) = state.withLock { ($0.held.count, $0.stoppedAt ?? .now) }
            guard sending > 0 else { return group.cancelAll() }
            log("stopping: \(sending) shard(s) still sending get \(options.stopGrace)")
            // From the stop, not from here: the loop may have finished a blocked read first.
            let deadline = stoppedAt + options.stopGrace
            let writeWindow = options.stopWriteWindow
            group.addTask {
                try? await Task.sleep(until: deadline, clock: .continuous)
                guard !Task.isCancelled else { return .graceOver }
                self.abandon()
                try? await Task.sleep(until: deadline + writeWindow, clock: .continuous)
                guard !Task.isCancelled else { return .graceOver }
                self.log("write window over: shards still waiting on Redis are left pending for another worker")
                self.cutOff.fire()
                return .graceOver
            }
            while running > 0 {
                if await group.next() == .shardEnded { running -= 1 }
            }
            group.cancelAll()
        }
        return state.withLock { $0.stats }
    }

    private func abandon() {
        let runs = state.withLock { state in
            state.abandoning = true
            return Array(state.runs.values)
        }
        log("grace period over: cancelling \(runs.count) shard(s); they stay pending for another worker")
        for run in runs { run.cancel() }
    }

    // MARK: Reading and claiming

    /// An entry of one of the streams.
    struct ShardRef: Hashable, Sendable {
        var stream: String
        var id: String
    }

    struct ShardEntry: Sendable {
        var stream: String
        var id: String
        /// Nil when the entry was deleted from the stream (nothing to send).
        var fields: [String: String]?

        var ref: ShardRef { ShardRef(stream: stream, id: id) }
    }

    /// What one read or claim pass gave: its entries; for a claim pass, the cursor of the next claim on each stream,
    /// and the streams it found.
    struct Fetched: Sendable {
        var entries: [ShardEntry]
        var cursors: [String: String] = [:]
        var streams: [String]?
    }

    /// Runs a read or claim in a task of its own, so that the reading loop can stop waiting for it and still learn,
    /// after the stop, which shards it brought.
    private func startFetch(
        _ operation: @escaping @Sendable () async throws(RedisError) -> Fetched
    ) -> Task<Result<Fetched, RedisError>, Never> {
        Task {
            do throws(RedisError) {
                return .success(try await operation())
            } catch {
                return .failure(error)
            }
        }
    }

    /// One stream's entries: one `XREADGROUP` (one stream a call: on a Redis Cluster the streams are in different
    /// slots, and a command's keys must share one).
    private func read(stream: String, count: Int, id: String, block: Duration) async throws(RedisError) -> Fetched {
        let reply = try await reader.command(
            [
                "XREADGROUP", "GROUP", RedisArgument(FleetKeys.group), RedisArgument(options.name), "COUNT",
                RedisArgument(count), "BLOCK", RedisArgument(Int(max(1, milliseconds(block)))), "STREAMS",
                RedisArgument(stream), RedisArgument(id),
            ], timeout: options.block + .seconds(10))
        // nil (timed out on the server) or [[stream, [entries]]].
        guard let streams = reply.array, let first = streams.first?.array, first.count == 2,
            let entries = first[1].array
        else { return Fetched(entries: []) }
        return Fetched(entries: entries.compactMap { Self.entry($0, stream: stream) })
    }

    /// Finds the streams (`fanout:shards` and the set's; a stream not in `known` gets its group made), then claims
    /// from each in turn until one gives entries.
    private func claimPass(count: Int, known: [String], cursors: [String: String]) async throws(RedisError)
        -> Fetched
    {
        let listed = try await writer.command(["SMEMBERS", RedisArgument(FleetKeys.streamSet)])
        let streams = [FleetKeys.stream] + (listed.array ?? []).compactMap(\.string).sorted()
        for stream in streams where !known.contains(stream) {
            try await FleetConnection.ensureGroup(writer, stream: stream)
        }
        var fetched = Fetched(entries: [], cursors: cursors, streams: streams)
        for stream in streams {
            let cursor = cursors[stream] ?? "0-0"
            let reply = try await writer.command([
                "XAUTOCLAIM", RedisArgument(stream), RedisArgument(FleetKeys.group), RedisArgument(options.name),
                RedisArgument(Int(milliseconds(options.claimIdle))), RedisArgument(cursor), "COUNT",
                RedisArgument(count),
            ])
            // [next cursor, [entries], [deleted ids]] (Redis 7; 6.2 has no third element).
            guard let parts = reply.array, parts.count >= 2, let next = parts[0].string, let entries = parts[1].array
            else { continue }
            fetched.cursors[stream] = next
            fetched.entries = entries.compactMap { Self.entry($0, stream: stream) }
            if !fetched.entries.isEmpty { break }
        }
        return fetched
    }

    private static func entry(_ value: RedisValue, stream: String) -> ShardEntry? {
        guard let pair = value.array, pair.count == 2, let id = pair[0].string else { return nil }
        guard let list = pair[1].array else { return ShardEntry(stream: stream, id: id, fields: nil) }
        var fields: [String: String] = [:]
        var index = 0
        while index + 1 < list.count {
            if let key = list[index].string, let value = list[index + 1].string { fields[key] = value }
            index += 2
        }
        return ShardEntry(stream: stream, id: id, fields: fields)
    }

    /// Frees this worker's name (a clean exit), waiting at most `timeout`; a restart under it may then take it at once.
    package func releaseName(timeout: Duration) async {
        // Taken out first, so that the heartbeat (still running when `run()` has not returned) does not take it back.
        await nameHold.withLock { $0.take() }?.release(client: writer, timeout: timeout)
    }

    private func heartbeatLoop() async {
        let interval = options.heartbeatInterval
        var replicasUnread = false
        while !Task.isCancelled {
            try? await Task.sleep(for: interval)
            // The name's hold first, every time: it must outlive the heartbeats even while no shard is held.
            if let hold = nameHold.withLock({ $0 }) {
                do {
                    if try await hold.refresh(client: writer) == false {
                        log(
                            "another worker named \(options.name) took this name while this worker could not reach "
                                + "Redis; stopping (give each worker its own --name)")
                        state.withLock { $0.stats.nameTaken = true }
                        stop()
                    }
                } catch {
                    log("heartbeat (name): \(error.message)")
                }
            }
            if replicas.isStale(after: options.replicaRefresh) {
                do {
                    try await replicas.refresh(writer)
                    replicasUnread = false
                } catch {
                    // Once per run of failures: a Redis that refuses the read would log it every few seconds.
                    if !replicasUnread { log("heartbeat: the replicas could not be read: \(error.message)") }
                    replicasUnread = true
                }
            }
            let held = state.withLock { Array($0.held) }
            // One script per stream (each in its own slot on a cluster).
            for (stream, entries) in Dictionary(grouping: held, by: \.stream) {
                do {
                    let owned = try await writer.evalScript(
                        FleetScripts.heartbeat, keys: [RedisArgument(stream)],
                        arguments: [RedisArgument(FleetKeys.group), RedisArgument(options.name)]
                            + entries.map { RedisArgument($0.id) })
                    let kept = Set((owned.array ?? []).compactMap(\.string))
                    for entry in entries where !kept.contains(entry.id) && state.withLock({ $0.held.contains(entry) }) {
                        log(
                            "shard \(entry.id) was claimed by another worker (a heartbeat came late); finishing it "
                                + "anyway")
                    }
                } catch {
                    log("heartbeat: \(error.message)")
                }
            }
        }
    }

    // MARK: One shard

    private func process(_ entry: ShardEntry) async {
        defer { state.withLock { _ = $0.held.remove(entry.ref) } }
        guard let fields = entry.fields, let jobID = fields["job"], let shard = fields["shard"].flatMap(Int.init),
            let start = fields["start"].flatMap(Int.init), let count = fields["count"].flatMap(Int.init)
        else {
            log("shard entry \(entry.id) is deleted or malformed; acknowledging it")
            await acknowledge(entry.ref)
            return
        }
        let keys = FleetKeys(job: jobID)
        var done = false
        var failures = 0
        // Redis errors (a restart, a timeout) are retried: the shard is ours until acknowledged, and every step is
        // idempotent.
        while !done {
            if state.withLock({ $0.abandoning }) { return }
            do {
                done = try await send(
                    entry: entry, keys: keys, shard: shard, start: start, count: count,
                    broadcast: fields["broadcast"] == "1")
                if !done { return }  // abandoned: left pending
            } catch {
                if cutOff.hasFired {
                    log("shard \(shard) of \(jobID): \(error.message); left pending for another worker")
                    return
                }
                failures += 1
                log("shard \(shard) of \(jobID): \(error.message); retrying")
                await cutOff.sleep(for: .milliseconds(min(2000, 100 * failures)))
            }
        }
    }

    /// Sends what the shard still needs and completes it. Returns false when the shard was abandoned (stop).
    /// - Parameter broadcast: the shard is an activity's broadcast (`FleetEnqueuer`): its one recipient is the
    ///   activity's channel, sent as a broadcast to the job's app.
    private func send(
        entry: ShardEntry, keys: FleetKeys, shard: Int, start: Int, count: Int, broadcast: Bool
    ) async throws(FleetError) -> Bool {
        // Nil for an entry an older `fanout enqueue` wrote.
        let enqueueID = entry.fields?[FleetKeys.enqueueIDField]
        let parsed: ParsedJob
        switch try await job(keys, enqueueID: enqueueID) {
        case .gone:
            log("job \(keys.job) is no longer in Redis; acknowledging its shard \(shard)")
            await acknowledge(entry.ref)
            return true
        case .enqueuedAgain:
            await acknowledgeEarlierEnqueue(entry, keys: keys, shard: shard)
            return true
        case .parsed(.failure(let error)):
            // Validated at enqueue; a line this version cannot parse gets the job's one `invalid` result.
            try await endInvalid(entry: entry, keys: keys, shard: shard, start: start, count: count, error.message)
            return true
        case .parsed(.success(let job)):
            parsed = job
        }
        guard let engine = engineFor(parsed) else {
            let app = Self.app(of: parsed)
            try await endInvalid(
                entry: entry, keys: keys, shard: shard, start: start, count: count,
                "no engine here sends for app \(app) (every process of a fleet must have every app's credentials)")
            return true
        }
        let replies: [RedisValue]
        do {
            // The tokens and the marks in one round trip, with the job's enqueue id (a line found in the cache may
            // belong to an enqueue whose keys were deleted since, and these tokens to the next one) and the policy of
            // the channel a broadcast shard goes to, as the enqueuer found it bound (absent: unknown).
            let writer = self.writer
            replies = try await cutOff.call { () async throws(RedisError) in
                try await writer.commands([
                    ["GET", keys.tokens(shard: shard)], ["GET", keys.marks(shard: shard)],
                    ["HMGET", keys.meta, RedisArgument(FleetKeys.enqueueIDField), "channel_policy"],
                ])
            }
        } catch {
            throw FleetError(error.message)
        }
        for case .error(let message) in replies { throw FleetError(message) }
        let meta = replies[2].array ?? []
        guard meta.first?.string == enqueueID else {
            await acknowledgeEarlierEnqueue(entry, keys: keys, shard: shard)
            return true
        }
        guard case .bytes(let data) = replies[0] else {
            log("the tokens of shard \(shard) of \(keys.job) are gone; acknowledging it")
            await acknowledge(entry.ref)
            return true
        }
        let tokens = data.split(separator: 10, omittingEmptySubsequences: false).map {
            String(decoding: $0, as: UTF8.self)
        }
        // The positions without a mark (`1`) have no result yet: all of them for a fresh shard.
        let marks: [UInt8] = if case .bytes(let marks) = replies[1] { marks } else { [] }
        let missing = (start..<start + min(count, tokens.count)).filter { position in
            let offset = position - start
            return offset >= marks.count || marks[offset] != UInt8(ascii: "1")
        }
        // The progress seen recorded, which the completion checks is still in Redis (a failover may lose writes).
        var progress = Progress(marked: marks.prefix(count).count(where: { $0 == UInt8(ascii: "1") }))
        var summary: JobSummary?
        if !missing.isEmpty {
            var job = FanoutJob(parsed)
            if broadcast, case .channel = job.recipients {
                // A `channel_id` job: its one recipient is the line's channel, sent as the line says.
            } else if broadcast, case .activity(let app, _) = job.recipients, let channel = tokens.first {
                // With the policy the channel was bound with, so a channel that keeps the latest message gets an
                // expiration that lets APNs keep it (`fanout send --registry` does the same).
                let policy = meta.dropFirst().first?.integer.flatMap { ChannelStoragePolicy(rawValue: Int($0)) }
                job.recipients = .channel(app: app, id: channel, storagePolicy: policy)
            } else {
                // A registry-addressed job's tokens were read at enqueue: the shard sends them as tokens.
                job.recipients = .tokens(missing.map { tokens[$0 - start] })
            }
            let sink = ResultSink(
                keys: keys, shard: shard, start: start, count: count, positions: missing, writer: writer,
                cutOff: cutOff)
            let interval = options.flushInterval
            let batch = options.flushBatch
            let log = self.log
            let flusher = Task {
                // Checks the buffer every 20 ms: writes a full batch at once, a partial one after `interval`. Results
                // Redis does not take stay buffered and go with the next write; the first failure of a run of them,
                // and the write that ends it, are logged, so results are never silently late while Redis is down.
                var last = ContinuousClock.now
                var failing = false
                while !Task.isCancelled {
                    try? await Task.sleep(for: .milliseconds(20))
                    guard sink.buffered >= batch || ContinuousClock.now - last >= interval else { continue }
                    last = ContinuousClock.now
                    do throws(RedisError) {
                        try await sink.flush()
                        if failing { log("shard \(shard) of \(keys.job): results written again") }
                        failing = false
                    } catch {
                        if !failing {
                            log(
                                "shard \(shard) of \(keys.job): results not written yet (\(error.message)); retrying"
                            )
                        }
                        failing = true
                    }
                }
            }
            let run = Task { () -> JobSummary? in
                // A job-level failure is recorded as its `invalid` result through onResult.
                try? await engine.run(job) { sink.add($0) }
            }
            // A run that starts after the grace period is over is cancelled here: `abandon()` only saw those before.
            if state.withLock({ state in
                state.runs[entry.ref] = run
                return state.abandoning
            }) {
                run.cancel()
            }
            // Raced: an engine run cancelled at the grace period's end can still be waiting on Redis (the fleet's
            // rate budget leases there).
            let ended = await cutOff.race { await run.value }
            state.withLock { _ = $0.runs.removeValue(forKey: entry.ref) }
            flusher.cancel()
            _ = await flusher.value
            guard let ended else { return false }
            summary = ended
            let abandoning = { self.state.withLock { $0.abandoning } }
            try await sink.flushAll(giveUp: abandoning)
            state.withLock { $0.stats.resultsWritten += sink.written }
            progress.marked += sink.marked
            progress.jobResult = sink.hasJobResult
            if run.isCancelled || abandoning() { return false }
        }
        try await complete(
            entry: entry, keys: keys, shard: shard, summary: summary, progress: progress, broadcast: broadcast)
        return true
    }

    /// Ends a shard whose job cannot be sent here with the job's one `invalid` result, and completes it.
    private func endInvalid(
        entry: ShardEntry, keys: FleetKeys, shard: Int, start: Int, count: Int, _ reason: String
    ) async throws(FleetError) {
        let sink = ResultSink(
            keys: keys, shard: shard, start: start, count: count, positions: [], writer: writer, cutOff: cutOff)
        sink.add(NotificationResult(jobID: keys.job, token: nil, outcome: .invalid, reason: reason))
        try await sink.flushAll(giveUp: { self.state.withLock { $0.abandoning } })
        try await complete(entry: entry, keys: keys, shard: shard, summary: nil, progress: Progress(jobResult: true))
    }

    /// The bundle id of a job's app: the one it names (registry-addressed and channel jobs), else its topic without
    /// the suffix its push type requires.
    package static func app(of job: ParsedJob) -> String {
        switch job.recipients {
        case .activity(let app, _), .pushToStart(let app, _, _, _), .devices(let app, _), .channel(let app, _, _):
            return app
        case .tokens, .file:
            let topic = job.headers.topic
            guard let suffix = job.headers.pushType.requiredTopicSuffix, !suffix.isEmpty, topic.hasSuffix(suffix)
            else { return topic }
            return String(topic.dropLast(suffix.count))
        }
    }

    /// What a worker saw recorded of a shard: the positions marked (found so, or marked by its writes) and whether
    /// the job-level result is there.
    struct Progress {
        var marked = 0
        var jobResult = false
    }

    /// Marks the shard done (`FleetScripts.completeShard`), makes sure that survives a failover, then acknowledges
    /// and deletes its entry.
    ///
    /// Redis replication is asynchronous: writes a primary acknowledged just before it died can be missing from the
    /// replica that takes over. Two checks keep that from leaving a token without a result:
    /// - The completion compares the shard's marks with `progress`: fewer (results lost in a failover of the job's
    ///   primary while the shard was sending) and it is refused, and this throws, so `process` sends the shard again
    ///   from its marks: the lost positions are sent a second time and get one result each.
    /// - Where the job's primary has replicas, the completion is followed by `WAIT 1` on its connection before the
    ///   entry is acknowledged (the stream may be on another primary, which a failover of the job's does not undo):
    ///   an entry is acknowledged once its completion, and every result before it, is on a replica.
    /// - Parameter broadcast: the shard is an activity's broadcast: the job's `broadcasts` count gets it, once.
    private func complete(
        entry: ShardEntry, keys: FleetKeys, shard: Int, summary: JobSummary?, progress: Progress,
        broadcast: Bool = false
    ) async throws(FleetError) {
        let writer = self.writer
        let replicaCount = replicas.replicas(forKey: keys.meta)
        let wait = options.replicaWait
        do throws(RedisError) {
            let scriptKeys = [
                keys.done, keys.counts, keys.meta, keys.tokens(shard: shard), keys.marks(shard: shard), keys.results,
            ]
            let arguments = [
                RedisArgument(shard), RedisArgument(summary?.payloadEncodings ?? 0),
                RedisArgument(summary?.demoted ?? 0), RedisArgument(broadcast ? 1 : 0), RedisArgument(progress.marked),
                RedisArgument(progress.jobResult ? 1 : 0),
            ]
            let (reply, acknowledged) = try await cutOff.call { () async throws(RedisError) in
                if replicaCount == 0 {
                    return (
                        try await writer.evalScript(FleetScripts.completeShard, keys: scriptKeys, arguments: arguments),
                        0
                    )
                }
                return try await writer.evalScript(
                    FleetScripts.completeShard, keys: scriptKeys, arguments: arguments, waitingFor: 1, within: wait,
                    timeout: wait + writer.configuration.commandTimeout)
            }
            if reply.integer == -1 {
                throw RedisError.server(
                    "fewer results are recorded than this worker wrote or found (a failover lost writes the old "
                        + "primary had acknowledged); sending the positions without one again")
            }
            if replicaCount > 0 && acknowledged == 0 {
                replicas.invalidate()
                log(
                    "shard \(shard) of \(keys.job): no replica acknowledged its completion within \(wait); "
                        + "acknowledging it anyway")
            }
            // Acknowledged, then deleted: the stream keeps only shards not done.
            let stream = RedisArgument(entry.stream)
            let replies = try await cutOff.call { () async throws(RedisError) in
                try await writer.commands([
                    ["XACK", stream, RedisArgument(FleetKeys.group), RedisArgument(entry.id)],
                    ["XDEL", stream, RedisArgument(entry.id)],
                ])
            }
            if case .error(let message) = replies[0] { throw RedisError.server(message) }
        } catch {
            throw FleetError(error.message)
        }
        state.withLock { $0.stats.shardsCompleted += 1 }
    }

    /// Acknowledges and deletes an entry with nothing (more) to send, retrying Redis failures with backoff until done
    /// or the stop's grace period is over: one dropped here would stay pending until claimed, and on the stream.
    private func acknowledge(_ entry: ShardRef) async {
        let (stream, id) = (RedisArgument(entry.stream), entry.id)
        let writer = self.writer
        var failures = 0
        while !state.withLock({ $0.abandoning }) {
            do throws(RedisError) {
                let replies = try await cutOff.call { () async throws(RedisError) in
                    try await writer.commands([
                        ["XACK", stream, RedisArgument(FleetKeys.group), RedisArgument(id)],
                        ["XDEL", stream, RedisArgument(id)],
                    ])
                }
                if case .error(let message) = replies[0] { throw RedisError.server(message) }
                return
            } catch {
                failures += 1
                log("acknowledging \(id): \(error.message); retrying")
                await cutOff.sleep(for: .milliseconds(min(2000, 100 * failures)))
            }
        }
    }

    /// A shard entry of an enqueue whose keys were deleted, its id since enqueued again (or not): there is nothing
    /// of it left to send, and the job's keys now belong to another enqueue.
    private func acknowledgeEarlierEnqueue(_ entry: ShardEntry, keys: FleetKeys, shard: Int) async {
        log(
            "shard \(shard) of \(keys.job) belongs to an earlier enqueue of that id, whose keys were deleted; "
                + "acknowledging it")
        await acknowledge(entry.ref)
    }

    /// What the job's hash says for a shard entry.
    private enum JobLine {
        /// The hash is gone.
        case gone
        /// The hash belongs to another enqueue of the job id than the entry's.
        case enqueuedAgain
        case parsed(Result<ParsedJob, FleetError>)
    }

    /// The parsed line of the enqueue `enqueueID` of the job (cached by both ids).
    /// - Parameter enqueueID: the shard entry's; nil for an entry an older `fanout enqueue` wrote, whose line is read
    ///   every time (nothing tells it from a later enqueue's under the same id).
    private func job(_ keys: FleetKeys, enqueueID: String?) async throws(FleetError) -> JobLine {
        if let enqueueID, let cached = jobs.value(for: .init(job: keys.job, enqueueID: enqueueID)) {
            return .parsed(cached)
        }
        let reply: RedisValue
        do {
            let writer = self.writer
            reply = try await cutOff.call { () async throws(RedisError) in
                try await writer.command(["HMGET", keys.meta, "line", "now", RedisArgument(FleetKeys.enqueueIDField)])
            }
        } catch {
            throw FleetError(error.message)
        }
        guard let values = reply.array, values.count == 3, case .bytes(let line) = values[0] else {
            jobs.removeAll(job: keys.job)
            return .gone
        }
        guard values[2].string == enqueueID else { return .enqueuedAgain }
        let now = values[1].integer ?? Int64(Date().timeIntervalSince1970)
        let result: Result<ParsedJob, FleetError>
        switch JobLineParser().parse(line: line, lineNumber: 1, jobFileDirectory: "", now: now) {
        case .success(let parsed): result = .success(parsed.job)
        case .failure(let error): result = .failure(FleetError(error.description))
        }
        if let enqueueID { jobs.insert(result, for: .init(job: keys.job, enqueueID: enqueueID)) }
        return .parsed(result)
    }
}

/// Whole milliseconds of a non-negative duration, for BLOCK and XAUTOCLAIM's min-idle-time.
func milliseconds(_ duration: Duration) -> UInt64 {
    let (seconds, attoseconds) = duration.components
    return UInt64(max(0, seconds)) * 1000 + UInt64(max(0, attoseconds) / 1_000_000_000_000_000)
}

/// One shard's results on their way to Redis: appended from engine threads, written by one task at a time.
final class ResultSink: Sendable {
    private struct Pending {
        var field: String
        var line: [UInt8]
        var outcome: String
        var retries: Int
    }

    private let keys: FleetKeys
    private let shard: Int
    private let start: Int
    private let count: Int
    /// Job positions by the engine's position (an index into the tokens it was given).
    private let positions: [Int]
    private let writer: RedisClient
    /// The worker's: a write still waiting on Redis when it fires is no longer waited for (see `StopSignal`).
    private let cutOff: StopSignal
    private let buffer = FanoutMutex<[Pending]>([])
    private let writtenCount = FanoutMutex(0)
    /// Positions this sink marked (results of the shard's tokens it wrote first), and whether the job-level result is
    /// recorded (by this sink or before): the progress the shard's completion checks.
    private let markedCount = FanoutMutex(0)
    private let jobResultRecorded = FanoutMutex(false)

    /// - Parameters: shard, start, count: the shard (its number, first position and size), whose marks and results
    ///   the results go to.
    init(
        keys: FleetKeys, shard: Int, start: Int, count: Int, positions: [Int], writer: RedisClient,
        cutOff: StopSignal = StopSignal()
    ) {
        self.keys = keys
        self.shard = shard
        self.start = start
        self.count = count
        self.positions = positions
        self.writer = writer
        self.cutOff = cutOff
    }

    var written: Int { writtenCount.withLock { $0 } }
    var marked: Int { markedCount.withLock { $0 } }
    var hasJobResult: Bool { jobResultRecorded.withLock { $0 } }

    /// Results waiting to be written.
    var buffered: Int { buffer.withLock { $0.count } }

    func add(_ result: NotificationResult) {
        // A cancelled notification (a stop past the grace period) is not a result: whoever resumes sends it.
        if result.outcome == .cancelled { return }
        let field: String
        if result.position >= 0 && result.position < positions.count {
            field = String(positions[result.position])
        } else {
            field = jobLevelField
        }
        var line: [UInt8] = []
        ResultLine.append(result, to: &line)
        let pending = Pending(
            field: field, line: line, outcome: result.outcome.name, retries: max(0, result.attempts - 1))
        buffer.withLock { $0.append(pending) }
    }

    /// Writes what is buffered (at most 5,000 results per script call). On failure the results go back to the buffer.
    func flush() async throws(RedisError) {
        while true {
            let batch = buffer.withLock { buffer -> [Pending] in
                let taken = min(buffer.count, 5000)
                let batch = Array(buffer.prefix(taken))
                buffer.removeFirst(taken)
                return batch
            }
            guard !batch.isEmpty else { return }
            do {
                var written = 0
                // The job-level result (a job line this version cannot parse): once per job, in the results hash.
                let (writer, keys, shard) = (self.writer, self.keys, self.shard)
                for pending in batch where pending.field == jobLevelField {
                    let reply = try await cutOff.call { () async throws(RedisError) in
                        try await writer.evalScript(
                            FleetScripts.recordJobResult, keys: [keys.results, keys.counts],
                            arguments: [
                                RedisArgument(bytes: pending.line), RedisArgument(pending.outcome),
                                RedisArgument(pending.retries),
                            ])
                    }
                    written += Int(reply.integer ?? 0)
                    jobResultRecorded.withLock { $0 = true }
                }
                let shardResults = batch.filter { $0.field != jobLevelField }
                if !shardResults.isEmpty {
                    let arguments = Self.recordArguments(shardResults, start: start, count: count)
                    let reply = try await cutOff.call { () async throws(RedisError) in
                        try await writer.evalScript(
                            FleetScripts.recordResults,
                            keys: [keys.marks(shard: shard), keys.results(shard: shard), keys.counts],
                            arguments: arguments)
                    }
                    written += Int(reply.integer ?? 0)
                    markedCount.withLock { $0 += Int(reply.integer ?? 0) }
                }
                writtenCount.withLock { $0 += written }
            } catch {
                buffer.withLock { $0.insert(contentsOf: batch, at: 0) }
                throw error
            }
        }
    }

    /// recordResults's arguments: the shard's start and count, the positions (space-separated), the records
    /// (`POSITION LINE`, each line ending in a newline, in the same order), then (outcome, count) pairs and
    /// `retries` for the whole batch.
    private static func recordArguments(_ batch: [Pending], start: Int, count: Int) -> [RedisArgument] {
        var positions: [UInt8] = []
        positions.reserveCapacity(batch.count * 8)
        var records: [UInt8] = []
        records.reserveCapacity(batch.reduce(0) { $0 + $1.line.count + 8 })
        var counts: [String: Int] = [:]
        var retries = 0
        for pending in batch {
            if !positions.isEmpty { positions.append(UInt8(ascii: " ")) }
            positions += pending.field.utf8
            records += pending.field.utf8
            records.append(UInt8(ascii: " "))
            records += pending.line
            counts[pending.outcome, default: 0] += 1
            retries += pending.retries
        }
        var arguments = [
            RedisArgument(start), RedisArgument(count), RedisArgument(bytes: positions), RedisArgument(bytes: records),
        ]
        for (outcome, number) in counts.sorted(by: { $0.key < $1.key }) {
            arguments += [RedisArgument(outcome), RedisArgument(number)]
        }
        if retries > 0 { arguments += ["retries", RedisArgument(retries)] }
        return arguments
    }

    /// Writes everything, retrying Redis failures with backoff until written, `giveUp()` says so, or the stop's
    /// write window is over (`cutOff`: from then every call and backoff ends at once, so retrying would spin).
    func flushAll(giveUp: () -> Bool) async throws(FleetError) {
        var failures = 0
        while true {
            do {
                try await flush()
                return
            } catch {
                failures += 1
                if giveUp() || cutOff.hasFired { throw FleetError("results not written: \(error.message)") }
                await cutOff.sleep(for: .milliseconds(min(2000, 100 * failures)))
            }
        }
    }
}
