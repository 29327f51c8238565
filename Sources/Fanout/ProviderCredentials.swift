package import FanoutTransport
import Foundation

/// How Fanout authenticates to APNs: an APNs signing key (.p8) and its ids, what provider tokens (JWTs) are made
/// from, or an app's push certificate and its private key, presented in the TLS handshake instead.
///
/// A signing key comes from a file (`init(keyPath:keyID:teamID:)`, read when an engine or channel client is made) or
/// from its contents in memory (`init(keyPEM:keyID:teamID:)`, for a gateway that keeps it in a secret store). A
/// certificate comes from a PKCS#12 file and its password (`init(pkcs12Path:password:)`) or from PEM files
/// (`init(certificatePath:privateKeyPath:)`), read when an engine or channel client is made; requests on its
/// connections carry no provider token. Either way the key material and the password never appear in a
/// description, a `dump`, a log line or an error: they show the ids and where the key or certificate came from (the
/// file's path, or "in memory"), never the key.
public struct ProviderCredentials: Sendable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    /// Where the key is: a file to read, the key already parsed from PEM text given in memory, or a certificate.
    private enum KeySource: Sendable {
        case file(String)
        case memory(ES256PrivateKey)
        case pkcs12(path: String, password: String)
        case pem(certificatePath: String, keyPath: String)
    }

    private var key: KeySource
    public var keyID: String
    public var teamID: String

    /// The .p8 file's path; empty for credentials made from the key's contents (`init(keyPEM:keyID:teamID:)`) and for
    /// a certificate.
    /// Setting it makes the credentials read the key from that file.
    public var keyPath: String {
        get {
            if case .file(let path) = key { return path }
            return ""
        }
        set { key = .file(newValue) }
    }

    /// Credentials whose key is read from the .p8 file at `keyPath` when an engine or a channel client is made.
    public init(keyPath: String, keyID: String, teamID: String) {
        key = .file(keyPath)
        self.keyID = keyID
        self.teamID = teamID
    }

    /// Credentials from the .p8 key's contents (its PKCS#8 PEM text, as the .p8 file holds it), as a secret store
    /// gives them. The key is parsed here and only the parsed key is kept, not `keyPEM`.
    /// - Throws: `.credentials` when `keyPEM` is not an unencrypted PKCS#8 EC P-256 key; the message says what is
    ///   wrong, never what the text holds.
    public init(keyPEM: String, keyID: String, teamID: String) throws(FanoutError) {
        do {
            key = .memory(try ES256PrivateKey(pem: keyPEM))
        } catch {
            throw FanoutError(.credentials, "signing key: \(Self.message(error))")
        }
        self.keyID = keyID
        self.teamID = teamID
    }

    /// Certificate-based authentication with a PKCS#12 file (`.p12`, as Keychain Access exports an app's push
    /// certificate with its private key), opened with `password`. The file is read when an engine or a channel
    /// client is made (`certificate()` reads it at once); the password is kept for that and never shown.
    /// `keyID` and `teamID` are empty: no provider token is made.
    /// - Parameters:
    ///   - pkcs12Path: the `.p12` file.
    ///   - password: its password (empty for a file exported without one).
    public init(pkcs12Path: String, password: String) {
        key = .pkcs12(path: pkcs12Path, password: password)
        keyID = ""
        teamID = ""
    }

    /// Certificate-based authentication with a PEM certificate (followed by any intermediate certificates) and its
    /// unencrypted PEM private key, read when an engine or a channel client is made. `keyID` and `teamID` are empty:
    /// no provider token is made.
    /// - Parameters:
    ///   - certificatePath: the PEM certificate file.
    ///   - privateKeyPath: the PEM private key file; may be `certificatePath` when one file holds both.
    public init(certificatePath: String, privateKeyPath: String) {
        key = .pem(certificatePath: certificatePath, keyPath: privateKeyPath)
        keyID = ""
        teamID = ""
    }

    /// Certificate credentials for the file at `path`: PEM (when `privateKeyPath` is given, or the file's text holds
    /// a `-----BEGIN` line, as after `openssl pkcs12 -nodes`' "Bag Attributes") with its key from `privateKeyPath`
    /// or the same file, else PKCS#12 opened with `password`. A file that cannot be read is taken by its name
    /// (`.pem`, `.crt`: PEM), and loading it names the problem.
    /// - Returns: the credentials, or nil when the file is PKCS#12 and no password was given.
    package static func certificate(path: String, privateKeyPath: String?, password: String?) -> ProviderCredentials? {
        if isPEM(path: path, privateKeyPath: privateKeyPath) {
            return ProviderCredentials(certificatePath: path, privateKeyPath: privateKeyPath ?? path)
        }
        return password.map { ProviderCredentials(pkcs12Path: path, password: $0) }
    }

    /// Whether `certificate(path:privateKeyPath:password:)` reads the file as PEM.
    package static func isPEM(path: String, privateKeyPath: String?) -> Bool {
        if privateKeyPath != nil { return true }
        if let contents = FileManager.default.contents(atPath: path) {
            return String(decoding: contents, as: UTF8.self).contains("-----BEGIN")
        }
        return path.hasSuffix(".pem") || path.hasSuffix(".crt")
    }

    /// A password file's contents less one final line break (the file's, not the password's); nil when the file
    /// cannot be read.
    package static func readPasswordFile(_ path: String) -> String? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        var text = String(decoding: data, as: UTF8.self)
        if text.hasSuffix("\r\n") {
            text.removeLast(2)
        } else if text.hasSuffix("\n") {
            text.removeLast()
        }
        return text
    }

    /// Whether these credentials are a certificate (TLS client authentication, no provider token) rather than a
    /// signing key.
    public var usesCertificate: Bool {
        switch key {
        case .file, .memory: return false
        case .pkcs12, .pem: return true
        }
    }

    /// `ProviderCredentials(keyID: …, teamID: …, key: <path> | in memory)`, or `ProviderCredentials(certificate:
    /// <path>)`: the ids and where the key is, never the key or a password.
    public var description: String {
        if usesCertificate { return "ProviderCredentials(certificate: \(keyLocation))" }
        return "ProviderCredentials(keyID: \(keyID), teamID: \(teamID), key: \(keyLocation))"
    }

    public var debugDescription: String { description }

    /// The ids and where the key is (as `description`), so that `dump` and other mirrors never reach the key.
    public var customMirror: Mirror {
        if usesCertificate { return Mirror(self, children: ["certificate": keyLocation], displayStyle: .struct) }
        return Mirror(self, children: ["keyID": keyID, "teamID": teamID, "key": keyLocation], displayStyle: .struct)
    }

    /// Where the key is, as descriptions show it: `file <path>`, `in memory`, or the certificate's file(s).
    private var keyLocation: String {
        switch key {
        case .file(let path): return "file \(path)"
        case .memory: return "in memory"
        case .pkcs12(let path, _): return "file \(path)"
        case .pem(let certificatePath, let keyPath) where certificatePath == keyPath: return "file \(certificatePath)"
        case .pem(let certificatePath, let keyPath): return "file \(certificatePath), key file \(keyPath)"
        }
    }

    /// Reads the certificate and describes it: whom it names, when it expires, the topics it covers. Nil for a
    /// signing key. A caller checks here, before starting anything, what an engine would refuse later.
    /// - Throws: `.credentials` naming the file and the cause (not found, unreadable, wrong password, not a
    ///   certificate, a key that is not its own); never the password.
    public func certificate() throws(FanoutError) -> ProviderCertificate? {
        try makeClientIdentity().map { ProviderCertificate($0.details) }
    }

    /// Loads the certificate and its key for TLS client authentication; nil for a signing key.
    package func makeClientIdentity() throws(FanoutError) -> TLSClientIdentity? {
        do {
            switch key {
            case .file, .memory: return nil
            case .pkcs12(let path, let password): return try TLSClientIdentity.pkcs12(path: path, password: password)
            case .pem(let certificatePath, let keyPath):
                return try TLSClientIdentity.pem(certificatePath: certificatePath, keyPath: keyPath)
            }
        } catch {
            throw FanoutError(.credentials, "certificate: \(Self.message(error))")
        }
    }

    /// A warning when the key file can be read by its group or by others (a signing key should be
    /// mode 0600), or nil. The commands print it; nothing is refused. Nil for a key given in memory.
    public func permissionWarning() -> String? {
        let keyPath: String
        switch key {
        case .file(let path), .pkcs12(let path, _), .pem(_, let path): keyPath = path
        case .memory: return nil
        }
        var status = stat()
        guard stat(keyPath, &status) == 0 else { return nil }
        let mode = status.st_mode & 0o777
        guard mode & 0o077 != 0 else { return nil }
        return "key file \(keyPath) is readable by group or others (mode \(String(mode, radix: 8))); chmod 600 it"
    }

    /// The key: read from the file, or the one given in memory.
    private func loadKey() throws -> ES256PrivateKey {
        switch key {
        case .file(let path): return try ES256PrivateKey(pemFilePath: path)
        case .memory(let key): return key
        case .pkcs12, .pem:
            throw CryptoError(.invalidArgument, "certificate credentials make no provider token")
        }
    }

    /// Loads the key and makes the signer that mints provider tokens. Errors name the file, never its contents.
    package func makeSigner() throws(FanoutError) -> ProviderTokenSigner {
        do {
            return try ProviderTokenSigner(key: loadKey(), keyID: keyID, teamID: teamID)
        } catch {
            throw FanoutError(.credentials, "signing key: \(Self.message(error))")
        }
    }

    /// Loads the key and returns the process's token cache for it (`ProviderTokenCache.shared`): every engine and
    /// channel client of this process that signs with this key shares one token, so the team's token is refreshed
    /// once per schedule, not once per client. The first cache made for the key sets the schedule. Errors name the
    /// file, never its contents. Nil for a certificate, whose connections carry no provider token.
    func makeTokenCache(refreshAfter: Duration, minimumInterval: Duration) throws(FanoutError) -> ProviderTokenCache? {
        guard !usesCertificate else { return nil }
        do {
            let signer = try ProviderTokenSigner(key: loadKey(), keyID: keyID, teamID: teamID)
            let cache = try ProviderTokenCache.shared(
                signer: signer, refreshAfter: refreshAfter.components.seconds,
                minimumInterval: minimumInterval.components.seconds)
            _ = try cache.currentToken()  // fail now, not at the first send
            return cache
        } catch {
            throw FanoutError(.credentials, "signing key: \(Self.message(error))")
        }
    }

    /// An error's message for people: a `CryptoError`'s message (naming the file), not its debug form.
    private static func message(_ error: any Error) -> String {
        (error as? CryptoError)?.message ?? "\(error)"
    }
}

