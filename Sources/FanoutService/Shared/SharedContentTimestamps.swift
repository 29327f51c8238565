import FanoutRedis

/// Content timestamps ordered across every `fanout serve` on one Redis. Each instance claims an activity's next
/// timestamp from one Redis key per activity, `max(at least, last + 1)`, in one script, so two instances never give
/// an activity the same timestamp, or an older one after a newer one was handed out.
///
/// | Key | Type | What |
/// |---|---|---|
/// | `fanout:content-ts:{APP/ACTIVITY}` | string | the greatest timestamp handed out (Unix seconds); expires after a day |
///
/// One key per script, so each runs on one Redis Cluster slot. A day after the last claim "now" is newer anyway
/// (and the registry's last sent timestamp is the floor as well).
struct SharedContentTimestamps: Sendable {
    private let client: RedisClient

    /// KEYS: the activity's key. ARGV: the least acceptable timestamp, the key's expiry (s). Returns the claimed one.
    static let claimScript = RedisScript(
        """
        local last = tonumber(redis.call('GET', KEYS[1]) or '0')
        local claimed = math.max(tonumber(ARGV[1]), last + 1)
        redis.call('SET', KEYS[1], claimed, 'EX', ARGV[2])
        return claimed
        """)

    /// KEYS: the activity's key. ARGV: a timestamp this instance used, the expiry (s). Raises the key to it.
    static let raiseScript = RedisScript(
        """
        local last = tonumber(redis.call('GET', KEYS[1]) or '0')
        if tonumber(ARGV[1]) > last then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
        return 0
        """)

    private static let expirySeconds = 86_400

    init(client: RedisClient) {
        self.client = client
    }

    /// The activity's next timestamp, at least `atLeast`.
    func claim(app: String, activityID: String, atLeast: Int64) async throws(RedisError) -> Int64 {
        let reply = try await client.evalScript(
            Self.claimScript, keys: [Self.key(app: app, activityID: activityID)],
            arguments: [RedisArgument(String(atLeast)), RedisArgument(String(Self.expirySeconds))])
        guard let claimed = reply.integer else {
            throw RedisError(.clientError, "the content timestamp script answered \(reply)")
        }
        return claimed
    }

    /// Records that `timestamp` was used (this instance had to go past what it claimed: two of its own requests for
    /// the activity committed in the other order), so that no instance claims it again.
    func raise(app: String, activityID: String, to timestamp: Int64) async throws(RedisError) {
        _ = try await client.evalScript(
            Self.raiseScript, keys: [Self.key(app: app, activityID: activityID)],
            arguments: [RedisArgument(String(timestamp)), RedisArgument(String(Self.expirySeconds))])
    }

    private static func key(app: String, activityID: String) -> RedisArgument {
        RedisArgument("fanout:content-ts:{\(app)/\(activityID)}")
    }
}
