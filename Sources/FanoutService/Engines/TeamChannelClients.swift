package import Fanout
package import FanoutRegistry
import Foundation

/// One broadcast channel management client per APNs team, management host and CA, shared by the team's apps
/// (like `TeamEngines`), made at start for every app that has a management host. Each sends its team's one provider
/// token, the one the team's engine sends: with the registry on Redis the team's shared source, else the process's
/// cache for the key (`ProviderTokenCache.shared`), so a channel created never mints a second token for the team.
package final class TeamChannelClients: Sendable {
    private struct Key: Hashable {
        var teamID: String
        var endpoint: APNsEndpoint
        var caFile: String?
    }

    private let byApp: [String: BroadcastChannelClient]
    /// Each client with the apps it serves.
    private let clients: [(client: BroadcastChannelClient, apps: Set<String>)]

    /// - Parameter tokenSources: a team's shared provider token source (with the registry on Redis, the one its engine
    ///   has); a team not in it takes the process's token for its key.
    init(configuration: ServiceConfiguration, tokenSources: [String: any ProviderTokenSource] = [:])
        throws(ServiceConfigurationError)
    {
        var byKey: [Key: BroadcastChannelClient] = [:]
        var byApp: [String: BroadcastChannelClient] = [:]
        let apps = configuration.workspaces.values.flatMap(\.apps.values).sorted { $0.bundleID < $1.bundleID }
        for app in apps {
            guard let manage = app.manageEndpoint else { continue }
            let key = Key(teamID: app.engineKey, endpoint: manage, caFile: app.caFile)
            if let client = byKey[key] {
                byApp[app.bundleID] = client
                continue
            }
            let environment = ProcessInfo.processInfo.environment
            let proxy = try configuration.proxy(for: manage.host, environment: environment)
            do {
                let client: BroadcastChannelClient
                if app.certificate == nil, let source = tokenSources[app.teamID] {
                    client = try BroadcastChannelClient(
                        endpoint: manage, tokenSource: source, caFile: app.caFile, requestTimeout: .seconds(10),
                        proxy: proxy)
                } else {
                    client = try BroadcastChannelClient(
                        endpoint: manage, credentials: try app.credentials(environment: environment),
                        caFile: app.caFile, requestTimeout: .seconds(10), proxy: proxy)
                }
                byKey[key] = client
                byApp[app.bundleID] = client
            } catch {
                throw ServiceConfigurationError(
                    "workspaces.\(app.workspace).apps.\(app.bundleID)", "cannot make its channel client: \(error)")
            }
        }
        self.byApp = byApp
        clients = byKey.values.map { client in
            (client, Set(byApp.filter { $0.value === client }.keys))
        }
    }

    package func client(forApp bundleID: String) -> BroadcastChannelClient? { byApp[bundleID] }

    /// Deletes the channels of ended, dismissed activities (every `interval`, until cancelled). A refusal is passed
    /// to `warn` (the channel stays bound and is tried again next time), so a stuck one is seen, and so are channels
    /// left bound because they were created in another environment than the app's management host (an app moved
    /// from the sandbox to production), each time their number changes.
    package func pruneEndedChannels(
        registry: any RegistryStore, every interval: Duration, warn: @Sendable (String) -> Void = { _ in }
    ) async {
        var otherEnvironment = [Int](repeating: 0, count: clients.count)
        while !Task.isCancelled {
            for (index, (client, apps)) in clients.enumerated() {
                do {
                    let prune = try await client.pruneEndedChannels(registry: registry, apps: apps)
                    let elsewhere = prune.otherEnvironment
                    if elsewhere.count != otherEnvironment[index] {
                        otherEnvironment[index] = elsewhere.count
                        let environments = Set(elsewhere.compactMap(\.environment)).sorted().joined(separator: ", ")
                        if !elsewhere.isEmpty {
                            warn(
                                "\(elsewhere.count) ended broadcast channels were created in \(environments), not "
                                    + "\(client.environment): left bound, delete them there")
                        }
                    }
                } catch {
                    warn("ended broadcast channels not all deleted: \(error.message)")
                }
            }
            try? await Task.sleep(for: interval)
        }
    }

    package func shutdown() {
        for (client, _) in clients { client.shutdown() }
    }
}
