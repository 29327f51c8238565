import Fanout
import FanoutCore
import FanoutFleet
import FanoutJobLines
import FanoutRedis
import Foundation

/// With the registry on Redis, what every `fanout serve` on it must know of the dispatches another one accepted:
/// their state and counts (so `GET /v1/dispatches/{id}` answers on any instance behind a load balancer), and the
/// idempotency keys already used (so a retry that reaches another instance returns the first dispatch instead of
/// sending again).
///
/// Each dispatch is accepted onto the shared queue (`SharedDispatchQueue`) and sent and recorded by the instance that
/// takes it, in its own SQLite file. This type publishes its record and its results lines, so that
/// `GET /v1/dispatches/{id}` and its `/results` answer on every instance, and an instance that takes the dispatch over
/// finds what was done.
///
/// | Key | Type | What |
/// |---|---|---|
/// | `fanout:dispatch:{ID}` | string | the record as JSON (with its workspace); expires 7 days after its last change |
/// | `fanout:dispatch:{ID}:results` | sorted set | position → `POSITION LINE` (the results line); expires a day after the last added |
/// | `fanout:idempotency:{WORKSPACE}:KEY` | string | the dispatch id that took the key; expires after 7 days |
/// | `fanout:dispatches:{WORKSPACE}` | sorted set | the workspace's newest 200 dispatch ids by creation time (the status page) |
///
/// The owner publishes a record when it accepts it (before the 202), and then every `interval` while it is queued or
/// running and once more when it is done, each time with the results committed since the last time (before the
/// record, so a record that says `done` has all its results there): another instance's answer lags by at most
/// `interval`.
///
/// Redis replication is asynchronous: a write the primary acknowledged just before it failed can be missing from the
/// replica promoted in its place (Sentinel, Cluster). Where the primary holding a key has a replica
/// (`FleetReplicas`, read every `replicaRefresh`):
/// - the accept's commit point (the queue entry's `XADD`) is followed by `WAIT 1 replicaWait` on the same node
///   before the `202`;
/// - each publication of results is followed by the same `WAIT` on the results' node.
///
/// No replica within `replicaWait` (one lagging, or gone): the `202` is given anyway and logged, and the replicas are
/// read again. A `503` there would turn a slow or lost replica into an outage of every accept, and a client without
/// an `Idempotency-Key` that retried one whose entry did survive would send twice; what a `202` risks then is a
/// failover in that window, in which the dispatch is lost with the write (`GET` answers 404).
///
/// What the owner published and a failover lost is published again: a publication that failed (the connection lost,
/// a timeout: perhaps a failover) makes the next one check the results set (`ZCARD`) against the store, and a
/// dispatch's last publication always does, before its `done` record; short, everything is published again from the
/// first position. A result is one member per position of a sorted set, so publishing it again adds nothing twice.
final class SharedDispatches: Sendable {
    /// How long a write waits for a replica to acknowledge it (`WAIT`) where its primary has one. A replica on the
    /// same network acknowledges in about a millisecond; one that takes longer is lagging or gone, and an accept (a
    /// `202`) or a results writer should not wait longer than this on it. As the fleet's `replicaWait`.
    static let replicaWait: Duration = .milliseconds(500)
    /// How often the replicas are read again (`FleetReplicas`), and at once after a `WAIT` came back short.
    static let replicaRefresh: Duration = .seconds(5)
    /// The API's connection: idempotency keys, lookups, the accept's record.
    private let client: RedisClient
    /// A connection of its own for the results (pipelines of thousands of lines), so that an API request's round
    /// trips never wait behind them. Owned: shut down by `stop`.
    private let results: RedisClient
    private let store: DispatchStore
    private let interval: Duration
    /// Dispatches accepted or started since the last publication, or running.
    private let dirty = FanoutMutex<Set<String>>([])
    private let publisher = FanoutMutex<Task<Void, Never>?>(nil)
    /// What is published of each of this instance's dispatches: forgotten once it is done, or once Redis is found
    /// short (everything is published again).
    private let published = FanoutMutex<[String: PublishedResults]>([:])
    /// The publications that follow the results writers' commits (`publishAfterCommit`).
    private let lanes = PublicationLanes()
    /// The replicas of the primaries holding the queue's stream and the dispatches' results.
    private let replicas: FleetReplicas
    /// Dispatches whose last publication failed: the next one checks what Redis holds (a failover may have lost what
    /// was published before).
    private let suspect = FanoutMutex<Set<String>>([])
    /// Whether the last `WAIT` came back short (logged once per run of them).
    private let replicaShort = FanoutMutex(false)
    private let log: @Sendable (String) -> Void
    /// The run this instance took each dispatch it runs with (`fanout:dispatch:{ID}:runs` after its `INCR`): its
    /// publications are fenced by it (`fencedScript`), so that once another instance takes the dispatch over (a
    /// later run) nothing this one still has in hand overwrites the new run's record or adds results beside it.
    private let runs = FanoutMutex<[String: Int]>([:])
    /// Dispatches another instance took over from this one: nothing more of them is published from here.
    private let disowned = FanoutMutex<Set<String>>([])
    private static let expirySeconds = 7 * 86_400
    private static let resultsExpirySeconds = 86_400
    /// Results lines per ZADD, and per pipeline (about 300 bytes each: a pipeline holds some 1.5 MB). A ZADD of
    /// 2,000 lines held Redis up to 89 ms under load, and every other client waited behind it.
    private static let resultsChunk = 500
    private static let resultsPerRound = 5_000

