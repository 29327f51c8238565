import Fanout
import FanoutCore
import FanoutObservability
import FanoutRegistry
import FanoutSQLite
import Foundation

/// What `fanout serve` tells its workspaces' webhook endpoints (docs/WEBHOOKS.md): the events of dispatches and of
/// the registry, recorded in the outbox (`WebhookOutbox`) and delivered by one `WebhookDeliverer` thread per lane of
/// each endpoint.
///
/// Where events come from:
/// - Dispatches: `dispatchChanged(_:)`, which the dispatcher calls with a dispatch's id when it is queued and when a
///   run of it ends (its `changed` callback). It reads the dispatch's committed state and records `dispatch.accepted`,
///   then `dispatch.finished` or `dispatch.failed` (and `activity.ended` for an `end`) once it is done. Event ids are
///   made from the dispatch id, so a call repeated after a restart records nothing twice.
/// - Token removals: a task that follows the registry's change feed (its durable event log) from a cursor kept in the
///   outbox, written in the same transaction as the events it read, so a restart resumes where it stopped.
///
/// Nothing here waits for a receiver: recording is one SQLite transaction on the caller's thread, and deliveries run
/// on the deliverers' threads.
final class ServiceEvents: Sendable {
    let outbox: WebhookOutbox
    private let store: DispatchStore
    private let byWorkspace: [String: [WebhookEndpointConfiguration]]
    /// Workspaces with `event_stream`: every event of theirs is kept, whatever their endpoints take.
    private let streamed: Set<String>
    /// The workspaces whose events are recorded: those with webhooks or `event_stream`.
    let recording: Set<String>
    private let maintenance: Task<Void, Never>
    /// Each endpoint's deliverers, one per lane (`concurrency`).
    private let deliverers: [String: [WebhookDeliverer]]
    private let metrics: WebhookMetrics
    private let registryFeed: Task<Void, Never>?
    private let log: FanoutLogger

    /// Opens the outbox and starts the deliverers and the registry feed; nil when no workspace has webhooks or
    /// `event_stream`.
    static func start(
        configuration: ServiceConfiguration, store: DispatchStore, registry: any RegistryStore,
        metrics: MetricsRegistry, logger: FanoutLogger, environment: [String: String]
    ) throws(ServiceStartError) -> ServiceEvents? {
        let endpoints = configuration.workspaces.keys.sorted().flatMap { configuration.workspaces[$0]!.webhooks }
        guard !endpoints.isEmpty || configuration.workspaces.values.contains(where: \.eventStream) else { return nil }
        var secrets: [String: [UInt8]] = [:]
        for endpoint in endpoints {
            do {
                secrets[endpoint.key] = try endpoint.secret(environment: environment)
            } catch {
                throw ServiceStartError("\(error)")
            }
        }
        let outbox: WebhookOutbox
        do {
            outbox = try WebhookOutbox(path: configuration.database)
        } catch {
            throw ServiceStartError("cannot open the webhook outbox in \(configuration.database): \(error)")
        }
        return ServiceEvents(
            configuration: configuration, endpoints: endpoints, secrets: secrets, outbox: outbox, store: store,
            registry: registry, metrics: WebhookMetrics(registry: metrics), logger: logger)
    }

