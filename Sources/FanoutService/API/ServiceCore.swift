import Fanout
package import FanoutObservability
import FanoutPolicy
package import FanoutRegistry
import Foundation

/// What every API flavour shares: who a key belongs to, the workspace budgets, the registry, the dispatch store and
/// the dispatcher. Each flavour (native, Pushwoosh, Braze) reads its own request shape, calls these, and renders
/// the answer in its own shape.
package final class ServiceCore: Sendable {
    package let configuration: ServiceConfiguration
    package let keyring: APIKeyring
    package let quotas: RequestQuotas
    package let registry: any RegistryStore
    package let store: DispatchStore
    package let dispatcher: Dispatcher
    package let channels: TeamChannelClients
    package let metrics: FanoutMetrics
    package let logger: FanoutLogger
    let started = Date()
    private let timestamps = ContentTimestamps()
    /// With the registry on Redis: timestamps ordered across every instance on it.
    private let sharedTimestamps: SharedContentTimestamps?
    /// With the registry on Redis: the dispatches and idempotency keys of every instance on it.
    let sharedDispatches: SharedDispatches?
    /// With the registry on Redis: the workspaces' API budgets, one bucket for every instance.
    private let sharedQuotas: SharedRequestQuotas?
    /// The webhooks' events, when a workspace has webhooks or `event_stream` (set once, at start).
    private let eventsBox = FanoutMutex<ServiceEvents?>(nil)
    var events: ServiceEvents? {
        get { eventsBox.withLock { $0 } }
        set { eventsBox.withLock { $0 = newValue } }
    }
    /// With the registry on Redis: the one dispatch queue of every instance (set once, at start).
    private let queueBox = FanoutMutex<SharedDispatchQueue?>(nil)
    var queue: SharedDispatchQueue? {
        get { queueBox.withLock { $0 } }
        set { queueBox.withLock { $0 = newValue } }
    }

    init(
        configuration: ServiceConfiguration, quotas: RequestQuotas, registry: any RegistryStore, store: DispatchStore,
        sharedTimestamps: SharedContentTimestamps?, sharedDispatches: SharedDispatches?,
        sharedQuotas: SharedRequestQuotas?, dispatcher: Dispatcher,
        channels: TeamChannelClients,
        metrics: FanoutMetrics, logger: FanoutLogger
    ) {
        self.configuration = configuration
        self.sharedTimestamps = sharedTimestamps
        self.sharedDispatches = sharedDispatches
        self.sharedQuotas = sharedQuotas
        keyring = APIKeyring(configuration)
        self.quotas = quotas
        self.registry = registry
        self.store = store
        self.dispatcher = dispatcher
        self.channels = channels
        self.metrics = metrics
        self.logger = logger
    }

    static func nowSeconds() -> Int64 { Int64(Date().timeIntervalSince1970) }
    static func nowMilliseconds() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    // MARK: Keys and budgets

    /// The caller of a presented key, refusing a device key where a server key is needed (403: the key is valid,
    /// its kind is not enough).
    func authenticate(key: String?, needs kind: APIKeyKind) throws(APIError) -> Caller {
        guard let key, let caller = keyring.caller(forKey: key) else {
            throw APIError(401, "missing or unknown API key")
        }
        if kind == .server && caller.kind != .server {
            throw APIError(403, "a device key cannot call this endpoint; use a server key")
        }
        return caller
    }

    /// Counts the request against the caller's budget: the headers to send back, or a 429 refusal with them.
    func admit(_ caller: Caller, budget: RequestQuotas.Budget) async -> (
        headers: [(name: String, value: String)], refused: Int?
    ) {
        var shared: RequestQuotaDecision?
        if let sharedQuotas, let rule = quotas.rule(workspace: caller.workspace, budget: budget) {
            // One bucket for every instance; this instance's own decides only while Redis does not answer.
            shared = await sharedQuotas.take(workspace: caller.workspace, budget: budget, rule: rule)
        }
        guard let decision = shared ?? quotas.take(workspace: caller.workspace, budget: budget) else {
            return ([], nil)
        }
        var headers: [(name: String, value: String)] = [
            ("x-ratelimit-limit", String(decision.limit)), ("x-ratelimit-remaining", String(decision.remaining)),
            ("x-ratelimit-reset", String(decision.resetAtUnixSeconds)),
        ]
        guard decision.admitted else {
            headers.append(("retry-after", String(decision.retryAfterSeconds)))
            return (headers, decision.retryAfterSeconds)
        }
        return (headers, nil)
    }

    /// What is left of the workspace's API budget, without taking any (the status page): the shared bucket's with
    /// Redis.
    func remainingBudget(workspace: String) async -> Int? {
        if let sharedQuotas, let rule = quotas.rule(workspace: workspace, budget: .api),
            let decision = await sharedQuotas.take(workspace: workspace, budget: .api, rule: rule, taking: false)
        {
            return decision.remaining
        }
        return quotas.remaining(workspace: workspace)
    }

    // MARK: Apps

    func workspace(of caller: Caller) -> WorkspaceConfiguration {
        configuration.workspaces[caller.workspace]!
    }

    /// The caller's app by bundle id; when none is named, the workspace's only app. Another workspace's app is
    /// "unknown" (404), never "forbidden", so app ids do not leak.
    func app(_ bundleID: String?, of caller: Caller, field: String = "app") throws(APIError) -> AppConfiguration {
        let apps = workspace(of: caller).apps
        guard let bundleID else {
            guard apps.count == 1, let only = apps.values.first else {
                throw APIError(400, field: field, "\(field) is required: this workspace has \(apps.count) apps")
            }
            return only
        }
        guard let app = apps[bundleID] else { throw APIError(404, field: field, "unknown app \(quoted(bundleID))") }
        return app
    }

    func app(where matches: (AppConfiguration) -> Bool, of caller: Caller) -> AppConfiguration? {
        workspace(of: caller).apps.values.first(where: matches)
    }

    /// A store that cannot be read now, as the caller sees it: a `503` to retry, naming what (`what`), not why. The
    /// error (a Redis address, a file path, SQLite's words) goes to the service's log only: a device key, which
    /// ships inside the app, reaches some of these endpoints.
    func unavailable(_ what: String, _ error: some Error) -> APIError {
        logger.error("\(what) cannot be read", fields: ["error": "\(error)"])
        return APIError(503, "\(what) cannot be read now; retry later")
    }

    // MARK: Registry

    /// Applies registrations. Bad input (a malformed token, an id too long) is the caller's 400, naming the field as
    /// the request spells it (`fields`: the registry's checks say `device` for `device_id` or `hwid`); a registry
    /// that cannot write now (busy, unavailable) is a 503 the caller should retry, since nothing was written.
    func register(_ changes: [RegistryChange], fields: RequestFieldNames) async throws(APIError)
        -> RegistryApplyResult
    {
        do {
            return try await registry.apply(changes)
        } catch {
            guard error.kind == .invalidInput else {
                logger.error("registration not written", fields: ["error": error.message])
                throw APIError(503, "the registry cannot be written now; retry later")
            }
            let named = fields.rename(field: error.field, message: error.description)
            throw APIError(400, field: named.field, named.message)
        }
    }

    // MARK: Dispatches

    /// Checks a dispatch, writes it to the store (committed before this returns) and queues it. With an
    /// idempotency key the workspace used before, returns the earlier dispatch and queues nothing, or, when the key
    /// came with another request, refuses it (`422`).
    func accept(_ spec: DispatchSpec, caller: Caller, idempotency: IdempotencyKey?) async throws(APIError)
        -> DispatchRecord
    {
        if let key = idempotency?.key, key.isEmpty || key.utf8.count > 255 {
            throw APIError(400, field: "Idempotency-Key", "Idempotency-Key must be 1 to 255 bytes")
        }
        if let key = idempotency?.key { try APIIdentifier.check(key, field: "Idempotency-Key") }
        guard let sharedDispatches else {
            return try await accept(spec, id: DispatchStore.newID(), caller: caller, idempotency: idempotency)
        }
        // Behind a load balancer a retry may reach another instance: the key is taken in Redis first, for the id
        // about to be committed, and a key already taken answers with the dispatch that took it.
        let id = DispatchStore.newID()
        if let idempotency {
            let earlier: (id: String, requestDigest: String?)?
            do {
                earlier = try await sharedDispatches.claim(idempotency, workspace: caller.workspace, for: id)
            } catch {
                logger.error("cannot check an idempotency key", fields: ["error": error.message])
                throw APIError(503, "the idempotency key could not be checked; nothing was sent, retry later")
            }
            if let earlier {
                guard idempotency.matches(earlier.requestDigest) else { throw Self.keyReused(by: earlier.id) }
                guard let record = try? await dispatch(earlier.id, of: caller) else {
                    throw APIError(409, "a request with this Idempotency-Key is still being accepted; retry later")
                }
                return record
            }
        }
        let record: DispatchRecord
        do {
            record = try await accept(spec, id: id, caller: caller, idempotency: idempotency)
        } catch {
            if let idempotency { await sharedDispatches.release(idempotency, workspace: caller.workspace, for: id) }
            throw error
        }
        guard queue == nil else { return record }
        do {
            try await sharedDispatches.publish(record)
        } catch {
            // Committed and queued: the publisher tries again on its next round.
            sharedDispatches.changed(record.id)
        }
        return record
    }

    /// The same `Idempotency-Key` sent with another request than the one that took it.
    private static func keyReused(by dispatchID: String) -> APIError {
        APIError(
            422, field: "Idempotency-Key",
            "this Idempotency-Key was sent with another request (dispatch \(dispatchID)); use a new key for a new request"
        )
    }

    /// `accept` once the dispatch's id is chosen: the content timestamp assigned, the dispatch committed and queued.
    private func accept(_ spec: DispatchSpec, id: String, caller: Caller, idempotency: IdempotencyKey?)
        async throws(APIError) -> DispatchRecord
    {
        guard let activityID = spec.activityID, !spec.timestampGiven else {
            try spec.validate(now: Self.nowSeconds())
            if let queue { return try await enqueue(spec, id: id, caller: caller, idempotency: idempotency, on: queue) }
            return try commit(spec, id: id, caller: caller, idempotency: idempotency)
        }
        let app = spec.app.bundleID
        if queue != nil, let sharedTimestamps, let sharedDispatches, sharedDispatches.claimsInTheAccept {
            return try await enqueue(
                spec, id: id, caller: caller, idempotency: idempotency, claimingFrom: sharedTimestamps,
                activityID: activityID)
        }
        // On Redis the claim's script reads the last timestamp sent from the registry itself.
        let lastSent =
            sharedTimestamps != nil
            ? nil : try? await registry.activity(app: app, activityID: activityID)?.lastContentTimestamp
        var now = Self.nowSeconds()
        if let sharedTimestamps {
            // Claimed from Redis, so that no two instances give this activity the same timestamp.
            do {
                now = try await sharedTimestamps.claim(app: app, activityID: activityID, atLeast: now)
            } catch {
                logger.error("cannot claim a content timestamp", fields: ["error": error.message])
                throw APIError(503, "the content timestamp could not be claimed; nothing was sent, retry later")
            }
        }
        var used = now
        let record: DispatchRecord
        if let queue {
            // Timestamps are claimed from Redis, unique per activity across instances; the queue's takers run them
            // in any order, and the registry's latest-wins rule keeps the newest content.
            let stamped = try timestamps.assign(app: app, activityID: activityID, now: now, lastSent: lastSent) {
                timestamp throws(APIError) in
                var stamped = spec
                stamped.setTimestamp(timestamp)
                try stamped.validate(now: Self.nowSeconds())
                used = timestamp
                return stamped
            }
            record = try await enqueue(stamped, id: id, caller: caller, idempotency: idempotency, on: queue)
        } else {
            record = try timestamps.assign(app: app, activityID: activityID, now: now, lastSent: lastSent) {
                timestamp throws(APIError) in
                var stamped = spec
                stamped.setTimestamp(timestamp)
                try stamped.validate(now: Self.nowSeconds())
                used = timestamp
                return try commit(stamped, id: id, caller: caller, idempotency: idempotency)
            }
        }
        if used > now, let sharedTimestamps {
            try? await sharedTimestamps.raise(app: app, activityID: activityID, to: used)
        }
        return record
    }

    /// With the queue on Redis: the checked dispatch committed there (its record, then its queue entry: the commit
    /// point), for any instance to take. This instance's store has nothing of it until it takes it.
    private func enqueue(
        _ spec: DispatchSpec, id: String, caller: Caller, idempotency: IdempotencyKey?, on queue: SharedDispatchQueue
    ) async throws(APIError) -> DispatchRecord {
        let record = queuedRecord(spec, id: id, caller: caller, idempotency: idempotency)
        guard let sharedDispatches else { preconditionFailure("the queue on Redis comes with the shared records") }
        do {
            try await sharedDispatches.publish(
                record, also: [SharedDispatchQueue.enqueueCommand(record, activityID: spec.activityID)],
                commitKey: SharedDispatchQueue.stream)
        } catch {
            logger.error("cannot queue a dispatch", fields: ["error": error.message])
            throw APIError(503, "the dispatch could not be queued; nothing was sent, retry later")
        }
        return record
    }

    /// `enqueue` of an activity's dispatch on one Redis, its content timestamp claimed in the same step: this
    /// instance chooses one (newer than the last it gave the activity), and when the accept's script finds that
    /// another instance gave or sent a newer one meanwhile, nothing was written and it chooses again past it. Each
    /// stale choice is a round trip; each answers with the newest, so a contended activity needs about as many as
    /// the instances writing it at once.
    private func enqueue(
        _ spec: DispatchSpec, id: String, caller: Caller, idempotency: IdempotencyKey?,
        claimingFrom sharedTimestamps: SharedContentTimestamps, activityID: String
    ) async throws(APIError) -> DispatchRecord {
        guard let sharedDispatches else { preconditionFailure("the queue on Redis comes with the shared records") }
        let app = spec.app.bundleID
        var floor: Int64?
        for _ in 0..<Self.timestampChoices {
            var chosen: Int64 = 0
            let stamped = try timestamps.assign(
                app: app, activityID: activityID, now: Self.nowSeconds(), lastSent: floor
            ) { timestamp throws(APIError) in
                var stamped = spec
                stamped.setTimestamp(timestamp)
                try stamped.validate(now: Self.nowSeconds())
                chosen = timestamp
                return stamped
            }
            let record = queuedRecord(stamped, id: id, caller: caller, idempotency: idempotency)
            do {
                floor = try await sharedDispatches.publish(
                    record, also: [SharedDispatchQueue.enqueueCommand(record, activityID: activityID)],
                    commitKey: SharedDispatchQueue.stream,
                    claim: SharedDispatches.TimestampClaim(
                        timestamps: sharedTimestamps, app: app, activityID: activityID, timestamp: chosen))
            } catch {
                logger.error("cannot queue a dispatch", fields: ["error": error.message])
                throw APIError(503, "the dispatch could not be queued; nothing was sent, retry later")
            }
            if floor == nil { return record }
        }
        logger.error("no content timestamp claimed", fields: ["activity": activityID])
        throw APIError(503, "the activity is being updated by too many requests at once; nothing was sent, retry later")
    }

    /// Choices of a content timestamp an accept makes before it gives up with a `503`: each stale one learned the
    /// newest, so only as many instances accepting updates of one activity at the same moment make it stale again.
    private static let timestampChoices = 16

    private func queuedRecord(_ spec: DispatchSpec, id: String, caller: Caller, idempotency: IdempotencyKey?)
        -> DispatchRecord
    {
        DispatchRecord(
            id: id, workspace: caller.workspace, app: spec.app.bundleID, kind: spec.kind, jobLine: spec.jobLine,
            state: .queued, counts: OutcomeCounts(), payloadEncodings: 0, demoted: 0,
            createdAt: Self.nowMilliseconds(), startedAt: nil, finishedAt: nil, idempotencyKey: idempotency?.key)
    }

    /// Writes the checked dispatch (or finds the earlier one of its idempotency key) and queues it if new.
    private func commit(_ spec: DispatchSpec, id: String, caller: Caller, idempotency: IdempotencyKey?)
        throws(APIError) -> DispatchRecord
    {
        do {
            let (record, created) = try store.accept(
                id: id, workspace: caller.workspace, app: spec.app.bundleID, kind: spec.kind, jobLine: spec.jobLine,
                idempotency: idempotency, now: Self.nowMilliseconds())
            if created { dispatcher.submit(record, activityID: spec.activityID) }
            return record
        } catch  where error.kind == .idempotencyKeyReused {
            throw Self.keyReused(by: error.message)
        } catch {
            logger.error("cannot record a dispatch", fields: ["error": "\(error)"])
            throw APIError(503, "the dispatch could not be recorded; nothing was sent, retry later")
        }
    }

    /// The caller's dispatch: from this instance's store, or (with Redis) as another instance published it.
    func dispatch(_ id: String, of caller: Caller) async throws(APIError) -> DispatchRecord {
        let local: DispatchRecord?
        do {
            local = try store.dispatch(id: id, workspace: caller.workspace)
        } catch {
            throw unavailable("the dispatch store", error)
        }
        if let local, isCurrent(local) { return local }
        guard let sharedDispatches else { throw APIError.notFound }
        do {
            guard let record = try await sharedDispatches.lookup(id: id, workspace: caller.workspace) ?? local else {
                throw APIError.notFound
            }
            return record
        } catch let error as APIError {
            throw error
        } catch {
            throw APIError(503, "the shared dispatch records cannot be read now; retry later")
        }
    }
}

extension ServiceCore {
    /// Whether this instance's copy of a dispatch is the one to answer with. With the queue on Redis a dispatch is
    /// in the instance's store once it took it; while it holds it, and once it finished it, its copy is the freshest.
    /// A copy it no longer holds and did not finish (another instance took the dispatch over, after a heartbeat came
    /// late) stopped where this instance stopped: the published record and results are the dispatch's.
    func isCurrent(_ local: DispatchRecord) -> Bool {
        guard let queue else { return true }
        return local.state == .done || queue.holds(local.id)
    }
}

func quoted(_ text: String) -> String {
    JSONValue.string(String(text.prefix(200))).description
}
