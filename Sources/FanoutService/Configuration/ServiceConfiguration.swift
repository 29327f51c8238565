package import Fanout
import FanoutCore
package import FanoutPolicy
import Foundation

/// `fanout serve --config FILE`: the workspaces, their apps and API keys, and the server's limits (docs/SERVE.md):
/// ```json
/// {"listen": "127.0.0.1:8080", "db": "fanout.db", "redis": "redis://host:6379/0", "max_connections": 10000,
///  "header_timeout_seconds": 10, "write_timeout_seconds": 30, "threads": 2, "grace_seconds": 10, "max_running_dispatches": 8, "loops": 1, "connections": 2, "max_attempts": 3,
///  "workspaces": {"acme": {
///     "server_keys_sha256": ["<hex sha256 of a key>"], "device_keys_sha256": ["..."],
///     "rate_limit": {"requests_per_hour": 250000, "burst_seconds": 60},
///     "device_rate_limit": {"requests_per_hour": 2500000, "burst": 50000},
///     "apps": {"com.acme.app": {"team_id": "...", "key_id": "...", "key_path": "AuthKey.p8",
///                               or "cert_path": "app.p12", "cert_password_env": "VAR" | "cert_password_file": "...",
///                               or "cert_path": "app.pem", "cert_key_path": "app-key.pem",
///                               "endpoint": "sandbox" | "production" | "HOST:PORT", "ca_file": null,
///                               "manage_endpoint": "HOST:PORT" (broadcast channels; Apple's host by default),
///                               "pushwoosh_application": "XXXXX-XXXXX", "braze_app_id": "..."}},
///     "webhooks": [{"url": "https://...", "secret_env": "VAR" | "secret_file": "...", "events": [...]}],
///     "event_stream": false}}}
/// ```
/// Paths are relative to the config file's directory. An unknown key is an error, and every error names the key
/// path at fault. Keys are only ever given as SHA-256 digests.
package struct ServiceConfiguration: Sendable {
    package var listenHost = "127.0.0.1"
    package var listenPort = 8080
    package var database = "fanout.db"
    /// `redis://…`: keep the registry on Redis, shared by every `fanout serve` given the same URL, with one provider
    /// token per team and content timestamps ordered across them, and the dispatch queue there too
    /// (`SharedDispatchQueue`): a dispatch any instance accepts is run by whichever takes it.
    package var redis: String?
    /// With `redis`: the instance takes dispatches from the shared queue and shards from the fleet's stream
    /// (`fanout enqueue`'s jobs), and sends them with its team engines, as a `fanout worker` does (`fleet_worker`;
    /// false for an API-only instance, which only accepts).
    package var fleetWorker = true
    /// With `redis`: a dispatch or shard whose instance has not been heard of this long (it died, or was stopped
    /// mid-send) is taken over by another (`claim_idle_seconds`).
    package var claimIdle: Duration = .seconds(30)
    /// `proxy`: the HTTP proxy every connection to Apple goes through (`http://[user:password@]host:port`), or
    /// `none`; nil: the environment's `HTTPS_PROXY` unless `NO_PROXY` names the host.
    package var proxy: String?
    package var maxConnections = 10_000
    /// A request head not complete this long after its first byte gets 408 and the connection closes.
    package var headerTimeout: Duration = .seconds(10)
    /// A connection whose pending answers see none of their bytes leave this long is closed, and an HTTP/2 answer
    /// that gets no flow-control credit this long while the others move is reset (`HTTPServerLimits.writeTimeout`).
    package var writeTimeout: Duration = .seconds(30)
    /// HTTP loop threads.
    package var threads = 2
    package var tlsCertificate: String?
    package var tlsKey: String?
    /// How long SIGTERM lets running dispatches go on before the rest is left queued for the next start.
    package var gracePeriod: Duration = .seconds(10)
    /// Dispatches sending at once (the rest wait their turn, oldest first).
    package var maxRunningDispatches = 8
    /// Engine settings shared by every team's engine.
    package var loopsPerEngine = 1
    package var connectionsPerLoop = 2
    package var maxAttempts = 3
    package var workspaces: [String: WorkspaceConfiguration] = [:]

    package init() {}

    /// The proxy for connections to `host`: `proxy`, else the environment's `HTTPS_PROXY` unless `NO_PROXY` names the
    /// host; nil for `none` or when none applies.
    package func proxy(for host: String, environment: [String: String]) throws(ServiceConfigurationError)
        -> APNsProxy?
    {
        do {
            guard let proxy else { return try APNsProxy.fromEnvironment(for: host, environment: environment) }
            return proxy == "none" ? nil : try APNsProxy(url: proxy)
        } catch {
            throw ServiceConfigurationError("proxy", error.message)
        }
    }

    /// The app with this bundle id (bundle ids are unique across workspaces).
    package func app(_ bundleID: String) -> AppConfiguration? {
        for workspace in workspaces.values { if let app = workspace.apps[bundleID] { return app } }
        return nil
    }
}

