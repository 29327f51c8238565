// Update tokens written straight into the registry on Redis (as a bulk import would), for the tests of
// `fanout serve --redis` that need large activities without registering each token through the API.
import FanoutRedis
import FanoutRedisRegistry
import FanoutRegistry

enum RedisActivitySeed {
    /// The test token of `number`: 64 hex digits, distinct per number.
    static func token(_ number: Int) -> String {
        let hex = String(number, radix: 16)
        return "a8" + String(repeating: "0", count: 62 - hex.count) + hex
    }

    /// Registers `count` update tokens of `activity` of the acme app, tokens and devices numbered from `offset`.
    static func register(_ count: Int, activity: String, redisURL: String, offset: Int = 0) async throws {
        let client = RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: redisURL)))
        let store = RedisRegistryStore(client: client)
        for start in stride(from: 0, to: count, by: 10_000) {
            _ = try await store.apply(
                (start..<min(count, start + 10_000)).map { index in
                    .updateToken(
                        UpdateTokenRegistration(
                            app: ServeHarness.acmeApp, activityID: activity, deviceID: "d-\(offset + index)",
                            token: token(offset + index)))
                })
        }
        await client.shutdown()
    }
}
