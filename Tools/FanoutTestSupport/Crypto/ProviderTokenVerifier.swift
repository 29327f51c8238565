import FanoutCore
package import FanoutTransport

/// The claims of a provider token whose signature checked out.
package struct ProviderTokenClaims: Sendable, Hashable {
    /// Header `kid`.
    package let keyID: String
    /// Claim `iss`.
    package let teamID: String
    /// Claim `iat`, seconds since 1970.
    package let issuedAt: Int64

    package init(keyID: String, teamID: String, issuedAt: Int64) {
        self.keyID = keyID
        self.teamID = teamID
        self.issuedAt = issuedAt
    }
}

/// Checks provider tokens the way APNs does (used by mock-apns on every request).
///
/// A token is `.invalid` (APNs `InvalidProviderToken`) if it is malformed, its `alg` is not ES256, its
/// signature does not verify with `publicKey`, its `kid`/`iss` differ from the configured expected values,
/// or its `iat` lies more than `maxAge` in the future. It is `.expired` (APNs `ExpiredProviderToken`) if
/// `iat` is more than `maxAge` seconds before `now`.
///
/// Verified tokens are remembered in `cache`, so a repeated token costs one dictionary lookup; its age is
/// still checked against `now` on every call. Reasons in `.invalid` never contain token text.
package struct ProviderTokenVerifier: Sendable {
    /// The outcome of `verify`.
    package enum Result: Sendable, Hashable {
        /// Signature, `alg`, `kid`, `iss` and age all fine.
        case valid(ProviderTokenClaims)
        /// APNs `InvalidProviderToken`; `reason` says why, for logs.
        case invalid(reason: String)
        /// APNs `ExpiredProviderToken`: correctly signed, but `iat` is older than `maxAge`.
        case expired(ProviderTokenClaims)

        /// The APNs `reason` string for a rejection, nil when valid.
        package var apnsReason: String? {
            switch self {
            case .valid: return nil
            case .invalid: return Self.invalidReason
            case .expired: return Self.expiredReason
            }
        }

        fileprivate static let invalidReason = "InvalidProviderToken"
        fileprivate static let expiredReason = "ExpiredProviderToken"

        /// True for `.valid`.
        package var isValid: Bool {
            if case .valid = self { return true }
            return false
        }
    }

    /// Tokens longer than this are rejected before any parsing (real ones are about 200 bytes).
    package static let maximumTokenLength = 8192

    package let publicKey: ES256PublicKey
    /// If set, `kid` must equal it.
    package let expectedKeyID: String?
    /// If set, `iss` must equal it.
    package let expectedTeamID: String?
    /// Maximum age of `iat` in seconds (APNs: one hour).
    package let maxAge: Int64
    /// Verified tokens, shared by copies of this verifier.
    package let cache: ProviderTokenVerifierCache

    package init(
        publicKey: ES256PublicKey, expectedKeyID: String? = nil, expectedTeamID: String? = nil,
        maxAge: Int64 = 3600, cacheCapacity: Int = 16
    ) {
        self.publicKey = publicKey
        self.expectedKeyID = expectedKeyID
        self.expectedTeamID = expectedTeamID
        self.maxAge = maxAge
        self.cache = ProviderTokenVerifierCache(capacity: cacheCapacity)
    }

    /// Verifies `jwt` (without the `bearer ` prefix) at time `now` (seconds since 1970).
    package func verify(_ jwt: some StringProtocol, now: Int64) -> Result {
        let token = String(jwt)
        if let claims = cache.claims(forToken: token) { return checkAge(claims, now: now) }
        switch verifyUncached(token) {
        case .success(let claims):
            cache.insert(claims, forToken: token)
            return checkAge(claims, now: now)
        case .failure(let failure):
            return .invalid(reason: failure.reason)
        }
    }

    /// The age check alone, for claims `verify` returned before: what a repeated token needs at a later `now`.
    package func checkAge(_ claims: ProviderTokenClaims, now: Int64) -> Result {
        switch Self.age(issuedAt: claims.issuedAt, now: now, maxAge: maxAge) {
        case .fine: return .valid(claims)
        case .expired: return .expired(claims)
        case .outOfRange: return .invalid(reason: "iat is out of range")
        case .inTheFuture: return .invalid(reason: "iat is more than \(maxAge) s in the future")
        }
    }

    /// `checkAge`'s verdict as APNs's reason only (nil when the age is fine), from the issue time alone: for a
    /// caller that checks the same token on every request and wants no claims or result copied for it.
    package static func ageRejection(issuedAt: Int64, now: Int64, maxAge: Int64) -> String? {
        switch age(issuedAt: issuedAt, now: now, maxAge: maxAge) {
        case .fine: return nil
        case .expired: return Result.expiredReason
        case .outOfRange, .inTheFuture: return Result.invalidReason
        }
    }

    private enum Age { case fine, expired, outOfRange, inTheFuture }

    private static func age(issuedAt: Int64, now: Int64, maxAge: Int64) -> Age {
        let (age, overflow) = now.subtractingReportingOverflow(issuedAt)
        if overflow { return .outOfRange }
        if age > maxAge { return .expired }
        if age < -maxAge { return .inTheFuture }
        return .fine
    }

    private struct Failure: Error {
        let reason: String
        init(_ reason: String) { self.reason = reason }
    }

    /// Full check: structure, JSON, alg, kid/iss against the configuration, signature. Not the age.
    private func verifyUncached(_ token: String) -> Swift.Result<ProviderTokenClaims, Failure> {
        let bytes = token.utf8
        guard !bytes.isEmpty else { return .failure(Failure("token is empty")) }
        guard bytes.count <= Self.maximumTokenLength else {
            return .failure(Failure("token is longer than \(Self.maximumTokenLength) bytes"))
        }
        let parts = bytes.split(separator: UInt8(ascii: "."), maxSplits: 3, omittingEmptySubsequences: false)
        guard parts.count == 3 else {
            return .failure(Failure("token has \(parts.count) dot-separated parts, expected 3"))
        }
        guard let headerJSON = Base64URL.decode(utf8: parts[0]), let header = Self.object(headerJSON) else {
            return .failure(Failure("header is not a base64url-encoded JSON object"))
        }
        guard let claimsJSON = Base64URL.decode(utf8: parts[1]), let claims = Self.object(claimsJSON) else {
            return .failure(Failure("claims are not a base64url-encoded JSON object"))
        }
        guard let signature = Base64URL.decode(utf8: parts[2]) else {
            return .failure(Failure("signature is not base64url"))
        }

        guard let algorithm = header["alg"]?.stringValue else { return .failure(Failure("header has no alg")) }
        guard algorithm == "ES256" else { return .failure(Failure("alg is not ES256")) }
        guard let keyID = header["kid"]?.stringValue, !keyID.isEmpty else {
            return .failure(Failure("header has no kid"))
        }
        guard let teamID = claims["iss"]?.stringValue, !teamID.isEmpty else {
            return .failure(Failure("claims have no iss"))
        }
        // An integer literal: a string, a boolean, a fraction or an exponent form is refused.
        guard let issuedAt = claims["iat"]?.int64Value else {
            return .failure(Failure("claims have no integer iat"))
        }
        if let expectedKeyID, keyID != expectedKeyID {
            return .failure(Failure("kid does not match the configured key ID"))
        }
        if let expectedTeamID, teamID != expectedTeamID {
            return .failure(Failure("iss does not match the configured team ID"))
        }

        guard signature.count == 2 * ECDSASignature.componentLength else {
            return .failure(Failure("signature is \(signature.count) bytes, expected 64 (raw r||s)"))
        }
        guard let der = ECDSASignature.derFromRaw(signature) else {
            return .failure(Failure("signature could not be converted to DER"))
        }
        // Signing input: "<header>.<claims>" exactly as sent.
        let signingInput = Array(bytes[parts[0].startIndex..<parts[1].endIndex])
        let verified = signingInput.withUnsafeBytes { publicKey.verify(derSignature: der, message: $0) }
        guard verified else { return .failure(Failure("signature does not verify with the configured key")) }
        return .success(ProviderTokenClaims(keyID: keyID, teamID: teamID, issuedAt: issuedAt))
    }

    /// A JSON object (FanoutCore's strict parser), or nil for anything else.
    private static func object(_ json: [UInt8]) -> JSONObject? {
        do {
            return try JSONValue.parse(json).objectValue
        } catch {
            return nil
        }
    }
}

