import FanoutRedis
import FanoutRedisRegistry

/// Content timestamps ordered across every `fanout serve` on one Redis. Each activity's timestamps come from one Redis
/// key, the greatest handed out, and the registry's last sent one is the floor as well: a new one is newer than both,
/// so two instances never give an activity the same timestamp, or an older one after a newer one was handed out.
///
/// | Key | Type | What |
/// |---|---|---|
/// | `fanout:content-ts:{APP/ACTIVITY}` | string | the greatest timestamp handed out (Unix seconds); expires after a day |
///
/// The hash tag is the registry's for the activity (`RedisRegistryStore.activityHashTag`), so the key and the
/// activity's registry metadata (`content`: the last timestamp sent) are in one Redis Cluster slot and each script
/// below reads both. A day after the last claim "now" is newer anyway, and the registry's floor still holds.
///
/// Two ways to take one:
/// - **`claim`**, a round trip of its own: the activity's next timestamp, `max(at least, greatest + 1)`.
/// - **`commitArguments`**, on one Redis (not a cluster): the accept's own commands run in the same script as the
///   claim of a timestamp the instance chose, only if it is newer than both floors. The accept's `202` then waits
///   for one write (and one AOF fsync) instead of two; a stale choice runs nothing, and the caller chooses again
///   past the floor the script answers with.
struct SharedContentTimestamps: Sendable {
    private let client: RedisClient
    private let registry: RedisRegistryStore

    /// KEYS: the activity's key, its registry metadata. ARGV: the least acceptable timestamp, the key's expiry (s).
    /// Returns the claimed one.
    static let claimScript = RedisScript(
        """
        local last = tonumber(redis.call('GET', KEYS[1]) or '0')
        local sent = tonumber(redis.call('HGET', KEYS[2], 'content') or '0')
        local claimed = math.max(tonumber(ARGV[1]), last + 1, sent + 1)
        redis.call('SET', KEYS[1], claimed, 'EX', ARGV[2])
        return claimed
        """)

    /// KEYS: the activity's key, its registry metadata. ARGV: the timestamp to claim, the key's expiry (s), then
    /// commands, each as its count of arguments followed by them. When the timestamp is newer than the greatest
    /// handed out and the last sent, claims it, runs the commands and returns 0; otherwise runs nothing and returns
    /// the greater of the two. The commands' keys are not declared: one Redis only.
    static let commitScript = RedisScript(
        """
        local last = tonumber(redis.call('GET', KEYS[1]) or '0')
        local sent = tonumber(redis.call('HGET', KEYS[2], 'content') or '0')
        local floor = math.max(last, sent)
        if tonumber(ARGV[1]) <= floor then return floor end
        redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
        local i = 3
        while i <= #ARGV do
          local count = tonumber(ARGV[i])
          redis.call(unpack(ARGV, i + 1, i + count))
          i = i + count + 1
        end
        return 0
        """)

    /// KEYS: the activity's key. ARGV: a timestamp this instance used, the expiry (s). Raises the key to it.
    static let raiseScript = RedisScript(
        """
        local last = tonumber(redis.call('GET', KEYS[1]) or '0')
        if tonumber(ARGV[1]) > last then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
        return 0
        """)

    private static let expirySeconds = 86_400

    /// `registry`: the Redis registry on the same data, whose activity metadata holds the last timestamp sent.
    init(client: RedisClient, registry: RedisRegistryStore) {
        self.client = client
        self.registry = registry
    }

    /// The activity's next timestamp, at least `atLeast` and newer than every one handed out or sent.
    func claim(app: String, activityID: String, atLeast: Int64) async throws(RedisError) -> Int64 {
        let reply = try await client.evalScript(
            Self.claimScript, keys: keys(app: app, activityID: activityID),
            arguments: [RedisArgument(String(atLeast)), RedisArgument(String(Self.expirySeconds))])
        guard let claimed = reply.integer else {
            throw RedisError(.clientError, "the content timestamp script answered \(reply)")
        }
        return claimed
    }

    /// `commitScript`'s keys and arguments: `commands` to run with `timestamp` claimed for the activity.
    func commitArguments(_ commands: [[RedisArgument]], claiming timestamp: Int64, app: String, activityID: String)
        -> (keys: [RedisArgument], arguments: [RedisArgument])
    {
        var arguments = [RedisArgument(String(timestamp)), RedisArgument(String(Self.expirySeconds))]
        for command in commands {
            arguments.append(RedisArgument(command.count))
            arguments += command
        }
        return (keys(app: app, activityID: activityID), arguments)
    }

    /// Records that `timestamp` was used (this instance had to go past what it claimed: two of its own requests for
    /// the activity committed in the other order), so that no instance claims it again.
    func raise(app: String, activityID: String, to timestamp: Int64) async throws(RedisError) {
        _ = try await client.evalScript(
            Self.raiseScript, keys: [key(app: app, activityID: activityID)],
            arguments: [RedisArgument(String(timestamp)), RedisArgument(String(Self.expirySeconds))])
    }

    private func keys(app: String, activityID: String) -> [RedisArgument] {
        [key(app: app, activityID: activityID), registry.activityMetaKey(app: app, activityID: activityID)]
    }

    private func key(app: String, activityID: String) -> RedisArgument {
        RedisArgument("fanout:content-ts:" + RedisRegistryStore.activityHashTag(app: app, activityID: activityID))
    }
}
