import Fanout
import FanoutCore
package import FanoutRedis
package import FanoutTransport
import Foundation

/// One APNs provider token per team for the whole fleet: minted by one worker under a Redis lock, read by the others,
/// and refreshed once by the fleet. Apple allows one new token per team every 20 minutes, not one per process.
///
/// | Key | Type | What |
/// |---|---|---|
/// | `fanout:token:{TEAM}` | hash | `token` (the JWT) and `iat` (its issued-at, seconds since 1970: the team's last mint); expires after an hour |
/// | `fanout:token:{TEAM}:lock` | string | the minting worker's random id, `SET NX PX` (released by compare-and-delete) |
///
/// Both keys carry the team as a hash tag, so the store-and-release script runs on one Redis Cluster slot.
///
/// - **Reading** (`currentToken`, on the engine's loop threads) answers from a local copy and never touches Redis.
/// - **Refreshing** (`refresh`, from `start`, a background task every `pollInterval`, and after a rejection): read the
///   shared token; if there is none but the local copy is not due for a refresh (Redis lost the key: a flush, a
///   restart without persistence), store the local copy back (only if still absent) instead of minting; if there is
///   none and no fresh local copy, or it is `refreshAfter` old, take the lock, read again (another worker may have
///   minted meanwhile), mint with the signer, store the token and release the lock in one script (which stores only
///   while the lock is still ours). A worker that finds the lock taken waits briefly and reads again.
/// - **After a rejection** (`ExpiredProviderToken`, `InvalidProviderToken`), a new token is minted only when the shared
///   token is still the rejected one and is at least `minimumInterval` (20 minutes) old, checked under the lock; else
///   the worker takes whatever the fleet holds. So the fleet mints at most one token per `minimumInterval` per team,
///   however many workers see the rejection.
package final class FleetProviderToken: ProviderTokenSource {
    package struct Options: Sendable {
        /// A shared token this old (seconds) is replaced. Less than 3600 (APNs rejects older tokens).
        package var refreshAfter: Int64 = 3000
        /// Minimum seconds between two mints for the team, also after a rejection.
        package var minimumInterval: Int64 = 1200
        /// How often the background task re-reads the shared token (one HMGET).
        package var pollInterval: Duration = .seconds(10)
        /// The lock's expiry: a worker that dies holding it blocks the others no longer than this.
        package var lockExpiry: Duration = .seconds(5)
        /// How long a worker waits for another's mint before `refresh` fails.
        package var waitForMint: Duration = .seconds(15)
        /// Seconds since 1970 (tests pass a fake clock).
        package var clock: @Sendable () -> Int64 = { ProviderTokenCache.wallClock() }

        package init() {}
    }

    private struct Local {
        var token: String?
        var issuedAt: Int64 = 0
        var refreshingAfterRejection = false
        var mintCount = 0
    }

    private let client: RedisClient
    private let signer: ProviderTokenSigner
    private let options: Options
    private let log: @Sendable (String) -> Void
    private let local = FanoutMutex(Local())
    private let background = FanoutMutex<Task<Void, Never>?>(nil)
    private let tokenKey: RedisArgument
    private let lockKey: RedisArgument

    /// Stores the minted token and releases the lock, only while the lock is still ours (it may have expired during a
    /// slow mint, and another worker may hold it now). KEYS: token hash, lock. ARGV: owner, token, iat, expiry (s).
    /// Returns 1 when stored.
    static let storeAndRelease = RedisScript(
        """
        if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
        redis.call('HSET', KEYS[1], 'token', ARGV[2], 'iat', ARGV[3])
        redis.call('EXPIRE', KEYS[1], ARGV[4])
        redis.call('DEL', KEYS[2])
        return 1
        """)

    /// Stores a token only if the key is absent (Redis lost it): KEYS: token hash. ARGV: token, iat, expiry (s).
    /// Returns 1 when stored.
    static let storeIfAbsent = RedisScript(
        """
        if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
        redis.call('HSET', KEYS[1], 'token', ARGV[1], 'iat', ARGV[2])
        redis.call('EXPIRE', KEYS[1], ARGV[3])
        return 1
        """)

    /// Compare-and-delete: releases the lock only if it is still ours. KEYS: lock. ARGV: owner.
    static let release = RedisScript(
        """
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """)

    /// - Parameters:
    ///   - client: the worker's Redis client (not the one blocked in XREADGROUP).
    ///   - signer: the team's key; its `teamID` names the keys.
    package init(
        client: RedisClient, signer: ProviderTokenSigner, options: Options = Options(),
        log: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.client = client
        self.signer = signer
        self.options = options
        self.log = log
        tokenKey = RedisArgument("fanout:token:{\(signer.teamID)}")
        lockKey = RedisArgument("fanout:token:{\(signer.teamID)}:lock")
    }

    deinit { background.withLock { $0?.cancel() } }

    /// Takes (or mints) the fleet's token, so the first send has one, then keeps the local copy current in the
    /// background until `stop()`.
    /// - Throws: `FleetError` when Redis fails or no token appears within `waitForMint`.
    package func start() async throws(FleetError) {
        try await refresh()
        let interval = options.pollInterval
        let task = Task { [weak self] in
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                guard let self, !Task.isCancelled else { return }
                do throws(FleetError) {
                    try await self.refresh()
                } catch {
                    // The message starts with "provider token: ".
                    self.log("\(error.message); keeping the current one")
                }
            }
        }
        background.withLock { $0 = task }
    }

    /// Stops the background refresh.
    package func stop() {
        background.withLock {
            $0?.cancel()
            $0 = nil
        }
    }

    // MARK: ProviderTokenSource (loop threads)

    package func currentToken() throws -> String {
        guard let token = local.withLock({ $0.token }) else {
            throw FleetError("no provider token yet (the fleet's token source was not started)")
        }
        return token
    }

    package func refreshAfterRejection() {
        // Many streams are rejected at once: one refresh at a time per worker is enough.
        let rejected: String?? = local.withLock { local in
            guard !local.refreshingAfterRejection else { return .none }
            local.refreshingAfterRejection = true
            return .some(local.token)
        }
        guard case .some(let token) = rejected else { return }
        Task {
            defer { local.withLock { $0.refreshingAfterRejection = false } }
            do throws(FleetError) {
                try await refresh(rejected: token)
            } catch {
                log("\(error.message) (refreshing after a rejection)")
            }
        }
    }

    // MARK: Refreshing

    /// How many tokens this worker minted and stored.
    package var mintCount: Int { local.withLock { $0.mintCount } }

    /// `iat` of the local copy; nil before the first refresh.
    package var issuedAt: Int64? { local.withLock { $0.token == nil ? nil : $0.issuedAt } }

    /// Brings the local copy up to date with the fleet's token, minting under the lock when the fleet needs a new one.
    /// - Parameter rejected: the token APNs rejected, for a refresh after a rejection: a new one is minted only when the
    ///   shared token is still this one and at least `minimumInterval` old.
    /// - Returns: the token now held.
    @discardableResult
    package func refresh(rejected: String? = nil) async throws(FleetError) -> String {
        let deadline = ContinuousClock.now + options.waitForMint
        var waits = 0
        do throws(RedisError) {
            while true {
                let now = options.clock()
                let shared = try await readShared()
                if let shared, !needsMint(shared, now: now, rejected: rejected) {
                    return adopt(shared)
                }
                if shared == nil, let held = localCopy(), !needsMint(held, now: now, rejected: rejected) {
                    // Redis lost the shared token (a flush, a restart without persistence) while ours is still fresh:
                    // put ours back rather than mint, since APNs refuses refreshes more often than every 20 minutes
                    // (TooManyProviderTokenUpdates). Stored only if still absent; whatever is there then is adopted.
                    if let restored = try await restore(held, now: now) { return adopt(restored) }
                }
                let owner = UUID().uuidString
                let locked = try await client.command([
                    "SET", lockKey, RedisArgument(owner), "NX", "PX",
                    RedisArgument(Int(milliseconds(options.lockExpiry))),
                ])
                if locked.isOK {
                    if let token = try await mintUnderLock(owner: owner, now: now, rejected: rejected) {
                        return token
                    }
                    // The lock expired during the mint: read again, and take the lock again if needed.
                } else {
                    // Another worker is minting: wait for its token.
                    guard ContinuousClock.now < deadline else {
                        throw RedisError(.timeout, "another worker held the mint lock for \(options.waitForMint)")
                    }
                    waits += 1
                    try? await Task.sleep(for: .milliseconds(min(200, 20 * waits)))
                }
            }
        } catch {
            throw FleetError("provider token: \(error.message)")
        }
    }

    private struct Shared {
        var token: String
        var issuedAt: Int64
    }

    private func readShared() async throws(RedisError) -> Shared? {
        let reply = try await client.command(["HMGET", tokenKey, "token", "iat"])
        guard let values = reply.array, values.count == 2, let token = values[0].string, !token.isEmpty,
            let issuedAt = values[1].integer
        else { return nil }
        return Shared(token: token, issuedAt: issuedAt)
    }

    /// The local copy, nil before the first refresh.
    private func localCopy() -> Shared? {
        local.withLock { local in local.token.map { Shared(token: $0, issuedAt: local.issuedAt) } }
    }

    /// Stores `held` as the shared token if there is none (expiring an hour after its `iat`, as a minted one), and
    /// returns the shared token then: `held`, or another worker's stored meanwhile; nil if there is still none.
    private func restore(_ held: Shared, now: Int64) async throws(RedisError) -> Shared? {
        let expiry = max(1, 3600 - (now - held.issuedAt))
        _ = try await client.evalScript(
            Self.storeIfAbsent, keys: [tokenKey],
            arguments: [RedisArgument(held.token), RedisArgument(Int(held.issuedAt)), RedisArgument(Int(expiry))])
        let shared = try await readShared()
        if shared?.token == held.token {
            log("stored the team's provider token again (iat \(held.issuedAt)): Redis had lost it")
        }
        return shared
    }

    private func needsMint(_ shared: Shared, now: Int64, rejected: String?) -> Bool {
        let age = now - shared.issuedAt
        if age >= options.refreshAfter { return true }
        // Rejected: mint only if nobody has replaced the rejected token yet, and not within the minimum interval.
        if let rejected, shared.token == rejected, age >= options.minimumInterval { return true }
        return false
    }

    /// With the lock held: reads again, mints if still needed, stores and releases. Returns nil when the lock was lost
    /// before the store (nothing stored).
    private func mintUnderLock(owner: String, now: Int64, rejected: String?) async throws(RedisError) -> String? {
        let shared: Shared?
        do {
            shared = try await readShared()
        } catch {
            await releaseLock(owner: owner)
            throw error
        }
        if let shared, !needsMint(shared, now: now, rejected: rejected) {
            await releaseLock(owner: owner)
            return adopt(shared)
        }
        let token: String
        do {
            token = try signer.makeToken(issuedAt: now)
        } catch {
            await releaseLock(owner: owner)
            throw RedisError(.clientError, "cannot sign: \(error)")
        }
        let stored = try await client.evalScript(
            Self.storeAndRelease, keys: [tokenKey, lockKey],
            arguments: [RedisArgument(owner), RedisArgument(token), RedisArgument(Int(now)), 3600])
        guard stored.integer == 1 else { return nil }
        local.withLock { $0.mintCount += 1 }
        log("minted the team's provider token (iat \(now))")
        return adopt(Shared(token: token, issuedAt: now))
    }

    private func releaseLock(owner: String) async {
        _ = try? await client.evalScript(Self.release, keys: [lockKey], arguments: [RedisArgument(owner)])
    }

    /// Keeps the newer of the local copy and `shared`.
    private func adopt(_ shared: Shared) -> String {
        local.withLock { local in
            if local.token == nil || shared.issuedAt >= local.issuedAt {
                local.token = shared.token
                local.issuedAt = shared.issuedAt
            }
            return local.token!
        }
    }
}
