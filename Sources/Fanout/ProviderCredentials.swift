package import FanoutTransport
import Foundation

/// An APNs signing key (.p8) and its ids: what provider tokens (JWTs) are made from.
///
/// The key comes from a file (`init(keyPath:keyID:teamID:)`, read when an engine or channel client is made) or from
/// its contents in memory (`init(keyPEM:keyID:teamID:)`, for a gateway that keeps it in a secret store). Either way
/// the key material never appears in a description, a `dump`, a log line or an error: they show the ids and where the
/// key came from (the file's path, or "in memory"), never the key.
public struct ProviderCredentials: Sendable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    /// Where the key is: a file to read, or the key already parsed from PEM text given in memory.
    private enum KeySource: Sendable {
        case file(String)
        case memory(ES256PrivateKey)
    }

    private var key: KeySource
    public var keyID: String
    public var teamID: String

    /// The .p8 file's path; empty for credentials made from the key's contents (`init(keyPEM:keyID:teamID:)`).
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

    /// `ProviderCredentials(keyID: …, teamID: …, key: <path> | in memory)`: the ids and where the key is, never the
    /// key.
    public var description: String {
        "ProviderCredentials(keyID: \(keyID), teamID: \(teamID), key: \(keyLocation))"
    }

    public var debugDescription: String { description }

    /// The ids and where the key is (as `description`), so that `dump` and other mirrors never reach the key.
    public var customMirror: Mirror {
        Mirror(self, children: ["keyID": keyID, "teamID": teamID, "key": keyLocation], displayStyle: .struct)
    }

    /// Where the key is, as descriptions show it: `file <path>` or `in memory`.
    private var keyLocation: String {
        switch key {
        case .file(let path): return "file \(path)"
        case .memory: return "in memory"
        }
    }

    /// A warning when the key file can be read by its group or by others (a signing key should be
    /// mode 0600), or nil. The commands print it; nothing is refused. Nil for a key given in memory.
    public func permissionWarning() -> String? {
        guard case .file(let keyPath) = key else { return nil }
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
    /// file, never its contents.
    func makeTokenCache(refreshAfter: Duration, minimumInterval: Duration) throws(FanoutError) -> ProviderTokenCache {
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
