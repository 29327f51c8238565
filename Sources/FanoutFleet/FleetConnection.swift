package import FanoutRedis

/// A failure of a fleet command, with the one-line message the CLI prints. `unavailable` (Redis cannot be reached,
/// or the URL is refused) is the CLI's exit status 2.
package struct FleetError: Error, Sendable, CustomStringConvertible {
    package let message: String
    package var description: String { message }

    package init(_ message: String) { self.message = message }
}

/// Opening the fleet's Redis connection: the URL parsed (`rediss://` refused with `RedisURL`'s message), then one PING
/// within `timeout`, so that a wrong address or a server that is down is a clear error at start, not a hang.
package enum FleetConnection {
    /// A client for `url` that has answered PING.
    /// - Parameter commandTimeout: the client's default deadline (a worker's reading client needs one longer than
    ///   its BLOCK).
    /// - Throws: `FleetError` naming the URL (password redacted) and the reason.
    package static func connect(
        _ url: String, commandTimeout: Duration = .seconds(10), pingTimeout: Duration = .seconds(3)
    ) async throws(FleetError) -> RedisClient {
        let parsed: RedisURL
        do {
            parsed = try RedisURL(parsing: url)
        } catch {
            throw FleetError("--redis: \(error.message)")
        }
        var configuration = RedisConfiguration(url: parsed)
        configuration.commandTimeout = commandTimeout
        let client = RedisClient(configuration: configuration)
        do {
            _ = try await client.command(["PING"], timeout: pingTimeout)
        } catch {
            await client.shutdown()
            throw FleetError("cannot reach Redis at \(parsed): \(error.message)")
        }
        return client
    }

    /// Creates the consumer group (and the stream) if they do not exist yet; from the stream's start, so that shards
    /// added before the first worker are read.
    static func ensureGroup(_ client: RedisClient, stream: String = FleetKeys.stream) async throws(RedisError) {
        do {
            _ = try await client.command([
                "XGROUP", "CREATE", RedisArgument(stream), RedisArgument(FleetKeys.group), "0", "MKSTREAM",
            ])
        } catch let error where error.kind == .server && error.message.hasPrefix("BUSYGROUP") {
            // Already there.
        }
    }
}
