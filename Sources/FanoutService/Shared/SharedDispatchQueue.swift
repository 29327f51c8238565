import Fanout
import FanoutCore
import FanoutFleet
import FanoutJobLines
import FanoutRedis
import Foundation

/// With Redis, the one queue of every `fanout serve` on it: a dispatch accepted by any instance is an entry on a
/// Redis stream, and any instance that takes work (`fleet_worker`) runs it; none holds work only it can finish.
///
/// | Key | Type | What |
/// |---|---|---|
/// | `fanout:dispatch-queue` | stream | one entry per accepted dispatch: its id, workspace, app, kind, creation time, job line, activity |
/// | (group `fanout-serve`) | consumer group | each instance a consumer of its own (`serve-HOST-PID-RANDOM`) |
/// | `fanout:dispatch:{ID}:runs` | counter | the runs any instance gave the dispatch: each take counts one |
///
/// - **Accepting is enqueueing**: `enqueueCommand` runs right after the record is published, as the accept's commit
///   point (`SharedDispatches.publish(_:also:commitKey:)`), before the `202` (and, where the stream's primary has a
///   replica, after one acknowledged it: `WAIT`); the accepting instance's file has nothing of it.
/// - **Taking**: `XREADGROUP` (new entries), and every `claimIdle` an `XAUTOCLAIM` of entries idle that long (their
///   instance died or was stopped mid-dispatch). The taker counts a run (`INCR`), copies into its own store the
///   results the earlier runs published (`SharedDispatches.publishedResults`), and hands the dispatch to its
///   `Dispatcher`, which skips every recipient with a result and stores this run's at positions of its own.
/// - **Heartbeat**: while a dispatch runs, its entry's idle time is reset every `claimIdle / 3` (`XCLAIM ...
///   JUSTID`), so nobody takes a live instance's work.
/// - **Done**: once the dispatcher marks it done, the record and its last results are published, then the entry is
///   acknowledged and deleted. An instance that dies before that leaves it pending: another takes it after
///   `claimIdle`, finds every result published so far, and sends the rest. What is sent twice is what the dead
///   instance had sent but not yet published: its in-flight notifications and the results committed since its last
///   publication (`SharedDispatches`' interval), never a second result for a recipient.
final class SharedDispatchQueue: Sendable {
    static let stream = RedisArgument("fanout:dispatch-queue")
    static let group = RedisArgument("fanout-serve")

    struct Options: Sendable {
        /// This instance's consumer name.
        var consumer: String
        /// An entry idle this long belongs to an instance that stopped: another takes it.
        var claimIdle: Duration = .seconds(30)
        /// Dispatches taken and not yet done, at most (the dispatcher's own limit on running ones applies too).
        var maxHeld: Int
        /// Whether this instance takes dispatches (false: an API-only instance, which only enqueues).
        var takes = true

        var block: Duration { min(.seconds(1), claimIdle / 4) }
        var heartbeatInterval: Duration { max(.milliseconds(100), claimIdle / 3) }
    }

    /// Owned, both shut down by `stop`: the reader's connection is held by blocked reads, the writer's carries
    /// claims, heartbeats and acknowledgements.
    private let writer: RedisClient
    private let reader: RedisClient
    private let store: DispatchStore
    private let shared: SharedDispatches
    private let dispatcher: Dispatcher
    private let options: Options
    private let log: @Sendable (String) -> Void
    /// A dispatch taken and not yet acknowledged: its stream entry, and the entry's fields (a stop queues them again).
    private struct Held {
        var entry: String
        var fields: [String: [UInt8]]
    }

    /// Dispatch id → what this instance holds of it.
    private let held = FanoutMutex<[String: Held]>([:])
    /// Dispatches of an activity taken while another instance runs one of the same activity: each starts once it
    /// gets the activity's run lock (`activityLockKey`). Dispatch id → the dispatch and its activity.
    private let waitingForActivity = FanoutMutex<[String: (record: DispatchRecord, activityID: String)]>([:])
    /// Dispatch id → the activity run lock it holds while it runs.
    private let activityLocks = FanoutMutex<[String: RedisArgument]>([:])
    private let loop = FanoutMutex<Task<Void, Never>?>(nil)

