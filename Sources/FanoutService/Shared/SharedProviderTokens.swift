import Fanout
import FanoutFleet
import FanoutObservability
import FanoutRedis

/// With the registry on Redis, one provider token per APNs team for every `fanout serve` and `fanout worker` on that
/// Redis (`FleetProviderToken`: minted by one under a lock, read by the others; Apple allows one new token per team
/// every 20 minutes, not one per process). Without Redis each engine mints its own, and `byTeam` is empty.
struct SharedProviderTokens: Sendable {
    /// The token source of each team id, for `TeamEngines`.
    let byTeam: [String: any ProviderTokenSource]
    private let sources: [FleetProviderToken]

    /// Takes (or mints) each team's token before the first request, so the first send has one.
    static func start(configuration: ServiceConfiguration, redis: RedisClient?, logger: FanoutLogger)
        async throws(ServiceStartError) -> SharedProviderTokens
    {
        guard let redis else { return SharedProviderTokens(byTeam: [:], sources: []) }
        var byTeam: [String: any ProviderTokenSource] = [:]
        var sources: [FleetProviderToken] = []
        let apps = configuration.workspaces.values.flatMap(\.apps.values).sorted { $0.bundleID < $1.bundleID }
        // An app with a certificate has no provider token to share.
        for app in apps where app.certificate == nil && byTeam[app.teamID] == nil {
            let credentials = ProviderCredentials(keyPath: app.keyPath, keyID: app.keyID, teamID: app.teamID)
            do {
                let source = FleetProviderToken(
                    client: redis, signer: try credentials.makeSigner(),
                    log: { logger.info($0, fields: ["team_id": app.teamID]) })
                try await source.start()
                byTeam[app.teamID] = source
                sources.append(source)
            } catch {
                for source in sources { source.stop() }
                throw ServiceStartError(
                    "workspaces.\(app.workspace).apps.\(app.bundleID): cannot take team \(app.teamID)'s provider "
                        + "token from Redis: \(error)")
            }
        }
        return SharedProviderTokens(byTeam: byTeam, sources: sources)
    }

    /// Stops the background refreshes.
    func stop() {
        for source in sources { source.stop() }
    }
}