package struct WorkspaceConfiguration: Sendable {
    package var name: String
    package var serverKeyDigests: [[UInt8]]
    package var deviceKeyDigests: [[UInt8]]
    /// API requests (start, update, end, push, reads).
    package var rateLimit: RequestQuotaRule
    /// Device registrations: their own, larger budget (10× the API's by default).
    package var deviceRateLimit: RequestQuotaRule
    /// What the workspace's notifications may send to APNs (`send_budget`): nil, 250,000 jobs an hour. With Redis,
    /// one budget for every instance and `fanout worker` on it (the fleet's leased budget).
    package var sendBudget: RateBudget?
    package var apps: [String: AppConfiguration]
    /// Where the workspace's events are POSTed (`webhooks`, docs/WEBHOOKS.md).
    package var webhooks: [WebhookEndpointConfiguration] = []
    /// `event_stream`: keep the workspace's events for `GET /v1/events` even without webhooks.
    package var eventStream = false
}

package struct AppConfiguration: Sendable, Hashable {
    package var bundleID: String
    package var workspace: String
    package var teamID: String
    package var keyID: String
    package var keyPath: String
    package var endpoint: APNsEndpoint
    /// The channel management host (broadcast channels): Apple's for `production` and `sandbox`, else
    /// `manage_endpoint`; nil when neither says (channels are then unavailable for the app).
    package var manageEndpoint: APNsEndpoint?
    package var caFile: String?
    package var pushwooshApplication: String?
    package var brazeAppID: String?
    /// The app's push certificate, instead of the team's signing key (then `keyID` and `keyPath` are empty, and
    /// `teamID` is what the config says, or empty).
    package var certificate: AppCertificate?

    /// Which engine the app shares: its team's (one signing key), or its own (a certificate is one app's).
    package var engineKey: String { certificate == nil ? teamID : "certificate \(bundleID)" }

    /// The app's credentials, a certificate's password read from the environment or its file now.
    package func credentials(environment: [String: String]) throws(ServiceConfigurationError) -> ProviderCredentials {
        guard let certificate else { return ProviderCredentials(keyPath: keyPath, keyID: keyID, teamID: teamID) }
        let path = "workspaces.\(workspace).apps.\(bundleID)"
        var password: String?
        if let name = certificate.passwordEnv {
            guard let value = environment[name] else {
                throw ServiceConfigurationError(
                    path + ".cert_password_env", "environment variable \(name) is not set")
            }
            password = value
        } else if let file = certificate.passwordFile {
            guard let text = ProviderCredentials.readPasswordFile(file) else {
                throw ServiceConfigurationError(path + ".cert_password_file", "\(file) cannot be read")
            }
            password = text
        }
        guard
            let credentials = ProviderCredentials.certificate(
                path: certificate.path, privateKeyPath: certificate.keyPath, password: password)
        else {
            throw ServiceConfigurationError(
                path,
                "certificate \(certificate.path) is PKCS#12 (.p12): give its password with cert_password_env or "
                    + "cert_password_file")
        }
        return credentials
    }
}

/// An app's push certificate in the config: a `.p12` file and where its password is (never the password itself),
/// or a PEM certificate and its key.
package struct AppCertificate: Sendable, Hashable {
    package var path: String
    package var keyPath: String?
    package var passwordEnv: String?
    package var passwordFile: String?
}

