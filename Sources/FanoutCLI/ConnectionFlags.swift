import CommandLineSupport
import Fanout
import FanoutJobFile
import FanoutObservability

/// The flags `fanout push` and `fanout send` share: where to connect and with which key.
struct ConnectionFlags {
    var endpoint: APNsEndpoint?
    var caFile: String?
    var keyPath: String?
    var keyID: String?
    var teamID: String?
    /// `--request-timeout SECONDS`: how long one request may wait for APNs's answer.
    var requestTimeout: Duration?
    /// `--proxy URL|none`: the HTTP proxy to reach Apple through, or `none` for a direct connection whatever
    /// `HTTPS_PROXY` says. Unset: `HTTPS_PROXY` and `NO_PROXY`, as curl reads them.
    var proxy: String?

    /// Takes `flag` (and its value) if it is one of these; returns false for any other flag.
    mutating func take(_ flag: String, from cursor: inout ArgumentCursor) throws(UsageError) -> Bool {
        switch flag {
        case "--endpoint":
            let (host, port) = try cursor.hostPort()
            endpoint = APNsEndpoint(host: host, port: port)
        case "--sandbox": endpoint = .sandbox
        case "--production": endpoint = .production
        case "--ca-file": caFile = try cursor.string()
        case "--key": keyPath = try cursor.string()
        case "--key-id": keyID = try cursor.string()
        case "--team-id": teamID = try cursor.string()
        case "--request-timeout": requestTimeout = try cursor.seconds()
        case "--proxy": proxy = try cursor.string()
        default: return false
        }
        return true
    }

    /// Fills what the flags left unset from a fallback (the config file) and then the environment
    /// (`APNS_KEY_PATH`, `APNS_KEY_ID`, `APNS_TEAM_ID`): flags win over both.
    mutating func fill(from fallback: ConnectionFlags = ConnectionFlags(), environment: [String: String]) {
        endpoint = endpoint ?? fallback.endpoint
        caFile = caFile ?? fallback.caFile
        keyPath = keyPath ?? fallback.keyPath ?? environment["APNS_KEY_PATH"]
        keyID = keyID ?? fallback.keyID ?? environment["APNS_KEY_ID"]
        teamID = teamID ?? fallback.teamID ?? environment["APNS_TEAM_ID"]
        requestTimeout = requestTimeout ?? fallback.requestTimeout
        proxy = proxy ?? fallback.proxy
    }

    /// The proxy for connections to `host`: `--proxy` (or the config file's `proxy`), else the environment's
    /// `HTTPS_PROXY` unless `NO_PROXY` names the host; nil for `none` or when none applies. The error names what is
    /// wrong without the password.
    func proxy(for host: String, environment: [String: String]) throws(UsageError) -> APNsProxy? {
        do {
            guard let proxy else { return try APNsProxy.fromEnvironment(for: host, environment: environment) }
            return proxy == "none" ? nil : try APNsProxy(url: proxy)
        } catch {
            throw UsageError(proxy == nil ? error.message : "--proxy: \(error.message)")
        }
    }

    /// The provider-token credentials, or the one-line error naming every way to give them.
    /// - Parameter configFile: whether a config file could have given them too (`fanout send`).
    func credentials(configFile: Bool = false) throws(UsageError) -> ProviderCredentials {
        guard let keyPath, let keyID, let teamID else {
            let alternatives = (configFile ? "the config file, or " : "") + "APNS_KEY_PATH, APNS_KEY_ID, APNS_TEAM_ID"
            throw UsageError("provider-token auth needs --key, --key-id and --team-id (or \(alternatives))")
        }
        return ProviderCredentials(keyPath: keyPath, keyID: keyID, teamID: teamID)
    }
}