    init(
        writer: RedisClient, reader: RedisClient, store: DispatchStore, shared: SharedDispatches,
        dispatcher: Dispatcher, options: Options, log: @escaping @Sendable (String) -> Void
    ) {
        self.writer = writer
        self.reader = reader
        self.store = store
        self.shared = shared
        self.dispatcher = dispatcher
        self.options = options
        self.log = log
    }

    /// The `XADD` of a new dispatch's entry (the accept's commit point, after its record).
    static func enqueueCommand(_ record: DispatchRecord, activityID: String?) -> [RedisArgument] {
        var command: [RedisArgument] = [
            "XADD", stream, "*", "id", RedisArgument(record.id), "workspace", RedisArgument(record.workspace), "app",
            RedisArgument(record.app), "kind", RedisArgument(record.kind), "created",
            RedisArgument(String(record.createdAt)), "line", RedisArgument(bytes: record.jobLine),
        ]
        if let activityID { command += ["activity", RedisArgument(activityID)] }
        if let key = record.idempotencyKey { command += ["idempotency", RedisArgument(key)] }
        return command
    }

    /// Creates the consumer group (once for every instance) and starts taking, unless this instance only accepts.
    func start() async throws(RedisError) {
        do {
            _ = try await writer.command(["XGROUP", "CREATE", Self.stream, Self.group, "0", "MKSTREAM"])
        } catch let error where error.kind == .server && error.message.hasPrefix("BUSYGROUP") {
            // Another instance made it.
        }
        guard options.takes else { return }
        let task = Task(priority: .utility) { [self] in
            // The heartbeat in a task of its own: a take that reads many published results must not delay it.
            async let beating: Void = heartbeatLoop()
            await run()
            await beating
        }
        loop.withLock { $0 = task }
    }

    /// Takes no more dispatches; what this instance holds and has not finished stays pending for another instance
    /// (the dispatcher's stop, before this, gave the running ones their grace period). Closes the reading client.
    func stop() async {
        let task = loop.withLock { $0.take() }
        task?.cancel()
        await task?.value
        await acknowledgeFinished()
        await handBackUnfinished()
        // The activities of dispatches left unfinished are free for others at once (whoever takes one takes its
        // lock too: the lock names the dispatch).
        for (id, lock) in activityLocks.withLock({ $0 }) {
            _ = try? await writer.evalScript(
                Self.releaseLock, keys: [lock], arguments: [RedisArgument(id)], timeout: .seconds(1))
        }
        await reader.shutdown()
        await writer.shutdown()
    }

    /// At a stop: each dispatch taken and not finished (its dispatcher has stopped) is published as far as it got,
    /// then queued again as a new entry in place of its own (one transaction), so another instance takes it at once
    /// instead of after `claimIdle`. One that cannot be published now stays pending, and is claimed as a dead
    /// instance's would be.
    private func handBackUnfinished() async {
        let unfinished = held.withLock { $0 }
        for (id, item) in unfinished {
            guard await shared.publish(id, timeout: .seconds(1))
            else { continue }
            var add: [RedisArgument] = ["XADD", Self.stream, "*"]
            for (name, value) in item.fields.sorted(by: { $0.key < $1.key }) {
                add += [RedisArgument(name), RedisArgument(bytes: value)]
            }
            let replies = try? await writer.commands(
                [
                    ["MULTI"], add, ["XACK", Self.stream, Self.group, RedisArgument(item.entry)],
                    ["XDEL", Self.stream, RedisArgument(item.entry)], ["EXEC"],
                ], timeout: .seconds(1))
            guard case .array? = replies?.last else { continue }
            held.withLock { _ = $0.removeValue(forKey: id) }
            log("dispatch \(id): not finished at the stop; queued again for another instance")
        }
    }