/// What an APNs provider certificate says about itself (`ProviderCredentials.certificate()`): whom it names, when it
/// expires, and which topics and environments it covers.
public struct ProviderCertificate: Sendable, Hashable {
    /// The subject's common name (Apple's read `Apple Push Services: <bundle id>`); empty when it has none.
    public let commonName: String
    /// When it becomes valid, and when it expires (APNs refuses it after), in seconds since 1970 (UTC).
    public let notBefore: Int64
    public let notAfter: Int64
    /// The APNs topics it covers: those of Apple's topic extension (the bundle id and its suffixed variants, such as
    /// `.voip` and `.complication`), or the subject's UID (the bundle id) in certificates without it. Empty: it
    /// names none, and no topic is checked against it.
    public let topics: [String]
    /// Whether it is marked for APNs's development (sandbox) and production environments. Both false: it carries
    /// neither of Apple's marks.
    public let development: Bool
    public let production: Bool

    init(_ details: CertificateDetails) {
        commonName = details.commonName
        notBefore = details.notBefore
        notAfter = details.notAfter
        topics = details.topics
        development = details.development
        production = details.production
    }

    /// Whether a notification for `topic` may be sent with it: it names the topic, or it names no topic at all.
    /// Live Activity (`.push-type.liveactivity`) and location (`.location-query`) topics never are: APNs takes those
    /// with token authentication only.
    /// - Parameter topic: the notification's `apns-topic`.
    public func covers(topic: String) -> Bool { CertificateDetails.covers(topic: topic, topics: topics) }

