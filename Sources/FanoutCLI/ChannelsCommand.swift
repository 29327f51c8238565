import CommandLineSupport
import Fanout
import FanoutObservability
import Foundation

/// `fanout channels`: an app's broadcast channels (iOS 18), through APNs's channel management API.
enum ChannelsCommand {
    static let usage = """
        fanout channels: create, read, delete and list an app's broadcast channels (iOS 18 broadcast push).

        usage: fanout channels create --app BUNDLE [--policy 0|1] [--db FILE --activity ID] [connection flags]
               fanout channels read   --app BUNDLE --channel ID     [connection flags]
               fanout channels delete --app BUNDLE (--channel ID | --db FILE --activity ID) [connection flags]
               fanout channels list   --app BUNDLE                  [connection flags]
               fanout channels prune  --db FILE                     [connection flags]

          --app BUNDLE          the app's bundle id (no push-type suffix)
          --policy 0|1          create: 1 keeps the latest message for offline devices up to 8 hours (default);
                                0 stores nothing (every broadcast then needs apns-expiration 0)
          --channel ID          the base64 channel id that create printed
          --db FILE --activity ID
                                create: bind the new channel to this activity in the token registry, so jobs by
                                its activity_id also broadcast to it and start jobs subscribe to it;
                                delete: delete the activity's channel and unbind it (before binding another)
          prune                 delete at APNs the channels of activities that have ended and whose dismissal
                                date has passed, and unbind them (the registry's next sweep drops the activity);
                                channels created in another environment are left bound for a prune there
          --production          api-manage-broadcast.push.apple.com:2196 (default)
          --sandbox             api-manage-broadcast.sandbox.push.apple.com:2195 (channels of development builds)
          --manage-endpoint HOST:PORT
                                another management host (mock-apns's --manage-listen)
          --ca-file PEM         trust this CA instead of the system store
          --key P8, --key-id ID, --team-id ID
                                the APNs signing key and its ids; default from APNS_KEY_PATH, APNS_KEY_ID,
                                APNS_TEAM_ID
          --cert FILE           the app's push certificate instead (.p12 with --cert-password-env VAR or
                                --cert-password-file FILE, or PEM with --cert-key PEM)
          --request-timeout SECONDS
                                how long to wait for APNs's answer (default 30)
          --proxy URL|none      reach Apple through this HTTP proxy (CONNECT; http://[user:password@]host:port);
                                default HTTPS_PROXY unless NO_PROXY names the host; none: directly

        Prints one JSON line: create {"channel": ID, "policy": N}; read {"channel": ID, "policy": N};
        delete {"deleted": ID}; list {"channels": [...]}; prune {"deleted": N, "other_environment": N}.
        Exit status: 0 done; 1 APNs refused (the reason is printed, e.g. ChannelNotRegistered,
        CannotCreateChannelConfig); 2 bad arguments or an unusable key or certificate.
        """