    /// Whether this instance holds the dispatch's entry now (it runs it, or is about to).
    func holds(_ id: String) -> Bool {
        held.withLock { $0[id] != nil }
    }

    /// Told by the dispatcher when a dispatch of this instance changed: once one it holds is done, it is published
    /// and acknowledged, its activity's lock released and the next dispatch of that activity started now, not when
    /// the reading loop next comes round (a blocked read, up to a second).
    func dispatchChanged(_ id: String) {
        guard held.withLock({ $0[id] != nil }) else { return }
        Task(priority: .utility) { [self] in
            await acknowledgeFinished()
            await startWaitingActivities()
        }
    }

    private func run() async {
        var lastClaim: ContinuousClock.Instant?
        var failures = 0
        while !Task.isCancelled {
            await acknowledgeFinished()
            await startWaitingActivities()
            let free = options.maxHeld - held.withLock { $0.count }
            guard free > 0 else {
                try? await Task.sleep(for: min(options.block, .milliseconds(100)))
                continue
            }
            do throws(RedisError) {
                var entries: [(id: String, fields: [String: [UInt8]])] = []
                if lastClaim.map({ ContinuousClock.now - $0 >= options.claimIdle / 4 }) ?? true {
                    entries = try await claim(count: free)
                    lastClaim = entries.isEmpty ? .now : nil
                }
                if entries.isEmpty { entries = try await read(count: free) }
                failures = 0
                for entry in entries where !Task.isCancelled { await take(entry) }
            } catch {
                failures += 1
                log("the dispatch queue: \(error.message); retrying")
                if error.kind == .server && error.message.hasPrefix("NOGROUP") {
                    // The group is gone (Redis restarted without its data): made again, from the stream's start.
                    _ = try? await writer.command(["XGROUP", "CREATE", Self.stream, Self.group, "0", "MKSTREAM"])
                }
                try? await Task.sleep(for: .milliseconds(min(2000, 100 * failures)))
            }
        }
    }

    private func read(count: Int) async throws(RedisError) -> [(id: String, fields: [String: [UInt8]])] {
        // A dispatch waiting for its activity's lock is tried again after each read: a short one then.
        let block = waitingForActivity.withLock { $0.isEmpty } ? options.block : .milliseconds(50)
        let reply = try await reader.command(
            [
                "XREADGROUP", "GROUP", Self.group, RedisArgument(options.consumer), "COUNT", RedisArgument(count),
                "BLOCK", RedisArgument(Self.milliseconds(block)), "STREAMS", Self.stream, ">",
            ], timeout: options.block + .seconds(10))
        guard let streams = reply.array, let first = streams.first?.array, first.count == 2,
            let entries = first[1].array
        else { return [] }
        return entries.compactMap(Self.entry)
    }

    private func claim(count: Int) async throws(RedisError) -> [(id: String, fields: [String: [UInt8]])] {
        let reply = try await writer.command([
            "XAUTOCLAIM", Self.stream, Self.group, RedisArgument(options.consumer),
            RedisArgument(Self.milliseconds(options.claimIdle)), "0-0", "COUNT", RedisArgument(count),
        ])
        guard let parts = reply.array, parts.count >= 2, let entries = parts[1].array else { return [] }
        return entries.compactMap(Self.entry)
    }

    private static func entry(_ value: RedisValue) -> (id: String, fields: [String: [UInt8]])? {
        guard let pair = value.array, pair.count == 2, let id = pair[0].string else { return nil }
        var fields: [String: [UInt8]] = [:]
        let list = pair[1].array ?? []
        var index = 0
        while index + 1 < list.count {
            if let key = list[index].string, case .bytes(let value) = list[index + 1] { fields[key] = value }
            index += 2
        }
        return (id, fields)
    }

    private static func milliseconds(_ duration: Duration) -> Int { Int(RedisClient.milliseconds(duration)) }