    /// The refusal of a job for a topic it does not cover, naming the topic and the ones it does.
    static func refusal(topic: String, topics: [String]) -> String {
        var text =
            "topic \(topic) is not covered by the provider certificate (it covers \(topics.joined(separator: ", ")))"
        if CertificateDetails.tokenOnlySuffixes.contains(where: { topic.hasSuffix($0) }) {
            text += "; APNs takes this push type with token authentication (a .p8 key) only"
        }
        return text
    }

    /// The refusal of `topic`, naming it and the topics the certificate covers.
    package func refusal(topic: String) -> String { Self.refusal(topic: topic, topics: topics) }

    /// How many days before its expiry a certificate is warned of.
    package static let expiryWarningDays: Int64 = 30

    /// The expiry as `2027-03-01T12:00:00Z`.
    package var expiryText: String {
        Date(timeIntervalSince1970: TimeInterval(notAfter)).formatted(.iso8601)
    }

    /// What the certificate is, for the log line at start: its name, topics and expiry.
    package var summary: String {
        let name = commonName.isEmpty ? "provider certificate" : "provider certificate \"\(commonName)\""
        let covered = topics.isEmpty ? "names no topic" : "covers \(topics.joined(separator: ", "))"
        return "\(name) \(covered), expires \(expiryText)"
    }

    /// Whether the certificate has expired at `now` (seconds since 1970), or expires within
    /// `expiryWarningDays`, with the sentence that says so.
    package func expiryStatus(now: Int64) -> (expired: Bool, warning: Bool, message: String) {
        if notAfter <= now {
            return (true, false, "the provider certificate expired on \(expiryText); APNs refuses it: renew it")
        }
        let days = (notAfter - now) / 86_400
        guard days < Self.expiryWarningDays else { return (false, false, "") }
        return (false, true, "the provider certificate expires in \(days) days (\(expiryText)): renew it")
    }
}
