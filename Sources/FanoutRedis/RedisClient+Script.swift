import FanoutTransport

/// A Lua script and its SHA-1, computed once: what `EVALSHA` names it by.
package struct RedisScript: Sendable, Hashable {
    package let source: String
    /// Lowercase hex SHA-1 of `source`'s UTF-8 bytes, as `SCRIPT LOAD` returns it.
    package let sha1: String

    package init(_ source: String) {
        self.source = source
        sha1 = OpenSSLDigest.hex(OpenSSLDigest.sha1(Array(source.utf8)))
    }
}

extension RedisClient {
    /// Runs a Lua script by its SHA-1 (`EVALSHA`), and, when the server does not have it (`NOSCRIPT`: a restarted
    /// server, `SCRIPT FLUSH`, a failover), with its source (`EVAL`, which also caches it for the next call). One
    /// round trip in the usual case; the script's body crosses the network only after a NOSCRIPT.
    ///
    /// - Parameters:
    ///   - keys: the script's `KEYS` (declared, so Redis Cluster can route them).
    ///   - arguments: the script's `ARGV`.
    ///   - timeout: one deadline for both attempts.
    /// - Throws: `RedisError.server` for a script error (its `redis.error_reply`, a runtime error), and the other
    ///   kinds as `command` does.
    package func evalScript(
        _ script: RedisScript, keys: [RedisArgument], arguments: [RedisArgument], timeout: Duration? = nil
    ) async throws(RedisError) -> RedisValue {
        let start = ContinuousClock.now
        let limit = timeout ?? configuration.commandTimeout
        let tail = [RedisArgument(keys.count)] + keys + arguments
        do {
            return try await command(["EVALSHA", RedisArgument(script.sha1)] + tail, timeout: limit)
        } catch let error where error.kind == .server && error.message.hasPrefix("NOSCRIPT") {
            let left = limit - (ContinuousClock.now - start)
            guard left > .zero else {
                throw RedisError(.timeout, "EVAL not sent: the deadline passed while EVALSHA was answered NOSCRIPT")
            }
            return try await command(["EVAL", RedisArgument(script.source)] + tail, timeout: left)
        }
    }

    /// `evalScript`, then `WAIT replicas milliseconds` on the same connection (on a cluster: the node of the keys),
    /// so that the caller knows whether the script's writes reached `replicas` replicas: Redis replication is
    /// asynchronous, and a write a primary acknowledged just before it failed may be missing from the replica that
    /// replaces it. Returns the script's reply and how many replicas acknowledged within `wait`.
    /// - Parameter timeout: one deadline for the whole call; it should exceed `wait`.
    package func evalScript(
        _ script: RedisScript, keys: [RedisArgument], arguments: [RedisArgument], waitingFor replicas: Int,
        within wait: Duration, timeout: Duration? = nil
    ) async throws(RedisError) -> (reply: RedisValue, replicas: Int) {
        let start = ContinuousClock.now
        let limit = timeout ?? configuration.commandTimeout
        let tail = [RedisArgument(keys.count)] + keys + arguments
        let waitCommand: [RedisArgument] = [
            "WAIT", RedisArgument(replicas), RedisArgument(Int(max(1, RedisClient.milliseconds(wait)))),
        ]
        var replies = try await commands(
            [["EVALSHA", RedisArgument(script.sha1)] + tail, waitCommand], timeout: limit)
        if case .error(let message) = replies[0], message.hasPrefix("NOSCRIPT") {
            let left = limit - (ContinuousClock.now - start)
            guard left > .zero else {
                throw RedisError(.timeout, "EVAL not sent: the deadline passed while EVALSHA was answered NOSCRIPT")
            }
            replies = try await commands([["EVAL", RedisArgument(script.source)] + tail, waitCommand], timeout: left)
        }
        if case .error(let message) = replies[0] { throw RedisError.server(message) }
        if case .error(let message) = replies[1] { throw RedisError.server(message) }
        return (replies[0], Int(replies[1].integer ?? 0))
    }

    /// `evalScript` for a script given as source (its SHA-1 is computed on each call; keep a `RedisScript` for a
    /// script run often).
    package func evalScript(
        _ source: String, keys: [RedisArgument], arguments: [RedisArgument], timeout: Duration? = nil
    ) async throws(RedisError) -> RedisValue {
        try await evalScript(RedisScript(source), keys: keys, arguments: arguments, timeout: timeout)
    }
}