    init(
        client: RedisClient, results: RedisClient, store: DispatchStore, interval: Duration = .milliseconds(250),
        log: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.client = client
        self.results = results
        self.store = store
        self.interval = interval
        self.log = log
        replicas = FleetReplicas(isCluster: client.configuration.url.isCluster)
    }

    // MARK: Replicas

    /// Reads the replicas of the primaries now (at start, before the first accept), and then when stale.
    func refreshReplicas() async {
        do {
            try await replicas.refresh(client)
        } catch {
            log("the Redis replicas could not be read: \(error.message)")
        }
    }

    /// The `WAIT` to send after a write to `key`, where its primary has a replica.
    private func waitCommand(forKey key: RedisArgument) -> [RedisArgument]? {
        guard replicas.replicas(forKey: key) > 0 else { return nil }
        return ["WAIT", "1", RedisArgument(Int(RedisClient.milliseconds(Self.replicaWait)))]
    }

    /// Notes a `WAIT`'s reply: no replica acknowledged, the write was kept anyway; the replicas are read again.
    private func waited(_ reply: RedisValue?, what: @autoclosure () -> String) {
        let acknowledged = (reply?.integer ?? 0) > 0
        let wasShort = replicaShort.withLock { short in
            defer { short = !acknowledged }
            return short
        }
        guard !acknowledged else {
            if wasShort { log("a Redis replica acknowledges writes again") }
            return
        }
        replicas.invalidate()
        if !wasShort {
            log(
                "no Redis replica acknowledged \(what()) within \(Self.replicaWait); kept anyway (a failover now may lose it)"
            )
        }
    }

    // MARK: Idempotency

    /// Takes `key` for the dispatch `id` about to be committed, or returns the dispatch that took it first (on any
    /// instance) with the digest of the request that took it (nil for a key taken before digests were kept).
    func claim(_ key: IdempotencyKey, workspace: String, for id: String) async throws(RedisError) -> (
        id: String, requestDigest: String?
    )? {
        let redisKey = Self.idempotencyKey(key.key, workspace: workspace)
        let arguments = [RedisArgument(id + " " + key.requestDigest), RedisArgument(Self.expirySeconds)]
        let reply: RedisValue
        if replicas.replicas(forKey: redisKey) > 0 {
            // A key taken and lost in a failover would let a retry through another instance make a second dispatch:
            // where the key's primary has a replica, it is on one before the accept goes on.
            let (value, acknowledged) = try await client.evalScript(
                Self.claimScript, keys: [redisKey], arguments: arguments, waitingFor: 1, within: Self.replicaWait,
                timeout: Self.replicaWait + client.configuration.commandTimeout)
            waited(.integer(Int64(acknowledged)), what: "the idempotency key of dispatch \(id)")
            reply = value
        } else {
            reply = try await client.evalScript(Self.claimScript, keys: [redisKey], arguments: arguments)
        }
        guard let taken = reply.string else { return nil }
        let parts = taken.split(separator: " ", maxSplits: 1)
        return (String(parts[0]), parts.count == 2 ? String(parts[1]) : nil)
    }

    /// KEYS: the idempotency key. ARGV: the dispatch id and its request's digest (`ID DIGEST`), the expiry in seconds.
    /// Returns what is already there, or takes the key and returns nil. A script, not `SET NX GET` (which Redis
    /// refuses before 7.0, and the fleet runs on 6.2).
    private static let claimScript = RedisScript(
        """
        local taken = redis.call('GET', KEYS[1])
        if taken then return taken end
        redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
        return false
        """)

    /// Gives `key` back after the dispatch that took it could not be committed, so that a retry may take it.
    func release(_ key: IdempotencyKey, workspace: String, for id: String) async {
        _ = try? await client.evalScript(
            Self.releaseScript, keys: [Self.idempotencyKey(key.key, workspace: workspace)],
            arguments: [RedisArgument(id)])
    }

