import FanoutPolicy
import FanoutRedis

/// With the registry on Redis, each workspace's API budgets (`rate_limit`, `device_rate_limit`) are one token bucket
/// in Redis for every `fanout serve` on it, instead of one per instance (N instances behind a load balancer would
/// otherwise admit N times the budget). The same model as `RequestQuota`: a bucket of `burst` requests refilled at
/// `requests_per_hour`, in micro-requests, with the server's clock (`TIME`), so the instances' clocks do not matter.
///
/// | Key | Type | What |
/// |---|---|---|
/// | `fanout:quota:{WS}:api`, `fanout:quota:{WS}:devices` | hash | `m` (micro-requests left), `ts` (server µs of the last take); expires once full again |
///
/// A decision costs one script call (about a round trip) per API request. When Redis cannot answer, the instance's
/// own bucket decides (`RequestQuotas`), so requests are not refused for an outage the registry may ride out.
struct SharedRequestQuotas: Sendable {
    private let client: RedisClient

    /// KEYS: the bucket. ARGV: burst, requests per hour, 1 to take a request (0 to only look). Returns {admitted,
    /// remaining, µs to full, µs to one request, server Unix seconds}.
    static let takeScript = RedisScript(
        """
        local scale = 1000000
        local capacity = tonumber(ARGV[1]) * scale
        local perHour = tonumber(ARGV[2])
        local time = redis.call('TIME')
        local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
        local state = redis.call('HMGET', KEYS[1], 'm', 'ts')
        local micro = tonumber(state[1]) or capacity
        local last = tonumber(state[2]) or now
        if now > last then
          micro = math.min(capacity, micro + math.floor((now - last) / 3600 * perHour))
        end
        local admitted = 0
        if micro >= scale then
          admitted = 1
          if ARGV[3] == '1' then micro = micro - scale end
        end
        redis.call('HSET', KEYS[1], 'm', micro, 'ts', now)
        local toFull = math.ceil((capacity - micro) * 3600 / perHour)
        redis.call('PEXPIRE', KEYS[1], math.floor(toFull / 1000) + 1000)
        local toOne = 0
        if micro < scale then toOne = math.ceil((scale - micro) * 3600 / perHour) end
        return {admitted, math.floor(micro / scale), toFull, toOne, tonumber(time[1])}
        """)

    init(client: RedisClient) {
        self.client = client
    }

    /// Takes one request from the workspace's bucket (or, with `taking` false, only looks at it); nil when Redis did
    /// not answer within a second.
    func take(workspace: String, budget: RequestQuotas.Budget, rule: RequestQuotaRule, taking: Bool = true) async
        -> RequestQuotaDecision?
    {
        let key = RedisArgument("fanout:quota:{\(workspace)}:\(budget == .api ? "api" : "devices")")
        guard
            let reply = try? await client.evalScript(
                Self.takeScript, keys: [key],
                arguments: [
                    RedisArgument(rule.burst), RedisArgument(rule.requestsPerHour), RedisArgument(taking ? 1 : 0),
                ], timeout: .seconds(1)),
            let values = reply.array?.compactMap(\.integer), values.count == 5
        else { return nil }
        let admitted = values[0] == 1
        return RequestQuotaDecision(
            admitted: admitted, limit: rule.requestsPerHour, remaining: Int(values[1]),
            resetAtUnixSeconds: values[4] + (values[2] + 999_999) / 1_000_000,
            retryAfterSeconds: admitted ? 0 : max(1, Int((values[3] + 999_999) / 1_000_000)))
    }
}
