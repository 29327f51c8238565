import FanoutCore
import Foundation
import Synchronization

/// Mints APNs provider tokens: ES256-signed JWTs with header `{"alg":"ES256","kid":…}` and claims
/// `{"iss":…,"iat":…}`.
///
/// Minting is cheap but APNs limits how often a token may change (at most every 20 minutes), so don't call
/// this per request: use `ProviderTokenCache`.
package struct ProviderTokenSigner: Sendable {
    /// The APNs auth key (.p8).
    package let key: ES256PrivateKey
    /// The 10-character Key ID of `key`, sent as `kid`.
    package let keyID: String
    /// The 10-character Team ID, sent as `iss`.
    package let teamID: String
    /// base64url(`{"alg":"ES256","kid":"<keyID>"}`) followed by ".", computed once.
    private let headerPrefix: String
    /// `{"iss":"<teamID>","iat":` computed once.
    private let claimsPrefix: String

    /// Throws `.invalidArgument` if `keyID` or `teamID` is empty.
    package init(key: ES256PrivateKey, keyID: String, teamID: String) throws {
        guard !keyID.isEmpty else { throw CryptoError(.invalidArgument, "provider token key ID (kid) is empty") }
        guard !teamID.isEmpty else { throw CryptoError(.invalidArgument, "provider token team ID (iss) is empty") }
        self.key = key
        self.keyID = keyID
        self.teamID = teamID
        let header = "{\"alg\":\"ES256\",\"kid\":\(JSONStringEscaping.quoted(keyID))}"
        self.headerPrefix = Base64URL.encode(Array(header.utf8)) + "."
        self.claimsPrefix = "{\"iss\":\(JSONStringEscaping.quoted(teamID)),\"iat\":"
    }

    /// Returns a signed token with `iat` = `issuedAt` (seconds since 1970).
    package func makeToken(issuedAt: Int64) throws -> String {
        let claims = claimsPrefix + String(issuedAt) + "}"
        let signingInput = headerPrefix + Base64URL.encode(Array(claims.utf8))
        let signature = try key.signature(for: Array(signingInput.utf8))
        return signingInput + "." + Base64URL.encode(signature)
    }
}

/// Returns an APNs provider token (ES256 JWT) for `keyID`/`teamID`, issued at `issuedAt` (seconds since 1970).
package func makeProviderToken(key: ES256PrivateKey, keyID: String, teamID: String, issuedAt: Int64) throws -> String {
    try ProviderTokenSigner(key: key, keyID: keyID, teamID: teamID).makeToken(issuedAt: issuedAt)
}