    /// KEYS: the idempotency key. ARGV: the dispatch id. Deletes the key only while it is still that dispatch's (its
    /// value is `ID DIGEST`, or `ID` alone as an older version took it).
    private static let releaseScript = RedisScript(
        """
        local taken = redis.call('GET', KEYS[1])
        if taken == ARGV[1] or (taken and string.sub(taken, 1, #ARGV[1] + 1) == ARGV[1] .. ' ') then
          return redis.call('DEL', KEYS[1])
        end
        return 0
        """)

    // MARK: Records

    /// Publishes the record now (the accept path: before the 202, so any instance finds the dispatch at once), and
    /// lists it among its workspace's newest (the status page's list, whichever instance serves it).
    func publish(_ record: DispatchRecord) async throws(RedisError) {
        let recent = Self.recentKey(record.workspace)
        let replies = try await client.commands([
            Self.setCommand(record),
            ["ZADD", recent, RedisArgument(String(record.createdAt)), RedisArgument(record.id)],
            ["ZREMRANGEBYRANK", recent, "0", RedisArgument(-Self.recentKept - 1)],
            ["EXPIRE", recent, RedisArgument(Self.expirySeconds)],
        ])
        for case .error(let message) in replies { throw RedisError.server(message) }
    }

    /// The workspace's newest dispatches on every instance, newest first (at most `limit`, at most 200).
    func recent(workspace: String, limit: Int) async throws(RedisError) -> [DispatchRecord] {
        let ids = try await client.command([
            "ZREVRANGE", Self.recentKey(workspace), "0", RedisArgument(max(0, min(limit, Self.recentKept) - 1)),
        ])
        let gets = (ids.array ?? []).compactMap(\.string).map { id -> [RedisArgument] in
            ["GET", RedisArgument("fanout:dispatch:{\(id)}")]
        }
        guard !gets.isEmpty else { return [] }
        return try await client.commands(gets).compactMap { reply in
            guard case .bytes(let bytes) = reply,
                let published = try? JSONDecoder().decode(PublishedDispatch.self, from: Data(bytes)),
                published.workspace == workspace
            else { return nil }
            return published.record
        }
    }

    /// Marks a dispatch to publish on the next round (queued, started, finished: the dispatcher's changes).
    func changed(_ id: String) {
        _ = dirty.withLock { $0.insert(id) }
    }

    /// A dispatch another instance accepted; nil when there is none, or it is another workspace's.
    func lookup(id: String, workspace: String) async throws(RedisError) -> DispatchRecord? {
        try await published(id: id, workspace: workspace)?.record
    }

    private func published(id: String, workspace: String) async throws(RedisError) -> PublishedDispatch? {
        let reply = try await client.command(["GET", RedisArgument("fanout:dispatch:{\(id)}")])
        guard case .bytes(let bytes) = reply,
            let published = try? JSONDecoder().decode(PublishedDispatch.self, from: Data(bytes)),
            published.workspace == workspace
        else { return nil }
        return published
    }

    /// Publishes the changed and the running dispatches every `interval` until `stop()`.
    func start(running: @escaping @Sendable () -> [String]) {
        let task = Task(priority: .utility) { [weak self] in
            while !Task.isCancelled {
                guard let self else { return }
                try? await Task.sleep(for: self.interval)
                if self.replicas.isStale(after: Self.replicaRefresh) { await self.refreshReplicas() }
                await self.publishChanged(running: running())
            }
        }
        publisher.withLock { $0 = task }
    }

    /// Stops the publisher after one last round (within 2 s, so a Redis that is away does not hold up the exit), so
    /// that what this instance finished is visible to the others.
    func stop() async {
        let task = publisher.withLock { task in
            defer { task = nil }
            return task
        }
        task?.cancel()
        await task?.value
        await publishChanged(running: [], timeout: .seconds(2))
        await results.shutdown()
    }

    private func publishChanged(running: [String], timeout: Duration? = nil) async {
        let ids = dirty.withLock { dirty in
            defer { dirty.removeAll() }
            return dirty.union(running)
        }
        for id in ids where await !publish(id, timeout: timeout) {
            // Redis is away: try this one again next round, from the same position.
            dirty.withLock { _ = $0.insert(id) }
        }
    }

    /// This instance took the dispatch as run `run`: its publications are this run's.
    func took(_ id: String, run: Int) {
        runs.withLock { $0[id] = run }
        disowned.withLock { _ = $0.remove(id) }
    }

    /// Another instance took the dispatch over: this one publishes nothing more of it.
    func disown(_ id: String) {
        disowned.withLock { _ = $0.insert(id) }
    }