    private init(
        configuration: ServiceConfiguration, endpoints: [WebhookEndpointConfiguration], secrets: [String: [UInt8]],
        outbox: WebhookOutbox, store: DispatchStore, registry: any RegistryStore, metrics: WebhookMetrics,
        logger: FanoutLogger
    ) {
        self.outbox = outbox
        self.store = store
        byWorkspace = Dictionary(grouping: endpoints, by: \.workspace)
        let streamed = Set(configuration.workspaces.values.filter(\.eventStream).map(\.name))
        self.streamed = streamed
        let recording = Set(
            configuration.workspaces.values.filter { !$0.webhooks.isEmpty || $0.eventStream }.map(\.name))
        self.recording = recording
        var workspaceOfApp: [String: String] = [:]
        for workspace in configuration.workspaces.values where recording.contains(workspace.name) {
            for app in workspace.apps.keys { workspaceOfApp[app] = workspace.name }
        }
        log = logger
        // An endpoint taken out of the config leaves its backlog behind: nobody would deliver it.
        if let dropped = try? outbox.dropEndpoints(except: Set(endpoints.map(\.key))), dropped > 0 {
            logger.warning("dropped \(dropped) webhook deliveries of endpoints no longer in the config")
        }
        for endpoint in endpoints {
            // A lowered `concurrency` leaves deliveries in lanes that no longer have a deliverer.
            try? outbox.fold(endpoint: endpoint.key, lanes: endpoint.concurrency)
        }
        let backlog = (try? outbox.backlog()) ?? [:]
        var deliverers: [String: [WebhookDeliverer]] = [:]
        for endpoint in endpoints {
            metrics.backlog.labels(endpoint.metricLabel).set(backlog[endpoint.key] ?? 0)
            _ = metrics.deliveries.labels(endpoint.metricLabel)
            deliverers[endpoint.key] = (0..<endpoint.concurrency).map { lane in
                WebhookDeliverer(
                    endpoint: endpoint, lane: lane, secret: secrets[endpoint.key] ?? [], outbox: outbox,
                    metrics: metrics, logger: logger, checkpoint: { store.checkpointIfDue() })
            }
        }
        self.deliverers = deliverers
        self.metrics = metrics
        if !streamed.isEmpty || endpoints.contains(where: { $0.events.contains(.tokenRemoved) }) {
            let feed = RegistryFeed(
                outbox: outbox, registry: registry, workspaceOfApp: workspaceOfApp, logger: logger)
            let record: @Sendable ([WebhookEvent], String) throws(SQLiteError) -> Void = {
                [byWorkspace, deliverers] events, cursor throws(SQLiteError) in
                try Self.record(
                    events, outbox: outbox, byWorkspace: byWorkspace, streamed: streamed, deliverers: deliverers,
                    metrics: metrics,
                    meta: [(RegistryFeed.cursorName, cursor)])
                store.checkpointIfDue()
            }
            registryFeed = Task(executorPreference: BlockingExecutor.dispatches, priority: .utility) {
                await feed.run(record: record)
            }
        } else {
            registryFeed = nil
        }
        for deliverer in deliverers.values.joined() { deliverer.start() }
        maintenance = Task(executorPreference: BlockingExecutor.dispatches, priority: .background) {
            while !Task.isCancelled {
                do {
                    try outbox.prune(now: Int64(Date().timeIntervalSince1970 * 1000))
                } catch {
                    logger.warning("webhooks: cannot prune the outbox: \(error)")
                }
                try? await Task.sleep(for: .seconds(3_600))
            }
        }
        recoverFinishedEvents()
    }

    /// A kill between a dispatch's last commit and the recording of its `dispatch.finished` (or `failed`) leaves
    /// the event unrecorded: the newest dispatches that finished in the last day without one get it now.
    private func recoverFinishedEvents() {
        guard let recent = try? store.recent(workspace: nil, limit: 1_000) else { return }
        let since = Int64(Date().timeIntervalSince1970 * 1000) - 86_400_000
        for record in recent.reversed()
        where record.state == .done && (record.finishedAt ?? 0) >= since
            && (keeps(record.workspace, .dispatchFinished) || keeps(record.workspace, .dispatchFailed))
        {
            let recorded = ["finished", "failed"].contains { outcome in
                (try? outbox.contains(eventID: "evt_\(record.id)_\(outcome)")) ?? true
            }
            if !recorded { dispatchChanged(record.id) }
        }
    }

    /// Whether events of `type` are kept for `workspace` (its stream, or an endpoint that takes them).
    private func keeps(_ workspace: String, _ type: WebhookEventType) -> Bool {
        streamed.contains(workspace) || (byWorkspace[workspace] ?? []).contains { $0.events.contains(type) }
    }

    /// Stops the feed and the deliverers (a delivery in flight is left pending for the next start), closes the
    /// outbox.
    func stop() {
        registryFeed?.cancel()
        maintenance.cancel()
        for deliverer in deliverers.values.joined() { deliverer.stop() }
        let deadline = ContinuousClock.now + .seconds(2)
        for deliverer in deliverers.values.joined() { deliverer.join(until: deadline) }
        outbox.close()
    }

    // MARK: Recording

