package import Fanout
package import FanoutObservability
import FanoutRegistry
import Foundation

/// One `FanoutEngine` per APNs team and endpoint, shared by that team's apps: a team has one provider token and
/// Apple counts its connections together, so two apps of a team never open separate pools.
package final class TeamEngines: Sendable {
    private struct TeamKey: Hashable {
        /// The team id, or the app's own key when it authenticates with a certificate (`AppConfiguration.engineKey`).
        var teamID: String
        var endpoint: APNsEndpoint
        var caFile: String?
    }

    private let byApp: [String: FanoutEngine]
    private let engines: [FanoutEngine]
    package let metrics: FanoutMetrics

    /// Starts the engines. Apps of one team must share one key (`key_id`, `key_path`); an app with a certificate has
    /// an engine of its own.
    /// - Parameter tokenSources: a team's shared provider token source (with the registry on Redis); a team not in it
    ///   mints its own tokens.
    /// - Parameter warn: where the engines report trouble they carry on through (a prune the registry refused).
    /// - Parameter sharedBudget: with Redis, where every engine's budget decisions are made (the fleet's leased
    ///   budget), so that all instances and workers on it send what one would be allowed to.
    init(
        configuration: ServiceConfiguration, registry: any RegistryStore, metrics: FanoutMetrics,
        tokenSources: [String: any ProviderTokenSource] = [:],
        warn: FanoutEngineConfiguration.WarningHandler? = nil, sharedBudget: (any SharedRateLimiter)? = nil,
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(ServiceConfigurationError) {
        let budgets = try Self.sendBudgets(configuration)
        var byTeam: [TeamKey: (app: AppConfiguration, engine: FanoutEngine)] = [:]
        var byApp: [String: FanoutEngine] = [:]
        let apps = configuration.workspaces.values.flatMap(\.apps.values).sorted { $0.bundleID < $1.bundleID }
        for app in apps {
            let key = TeamKey(teamID: app.engineKey, endpoint: app.endpoint, caFile: app.caFile)
            if let existing = byTeam[key] {
                guard existing.app.keyID == app.keyID, existing.app.keyPath == app.keyPath else {
                    throw ServiceConfigurationError(
                        "workspaces.\(app.workspace).apps.\(app.bundleID)",
                        "team \(app.teamID) already uses key \(existing.app.keyID) (app \(existing.app.bundleID)); "
                            + "one team has one provider key")
                }
                byApp[app.bundleID] = existing.engine
                continue
            }
            var engineConfiguration = FanoutEngineConfiguration(
                endpoint: app.endpoint,
                credentials: try app.credentials(environment: environment), caFile: app.caFile)
            engineConfiguration.loops = configuration.loopsPerEngine
            engineConfiguration.connectionsPerLoop = configuration.connectionsPerLoop
            engineConfiguration.maxAttempts = configuration.maxAttempts
            engineConfiguration.proxy = try configuration.proxy(for: app.endpoint.host, environment: environment)
            // Each workspace's send budget (`send_budget`; the library's are opt-in, the service keeps 250,000 an
            // hour), decided by the shared budget with Redis.
            engineConfiguration.rateLimits = budgets
            engineConfiguration.sharedRateLimits = sharedBudget
            // A dispatch's results keep each notification's id across its resends, as `fanout send`'s do.
            engineConfiguration.apnsIDs = .fanout
            engineConfiguration.registry = registry
            engineConfiguration.warningHandler = warn
            engineConfiguration.metricsListener = metrics
            engineConfiguration.tokenSource = app.certificate == nil ? tokenSources[app.teamID] : nil
            let engine: FanoutEngine
            do {
                engine = try FanoutEngine(configuration: engineConfiguration)
            } catch {
                throw ServiceConfigurationError(
                    "workspaces.\(app.workspace).apps.\(app.bundleID)", "cannot start its engine: \(error)")
            }
            byTeam[key] = (app, engine)
            byApp[app.bundleID] = engine
        }
        self.byApp = byApp
        engines = byTeam.values.map(\.engine)
        self.metrics = metrics
    }

    package func engine(forApp bundleID: String) -> FanoutEngine? { byApp[bundleID] }

    /// The workspaces' send budgets: each `send_budget`, else 250,000 jobs an hour.
    static func sendBudgets(_ configuration: ServiceConfiguration) throws(ServiceConfigurationError)
        -> RateLimiterRegistry
    {
        var overrides: [String: RateBudget] = [:]
        for workspace in configuration.workspaces.values {
            if let budget = workspace.sendBudget { overrides[workspace.name] = budget }
        }
        do {
            return try RateLimiterRegistry(overrides: overrides)
        } catch {
            throw ServiceConfigurationError("send_budget", error.message)
        }
    }

    /// Shuts every engine down (each waits up to `gracePeriod` for what it has in flight).
    package func shutdown(gracePeriod: Duration) async {
        await withTaskGroup(of: Void.self) { group in
            for engine in engines { group.addTask { await engine.shutdown(gracePeriod: gracePeriod) } }
        }
    }
}