    /// KEYS: the dispatch's runs counter, the key the command writes (the same slot). ARGV: the publisher's run, the
    /// command's name, its arguments after the key. Runs the command unless a later run has begun (another instance
    /// took the dispatch over); then returns -1 and writes nothing.
    private static let fencedScript = RedisScript(
        """
        if tonumber(redis.call('GET', KEYS[1]) or '0') > tonumber(ARGV[1]) then return -1 end
        return redis.call(ARGV[2], KEYS[2], unpack(ARGV, 3))
        """)

    /// `command` (its key second) as this run's: fenced by `fencedScript` when the instance knows its run.
    private func fenced(_ command: [RedisArgument], id: String, run: Int?) -> [RedisArgument] {
        guard let run, command.count >= 2 else { return command }
        let runsKey = RedisArgument("fanout:dispatch:{\(id)}:runs")
        return [
            "EVAL", RedisArgument(Self.fencedScript.source), "2", runsKey, command[1], RedisArgument(run), command[0],
        ]
            + command.dropFirst(2)
    }

    /// Publishes the dispatch's record and the results committed since the last time; false when Redis did not take
    /// all of it (what it took stays published, the rest is sent again next time).
    ///
    /// Results are published in position order up to the first position still without one: a gap-free cursor, which
    /// the record carries (`resultsBelow`) so that readers page below it. `committed`, the batch the results writer
    /// just committed, is published past the cursor as well: one position left without a result for a while (a
    /// stream slow to be answered, a retry waiting out its backoff) holds the cursor back while the dispatch goes on
    /// sending, and an instance that took the dispatch over would send everything committed past it again. Those are
    /// not published again as the cursor passes them.
    func publish(_ id: String, timeout: Duration? = nil, committed: [NotificationResult] = []) async -> Bool {
        guard !disowned.withLock({ $0.contains(id) }), let record = try? store.record(id: id) else { return true }
        let run = runs.withLock { $0[id] }
        let key = Self.resultsKey(id)
        let wait = waitCommand(forKey: key)
        // A check of what Redis holds: after a failed publication, and before the record says `done`.
        var check = suspect.withLock { $0.contains(id) } || record.state == .done
        var ahead = committed
        // Its new results in pipelines of at most `resultsPerRound` lines, then the record with the last one.
        while true {
            var (lines, last, more, cursorBound) = resultsCommands(record)
            var aheadPositions = IndexSet()
            if !ahead.isEmpty {
                let (commands, positions) = Self.aheadCommands(ahead, from: cursorBound, key: key)
                lines += commands
                aheadPositions = positions
                ahead = []
            }
            let checking = check && !more
            let cursor = last ?? published.withLock { $0[id]?.upTo }
            let recordCommand = Self.setCommand(
                record, resultsBelow: cursor.map { $0 + 1 } ?? Int(DispatchSchema.jobLevelKeyBase))
            var commands = (more || checking ? lines : lines + [recordCommand]).map {
                fenced($0, id: id, run: run)
            }
            // One expiry per pipeline, not fenced: refreshing it is harmless from any run.
            if !lines.isEmpty { commands.append(["EXPIRE", key, RedisArgument(Self.resultsExpirySeconds)]) }
            // What Redis holds up to the cursor, against the store (results past it are not counted).
            if checking { commands.append(["ZCOUNT", key, "-inf", RedisArgument(cursor.map(Self.score) ?? "-inf")]) }
            if let wait, !commands.isEmpty { commands.append(wait) }
            let replies = try? await results.commands(commands, timeout: timeout)
            guard var replies, !replies.contains(where: { if case .error = $0 { true } else { false } }) else {
                suspect.withLock { _ = $0.insert(id) }
                return false
            }
            if wait != nil, !commands.isEmpty { waited(replies.popLast(), what: "results of dispatch \(id)") }
            if replies.contains(where: { $0.integer == -1 }) {
                // A later run began on another instance: what this one still holds is that run's to send again.
                disown(id)
                log("dispatch \(id): another instance took it over; this one publishes nothing more of it")
                return true
            }
            published.withLock { $0[id, default: PublishedResults()].add(upTo: last, ahead: aheadPositions) }
            if checking {
                check = false
                suspect.withLock { _ = $0.remove(id) }
                let held = replies.last?.integer.map(Int.init) ?? 0
                let upTo = published.withLock { $0[id]?.upTo } ?? Int.min
                if let stored = try? store.resultCount(id: id, upTo: upTo), held < stored {
                    log(
                        "dispatch \(id): Redis holds \(held) of the \(stored) results published (a failover lost "
                            + "some); publishing them again")
                    published.withLock { _ = $0.removeValue(forKey: id) }
                }
                continue
            }
            if !more { break }
        }
        if record.state == .done {
            published.withLock { _ = $0.removeValue(forKey: id) }
            runs.withLock { _ = $0.removeValue(forKey: id) }
        }
        return true
    }