    /// Records `events`, each with a delivery for every endpoint of its workspace that takes its type, and wakes
    /// those endpoints' deliverers.
    private static func record(
        _ events: [WebhookEvent], outbox: WebhookOutbox, byWorkspace: [String: [WebhookEndpointConfiguration]],
        streamed: Set<String>,
        deliverers: [String: [WebhookDeliverer]], metrics: WebhookMetrics, meta: [(String, String)] = []
    ) throws(SQLiteError) {
        // New deliveries per endpoint and lane (the closure is asked only for events not recorded before).
        var added: [String: [Int: Int]] = [:]
        var labels: [String: String] = [:]
        // Kept only when an endpoint takes its type or its workspace streams: an expiry sweep of a million tokens
        // is not a million rows for a workspace whose endpoints want only dispatches.
        let kept = events.filter { event in
            streamed.contains(event.workspace)
                || (byWorkspace[event.workspace] ?? []).contains { $0.events.contains(event.type) }
        }
        try outbox.record(
            kept,
            endpoints: { event in
                (byWorkspace[event.workspace] ?? []).filter { $0.events.contains(event.type) }.map { endpoint in
                    let lane = event.lane(of: endpoint.concurrency)
                    added[endpoint.key, default: [:]][lane, default: 0] += 1
                    labels[endpoint.key] = endpoint.metricLabel
                    return (endpoint.key, lane)
                }
            }, meta: meta)
        for (key, lanes) in added {
            metrics.backlog.labels(labels[key]!).increment(by: lanes.values.reduce(0, +))
            for lane in lanes.keys { deliverers[key]?[lane].wake() }
        }
    }

    private func record(_ events: [WebhookEvent]) {
        guard !events.isEmpty else { return }
        do {
            try Self.record(
                events, outbox: outbox, byWorkspace: byWorkspace, streamed: streamed, deliverers: deliverers,
                metrics: metrics)
        } catch {
            log.error("cannot record webhook events \(events.map(\.id)): \(error)")
        }
    }

    /// The dispatcher's hook: dispatch `id` was queued, or a run of it ended. Records what its committed state says
    /// happened (nothing for a workspace without webhooks).
    /// The workspace's endpoints as `/v1/status` shows them: each one's label (`workspace/index`, never its URL,
    /// which may carry a credential in its path), the events delivered since start, and the backlog.
    func status(workspace: String) -> JSONValue {
        let backlog = (try? outbox.backlog()) ?? [:]
        return .array(
            (byWorkspace[workspace] ?? []).map { endpoint -> JSONValue in
                [
                    "endpoint": .string(endpoint.metricLabel),
                    "delivered": .integer(Int64(metrics.deliveries.labels(endpoint.metricLabel).value)),
                    "backlog": .integer(Int64(backlog[endpoint.key] ?? 0)),
                ]
            })
    }

    func dispatchChanged(_ id: String) {
        guard let record = try? store.record(id: id), recording.contains(record.workspace) else { return }
        let activityID = Dispatcher.activityID(of: record)
        // An activity's events stay in order; a dispatch without one is ordered on its own.
        let orderKey = activityID.map { "\(record.app) \($0)" } ?? record.id
        var data: JSONObject = [
            "dispatch_id": .string(record.id), "app": .string(record.app), "kind": .string(record.kind),
        ]
        if let activityID { data["activity_id"] = .string(activityID) }
        var events = [
            WebhookEvent(
                id: "evt_\(record.id)_accepted", type: .dispatchAccepted, workspace: record.workspace,
                created: record.createdAt, data: data, orderKey: orderKey)
        ]
        if record.state == .done {
            let finished = record.finishedAt ?? record.createdAt
            if let reason = try? store.jobFailure(id: record.id) {
                var failed = data
                failed["reason"] = .string(reason)
                events.append(
                    WebhookEvent(
                        id: "evt_\(record.id)_failed", type: .dispatchFailed, workspace: record.workspace,
                        created: finished, data: failed, orderKey: orderKey))
            } else {
                var summary = data
                summary["notifications"] = .integer(Int64(record.notifications))
                let counts = record.counts
                summary["counts"] = .object([
                    "delivered": .integer(Int64(counts.delivered)), "rejected": .integer(Int64(counts.rejected)),
                    "unregistered": .integer(Int64(counts.unregistered)), "failed": .integer(Int64(counts.failed)),
                    "expired": .integer(Int64(counts.expired)), "rate_limited": .integer(Int64(counts.rateLimited)),
                    "invalid": .integer(Int64(counts.invalid)), "superseded": .integer(Int64(counts.superseded)),
                ])
                summary["retries"] = .integer(Int64(counts.retries))
                summary["broadcasts"] = .integer(Int64(record.broadcasts))
                summary["created"] = .integer(record.createdAt)
                if let started = record.startedAt { summary["started"] = .integer(started) }
                summary["finished"] = .integer(finished)
                events.append(
                    WebhookEvent(
                        id: "evt_\(record.id)_finished", type: .dispatchFinished, workspace: record.workspace,
                        created: finished, data: summary, orderKey: orderKey))
            }
            if record.kind == "end", let activityID {
                events.append(
                    WebhookEvent(
                        id: "evt_\(record.id)_activity_ended", type: .activityEnded, workspace: record.workspace,
                        created: finished,
                        data: [
                            "app": .string(record.app), "activity_id": .string(activityID),
                            "dispatch_id": .string(record.id),
                        ], orderKey: orderKey))
            }
        }
        self.record(events)
    }
}

