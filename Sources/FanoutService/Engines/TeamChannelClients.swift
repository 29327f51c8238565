import Fanout
import FanoutRegistry

/// One broadcast channel management client per APNs team, management host and CA, shared by the team's apps
/// (like `TeamEngines`), made at start for every app that has a management host.
package final class TeamChannelClients: Sendable {
    private struct Key: Hashable {
        var teamID: String
        var endpoint: APNsEndpoint
        var caFile: String?
    }

    private let byApp: [String: BroadcastChannelClient]
    /// Each client with the apps it serves.
    private let clients: [(client: BroadcastChannelClient, apps: Set<String>)]

    package init(configuration: ServiceConfiguration) throws(ServiceConfigurationError) {
        var byKey: [Key: BroadcastChannelClient] = [:]
        var byApp: [String: BroadcastChannelClient] = [:]
        let apps = configuration.workspaces.values.flatMap(\.apps.values).sorted { $0.bundleID < $1.bundleID }
        for app in apps {
            guard let manage = app.manageEndpoint else { continue }
            let key = Key(teamID: app.teamID, endpoint: manage, caFile: app.caFile)
            if let client = byKey[key] {
                byApp[app.bundleID] = client
                continue
            }
            do {
                let client = try BroadcastChannelClient(
                    endpoint: manage,
                    credentials: ProviderCredentials(keyPath: app.keyPath, keyID: app.keyID, teamID: app.teamID),
                    caFile: app.caFile, requestTimeout: .seconds(10))
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
    /// to `warn` (the channel stays bound and is tried again next time), so a stuck one is seen.
    package func pruneEndedChannels(
        registry: any RegistryStore, every interval: Duration, warn: @Sendable (String) -> Void = { _ in }
    ) async {
        while !Task.isCancelled {
            for (client, apps) in clients {
                do {
                    _ = try await client.deleteEndedChannels(registry: registry, apps: apps)
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
