import FanoutCore
import Foundation

/// Holds the current APNs provider token and decides when to mint a new one.
///
/// APNs wants a token refreshed no more than once every 20 minutes and no less than once every 60 minutes
/// (too often → 429 `TooManyProviderTokenUpdates`, too old → 403 `ExpiredProviderToken`). This cache mints
/// on first use and again once the token is `refreshAfter` seconds old (default 50 minutes), and never mints
/// twice within `minimumInterval` (default 20 minutes), even when asked to by `forceRefresh`.
///
/// One instance should serve every connection of a team/key. Times are seconds since 1970, passed in
/// explicitly (tests use a fake clock); the overloads without `now` read the wall clock.
package final class ProviderTokenCache: Sendable {
    private struct State {
        var token: String?
        var issuedAt: Int64 = 0
        var mintCount = 0
    }

    /// Signs new tokens.
    package let signer: ProviderTokenSigner
    /// A token this old (seconds) is replaced on the next `currentToken`. Less than 3600.
    package let refreshAfter: Int64
    /// Minimum seconds between two mints, also for `forceRefresh`.
    package let minimumInterval: Int64
    private let state = FanoutMutex(State())

    /// Throws `.invalidArgument` unless 0 < `refreshAfter` < 3600 and 0 ≤ `minimumInterval` ≤ `refreshAfter`.
    package init(signer: ProviderTokenSigner, refreshAfter: Int64 = 3000, minimumInterval: Int64 = 1200) throws {
        guard refreshAfter > 0, refreshAfter < 3600 else {
            throw CryptoError(
                .invalidArgument,
                "refreshAfter must be between 1 and 3599 seconds (APNs rejects tokens older than 3600 s), "
                    + "got \(refreshAfter)")
        }
        guard minimumInterval >= 0, minimumInterval <= refreshAfter else {
            throw CryptoError(
                .invalidArgument,
                "minimumInterval must be between 0 and refreshAfter (\(refreshAfter) s), got \(minimumInterval)")
        }
        self.signer = signer
        self.refreshAfter = refreshAfter
        self.minimumInterval = minimumInterval
    }

    /// Convenience: builds the signer from a key, Key ID and Team ID.
    package convenience init(
        key: ES256PrivateKey, keyID: String, teamID: String, refreshAfter: Int64 = 3000, minimumInterval: Int64 = 1200
    ) throws {
        try self.init(
            signer: ProviderTokenSigner(key: key, keyID: keyID, teamID: teamID), refreshAfter: refreshAfter,
            minimumInterval: minimumInterval)
    }

    /// The token to send at `now`: minted on first use and when the current one is `refreshAfter` old.
    package func currentToken(now: Int64) throws -> String {
        try state.withLock { state in
            if let token = state.token, now - state.issuedAt < refreshAfter { return token }
            return try mint(&state, now: now)
        }
    }

    /// `currentToken(now:)` at the wall-clock time.
    package func currentToken() throws -> String { try currentToken(now: Self.wallClock()) }

    /// Call after APNs answered `ExpiredProviderToken`: mints a new token if `minimumInterval` has passed
    /// since the last mint (or there is none yet), else returns the current token unchanged.
    package func forceRefresh(now: Int64) throws -> String {
        try state.withLock { state in
            if let token = state.token, now - state.issuedAt < minimumInterval { return token }
            return try mint(&state, now: now)
        }
    }

    /// `forceRefresh(now:)` at the wall-clock time.
    package func forceRefresh() throws -> String { try forceRefresh(now: Self.wallClock()) }

    /// How many tokens this cache has minted.
    package var mintCount: Int { state.withLock { $0.mintCount } }

    /// `iat` of the current token, nil before the first mint.
    package var issuedAt: Int64? { state.withLock { $0.token == nil ? nil : $0.issuedAt } }

    /// Seconds since 1970 from the system clock.
    package static func wallClock() -> Int64 { Int64(Date().timeIntervalSince1970) }

    /// Mints while the lock is held, so concurrent callers never mint twice.
    private func mint(_ state: inout State, now: Int64) throws -> String {
        let token = try signer.makeToken(issuedAt: now)
        state.token = token
        state.issuedAt = now
        state.mintCount += 1
        return token
    }
}

extension ProviderTokenCache {
    /// The one cache of this process for `signer`'s key (its Key ID, Team ID and key material): every APNs client
    /// that signs with that key (the engine's loops, the broadcast channel client, a second engine) takes its
    /// token from it, so one token is in use per key at a time and the team's refreshes are one schedule's. Two
    /// caches minted apart, minutes or seconds from each other, are two tokens refreshed twice, which APNs counts as
    /// `TooManyProviderTokenUpdates` within 20 minutes.
    ///
    /// The first cache made for a key sets its schedule; a later caller asking for another `refreshAfter` or
    /// `minimumInterval` gets it as it is (one token per key matters more than whose schedule it follows). Kept only
    /// while a client holds it: a key no client uses any more is forgotten, its signing key with it.
    package static func shared(signer: ProviderTokenSigner, refreshAfter: Int64 = 3000, minimumInterval: Int64 = 1200)
        throws -> ProviderTokenCache
    {
        let key = SharedKey(keyID: signer.keyID, teamID: signer.teamID, publicKey: signer.key.publicKey.pem())
        return try sharedCaches.withLock { caches in
            if let cache = caches[key]?.cache { return cache }
            let cache = try ProviderTokenCache(
                signer: signer, refreshAfter: refreshAfter, minimumInterval: minimumInterval)
            caches = caches.filter { $0.value.cache != nil }
            caches[key] = WeakCache(cache: cache)
            return cache
        }
    }

    /// A key's identity: two keys with one Key ID (a test's, a mistake) sign tokens that verify only with their own.
    private struct SharedKey: Hashable {
        var keyID: String
        var teamID: String
        var publicKey: String
    }

    private struct WeakCache {
        weak var cache: ProviderTokenCache?
    }

    private static let sharedCaches = FanoutMutex<[SharedKey: WeakCache]>([:])
}
