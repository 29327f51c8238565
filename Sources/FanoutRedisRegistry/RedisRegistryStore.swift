import FanoutCore
package import FanoutRedis
package import FanoutRegistry

/// The registry on Redis, shared by every `fanout serve` and worker pointed at the same server: the same observable
/// semantics as `SQLiteRegistryStore` for everything `RegistryStore` promises. Keys: `RedisRegistryKeys`; scripts:
/// `RedisRegistryScripts`.
///
/// **What one write does.** Each change is one Lua script on its activity's keys (one hash tag, so one slot on Redis
/// Cluster) or on its app's keys, preceded in the same pipeline by plain single-key commands on other slots that only
/// ever add (the global token index, the activity set, the sweep schedule with `ZADD LT`, the ended-activities index).
/// A batch goes out as one pipeline (in chunks of a few thousand commands), then a second pipeline writes the events to
/// the log (one script on the global slot, which numbers them), the `expired_swept` counter and the index clean-ups
/// (the tokens no longer held where they were), and moves an activity's sweep visit to now when a change took its last
/// token or registered into it after its dismissal. A 410 or a bad token first reads the token's index (`SMEMBERS`), then
/// runs one script per place it is registered.
///
/// **Atomicity.** SQLite applies a whole batch in one transaction. Here:
/// - the batch is validated entirely first (ids, tokens, apps): invalid input writes nothing;
/// - each change's script is atomic (its activity, or its app's devices and push-to-start tokens), and the changes
///   run in batch order; but a batch as a whole is not: another client may interleave between two changes, and a
///   failure mid-batch (connection loss, timeout) leaves the changes before it applied. Re-applying a batch is safe:
///   every change is idempotent (latest registration wins, the same token again is `unchanged`).
/// - a registration with a device is two scripts (the device on the app's slot, then the token on the activity's).
///
/// **A crash between steps** (of this process, or of the connection) can leave:
/// - index entries without the token they point to (added before the script, or the clean-up never ran): every
///   reader checks the activity or device itself, so a stale entry only costs a look-up; a 410 for that token removes
///   it;
/// - a change applied whose events were not logged (the second pipeline never ran): the state is right, the event log
///   and `subscribe()` miss those events, and `expired_swept` may undercount;
/// - an activity visited late by the sweep (its schedule entry raced with a sweep): reads never return an expired
///   token or one of a dismissed activity whatever the sweep did, and every visit reschedules from the activity's real
///   state, so the sweep catches up at the latest one token lifetime later.
///
/// Removing a gone token's index entry (the second pipeline) can race with another client registering the same token
/// at the same place again: the entry is then missing until the token is next registered there (every registration
/// adds it again), and a 410 in between does not find it; an update token expires within its lifetime anyway.
///
/// **Events** are published to this object's `subscribe()` streams when a write's second pipeline has numbered them;
/// concurrent `apply` calls on one object may publish in an order other than their sequence numbers (SQLite
/// publishes under its write lock).
///
/// **Differences a caller can see.** `updateTokens(app:deviceID:)` pages a device's tokens in activity-id order (SQLite:
/// registration order). A sweep counts an ended activity in `activitiesRemoved` when it removes it (SQLite also counts
/// one it keeps for its broadcast channel). Batches are not atomic as a whole (above).
///
/// A stop of all of an activity's tokens, or an end with a dismissal date already past, removes them in one script,
/// as SQLite does in one transaction: Redis runs nothing else meanwhile (seconds for a million tokens).
///
/// Every call has a deadline: the client's command timeout per round trip. Connection trouble (unreachable, lost,
/// timed out, shut down) is `unavailable`; any other Redis error is `storage`.
package final class RedisRegistryStore: RegistryStore {
    package let client: RedisClient
    package let configuration: RegistryConfiguration
    package let keyPrefix: String
    package var clock: RegistryClock { configuration.clock }

    /// 1,024 tokens a page: Redis runs one script at a time, and a page of 4,096 held it about 10 ms (2.5 µs a token,
    /// `fanout-bench --scenario serve`), which every other client (a `202`'s writes, heartbeats, results) waited
    /// behind. A quarter of that, read one page ahead, still pages faster than a send goes.
    package var preferredPageSize: Int { 1024 }

    let keys: RedisRegistryKeys
    let hub: RegistryEventHub
    private let state = FanoutMutex(State())

    private struct State {
        /// Bundle id → workspace, reloaded on a miss (another process may have defined the app since).
        var apps: [String: String] = [:]
        var closed = false
        /// Whether this store has loaded its scripts (so its first pipeline is not answered NOSCRIPT throughout).
        var scriptsLoaded = false
    }

    /// Commands per pipeline: a batch of 10,000 registrations goes out in chunks of this many.
    static let pipelineChunk = 4_096

    /// A store on `client` (which stays the caller's: `close()` does not shut it down). Nothing is sent until the first
    /// call. `keyPrefix` starts every key; it must not contain `{` or `}` (the keys' hash tags follow it).
    package init(
        client: RedisClient, configuration: RegistryConfiguration = RegistryConfiguration(),
        keyPrefix: String = "fanout:registry:"
    ) {
        self.client = client
        self.configuration = configuration
        self.keyPrefix = keyPrefix
        keys = RedisRegistryKeys(prefix: keyPrefix)
        hub = RegistryEventHub(bufferLimit: configuration.subscriberBufferLimit)
    }

    /// The key of an activity's metadata hash. Its `content` field is the last content timestamp sent to the
    /// activity (a decimal string, Unix seconds), which scripts of other modules read in the activity's own slot:
    /// a key carrying `activityHashTag` is in it.
    package func activityMetaKey(app: String, activityID: String) -> RedisArgument {
        keys.activityMeta(ActivityReference(app: app, activityID: activityID))
    }

    /// `{APP/ACTIVITY}` as the registry's keys of the activity carry it (ids escaped), so that another key with it
    /// is in the same Redis Cluster slot.
    package static func activityHashTag(app: String, activityID: String) -> String {
        "{" + ActivityReference(app: app, activityID: activityID).member + "}"
    }

    /// Ends every `subscribe()` stream; calls after it fail `unavailable`. The client stays open (it is the caller's).
    package func close() {
        state.withLock { $0.closed = true }
        hub.finish()
    }

    deinit {
        hub.finish()
    }

    package func subscribe() -> AsyncStream<RegistryEvent> {
        hub.subscribe()
    }

    // MARK: Talking to Redis

    /// Sends `batch` in one round trip; runs a script again with its source if the server did not have it
    /// (`NOSCRIPT`: a restart, `SCRIPT FLUSH`). Error replies stay in place.
    func send(_ batch: [[RedisArgument]]) async throws(RegistryError) -> [RedisValue] {
        guard !state.withLock({ $0.closed }) else { throw RegistryError(.unavailable, "the Redis registry is closed") }
        if batch.isEmpty { return [] }
        let load: [[RedisArgument]] =
            state.withLock({ $0.scriptsLoaded })
            ? [] : RedisRegistryScripts.all.map { ["SCRIPT", "LOAD", RedisArgument($0.source)] }
        do {
            var replies = Array(try await client.commands(load + batch).dropFirst(load.count))
            if !load.isEmpty { state.withLock { $0.scriptsLoaded = true } }
            let missing = replies.indices.filter {
                if case .error(let message) = replies[$0] { return message.hasPrefix("NOSCRIPT") }
                return false
            }
            if !missing.isEmpty {
                // NOSCRIPT means the command did not run: load the scripts, then send those commands again.
                _ = try await client.commands(
                    RedisRegistryScripts.all.map { ["SCRIPT", "LOAD", RedisArgument($0.source)] })
                let again = try await client.commands(missing.map { batch[$0] })
                for (index, reply) in zip(missing, again) { replies[index] = reply }
            }
            return replies
        } catch {
            throw Self.map(error)
        }
    }

    /// One command; an error reply is thrown as `storage`.
    func send(_ command: [RedisArgument]) async throws(RegistryError) -> RedisValue {
        let reply = try await send([command])[0]
        if case .error(let message) = reply { throw RegistryError(.storage, "Redis: \(message)") }
        return reply
    }

    static func map(_ error: RedisError) -> RegistryError {
        switch error.kind {
        case .timeout, .unavailable, .connectionLost, .shutdown, .authenticationFailed:
            return RegistryError(.unavailable, "Redis: \(error.message)")
        default:
            return RegistryError(.storage, "Redis: \(error.message)")
        }
    }

    /// `EVALSHA` of `script` (see `send` for NOSCRIPT).
    static func eval(_ script: RedisScript, keys: [RedisArgument], _ arguments: [RedisArgument]) -> [RedisArgument] {
        ["EVALSHA", RedisArgument(script.sha1), RedisArgument(keys.count)] + keys + arguments
    }

    // MARK: Apps

    package func defineApps(_ apps: [RegistryApp]) async throws(RegistryError) {
        for app in apps {
            _ = try RegistryValidation.identifier(app.bundleID, field: "app")
            _ = try RegistryValidation.identifier(app.workspace, field: "workspace")
        }
        guard !apps.isEmpty else { return }
        var command: [RedisArgument] = ["HSET", keys.apps]
        for app in apps { command += [RedisArgument(app.bundleID), RedisArgument(app.workspace)] }
        _ = try await send(command)
        _ = try await loadApps()
    }

    package func apps() async throws(RegistryError) -> [RegistryApp] {
        try await loadApps().map { RegistryApp(bundleID: $0.key, workspace: $0.value) }.sorted {
            $0.bundleID < $1.bundleID
        }
    }

    func loadApps() async throws(RegistryError) -> [String: String] {
        let reply = try await send(["HGETALL", keys.apps])
        var apps: [String: String] = [:]
        let values = reply.array ?? []
        for index in stride(from: 0, to: values.count - 1, by: 2) {
            apps[values[index].string ?? ""] = values[index + 1].string ?? ""
        }
        state.withLock { $0.apps = apps }
        return apps
    }

    /// `invalidInput` naming `app` when the app is not defined (after reloading the apps once).
    func requireApp(_ bundleID: String) async throws(RegistryError) {
        if state.withLock({ $0.apps[bundleID] != nil }) { return }
        if try await loadApps()[bundleID] != nil { return }
        throw .invalid(
            "app", "unknown app \(RegistryValidation.excerpt(bundleID)) (define it in the registry's apps first)")
    }
}
