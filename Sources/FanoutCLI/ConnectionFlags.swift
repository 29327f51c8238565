import CommandLineSupport
import Fanout
import FanoutJobFile
import FanoutObservability
import Foundation

/// The flags `fanout push` and `fanout send` share: where to connect and with which key.
struct ConnectionFlags {
    var endpoint: APNsEndpoint?
    var caFile: String?
    var keyPath: String?
    var keyID: String?
    var teamID: String?
    /// `--cert FILE`: a provider certificate, as a PKCS#12 file (`.p12`) or PEM; instead of a signing key.
    var certificatePath: String?
    /// `--cert-key FILE`: the PEM certificate's private key (unencrypted), when not in the `--cert` file.
    var certificateKeyPath: String?
    /// `--cert-password-env VAR` / `--cert-password-file FILE`: where the `.p12` file's password is. Never the
    /// password itself: a command line and a config file are readable by others.
    var certificatePasswordEnv: String?
    var certificatePasswordFile: String?
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
        case "--cert": certificatePath = try cursor.string()
        case "--cert-key": certificateKeyPath = try cursor.string()
        case "--cert-password-env": certificatePasswordEnv = try cursor.string()
        case "--cert-password-file": certificatePasswordFile = try cursor.string()
        case "--cert-password":
            throw UsageError(
                "the certificate's password is not taken on the command line (others can read it there): "
                    + "give --cert-password-env VAR or --cert-password-file FILE")
        case "--request-timeout": requestTimeout = try cursor.seconds()
        case "--proxy": proxy = try cursor.string()
        default: return false
        }
        return true
    }

    /// Fills what the flags left unset from a fallback (the config file) and then the environment
    /// (`APNS_KEY_PATH`, `APNS_KEY_ID`, `APNS_TEAM_ID`): flags win over both. A certificate given by a flag or the
    /// config file leaves the environment's key unused.
    mutating func fill(from fallback: ConnectionFlags = ConnectionFlags(), environment: [String: String]) {
        endpoint = endpoint ?? fallback.endpoint
        caFile = caFile ?? fallback.caFile
        // A key or a certificate on the command line wins over the other in the config file and the environment.
        if certificatePath == nil && keyPath == nil {
            certificatePath = fallback.certificatePath
            certificateKeyPath = certificateKeyPath ?? fallback.certificateKeyPath
            certificatePasswordEnv = certificatePasswordEnv ?? fallback.certificatePasswordEnv
            certificatePasswordFile = certificatePasswordFile ?? fallback.certificatePasswordFile
        }
        if certificatePath == nil {
            keyPath = keyPath ?? fallback.keyPath ?? environment["APNS_KEY_PATH"]
            keyID = keyID ?? fallback.keyID ?? environment["APNS_KEY_ID"]
            teamID = teamID ?? fallback.teamID ?? environment["APNS_TEAM_ID"]
        }
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

    /// The credentials (a signing key, or a certificate), or the one-line error naming every way to give them.
    /// - Parameters:
    ///   - configFile: whether a config file could have given them too (`fanout send`).
    ///   - environment: where `--cert-password-env` names a variable.
    func credentials(
        configFile: Bool = false, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(UsageError) -> ProviderCredentials {
        if let certificatePath {
            guard keyPath == nil else {
                throw UsageError("give either a signing key (--key) or a certificate (--cert), not both")
            }
            return try Self.certificateCredentials(
                path: certificatePath, keyPath: certificateKeyPath, passwordEnv: certificatePasswordEnv,
                passwordFile: certificatePasswordFile, environment: environment)
        }
        if certificateKeyPath != nil || certificatePasswordEnv != nil || certificatePasswordFile != nil {
            throw UsageError("--cert-key and --cert-password-env/-file go with --cert FILE")
        }
        guard let keyPath, let keyID, let teamID else {
            let alternatives = (configFile ? "the config file, or " : "") + "APNS_KEY_PATH, APNS_KEY_ID, APNS_TEAM_ID"
            throw UsageError("provider-token auth needs --key, --key-id and --team-id (or \(alternatives))")
        }
        return ProviderCredentials(keyPath: keyPath, keyID: keyID, teamID: teamID)
    }

    /// Certificate credentials from a `.p12` file and where its password is, or from a PEM certificate and key
    /// (`keyPath`, or the certificate's own file when it holds the key too). The errors name the flag, the file or the
    /// variable, never the password. A config file's `cert_password_env` and `cert_password_file` are named by the
    /// flags they stand for.
    static func certificateCredentials(
        path: String, keyPath: String?, passwordEnv: String?, passwordFile: String?, environment: [String: String]
    ) throws(UsageError) -> ProviderCredentials {
        if ProviderCredentials.isPEM(path: path, privateKeyPath: keyPath) {
            guard passwordEnv == nil && passwordFile == nil else {
                throw UsageError(
                    "certificate \(path) is PEM: its key is given unencrypted (mode 0600), without a password")
            }
            return ProviderCredentials(certificatePath: path, privateKeyPath: keyPath ?? path)
        }
        let password: String
        switch (passwordEnv, passwordFile) {
        case (let name?, nil):
            guard let value = environment[name] else {
                throw UsageError("--cert-password-env: environment variable \(name) is not set")
            }
            password = value
        case (nil, let file?):
            guard let text = ProviderCredentials.readPasswordFile(file) else {
                throw UsageError("--cert-password-file: \(file) cannot be read")
            }
            password = text
        case (nil, nil):
            throw UsageError(
                "certificate \(path) is PKCS#12 (.p12): give its password with --cert-password-env VAR or --cert-password-file FILE"
            )
        case (.some, .some):
            throw UsageError(
                "give the certificate's password one way: --cert-password-env VAR or --cert-password-file FILE, not both"
            )
        }
        return ProviderCredentials(pkcs12Path: path, password: password)
    }
}
