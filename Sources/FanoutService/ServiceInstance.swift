import Fanout
import FanoutFleet
package import FanoutObservability
import FanoutRedis
import FanoutRegistry
import FanoutTransport
import Foundation

/// A running `fanout serve`: the registry and dispatch store (one SQLite file, or the registry on Redis), one engine
/// per APNs team, the dispatcher, and the HTTP server (HTTP/1.1 and HTTP/2) in front of the router.
///
/// Started with `serving: false` (`fanout worker --serve-config`, Redis only) it is the same without the HTTP
/// server: it takes dispatches from the shared queue and the fleet's shards, and sends them.
///
/// Start order: stores, engines, dispatcher (which queues what a previous process left unfinished), and only then
/// the listener, so that the first request finds everything ready. Stop order is the reverse: stop accepting,
/// let running dispatches finish within the grace period (what is left stays in the store for the next start),
/// shut the engines down, close the connections and the stores.
package final class ServiceInstance: Sendable {
    /// The port it listens on; 0 when it does not serve HTTP.
    package let port: Int
    /// Dispatches found queued or running at start (a previous process stopped or died before they finished).
    package let resumedDispatches: Int
    /// Nil when the instance only sends (`serving: false`).
    private let http: HTTPServer?
    private let core: ServiceCore
    private let engines: TeamEngines
    private let stores: ServiceStores
    private let tokens: SharedProviderTokens
    /// With Redis: the workspaces' send budgets, shared with every instance and worker on it.
    private let sharedBudget: FleetRateBudget?
    /// With Redis and `fleet_worker`: the fleet's shards this instance sends, and the task running it.
    private let fleet: ServiceFleetWorker?
    /// With Redis: the one dispatch queue, which this instance feeds and (with `fleet_worker`) takes from.
    private let queue: SharedDispatchQueue?
    private let sweeper: Task<Void, Never>
    /// Webhooks and the event stream: the outbox, its deliverer threads and the registry feed (nil when no workspace
    /// has webhooks or `event_stream`).
    private let events: ServiceEvents?

    /// - Parameter serving: false for an instance that only sends what the shared queue on Redis holds (no
    ///   listener); it needs `configuration.redis`.
    package static func start(
        configuration: ServiceConfiguration, logger: FanoutLogger, serving: Bool = true
    ) async throws(ServiceStartError) -> ServiceInstance {
        guard serving || configuration.redis != nil else {
            throw ServiceStartError(
                "an instance that does not serve HTTP needs Redis: it sends the shared queue's work")
        }
        let stores = try await ServiceStores.open(configuration)
        let registry = stores.registry
        let metrics = FanoutMetrics()
        // The registry learns which workspace each app is in (its own isolation key).
        let apps = configuration.workspaces.values.flatMap { workspace in
            workspace.apps.keys.map { RegistryApp(bundleID: $0, workspace: workspace.name) }
        }
        do {
            try await registry.defineApps(apps)
        } catch {
            await stores.close()
            throw ServiceStartError("cannot record the apps in the registry: \(error)")
        }
        let tokens: SharedProviderTokens
        do {
            tokens = try await SharedProviderTokens.start(
                configuration: configuration, redis: stores.redis, logger: logger)
        } catch {
            await stores.close()
            throw error
        }
        do {
            try AppCertificates.check(configuration, logger: logger, metrics: metrics)
        } catch {
            tokens.stop()
            await stores.close()
            throw error
        }
        let engines: TeamEngines
        let channels: TeamChannelClients
        var sharedBudget: FleetRateBudget?
        do {
            if let redis = stores.redis {
                // One send budget per workspace for every instance and `fanout worker` on this Redis: its buckets
                // there, leased to this instance in chunks (`fanout worker` leases from the same ones).
                let leaseID =
                    "serve-\(ProcessInfo.processInfo.hostName)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
                sharedBudget = FleetRateBudget(
                    client: redis, limits: try TeamEngines.sendBudgets(configuration),
                    options: FleetRateBudget.Options(leaseID: leaseID), log: { logger.info($0) })
            }
            engines = try TeamEngines(
                configuration: configuration, registry: stores.engineRegistry, metrics: metrics,
                tokenSources: tokens.byTeam, warn: { logger.warning($0, fields: $1) }, sharedBudget: sharedBudget)
            channels = try TeamChannelClients(configuration: configuration, tokenSources: tokens.byTeam)
        } catch {
            tokens.stop()
            await stores.close()
            throw ServiceStartError("\(error)")
        }
        let sharedDispatches: SharedDispatches?
        if let redis = stores.redis, let url = configuration.redis {
            do {
                let results = try await FleetConnection.connect(url)
                let shared = SharedDispatches(
                    client: redis, results: results, store: stores.dispatches, log: { logger.warning($0) })
                // Before the first accept: where the queue's primary has a replica, an accept waits for it.
                await shared.refreshReplicas()
                sharedDispatches = shared
            } catch {
                await engines.shutdown(gracePeriod: .zero)
                _ = await sharedBudget?.returnLeases(timeout: .seconds(1))
                tokens.stop()
                await stores.close()
                throw ServiceStartError("cannot reach Redis for the dispatches' results: \(error.message)")
            }
        } else {
            sharedDispatches = nil
        }
        let events: ServiceEvents?
        do {
            events = try ServiceEvents.start(
                configuration: configuration, store: stores.dispatches, registry: registry,
                metrics: metrics.registry, logger: logger, environment: ProcessInfo.processInfo.environment)
        } catch {
            await sharedDispatches?.stop()
            await engines.shutdown(gracePeriod: .zero)
            _ = await sharedBudget?.returnLeases(timeout: .seconds(1))
            tokens.stop()
            await stores.close()
            throw error
        }
        // The shared queue, once started: told when a dispatch ends, so that it hands the activity on at once.
        let queueBox = FanoutMutex<SharedDispatchQueue?>(nil)
        // With the queue on Redis, each committed batch of results is published while the next one is committed,
        // and the dispatch's results writer goes no further until it is (`SharedDispatches.publishAfterCommit`).
        var publishCommitted: (@Sendable (String, [NotificationResult]) -> Void)?
        if let sharedDispatches {
            publishCommitted = { id, batch in sharedDispatches.publishAfterCommit(id, committed: batch) }
        }
        let dispatcher = Dispatcher(
            store: stores.dispatches, engines: engines, registry: registry,
            maxRunning: configuration.maxRunningDispatches, log: { message in logger.error(message) },
            changed: { id in
                sharedDispatches?.changed(id)
                queueBox.withLock { $0 }?.dispatchChanged(id)
                events?.dispatchChanged(id)  // webhooks: accepted, finished, failed (Webhooks/ServiceEvents.swift)
            },
            afterCommit: publishCommitted)
        sharedDispatches?.start(running: { dispatcher.runningIDs })
        let core = ServiceCore(
            configuration: configuration, quotas: RequestQuotas(configuration), registry: registry,
            store: stores.dispatches, sharedTimestamps: stores.contentTimestamps,
            sharedDispatches: sharedDispatches,
            sharedQuotas: stores.redis.map { SharedRequestQuotas(client: $0) },
            dispatcher: dispatcher, channels: channels, metrics: metrics, logger: logger)
        do throws(ServiceStartError) {
            var fleet: ServiceFleetWorker?
            if let url = configuration.redis, configuration.fleetWorker {
                fleet = try await ServiceFleetWorker.start(
                    url: url, engines: engines, claimIdle: configuration.claimIdle, logger: logger)
            }
            var queue: SharedDispatchQueue?
            do {
                if let url = configuration.redis, let sharedDispatches {
                    queue = try await Self.startQueue(
                        url: url, shared: sharedDispatches, core: core, configuration: configuration, logger: logger)
                }
                core.queue = queue
                queueBox.withLock { $0 = queue }
                return try ServiceInstance(
                    configuration: configuration, core: core, engines: engines, stores: stores, tokens: tokens,
                    sharedBudget: sharedBudget, fleet: fleet, queue: queue, events: events, serving: serving)
            } catch {
                await queue?.stop()
                await fleet?.stop()
                throw error
            }
        } catch {
            events?.stop()
            await sharedDispatches?.stop()
            await engines.shutdown(gracePeriod: .zero)
            _ = await sharedBudget?.returnLeases(timeout: .seconds(1))
            tokens.stop()
            await stores.close()
            throw error
        }
    }

    /// The shared dispatch queue: its group made, and taking dispatches unless the instance is API-only.
    private static func startQueue(
        url: String, shared: SharedDispatches, core: ServiceCore,
        configuration: ServiceConfiguration, logger: FanoutLogger
    ) async throws(ServiceStartError) -> SharedDispatchQueue {
        let consumer =
            "serve-\(FleetWorkerOptions.defaultName)-\(String(UInt32.random(in: 0...UInt32.max), radix: 36))"
        var options = SharedDispatchQueue.Options(
            consumer: consumer, claimIdle: configuration.claimIdle, maxHeld: configuration.maxRunningDispatches)
        options.takes = configuration.fleetWorker
        // Two connections of its own: blocked reads hold one, and the heartbeat must not wait behind the results
        // the instance publishes on the shared one.
        let reader: RedisClient
        let writer: RedisClient
        do {
            reader = try await FleetConnection.connect(url, commandTimeout: options.block + .seconds(10))
        } catch {
            throw ServiceStartError("the dispatch queue: \(error)")
        }
        do {
            writer = try await FleetConnection.connect(url)
        } catch {
            await reader.shutdown()
            throw ServiceStartError("the dispatch queue: \(error)")
        }
        let queue = SharedDispatchQueue(
            writer: writer, reader: reader, store: core.store, shared: shared, dispatcher: core.dispatcher,
            options: options, log: { logger.info($0, fields: ["consumer": consumer]) })
        do {
            try await queue.start()
        } catch {
            await reader.shutdown()
            await writer.shutdown()
            throw ServiceStartError("the dispatch queue: \(error.message)")
        }
        return queue
    }

    private init(
        configuration: ServiceConfiguration, core: ServiceCore, engines: TeamEngines, stores: ServiceStores,
        tokens: SharedProviderTokens, sharedBudget: FleetRateBudget?, fleet: ServiceFleetWorker?,
        queue: SharedDispatchQueue?, events: ServiceEvents?, serving: Bool
    ) throws(ServiceStartError) {
        self.events = events
        self.sharedBudget = sharedBudget
        self.fleet = fleet
        self.queue = queue
        self.core = core
        self.engines = engines
        self.stores = stores
        self.tokens = tokens
        let registry = stores.registry
        let channels = core.channels
        let logger = core.logger
        sweeper = Task(executorPreference: BlockingExecutor.dispatches, priority: .background) {
            // Sweep, and delete the channels of ended activities, once a minute.
            async let sweeping: Void = registry.sweepPeriodically(every: .seconds(60))
            async let pruning: Void = channels.pruneEndedChannels(
                registry: registry, every: .seconds(60), warn: { logger.warning($0) })
            _ = await (sweeping, pruning)
        }
        core.events = events
        guard serving else {
            http = nil
            port = 0
            resumedDispatches = 0
            return
        }
        var tls: TLSServerContext?
        if let certificate = configuration.tlsCertificate, let key = configuration.tlsKey {
            do {
                tls = try TLSServerContext(
                    TLSServerConfiguration(
                        certificateFile: certificate, privateKeyFile: key, alpnProtocols: ["h2", "http/1.1"]))
            } catch {
                throw ServiceStartError("cannot load the TLS certificate or key: \(error)")
            }
        }
        var limits = HTTPServerLimits()
        limits.maxConnections = configuration.maxConnections
        limits.headerTimeout = configuration.headerTimeout
        limits.writeTimeout = configuration.writeTimeout
        // The server's own refusals (a body over 1 MiB, a request that timed out, a malformed head, too many
        // connections) in a JSON shape every API's clients read, not plain text.
        limits.ownAnswer = { status, message in ServiceRouter.serverAnswer(status: status, message: message) }
        let router = ServiceRouter(core: core, events: events)
        let http: HTTPServer
        do {
            http = try HTTPServer(
                host: configuration.listenHost, port: configuration.listenPort, threads: configuration.threads,
                tls: tls, limits: limits
            ) { request, responder in
                let apiRequest = APIRequest(
                    method: request.method, target: request.target, headers: request.headers, body: request.body)
                // On Swift's cooperative threads: an API request's SQLite calls are short, and hopping to a pool of
                // its own would cost registrations more than half their rate (measured: 13,000/s against 29,000/s).
                Task(priority: .userInitiated) {
                    responder.respond(await router.handle(apiRequest))
                }
            }
        } catch {
            sweeper.cancel()
            throw ServiceStartError(
                "cannot listen on \(configuration.listenHost):\(configuration.listenPort): \(error)")
        }
        self.http = http
        port = http.port
        // Only once the port is ours: a start that fails to bind must not have begun sending. With the queue on
        // Redis, what a previous process left unfinished is pending there, and is taken over like any other's.
        do {
            resumedDispatches = queue == nil ? try core.dispatcher.resumeUnfinished() : 0
        } catch {
            http.shutdown()
            sweeper.cancel()
            throw ServiceStartError("cannot read the dispatch queue: \(error)")
        }
    }

    /// SIGTERM: stop accepting, give running dispatches `gracePeriod`, leave the rest queued, stop everything.
    package func stop(gracePeriod: Duration) async {
        http?.stopAccepting()
        // The fleet's shards being sent get the worker's grace from now, alongside the dispatches'; what is left of
        // them stays pending for another instance or worker.
        fleet?.requestStop()
        await core.dispatcher.stop(gracePeriod: gracePeriod)
        await queue?.stop()
        await fleet?.stop()
        await core.sharedDispatches?.stop()
        await engines.shutdown(gracePeriod: .seconds(2))
        // What this instance leased and did not spend goes back to the workspaces' buckets.
        _ = await sharedBudget?.returnLeases(timeout: .seconds(1))
        sweeper.cancel()
        core.channels.shutdown()
        http?.shutdown()
        tokens.stop()
        events?.stop()
        await stores.close()
    }
}

/// Why `fanout serve` could not start, in one line.
package struct ServiceStartError: Error, CustomStringConvertible, Sendable {
    package let description: String
    init(_ description: String) { self.description = description }
}