extension DispatchStore {
    /// The reason of the dispatch's job-level failure (its job could not be run: the line no longer parsed, the
    /// registry could not be read on its last attempt), nil when it has none.
    func jobFailure(id: String) throws(DispatchStoreError) -> String? {
        try read { connection throws(SQLiteError) -> String? in
            try connection.database.withStatement(
                """
                SELECT r.reason FROM dispatch_results r JOIN dispatches d ON r.dispatch = d.seq
                WHERE d.id = ?1 AND r.position <= ?2 AND r.outcome = ?3 LIMIT 1
                """
            ) { statement throws(SQLiteError) -> String? in
                try statement.bind(id, at: 1)
                try statement.bind(DispatchSchema.jobLevelKeyLimit, at: 2)
                try statement.bind(NotificationOutcome.invalid.code, at: 3)
                return try statement.step() ? (statement.optionalString(at: 0) ?? "invalid") : nil
            }
        }
    }
}

/// Follows the registry's change feed and turns token removals into `token.removed` events.
private struct RegistryFeed: Sendable {
    static let cursorName = "registry_cursor"
    static let sinceName = "registry_since"
    let outbox: WebhookOutbox
    let registry: any RegistryStore
    let workspaceOfApp: [String: String]
    let logger: FanoutLogger

    func run(record: @Sendable ([WebhookEvent], String) throws(SQLiteError) -> Void) async {
        // The first start follows the feed from now on (the log's earlier day is history, not news).
        var since = Int64(Date().timeIntervalSince1970 * 1000)
        var cursor: RegistryCursor?
        do {
            if let stored = try outbox.meta(Self.sinceName), let value = Int64(stored) {
                since = value
            } else {
                try outbox.record([], endpoints: { _ in [] }, meta: [(Self.sinceName, String(since))])
            }
            cursor = try outbox.meta(Self.cursorName).map(RegistryCursor.init(rawValue:))
        } catch {
            logger.error("webhooks: cannot read the registry feed's cursor: \(error)")
        }
        let pageSize = 500
        while !Task.isCancelled {
            do {
                let page = try await registry.events(after: cursor, limit: pageSize)
                var events: [WebhookEvent] = []
                for event in page.items where event.change == .removed && event.at >= since {
                    guard let workspace = workspaceOfApp[event.app] else { continue }
                    var data: JSONObject = [
                        "app": .string(event.app), "token": .string(event.token), "kind": .string(event.kind.rawValue),
                        "reason": .string(event.reason?.rawValue ?? "stopped"),
                    ]
                    if let activity = event.activityID { data["activity_id"] = .string(activity) }
                    if let device = event.deviceID { data["device_id"] = .string(device) }
                    events.append(
                        WebhookEvent(
                            id: "evt_tok_\(event.sequence)", type: .tokenRemoved, workspace: workspace,
                            created: event.at, data: data,
                            orderKey: event.activityID.map { "\(event.app) \($0)" } ?? "\(event.app) \(event.token)"))
                }
                let next = page.next ?? cursor
                if let next, next != cursor || !events.isEmpty {
                    try record(events, next.rawValue)
                    cursor = next
                }
                if page.items.count < pageSize { try? await Task.sleep(for: .milliseconds(250)) }
            } catch {
                logger.warning("webhooks: cannot read the registry's change feed: \(error); trying again")
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }
}