/// A configuration that cannot be used, with the key path at fault.
package struct ServiceConfigurationError: Error, CustomStringConvertible, Sendable {
    package let description: String
    init(_ path: String, _ problem: String) { description = path.isEmpty ? problem : "\(path): \(problem)" }
}

extension ServiceConfiguration {
    /// Reads and checks the file at `path`.
    package static func load(path: String) throws(ServiceConfigurationError) -> ServiceConfiguration {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ServiceConfigurationError("", "config file \(path) cannot be read")
        }
        let directory = (path as NSString).deletingLastPathComponent
        return try parse(Array(data), relativeTo: directory)
    }

    /// Parses a configuration; relative paths are resolved against `directory`.
    package static func parse(_ bytes: [UInt8], relativeTo directory: String) throws(ServiceConfigurationError)
        -> ServiceConfiguration
    {
        let root: JSONValue
        do { root = try JSONValue.parse(bytes) } catch {
            throw ServiceConfigurationError("", "the config file is not valid JSON: \(error)")
        }
        var reader = ConfigReader(directory: directory)
        return try reader.read(root)
    }
}

/// Walks the JSON with the current key path for errors.
private struct ConfigReader {
    let directory: String

    func object(_ value: JSONValue, _ path: String, keys: Set<String>) throws(ServiceConfigurationError) -> JSONObject {
        guard let object = value.objectValue else { throw ServiceConfigurationError(path, "must be an object") }
        for member in object where !keys.contains(member.key) {
            throw ServiceConfigurationError(
                join(path, member.key), "unknown key (known: \(keys.sorted().joined(separator: ", ")))")
        }
        return object
    }

