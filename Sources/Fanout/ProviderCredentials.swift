package import FanoutTransport
import Foundation

/// An APNs signing key (.p8) and its ids: what provider tokens (JWTs) are made from.
public struct ProviderCredentials: Sendable {
    public var keyPath: String
    public var keyID: String
    public var teamID: String

    public init(keyPath: String, keyID: String, teamID: String) {
        self.keyPath = keyPath
        self.keyID = keyID
        self.teamID = teamID
    }

    /// A warning when the key file can be read by its group or by others (a signing key should be
    /// mode 0600), or nil. The commands print it; nothing is refused.
    public func permissionWarning() -> String? {
        var status = stat()
        guard stat(keyPath, &status) == 0 else { return nil }
        let mode = status.st_mode & 0o777
        guard mode & 0o077 != 0 else { return nil }
        return "key file \(keyPath) is readable by group or others (mode \(String(mode, radix: 8))); chmod 600 it"
    }

    /// Loads the key and makes the signer that mints provider tokens. Errors name the file, never its contents.
    package func makeSigner() throws(FanoutError) -> ProviderTokenSigner {
        do {
            return try ProviderTokenSigner(key: ES256PrivateKey(pemFilePath: keyPath), keyID: keyID, teamID: teamID)
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
            let key = try ES256PrivateKey(pemFilePath: keyPath)
            let signer = try ProviderTokenSigner(key: key, keyID: keyID, teamID: teamID)
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