    static func run(_ arguments: [String]) async -> Int32 {
        var arguments = arguments
        guard let action = arguments.first, !action.hasPrefix("-") else {
            if arguments.contains(where: { $0 == "--help" || $0 == "-h" }) {
                print(usage)
                return 0
            }
            return fail(
                "the first argument is the action: create, read, delete, list or prune (see fanout channels --help)")
        }
        arguments.removeFirst()
        guard ["create", "read", "delete", "list", "prune"].contains(action) else {
            return fail("unknown action '\(action)' (create, read, delete, list or prune)")
        }
        var app: String?
        var channel: String?
        var database: String?
        var activity: String?
        var policy = ChannelStoragePolicy.mostRecentMessageStored
        var manageEndpoint: APNsEndpoint?
        var connection = ConnectionFlags()
        do throws(UsageError) {
            var cursor = ArgumentCursor(arguments)
            while let flag = try cursor.nextFlag() {
                switch flag {
                case "--help", "-h":
                    print(usage)
                    return 0
                case "--app": app = try cursor.string()
                case "--channel": channel = try cursor.string()
                case "--db": database = try cursor.string()
                case "--activity": activity = try cursor.string()
                case "--policy": policy = ChannelStoragePolicy(rawValue: try cursor.int(in: 0...1))!
                case "--manage-endpoint":
                    let (host, port) = try cursor.hostPort()
                    manageEndpoint = APNsEndpoint(host: host, port: port)
                default:
                    guard try connection.take(flag, from: &cursor) else {
                        throw UsageError("unknown option \(flag) (see fanout channels --help)")
                    }
                }
            }
            guard app != nil || action == "prune" else { throw UsageError("--app BUNDLE is required") }
            if action == "prune" && database == nil { throw UsageError("prune needs --db FILE") }
            if (database == nil) != (activity == nil) && (action == "create" || action == "delete") {
                throw UsageError("--db and --activity go together (the activity's channel in the registry)")
            }
            if action == "delete" && channel != nil && activity != nil {
                throw UsageError("delete takes --channel ID or --db FILE --activity ID, not both")
            }
            if action == "read" && channel == nil { throw UsageError("--channel ID is required to read") }
            if action == "delete" && channel == nil && activity == nil {
                throw UsageError("delete needs --channel ID, or --db FILE --activity ID")
            }
            if let database, !FileManager.default.fileExists(atPath: database) {
                throw UsageError("registry \(database) does not exist")
            }
        } catch {
            return fail("\(error)")
        }
        connection.fill(environment: ProcessInfo.processInfo.environment)
        if manageEndpoint == nil, let given = connection.endpoint, given != .sandbox, given != .production {
            // A push endpoint is not where channels are managed: going to Apple's host instead would be a surprise.
            return fail(
                "--endpoint \(given.host):\(given.port) is a push endpoint; channels are managed at "
                    + "--manage-endpoint HOST:PORT (or --sandbox, --production)")
        }
        let endpoint =
            manageEndpoint
            ?? (connection.endpoint == .sandbox ? BroadcastChannelClient.sandbox : BroadcastChannelClient.production)
        let client: BroadcastChannelClient
        do {
            let credentials = try connection.credentials()
            if let warning = try CertificateCheck.check(credentials)?.warning {
                StandardStream.error.write("fanout channels: warning: \(warning)\n")
            }
            client = try BroadcastChannelClient(
                endpoint: endpoint, credentials: credentials, caFile: connection.caFile,
                requestTimeout: connection.requestTimeout ?? .seconds(30),
                proxy: try connection.proxy(for: endpoint.host, environment: ProcessInfo.processInfo.environment))
        } catch {
            return fail("\(error)")
        }
        defer { client.shutdown() }
        do {
            switch action {
            case "create":
                let id: String
                if let database, let activity {
                    let registry = try openRegistry(database)
                    defer { registry.close() }
                    id = try await client.createChannel(
                        forActivity: activity, app: app!, storagePolicy: policy, registry: registry)
                } else {
                    id = try await client.create(app: app!, storagePolicy: policy)
                }
                print(#"{"channel": \#(JSONValue.string(id)), "policy": \#(policy.rawValue)}"#)
            case "prune":
                let registry = try openRegistry(database!)
                defer { registry.close() }
                let prune = try await client.pruneEndedChannels(registry: registry)
                print(#"{"deleted": \#(prune.deleted.count), "other_environment": \#(prune.otherEnvironment.count)}"#)
                if !prune.otherEnvironment.isEmpty {
                    let elsewhere = Set(prune.otherEnvironment.compactMap(\.environment)).sorted()
                    let note =
                        "\(prune.otherEnvironment.count) ended channels were created in "
                        + "\(elsewhere.joined(separator: ", ")), not \(client.environment): left bound; prune them with "
                        + elsewhere.map(flag(forEnvironment:)).joined(separator: " or ")
                    StandardStream.error.write("fanout channels: \(note)\n")
                }
            case "read":
                let stored = try await client.read(app: app!, channelID: channel!)
                print(#"{"channel": \#(JSONValue.string(channel!)), "policy": \#(stored.rawValue)}"#)
            case "delete":
                if let database, let activity {
                    let registry = try openRegistry(database)
                    defer { registry.close() }
                    let deleted = try await client.deleteChannel(forActivity: activity, app: app!, registry: registry)
                    print(#"{"deleted": \#(JSONValue.string(deleted))}"#)
                } else {
                    try await client.delete(app: app!, channelID: channel!)
                    print(#"{"deleted": \#(JSONValue.string(channel!))}"#)
                }
            default:
                let channels = try await client.list(app: app!)
                print(#"{"channels": \#(JSONValue.array(channels.map(JSONValue.string)))}"#)
            }
            return 0
        } catch {
            StandardStream.error.write("fanout channels: \(error.message)\n")
            return 1
        }
    }

    private static func openRegistry(_ path: String) throws(BroadcastChannelError) -> SQLiteRegistryStore {
        guard FileManager.default.fileExists(atPath: path) else {
            throw BroadcastChannelError(status: nil, reason: nil, message: "registry \(path) does not exist")
        }
        do {
            return try SQLiteRegistryStore(path: path)
        } catch {
            throw BroadcastChannelError(status: nil, reason: nil, message: "registry \(path): \(error.description)")
        }
    }

    /// The flag that manages channels in `environment` (`BroadcastChannelClient.environment`).
    private static func flag(forEnvironment environment: String) -> String {
        switch environment {
        case "production": "--production"
        case "development": "--sandbox"
        default: "--manage-endpoint \(environment)"
        }
    }

    private static func fail(_ message: String) -> Int32 {
        StandardStream.error.write("fanout channels: \(message)\n")
        return 2
    }
}