    /// Takes one entry: counts a run, brings in what earlier runs published, and queues it on this instance. An
    /// entry that cannot be taken now (Redis or the store failing) is left pending: it is claimed again later.
    private func take(_ entry: (id: String, fields: [String: [UInt8]])) async {
        func text(_ name: String) -> String? { entry.fields[name].map { String(decoding: $0, as: UTF8.self) } }
        guard let id = text("id"), let workspace = text("workspace"), let app = text("app"), let kind = text("kind"),
            let created = text("created").flatMap(Int64.init), let line = entry.fields["line"]
        else {
            // Not an entry this version wrote: nothing to run.
            log("the dispatch queue: entry \(entry.id) is not a dispatch; deleted")
            _ = try? await writer.commands([
                ["XACK", Self.stream, Self.group, RedisArgument(entry.id)],
                ["XDEL", Self.stream, RedisArgument(entry.id)],
            ])
            return
        }
        // Held from here, so that the heartbeat keeps it while its earlier results are read.
        let isNew = held.withLock { held -> Bool in
            guard held[id] == nil else { return false }
            held[id] = Held(entry: entry.id, fields: entry.fields)
            return true
        }
        guard isNew else { return }
        do {
            let runsKey = RedisArgument("fanout:dispatch:{\(id)}:runs")
            let replies = try await writer.commands([["INCR", runsKey], ["EXPIRE", runsKey, "604800"]])
            guard case .integer(let runs)? = replies.first else {
                throw RedisError.server("INCR answered \(String(describing: replies.first))")
            }
            shared.took(id, run: Int(runs))
            let record = DispatchRecord(
                id: id, workspace: workspace, app: app, kind: kind, jobLine: line, state: .queued,
                counts: OutcomeCounts(), payloadEncodings: 0, demoted: 0, createdAt: created, startedAt: nil,
                finishedAt: nil, idempotencyKey: text("idempotency"))
            let adopted = try store.adopt(record, runsBefore: Int(runs) - 1)
            if runs > 1 {
                // An earlier run's results, as its instance published them: this store gets them at the same
                // positions (a position it has already is kept), so the resume skips them and the counts hold them.
                var recorded = 0
                let last = try await shared.publishedResults(id: id) { page in
                    let results = page.compactMap { item -> NotificationResult? in
                        guard item.position >= 0 else { return nil }
                        return ResultLine.result(item.line, position: item.position)
                    }
                    try store.appendResults(results, dispatch: id)
                    recorded += results.count
                }
                // Published gap-free up to the first position still without a result (the earlier runs may have
                // published results past it too).
                if last != nil, let prefix = try store.donePrefix(id: id) { shared.markPublished(id, upTo: prefix - 1) }
                log("dispatch \(id) taken over (run \(runs)): \(recorded) result(s) already recorded")
            }
            if adopted.state != .done {
                if let activityID = text("activity") {
                    waitingForActivity.withLock { $0[id] = (adopted, activityID) }
                    await startWaitingActivities()
                } else {
                    dispatcher.submit(adopted, activityID: nil)
                }
            }
        } catch {
            held.withLock { _ = $0.removeValue(forKey: id) }
            log("dispatch \(id): cannot be taken now (\(error)); left for a later claim")
        }
    }

    /// Publishes each finished dispatch and then acknowledges its entry: an entry is deleted only once every
    /// instance can read the dispatch's end. Its activity's run lock is then released.
    private func acknowledgeFinished() async {
        let finished = held.withLock { $0 }.filter { id, _ in
            waitingForActivity.withLock { $0[id] == nil } && (try? store.record(id: id))?.state == .done
        }
        for (id, item) in finished {
            guard await shared.publish(id, timeout: .seconds(2)) else { continue }
            let replies = try? await writer.commands([
                ["XACK", Self.stream, Self.group, RedisArgument(item.entry)],
                ["XDEL", Self.stream, RedisArgument(item.entry)],
            ])
            guard replies != nil else { continue }
            held.withLock { _ = $0.removeValue(forKey: id) }
            if let lock = activityLocks.withLock({ $0.removeValue(forKey: id) }) {
                _ = try? await writer.evalScript(Self.releaseLock, keys: [lock], arguments: [RedisArgument(id)])
            }
        }
    }