    func join(_ path: String, _ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    func string(_ object: JSONObject, _ key: String, _ path: String) throws(ServiceConfigurationError) -> String? {
        guard let value = object[key], !value.isNull else { return nil }
        guard let text = value.stringValue, !text.isEmpty else {
            throw ServiceConfigurationError(join(path, key), "must be a non-empty string")
        }
        return text
    }

    func required(_ object: JSONObject, _ key: String, _ path: String) throws(ServiceConfigurationError) -> String {
        guard let text = try string(object, key, path) else {
            throw ServiceConfigurationError(join(path, key), "is required")
        }
        return text
    }

    func positive(_ object: JSONObject, _ key: String, _ path: String) throws(ServiceConfigurationError) -> Int? {
        guard let value = object[key], !value.isNull else { return nil }
        guard let number = value.int64Value, number > 0, number <= Int64(Int32.max) else {
            throw ServiceConfigurationError(join(path, key), "must be a positive whole number")
        }
        return Int(number)
    }

    func resolve(_ file: String) -> String {
        file.hasPrefix("/") || directory.isEmpty ? file : directory + "/" + file
    }

    mutating func read(_ root: JSONValue) throws(ServiceConfigurationError) -> ServiceConfiguration {
        let object = try object(
            root, "",
            keys: [
                "listen", "db", "redis", "fleet_worker", "claim_idle_seconds", "proxy", "max_connections",
                "header_timeout_seconds",
                "write_timeout_seconds",
                "threads",
                "tls_cert", "tls_key",
                "grace_seconds",
                "max_running_dispatches", "loops", "connections", "max_attempts", "workspaces",
            ])
        var config = ServiceConfiguration()
        if let listen = try string(object, "listen", "") {
            guard let (host, port) = HostPort.parse(listen) else {
                throw ServiceConfigurationError("listen", "must be HOST:PORT")
            }
            (config.listenHost, config.listenPort) = (host, port)
        }
        if let db = try string(object, "db", "") { config.database = resolve(db) }
        config.redis = try string(object, "redis", "")
        config.proxy = try string(object, "proxy", "")
        // Checked now, so that a mistyped URL stops the start naming the key (never the password).
        if let proxy = config.proxy, proxy != "none" {
            do { _ = try APNsProxy(url: proxy) } catch { throw ServiceConfigurationError("proxy", error.message) }
        }
        if let value = object["fleet_worker"], !value.isNull {
            guard let flag = value.boolValue else {
                throw ServiceConfigurationError("fleet_worker", "must be true or false")
            }
            config.fleetWorker = flag
        }
        if let seconds = try positive(object, "claim_idle_seconds", "") { config.claimIdle = .seconds(seconds) }
        config.maxConnections = try positive(object, "max_connections", "") ?? config.maxConnections
        if let seconds = try positive(object, "header_timeout_seconds", "") { config.headerTimeout = .seconds(seconds) }
        if let seconds = try positive(object, "write_timeout_seconds", "") { config.writeTimeout = .seconds(seconds) }
        config.threads = try positive(object, "threads", "") ?? config.threads
        config.tlsCertificate = try string(object, "tls_cert", "").map(resolve)
        config.tlsKey = try string(object, "tls_key", "").map(resolve)
        if let grace = try positive(object, "grace_seconds", "") { config.gracePeriod = .seconds(grace) }
        config.maxRunningDispatches = try positive(object, "max_running_dispatches", "") ?? config.maxRunningDispatches
        config.loopsPerEngine = try positive(object, "loops", "") ?? config.loopsPerEngine
        config.connectionsPerLoop = try positive(object, "connections", "") ?? config.connectionsPerLoop
        config.maxAttempts = try positive(object, "max_attempts", "") ?? config.maxAttempts
        guard let workspaces = object["workspaces"] else {
            throw ServiceConfigurationError("workspaces", "is required (at least one workspace)")
        }
        guard let members = workspaces.objectValue, !members.isEmpty else {
            throw ServiceConfigurationError("workspaces", "must be an object with at least one workspace")
        }
        var owner: [String: String] = [:]
        var keyOwner: [[UInt8]: String] = [:]
        var codeOwner: [String: String] = [:]
        for member in members {
            let workspace = try readWorkspace(member.value, name: member.key)
            // One key, one workspace and kind: a digest listed twice would give its key the first one found.
            for digest in workspace.serverKeyDigests + workspace.deviceKeyDigests {
                if let other = keyOwner[digest] {
                    throw ServiceConfigurationError(
                        "workspaces.\(member.key)",
                        "a key digest is listed twice (also in \(other)); give each key once")
                }
                keyOwner[digest] = member.key
            }
            // Pushwoosh application codes and Braze app ids find the app a request is for: each names one app.
            for app in workspace.apps.values {
                for code in [
                    app.pushwooshApplication.map { "pushwoosh_application " + $0 },
                    app.brazeAppID.map { "braze_app_id " + $0 },
                ]
                .compactMap({ $0 }) {
                    if let other = codeOwner[code] {
                        throw ServiceConfigurationError(
                            "workspaces.\(member.key).apps.\(app.bundleID)", "\(code) is also \(other)'s")
                    }
                    codeOwner[code] = app.bundleID
                }
            }
            for bundleID in workspace.apps.keys {
                if let other = owner[bundleID] {
                    throw ServiceConfigurationError(
                        "workspaces.\(member.key).apps.\(bundleID)",
                        "the app is already in workspace \(other); an app belongs to one workspace")
                }
                owner[bundleID] = member.key
            }
            config.workspaces[member.key] = workspace
        }
        return config
    }

    func readWorkspace(_ value: JSONValue, name: String) throws(ServiceConfigurationError) -> WorkspaceConfiguration {
        let path = "workspaces.\(name)"
        let object = try object(
            value, path,
            keys: [
                "server_keys_sha256", "device_keys_sha256", "rate_limit", "device_rate_limit", "send_budget", "apps",
                "webhooks", "event_stream",
            ])
        let serverKeys = try digests(object, "server_keys_sha256", path)
        let deviceKeys = try digests(object, "device_keys_sha256", path)
        guard !serverKeys.isEmpty else {
            throw ServiceConfigurationError(join(path, "server_keys_sha256"), "needs at least one key digest")
        }
        let rateLimit =
            try quota(object["rate_limit"], join(path, "rate_limit"))
            ?? RequestQuotaRule(requestsPerHour: 250_000, burstSeconds: 60)
        let deviceRateLimit =
            try quota(object["device_rate_limit"], join(path, "device_rate_limit"))
            ?? RequestQuotaRule(requestsPerHour: rateLimit.requestsPerHour * 10, burst: rateLimit.burst * 10)
        guard let apps = object["apps"]?.objectValue, !apps.isEmpty else {
            throw ServiceConfigurationError(join(path, "apps"), "must be an object with at least one app")
        }
        var byBundle: [String: AppConfiguration] = [:]
        for app in apps {
            byBundle[app.key] = try readApp(
                app.value, bundleID: app.key, workspace: name, path: "\(path).apps.\(app.key)")
        }
        return WorkspaceConfiguration(
            name: name, serverKeyDigests: serverKeys, deviceKeyDigests: deviceKeys, rateLimit: rateLimit,
            deviceRateLimit: deviceRateLimit,
            sendBudget: try sendBudget(object["send_budget"], join(path, "send_budget")),
            apps: byBundle,
            webhooks: try WebhookConfigurationReader.read(
                object["webhooks"], workspace: name, path: join(path, "webhooks"), resolve: resolve),
            eventStream: try WebhookConfigurationReader.flag(object["event_stream"], path: join(path, "event_stream")))
    }

    /// `send_budget`: `{"requests_per_hour", "burst_seconds", "counting": "job" | "notification", "policy": "wait" |
    /// "reject" | "demote"}`, the fields of `fanout send`'s `rate_limits` (defaults 250,000, 60, `job`, `reject`).
    func sendBudget(_ value: JSONValue?, _ path: String) throws(ServiceConfigurationError) -> RateBudget? {
        guard let value, !value.isNull else { return nil }
        let object = try object(value, path, keys: ["requests_per_hour", "burst_seconds", "counting", "policy"])
        let counting: RateCountingUnit
        switch try string(object, "counting", path) ?? "job" {
        case "job": counting = .job
        case "notification": counting = .notification
        default: throw ServiceConfigurationError(join(path, "counting"), "must be job or notification")
        }
        guard let policy = RateLimitPolicy(rawValue: try string(object, "policy", path) ?? "reject") else {
            throw ServiceConfigurationError(join(path, "policy"), "must be wait, reject or demote")
        }
        let budget = RateBudget(
            requestsPerHour: try positive(object, "requests_per_hour", path) ?? 250_000,
            burstSeconds: try positive(object, "burst_seconds", path) ?? 60, countingUnit: counting, policy: policy)
        do {
            try budget.validate()
        } catch {
            throw ServiceConfigurationError(path, error.message)
        }
        return budget
    }

    func digests(_ object: JSONObject, _ key: String, _ path: String) throws(ServiceConfigurationError) -> [[UInt8]] {
        guard let value = object[key], !value.isNull else { return [] }
        guard let array = value.arrayValue else {
            throw ServiceConfigurationError(join(path, key), "must be an array of hex SHA-256 digests")
        }
        var digests: [[UInt8]] = []
        for (index, element) in array.enumerated() {
            guard let text = element.stringValue, text.utf8.count == 64, let bytes = HexDigest.decode(text) else {
                throw ServiceConfigurationError(
                    "\(join(path, key))[\(index)]", "must be 64 hex digits (the SHA-256 of a key, not the key)")
            }
            digests.append(bytes)
        }
        return digests
    }

    func quota(_ value: JSONValue?, _ path: String) throws(ServiceConfigurationError) -> RequestQuotaRule? {
        guard let value, !value.isNull else { return nil }
        let object = try object(value, path, keys: ["requests_per_hour", "burst_seconds", "burst"])
        guard let perHour = try positive(object, "requests_per_hour", path) else {
            throw ServiceConfigurationError(join(path, "requests_per_hour"), "is required")
        }
        if let burst = try positive(object, "burst", path) {
            if object["burst_seconds"] != nil {
                throw ServiceConfigurationError(join(path, "burst"), "give burst or burst_seconds, not both")
            }
            return RequestQuotaRule(requestsPerHour: perHour, burst: burst)
        }
        return RequestQuotaRule(
            requestsPerHour: perHour, burstSeconds: try positive(object, "burst_seconds", path) ?? 60)
    }

    func readApp(_ value: JSONValue, bundleID: String, workspace: String, path: String)
        throws(ServiceConfigurationError)
        -> AppConfiguration
    {
        let object = try object(
            value, path,
            keys: [
                "team_id", "key_id", "key_path", "endpoint", "manage_endpoint", "ca_file", "pushwoosh_application",
                "braze_app_id", "cert_path", "cert_key_path", "cert_password_env", "cert_password_file",
                "cert_password",
            ])
        if object["cert_password"] != nil {
            throw ServiceConfigurationError(
                join(path, "cert_password"),
                "the certificate's password is not kept in the config: give cert_password_env or cert_password_file")
        }
        var certificate: AppCertificate?
        if let certificatePath = try string(object, "cert_path", path) {
            for key in ["key_id", "key_path"] where object[key] != nil {
                throw ServiceConfigurationError(
                    join(path, key), "give a signing key (key_path, key_id) or a certificate (cert_path), not both")
            }
            let passwordEnv = try string(object, "cert_password_env", path)
            let passwordFile = try string(object, "cert_password_file", path).map(resolve)
            if passwordEnv != nil && passwordFile != nil {
                throw ServiceConfigurationError(
                    join(path, "cert_password_file"), "give the password one way: cert_password_env or this")
            }
            certificate = AppCertificate(
                path: resolve(certificatePath), keyPath: try string(object, "cert_key_path", path).map(resolve),
                passwordEnv: passwordEnv, passwordFile: passwordFile)
        } else {
            for key in ["cert_key_path", "cert_password_env", "cert_password_file"] where object[key] != nil {
                throw ServiceConfigurationError(join(path, key), "goes with cert_path")
            }
        }
        let endpoint: APNsEndpoint
        var manageEndpoint: APNsEndpoint?
        switch try string(object, "endpoint", path) {
        case nil, "production":
            endpoint = .production
            manageEndpoint = BroadcastChannelClient.production
        case "sandbox":
            endpoint = .sandbox
            manageEndpoint = BroadcastChannelClient.sandbox
        case let text?:
            guard let (host, port) = HostPort.parse(text) else {
                throw ServiceConfigurationError(join(path, "endpoint"), "must be sandbox, production or HOST:PORT")
            }
            endpoint = APNsEndpoint(host: host, port: port)
        }
        switch try string(object, "manage_endpoint", path) {
        case nil: break
        case "production": manageEndpoint = BroadcastChannelClient.production
        case "sandbox": manageEndpoint = BroadcastChannelClient.sandbox
        case let text?:
            guard let (host, port) = HostPort.parse(text) else {
                throw ServiceConfigurationError(
                    join(path, "manage_endpoint"), "must be sandbox, production or HOST:PORT")
            }
            manageEndpoint = APNsEndpoint(host: host, port: port)
        }
        let usesKey = certificate == nil
        return AppConfiguration(
            bundleID: bundleID, workspace: workspace,
            teamID: usesKey ? try required(object, "team_id", path) : try string(object, "team_id", path) ?? "",
            keyID: usesKey ? try required(object, "key_id", path) : "",
            keyPath: usesKey ? resolve(try required(object, "key_path", path)) : "",
            endpoint: endpoint, manageEndpoint: manageEndpoint,
            caFile: try string(object, "ca_file", path).map(resolve),
            pushwooshApplication: try string(object, "pushwoosh_application", path),
            brazeAppID: try string(object, "braze_app_id", path), certificate: certificate)
    }
}

/// `HOST:PORT`, with `[v6]:PORT` for IPv6.
enum HostPort {
    static func parse(_ text: String) -> (String, Int)? {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
            (0...65535).contains(port)
        else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return host.isEmpty ? nil : (host, port)
    }
}

/// Lowercase or uppercase hex to bytes.
enum HexDigest {
    static func decode(_ text: String) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = value(digits[index]), let low = value(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
    }

    private static func value(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return digit - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}