    /// Publishes a dispatch's results after each commit of its results writer (a thread that may block): with the
    /// queue on Redis, an instance that dies leaves little unpublished for the one that takes its dispatch over.
    ///
    /// One publication runs while the writer commits the next batch: the writer waits here only until the
    /// publication covering its previous commit is done (at most about 3 s), so a dispatch's unpublished results are
    /// at most the batch just committed plus the ones not committed yet, while Redis's round trip (an AOF fsync with
    /// `appendfsync always`) overlaps the next SQLite commit instead of following it. With Redis away each
    /// publication waits its 2 s, which slows sending until Redis is back rather than letting what cannot be recorded
    /// grow.
    func publishAfterCommit(_ id: String, committed: [NotificationResult]) {
        let (commit, startsLane) = lanes.commit(id, committed)
        if startsLane {
            Task(priority: .userInitiated) {
                while let (target, committed) = lanes.next(id) {
                    _ = await publish(id, timeout: .seconds(2), committed: committed)
                    lanes.covered(id, upTo: target)
                }
            }
        }
        lanes.wait(id, covering: commit - 1, until: Date(timeIntervalSinceNow: 3))
    }

    /// Every results line published for the dispatch, with its position, in position order, a page of at most
    /// `resultsChunk` at a time (a dispatch taken over from an instance that stopped: what it finished). Returns the
    /// last position (nil when none was published).
    func publishedResults(
        id: String, page: ([(position: Int, line: ArraySlice<UInt8>)]) throws -> Void
    ) async throws -> Int? {
        var lower = "-inf"
        var last: Int?
        while true {
            let reply = try await results.command([
                "ZRANGEBYSCORE", Self.resultsKey(id), RedisArgument(lower), "+inf", "LIMIT", "0",
                RedisArgument(Self.resultsChunk),
            ])
            let members = reply.array ?? []
            var lines: [(position: Int, line: ArraySlice<UInt8>)] = []
            for case .bytes(let member) in members {
                guard let space = member.firstIndex(of: UInt8(ascii: " ")),
                    let position = Int(String(decoding: member[..<space], as: UTF8.self))
                else { continue }
                lines.append((position, member[(space + 1)...]))
                lower = "(" + Self.score(position)
                last = position
            }
            try page(lines)
            if members.count < Self.resultsChunk { return last }
        }
    }

    /// The results up to `position` are published already (taken over from the instance that published them).
    func markPublished(_ id: String, upTo position: Int) {
        published.withLock { $0[id, default: PublishedResults()].add(upTo: position, ahead: IndexSet()) }
    }