/// A small LRU cache of verified provider tokens: token string → claims. Thread-safe.
///
/// Only tokens whose structure, `alg`, `kid`/`iss` and signature checked out are stored, so a hit skips
/// the base64, JSON and ECDSA work. Expiry is not cached: the verifier checks `iat` against `now` on each hit.
package final class ProviderTokenVerifierCache: Sendable {
    private struct Entry {
        var claims: ProviderTokenClaims
        var lastUse: UInt64
    }

    private struct State {
        var entries: [String: Entry] = [:]
        var tick: UInt64 = 0
        var hits = 0
        var misses = 0
    }

    /// Maximum number of remembered tokens (least recently used is evicted first).
    package let capacity: Int
    private let state = FanoutMutex(State())

    package init(capacity: Int = 16) {
        precondition(capacity >= 1, "ProviderTokenVerifierCache capacity must be at least 1")
        self.capacity = capacity
    }

    /// The remembered claims for `token`, or nil (counts a hit or a miss).
    package func claims(forToken token: String) -> ProviderTokenClaims? {
        state.withLock { state in
            state.tick &+= 1
            guard var entry = state.entries[token] else {
                state.misses += 1
                return nil
            }
            state.hits += 1
            entry.lastUse = state.tick
            state.entries[token] = entry
            return entry.claims
        }
    }

    /// Remembers `claims` for `token`, evicting the least recently used token when full.
    package func insert(_ claims: ProviderTokenClaims, forToken token: String) {
        state.withLock { state in
            state.tick &+= 1
            if state.entries[token] == nil, state.entries.count >= capacity,
                let oldest = state.entries.min(by: { $0.value.lastUse < $1.value.lastUse })?.key
            {
                state.entries.removeValue(forKey: oldest)
            }
            state.entries[token] = Entry(claims: claims, lastUse: state.tick)
        }
    }

    /// Lookups answered from the cache.
    package var hitCount: Int { state.withLock { $0.hits } }
    /// Lookups that had to verify.
    package var missCount: Int { state.withLock { $0.misses } }
    /// Tokens currently remembered.
    package var count: Int { state.withLock { $0.entries.count } }

    /// Forgets every token (counters are kept).
    package func removeAll() {
        state.withLock { $0.entries.removeAll() }
    }
}
