package import FanoutRedis
import Foundation

/// A live worker's hold on its consumer name: two live workers under one name (`--name`, or the default host-PID that
/// containers on host networking share) would read each other's pending shards and both send them.
///
/// | Key | Type | What |
/// |---|---|---|
/// | `fanout:worker:{NAME}` | string | the holding worker's random id, `SET NX PX` for the worker's `claimIdle` |
///
/// The heartbeat refreshes it (`refreshScript`), and a clean exit deletes it (compare-and-delete). A worker that dies
/// holds it until it expires, after the same `claimIdle` as its shards: then the name is free again, so a worker
/// restarted under it reads that name's pending shards back at once.
package final class FleetWorkerName: Sendable {
    package let name: String
    let key: RedisArgument
    let id: String
    let expiry: Duration

    package static func key(_ name: String) -> String { "fanout:worker:{\(name)}" }

    private init(name: String, expiry: Duration) {
        self.name = name
        key = RedisArgument(Self.key(name))
        id = UUID().uuidString
        self.expiry = expiry
    }

    /// Takes `name` for `expiry` (the worker's `claimIdle`).
    /// - Throws: `FleetError` when another live worker holds the name, or Redis fails.
    package static func claim(_ name: String, expiry: Duration, client: RedisClient) async throws(FleetError)
        -> FleetWorkerName
    {
        let claim = FleetWorkerName(name: name, expiry: expiry)
        let reply: RedisValue
        do {
            reply = try await client.command([
                "SET", claim.key, RedisArgument(claim.id), "NX", "PX", RedisArgument(Int(milliseconds(expiry))),
            ])
        } catch {
            throw FleetError("cannot claim the worker name \(name): \(error.message)")
        }
        guard reply.isOK else {
            throw FleetError(
                "another worker named \(name) is running on this Redis; give each worker its own --name")
        }
        return claim
    }

    /// Extends the hold by `expiry`, or takes the name again if the hold expired meanwhile (Redis hung, or this worker
    /// was cut off). KEYS: the name's key. ARGV: id, expiry (ms). Returns 0 when another worker holds the name.
    static let refreshScript = RedisScript(
        """
        local holder = redis.call('GET', KEYS[1])
        if holder == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
        if holder then return 0 end
        redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
        return 1
        """)

    /// Compare-and-delete: frees the name only while this worker holds it. KEYS: the name's key. ARGV: id.
    static let releaseScript = RedisScript(
        """
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """)

    /// Whether this worker still holds the name (refreshed). - Throws: Redis failures.
    func refresh(client: RedisClient) async throws(RedisError) -> Bool {
        let reply = try await client.evalScript(
            Self.refreshScript, keys: [key], arguments: [RedisArgument(id), RedisArgument(Int(milliseconds(expiry)))])
        return reply.integer != 0
    }

    /// Frees the name at a clean exit, waiting at most `timeout` (with Redis hung, the hold expires instead).
    package func release(client: RedisClient, timeout: Duration) async {
        guard timeout > .zero else { return }
        _ = try? await client.evalScript(
            Self.releaseScript, keys: [key], arguments: [RedisArgument(id)], timeout: timeout)
    }
}