    /// Publishes a new dispatch's record, runs `also` (the shared queue's entry: commands of one slot, the accept's
    /// commit point), and lists the dispatch among its workspace's newest.
    ///
    /// On one Redis (with or without Sentinel), all of it is one transaction (`MULTI`/`EXEC`, one round trip: all or
    /// none, and an accept waits for one append to the AOF rather than three). On Redis Cluster the record (`{ID}`),
    /// the queue's stream and the workspace's list (`{WORKSPACE}`) are in three slots, and a transaction runs in one:
    /// three steps, each safe on its own:
    /// - The record first, so that whoever takes the entry, or looks the dispatch up, finds it.
    /// - `also` is the commit point: once it is answered the dispatch is accepted. When Redis refuses it, or it
    ///   was never sent, the record is deleted again (a record left by a failed delete was never answered to anyone,
    ///   so nobody has its id; it expires like any record). When its answer is lost the entry may be there, so the
    ///   record stays: the call fails as a lost `EXEC` answer did.
    /// - The list last, and not an error once the dispatch is accepted (the status page may miss a dispatch accepted
    ///   while Redis was failing; the dispatch runs and is found by its id).
    ///
    /// Where the primary holding `commitKey` (the key `also` writes last) has a replica, the transaction, or `also` on
    /// a cluster, is followed by `WAIT` on the same node, so that the `202` follows the entry's arrival on a replica
    /// (see the type's notes for a replica that does not answer in time).
    ///
    /// With `claim` (one Redis only: `claimsInTheAccept`), the same commands run in one script with the activity's
    /// content timestamp claimed (`SharedContentTimestamps.commitScript`); when the timestamp is stale, nothing is
    /// written and the floor to choose past is returned.
    @discardableResult
    func publish(
        _ record: DispatchRecord, also: [[RedisArgument]], commitKey: RedisArgument, claim: TimestampClaim? = nil
    ) async throws(RedisError) -> Int64? {
        let recent = Self.recentKey(record.workspace)
        let listed: [[RedisArgument]] = [
            ["ZADD", recent, RedisArgument(String(record.createdAt)), RedisArgument(record.id)],
            ["ZREMRANGEBYRANK", recent, "0", RedisArgument(-Self.recentKept - 1)],
            ["EXPIRE", recent, RedisArgument(Self.expirySeconds)],
        ]
        let wait = waitCommand(forKey: commitKey)
        if let claim {
            precondition(claimsInTheAccept, "a cluster claims the content timestamp in a step of its own")
            let script = claim.timestamps.commitArguments(
                [Self.setCommand(record)] + also + listed, claiming: claim.timestamp, app: claim.app,
                activityID: claim.activityID)
            let reply: RedisValue
            if wait != nil {
                let answer = try await client.evalScript(
                    SharedContentTimestamps.commitScript, keys: script.keys, arguments: script.arguments,
                    waitingFor: 1, within: Self.replicaWait)
                waited(.integer(Int64(answer.replicas)), what: "the accept of dispatch \(record.id)")
                reply = answer.reply
            } else {
                reply = try await client.evalScript(
                    SharedContentTimestamps.commitScript, keys: script.keys, arguments: script.arguments)
            }
            guard let floor = reply.integer else { throw RedisError.server("the accept's script answered \(reply)") }
            return floor == 0 ? nil : floor
        }
        guard client.configuration.url.isCluster else {
            var replies = try await client.commands(
                [["MULTI"], Self.setCommand(record)] + also + listed + [["EXEC"]] + (wait.map { [$0] } ?? []))
            if wait != nil { waited(replies.popLast(), what: "the accept of dispatch \(record.id)") }
            for case .error(let message) in replies { throw RedisError.server(message) }
            guard case .array(let results)? = replies.last else {
                throw RedisError.server("the transaction was not run")
            }
            for case .error(let message) in results { throw RedisError.server(message) }
            return nil
        }
        _ = try await client.command(Self.setCommand(record))
        do throws(RedisError) {
            var replies = try await client.commands(also + (wait.map { [$0] } ?? []))
            if wait != nil { waited(replies.popLast(), what: "the accept of dispatch \(record.id)") }
            for case .error(let message) in replies { throw RedisError.server(message) }
        } catch {
            // Refused by Redis, or never sent: no entry, so no dispatch. Anything else (a lost connection, a
            // timeout, a shutdown with the call in flight) may have added it.
            if [.server, .unavailable, .crossSlot, .unsupported, .authenticationFailed].contains(error.kind) {
                _ = try? await client.command(["DEL", RedisArgument("fanout:dispatch:{\(record.id)}")])
            }
            throw error
        }
        _ = try? await client.commands(listed)
        return nil
    }

    /// Whether an accept can claim its content timestamp in its own step (`publish(_:also:commitKey:claim:)`): on one
    /// Redis, with or without Sentinel; a cluster's accept writes three slots, which no one script may.
    var claimsInTheAccept: Bool { !client.configuration.url.isCluster }

    /// The content timestamp an accept claims in its own step.
    struct TimestampClaim: Sendable {
        let timestamps: SharedContentTimestamps
        let app: String
        let activityID: String
        let timestamp: Int64
    }

    /// ZADD commands for up to `resultsPerRound` results committed after the last published position and not
    /// published with their commit, the last position the cursor passed (nil when it did not move), whether more may
    /// follow, and the position the cursor stops at (the first one still without a result; `Int.max` once the
    /// dispatch is done).
    private func resultsCommands(_ record: DispatchRecord) -> (
        commands: [[RedisArgument]], last: Int?, more: Bool, cursorBound: Int
    ) {
        let key = Self.resultsKey(record.id)
        let published = self.published.withLock { $0[record.id] } ?? PublishedResults()
        var after = published.upTo ?? -1
        var commands: [[RedisArgument]] = []
        var cursor: Int?
        // Results are committed in the order they complete, not by position: while the dispatch runs, only the
        // positions below its done prefix are final (every one has its result), so publishing stops there, and the
        // published position is a gap-free cursor. Once done, everything is.
        let before = record.state == .done ? Int.max : (try? store.donePrefix(id: record.id)) ?? 0
        var lines = 0
        // Reads are bounded as well as lines: in the usual run every result was published with its commit, and the
        // cursor only walks past them.
        var reads = 0
        while lines < Self.resultsPerRound && reads < 4 * Self.resultsPerRound / Self.resultsChunk {
            reads += 1
            var command: [RedisArgument] = ["ZADD", key]
            let last = try? store.results(
                id: record.id, workspace: record.workspace, after: after, before: before, limit: Self.resultsChunk
            ) { position, result in
                if position >= 0 && published.ahead.contains(position) { return }
                Self.appendMember(position, result, to: &command)
            }
            // `results` returns `after` when it read nothing.
            guard let last, last != after else { return (commands, cursor, false, before) }
            if command.count > 2 {
                lines += (command.count - 2) / 2
                commands.append(command)
            }
            after = last
            cursor = last
        }
        return (commands, cursor, true, before)
    }