    // MARK: One activity at a time

    /// The run lock of an activity: the id of the dispatch of it that runs now, on any instance. Two updates of one
    /// activity run one after the other, so the registry's latest-wins rule sees the first one's content before it
    /// checks the second's (an older one that comes second is superseded, not sent), and a device's last update is
    /// the newest content.
    private static func activityLockKey(app: String, activityID: String) -> RedisArgument {
        RedisArgument("fanout:activity-run:{\(app)/\(activityID)}")
    }

    /// KEYS: the lock. ARGV: the dispatch id, the expiry in ms. Takes the lock, or keeps it fresh for its holder;
    /// returns 1 when the dispatch holds it.
    private static let takeLock = RedisScript(
        """
        local holder = redis.call('GET', KEYS[1])
        if holder and holder ~= ARGV[1] then return 0 end
        redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
        return 1
        """)

    /// KEYS: the lock. ARGV: the dispatch id. Frees it if the dispatch holds it.
    private static let releaseLock = RedisScript(
        """
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """)

    /// Starts each waiting dispatch whose activity's run lock it gets. The lock expires after `claimIdle` unless
    /// the heartbeat refreshes it, so an instance that died holding it holds up the activity no longer than it
    /// holds up the dispatch itself.
    private func startWaitingActivities() async {
        let waiting = waitingForActivity.withLock { $0 }
        for (id, item) in waiting {
            let lock = Self.activityLockKey(app: item.record.app, activityID: item.activityID)
            guard
                let reply = try? await writer.evalScript(
                    Self.takeLock, keys: [lock],
                    arguments: [RedisArgument(id), RedisArgument(Self.milliseconds(options.claimIdle))]),
                reply.integer == 1
            else { continue }
            guard waitingForActivity.withLock({ $0.removeValue(forKey: id) }) != nil else { continue }
            activityLocks.withLock { $0[id] = lock }
            dispatcher.submit(item.record, activityID: item.activityID)
        }
    }

    private func heartbeatLoop() async {
        while !Task.isCancelled {
            try? await Task.sleep(for: options.heartbeatInterval)
            await heartbeat()
        }
    }

    /// Resets the idle time of every entry this instance still owns, so that no other instance claims it. One that
    /// another has claimed meanwhile (a heartbeat came late) is left to it (`FleetScripts.heartbeat`), and this
    /// instance stops sending it: the other resumes it after what is published.
    private func heartbeat() async {
        let entries = held.withLock { $0 }
        guard !entries.isEmpty else { return }
        do {
            let owned = try await writer.evalScript(
                FleetScripts.heartbeat, keys: [Self.stream],
                arguments: [Self.group, RedisArgument(options.consumer)]
                    + entries.values.map { RedisArgument($0.entry) })
            let kept = Set((owned.array ?? []).compactMap(\.string))
            for (id, item) in entries where !kept.contains(item.entry) {
                guard held.withLock({ $0.removeValue(forKey: id) }) != nil else { continue }
                log("dispatch \(id) was taken over by another instance (a heartbeat came late); stopping it here")
                shared.disown(id)
                waitingForActivity.withLock { _ = $0.removeValue(forKey: id) }
                activityLocks.withLock { _ = $0.removeValue(forKey: id) }
                dispatcher.cancel(id)
            }
            for (id, lock) in activityLocks.withLock({ $0 }) {
                _ = try await writer.evalScript(
                    Self.takeLock, keys: [lock],
                    arguments: [RedisArgument(id), RedisArgument(Self.milliseconds(options.claimIdle))])
            }
        } catch {
            log("the dispatch queue's heartbeat: \(error.message)")
        }
    }
}