    /// ZADD commands for the results of `committed` at or past `bound` (where the cursor stops), `resultsChunk` per
    /// command, and their positions.
    private static func aheadCommands(_ committed: [NotificationResult], from bound: Int, key: RedisArgument)
        -> (commands: [[RedisArgument]], positions: IndexSet)
    {
        var commands: [[RedisArgument]] = []
        var positions = IndexSet()
        var command: [RedisArgument] = ["ZADD", key]
        for result in committed where result.position >= 0 && result.position >= bound {
            positions.insert(result.position)
            appendMember(result.position, result, to: &command)
            if command.count == 2 + 2 * resultsChunk {
                commands.append(command)
                command = ["ZADD", key]
            }
        }
        if command.count > 2 { commands.append(command) }
        return (commands, positions)
    }

    /// Adds a result to a results `ZADD`: its position's score and its member, `POSITION LINE`.
    private static func appendMember(_ position: Int, _ result: NotificationResult, to command: inout [RedisArgument]) {
        var member = Array(String(position).utf8)
        member.append(UInt8(ascii: " "))
        ResultLine.append(result, to: &member)
        command.append(RedisArgument(score(position)))
        command.append(RedisArgument(bytes: member))
    }

    /// A page of another instance's dispatch's results, as the owner's store answers it: the lines after position
    /// `after`, at most `limit`, and the last position (`after` when none). Nil when the dispatch is not published
    /// for `workspace`.
    func results(id: String, workspace: String, after: Int, limit: Int) async throws(RedisError)
        -> (lines: [UInt8], last: Int)?
    {
        guard let published = try await published(id: id, workspace: workspace) else { return nil }
        let lower = after < 0 && Int64(after) > DispatchSchema.jobLevelKeyLimit ? "-inf" : "(" + Self.score(after)
        let upper = published.resultsBelow.map { "(" + Self.score($0) } ?? "+inf"
        let reply = try await client.command([
            "ZRANGEBYSCORE", Self.resultsKey(id), RedisArgument(lower), RedisArgument(upper), "LIMIT", "0",
            RedisArgument(limit),
        ])
        var lines: [UInt8] = []
        var last = after
        for case .bytes(let member) in reply.array ?? [] {
            guard let space = member.firstIndex(of: UInt8(ascii: " ")),
                let position = Int(String(decoding: member[..<space], as: UTF8.self))
            else { continue }
            lines += member[(space + 1)...]
            last = position
        }
        return (lines, last)
    }

    /// A position's score in the results set. Job-level results are stored under keys near `Int64.min`, where a
    /// double cannot tell neighbours apart: they are moved to just above -2^52, below every other position, where it
    /// can.
    private static func score(_ position: Int) -> String {
        guard Int64(position) <= DispatchSchema.jobLevelKeyLimit else { return String(position) }
        return String(-(1 << 52) + Int(Int64(position) - DispatchSchema.jobLevelKeyBase))
    }

    private static func resultsKey(_ id: String) -> RedisArgument {
        RedisArgument("fanout:dispatch:{\(id)}:results")
    }

    private static func setCommand(_ record: DispatchRecord, resultsBelow: Int? = nil) -> [RedisArgument] {
        let json = (try? JSONEncoder().encode(PublishedDispatch(record, resultsBelow: resultsBelow))) ?? Data()
        return [
            "SET", RedisArgument("fanout:dispatch:{\(record.id)}"), RedisArgument(bytes: Array(json)), "EX",
            RedisArgument(expirySeconds),
        ]
    }

    /// The workspace's newest dispatch ids, scored by creation time (Unix ms), the newest `recentKept` kept.
    private static func recentKey(_ workspace: String) -> RedisArgument {
        RedisArgument("fanout:dispatches:{\(workspace)}")
    }

    private static let recentKept = 200

    private static func idempotencyKey(_ key: String, workspace: String) -> RedisArgument {
        RedisArgument("fanout:idempotency:{\(workspace)}:\(key)")
    }
}

/// What is published of one dispatch's results.
private struct PublishedResults {
    /// The gap-free cursor: every position up to it is published (nil: none yet).
    var upTo: Int?
    /// Positions past the cursor whose results were published with their commit (`publishAfterCommit`): the cursor
    /// skips them as it passes them. Ranges, so a stall of one position while the rest is sent holds a few ranges,
    /// not a position each.
    var ahead = IndexSet()

    /// Records a publication: the cursor moved to `upTo` (nil: it did not move), and `ahead` published past it.
    mutating func add(upTo cursor: Int?, ahead positions: IndexSet) {
        ahead.formUnion(positions)
        guard let cursor else { return }
        upTo = max(upTo ?? cursor, cursor)
        if cursor >= 0 { ahead.remove(integersIn: 0..<(cursor + 1)) }
    }
}

/// Per dispatch, the results writer's commits and the publications that cover them: one publication at a time per
/// dispatch, each covering every commit made before it started. The writer threads wait on `condition`, so this is a
/// condition's lock, not a `FanoutMutex` (whose waiters are tasks); every field is guarded by it, hence
/// `@unchecked Sendable`.
private final class PublicationLanes: @unchecked Sendable {
    private struct Lane {
        /// Commits made, and the last one a finished publication covers.
        var commits = 0
        var covered = 0
        var publishing = false
        /// The results of the commits no publication has taken yet (at most about two batches: the writer waits for
        /// the publication covering its previous commit).
        var committed: [NotificationResult] = []
    }

    private let condition = NSCondition()
    /// Only dispatches with a publication running or due: a lane is dropped once it has caught up.
    private var lanes: [String: Lane] = [:]

    /// Counts a commit of `results`; returns its number and whether the caller starts the lane's publishing task.
    func commit(_ id: String, _ results: [NotificationResult]) -> (commit: Int, startsLane: Bool) {
        condition.lock()
        defer { condition.unlock() }
        var lane = lanes[id] ?? Lane()
        lane.commits += 1
        lane.committed += results
        let starts = !lane.publishing
        lane.publishing = true
        lanes[id] = lane
        return (lane.commits, starts)
    }

    /// The commit the next publication covers and the results committed since the last one took them, or nil once
    /// the lane has caught up (and is dropped).
    func next(_ id: String) -> (commit: Int, committed: [NotificationResult])? {
        condition.lock()
        defer { condition.unlock() }
        guard var lane = lanes[id], lane.covered < lane.commits else {
            lanes[id] = nil
            condition.broadcast()
            return nil
        }
        let committed = lane.committed
        lane.committed = []
        lanes[id] = lane
        return (lane.commits, committed)
    }

    func covered(_ id: String, upTo commit: Int) {
        condition.lock()
        lanes[id]?.covered = commit
        condition.broadcast()
        condition.unlock()
    }

    /// Waits until a publication covers `commit` (a dropped lane covers everything), or until `deadline`.
    func wait(_ id: String, covering commit: Int, until deadline: Date) {
        condition.lock()
        while let lane = lanes[id], lane.covered < commit {
            if !condition.wait(until: deadline) { break }
        }
        condition.unlock()
    }
}

/// A dispatch record as published: everything the API shows, not the job line.
private struct PublishedDispatch: Codable {
    var id: String
    var workspace: String
    var app: String
    var kind: String
    var state: String
    var counts: OutcomeCounts
    var payloadEncodings: Int
    var demoted: Int
    var broadcasts: Int
    var createdAt: Int64
    var startedAt: Int64?
    var finishedAt: Int64?
    var idempotencyKey: String?
    /// While the dispatch is not done: every position below this has its result in the results set, which may also
    /// hold results past it (committed beyond a position still without one). A reader pages below it only, so that
    /// its cursor never passes a position whose result comes later. Nil: no bound (the dispatch is done, or the
    /// record was published at its accept, before any result).
    var resultsBelow: Int?

    init(_ record: DispatchRecord, resultsBelow: Int? = nil) {
        id = record.id
        workspace = record.workspace
        app = record.app
        kind = record.kind
        state = record.state.rawValue
        counts = record.counts
        payloadEncodings = record.payloadEncodings
        demoted = record.demoted
        broadcasts = record.broadcasts
        createdAt = record.createdAt
        startedAt = record.startedAt
        finishedAt = record.finishedAt
        idempotencyKey = record.idempotencyKey
        self.resultsBelow = record.state == .done ? nil : resultsBelow
    }

    var record: DispatchRecord {
        var record = DispatchRecord(
            id: id, workspace: workspace, app: app, kind: kind, jobLine: [],
            state: DispatchState(rawValue: state) ?? .queued,
            counts: counts, payloadEncodings: payloadEncodings, demoted: demoted, createdAt: createdAt,
            startedAt: startedAt, finishedAt: finishedAt, idempotencyKey: idempotencyKey)
        record.broadcasts = broadcasts
        return record
    }
}
