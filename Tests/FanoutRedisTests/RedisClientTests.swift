import FanoutRedis
import FanoutTestSupport
import Foundation
import XCTest

/// The client against a real redis-server started by each test (RedisServerProcess): no mock.
final class RedisClientTests: XCTestCase {
    // MARK: Commands

    func testSetAndGetAreBinarySafe() async throws {
        let server = try RedisServerProcess(for: self)
        try await withClient(server.url) { client in
            let key = RedisArgument(bytes: [0x6B, 0x00, 0xFF, 0x0D, 0x0A])
            let value = Array(0...255).map(UInt8.init) + Array("\r\n$-1\r\n\0".utf8)
            let set = try await client.command(["SET", key, RedisArgument(bytes: value)])
            XCTAssertTrue(set.isOK, "\(set)")
            try await expect(client, ["GET", key], .bytes(value))
            try await expect(client, ["STRLEN", key], .integer(Int64(value.count)))
            try await expect(client, ["GET", "missing"], .null)
            try await expect(client, ["SET", "empty", ""], .status("OK"))
            try await expect(client, ["GET", "empty"], .bytes([]))
            let multiple = try await client.command(["MGET", key, "missing", "empty"])
            XCTAssertEqual(multiple, .array([.bytes(value), .null, .bytes([])]))
        }
    }

    func testPipelineOfTenThousandIncrementsInOneCall() async throws {
        let server = try RedisServerProcess(for: self)
        try await withClient(server.url) { client in
            let batch = Array(repeating: ["INCR", "counter"] as [RedisArgument], count: 10_000)
            let start = ContinuousClock.now
            let replies = try await client.commands(batch)
            let elapsed = ContinuousClock.now - start
            XCTAssertEqual(replies.count, 10_000)
            XCTAssertEqual(replies, (1...10_000).map { RedisValue.integer(Int64($0)) }, "replies in order")
            let counter = try await client.command(["GET", "counter"]).integer
            XCTAssertEqual(counter, 10_000)
            XCTAssertLessThan(elapsed, .seconds(3) * testTimeScale, "10,000 pipelined INCRs took \(elapsed)")
        }
    }

    func testServerErrorIsThrownByCommandAndKeptInPlaceInAPipeline() async throws {
        let server = try RedisServerProcess(for: self)
        try await withClient(server.url) { client in
            let error = await redisError { () async throws(RedisError) in
                try await client.command(["NOSUCHCOMMAND", "x"])
            }
            XCTAssertEqual(error?.kind, .server)
            XCTAssertTrue(error?.message.hasPrefix("ERR unknown command") ?? false, "\(String(describing: error))")

            let replies = try await client.commands([["SET", "k", "text"], ["INCR", "k"], ["GET", "k"]])
            XCTAssertEqual(replies[0], .status("OK"))
            guard case .error(let message) = replies[1] else { return XCTFail("\(replies[1])") }
            XCTAssertTrue(message.hasPrefix("ERR value is not an integer"), message)
            XCTAssertEqual(replies[2], .bytes(Array("text".utf8)))
            // The connection is still usable.
            try await expect(client, ["PING"], .status("PONG"))
        }
    }

    // MARK: AUTH and SELECT

    func testAuthWithRequirePass() async throws {
        let password = "correct horse battery staple"
        let server = try RedisServerProcess(for: self, extra: ["--requirepass", password])
        let encoded = "correct%20horse%20battery%20staple"
        try await withClient("redis://:\(encoded)@127.0.0.1:\(server.port)") { client in
            try await expect(client, ["PING"], .status("PONG"))
        }
        // Redis 6 ACL form: AUTH default <password>.
        try await withClient("redis://default:\(encoded)@127.0.0.1:\(server.port)") { client in
            try await expect(client, ["SET", "k", "v"], .status("OK"))
        }
        // A wrong password fails fast (not at the 5 s deadline), and neither password is in the error.
        try await withClient("redis://:wrong-secret-42@127.0.0.1:\(server.port)") { client in
            let start = ContinuousClock.now
            let error = await redisError { () async throws(RedisError) in try await client.command(["PING"]) }
            XCTAssertEqual(error?.kind, .authenticationFailed, "\(String(describing: error))")
            XCTAssertLessThan(ContinuousClock.now - start, .seconds(2) * testTimeScale)
            let text = "\(String(describing: error)) \(error?.message ?? "")"
            XCTAssertFalse(text.contains("wrong-secret-42"), text)
            XCTAssertFalse(text.contains("horse"), text)
            XCTAssertTrue(text.contains("AUTH refused"), text)
        }
        // No password at all: the server's NOAUTH reply, thrown as a server error.
        try await withClient(server.url) { client in
            let error = await redisError { () async throws(RedisError) in try await client.command(["GET", "k"]) }
            XCTAssertEqual(error?.kind, .server)
            XCTAssertTrue(error?.message.hasPrefix("NOAUTH") ?? false, "\(String(describing: error))")
        }
    }

    func testSelectsTheURLsDatabase() async throws {
        let server = try RedisServerProcess(for: self)
        try await withClient(server.url + "/3") { client in
            try await expect(client, ["SET", "where", "three"], .status("OK"))
            let info = try await client.command(["CLIENT", "INFO"]).string ?? ""
            XCTAssertTrue(info.contains(" db=3 "), info)
        }
        try await withClient(server.url) { client in
            try await expect(client, ["GET", "where"], .null)
            try await expect(client, ["SELECT", "3"], .status("OK"))
            let selected = try await client.command(["GET", "where"]).string
            XCTAssertEqual(selected, "three")
        }
    }

    // MARK: Deadlines and connection loss

    func testTimeoutFailsInTimeDropsTheConnectionAndTheClientRecovers() async throws {
        let server = try RedisServerProcess(for: self)
        try await withClient(server.url) { client in
            let before = try await client.command(["CLIENT", "ID"]).integer
            let start = ContinuousClock.now
            let error = await redisError { () async throws(RedisError) in
                try await client.command(["BLPOP", "nothing-here", "5"], timeout: .milliseconds(300))
            }
            let elapsed = ContinuousClock.now - start
            XCTAssertEqual(error?.kind, .timeout, "\(String(describing: error))")
            XCTAssertTrue(error?.message.contains("BLPOP") ?? false, "\(String(describing: error))")
            XCTAssertGreaterThanOrEqual(elapsed, .milliseconds(280))
            XCTAssertLessThan(elapsed, .milliseconds(1500) * testTimeScale, "the timeout fired late: \(elapsed)")
            // The next command goes through on a new connection.
            try await expect(client, ["PING"], .status("PONG"))
            let after = try await client.command(["CLIENT", "ID"]).integer
            XCTAssertNotEqual(before, after, "the timed-out connection was dropped")
        }
    }

    func testCommandsWaitForAConnectionUpToTheirDeadline() async throws {
        let port = try RedisServerProcess.freeLoopbackPort()
        try await withClient("redis://127.0.0.1:\(port)") { client in
            // Nothing listens yet: a short deadline fails as unavailable, naming the last connection error.
            let error = await redisError { () async throws(RedisError) in
                try await client.command(["PING"], timeout: .milliseconds(200))
            }
            XCTAssertEqual(error?.kind, .unavailable, "\(String(describing: error))")
            XCTAssertTrue(error?.message.contains("127.0.0.1:\(port)") ?? false, "\(String(describing: error))")
            // The refused connect was seen as such at once (hiredis 0.14's own libuv adapter ignores the poll error
            // and would still be "connecting" here, until the 2 s connect timeout).
            XCTAssertTrue(error?.message.contains("refused") ?? false, "\(String(describing: error))")
            // A command issued now waits; the server comes up; the command is sent and answered at the next
            // reconnection attempt (backoff at most 1 s).
            let waiting = Task { () async throws(RedisError) -> RedisValue in
                try await client.command(["SET", "late", "yes"], timeout: .seconds(8))
            }
            _ = try RedisServerProcess(for: self, port: port)
            let started = ContinuousClock.now
            let late = try await waiting.value
            XCTAssertEqual(late, .status("OK"))
            XCTAssertLessThan(ContinuousClock.now - started, .milliseconds(1500) * testTimeScale)
        }
    }

    func testReconnectsAfterTheServerIsKilledAndRestartedWithItsData() async throws {
        let server = try RedisServerProcess(for: self, appendOnly: true)
        try await withClient(server.url) { client in
            let writes = (0..<100).map {
                ["SET", RedisArgument("key:\($0)"), RedisArgument("value:\($0)")] as [RedisArgument]
            }
            let allWritten = try await client.commands(writes).allSatisfy(\.isOK)
            XCTAssertTrue(allWritten)
            try await expect(client, ["INCRBY", "total", "41"], .integer(41))

            server.kill()
            // Down: a command with a short deadline fails (unavailable, or connection lost when it was written
            // before the client saw the close).
            let down = await redisError { () async throws(RedisError) in
                try await client.command(["PING"], timeout: .milliseconds(200))
            }
            XCTAssertTrue(
                [RedisError.Kind.unavailable, .connectionLost].contains(down?.kind), "\(String(describing: down))")

            try server.restart()
            // The client reconnects by itself (backoff at most 1 s); every write acknowledged before the kill is
            // back from the AOF (appendfsync always).
            let value = try await client.command(["INCRBY", "total", "1"], timeout: .seconds(5))
            XCTAssertEqual(value, .integer(42))
            let reads = try await client.commands((0..<100).map { ["GET", RedisArgument("key:\($0)")] })
            XCTAssertEqual(reads, (0..<100).map { .bytes(Array("value:\($0)".utf8)) })
        }
    }

    func testReadonlyRepliesAreRetriedUntilTheDeadline() async throws {
        let primary = try RedisServerProcess(for: self)
        let replica = try RedisServerProcess(for: self, extra: ["--replicaof", "127.0.0.1", String(primary.port)])
        try await withClient(replica.url) { client in
            // A replica answers writes READONLY: retried until the deadline, then a timeout naming the answer.
            let start = ContinuousClock.now
            let error = await redisError { () async throws(RedisError) in
                try await client.command(["SET", "k", "v"], timeout: .milliseconds(400))
            }
            XCTAssertEqual(error?.kind, .timeout, "\(String(describing: error))")
            XCTAssertTrue(error?.message.contains("READONLY") ?? false, "\(String(describing: error))")
            XCTAssertGreaterThanOrEqual(ContinuousClock.now - start, .milliseconds(380))

            // Promoted while a write is being retried: the write then succeeds.
            let write = Task { () async throws(RedisError) -> RedisValue in
                try await client.command(["SET", "k", "after-failover"], timeout: .seconds(8))
            }
            try await withClient(replica.url) { admin in
                let refusedBefore = try await readonlyErrors(admin)
                try await poll("the write to be refused READONLY again") {
                    try await readonlyErrors(admin) > refusedBefore
                }
                let promoted = try await admin.command(["REPLICAOF", "NO", "ONE"]).isOK
                XCTAssertTrue(promoted)
            }
            let written = try await write.value
            XCTAssertEqual(written, .status("OK"))
            let afterFailover = try await client.command(["GET", "k"]).string
            XCTAssertEqual(afterFailover, "after-failover")
        }
    }

    func testLoadingRepliesAreRetriedUntilTheDatasetIsLoaded() async throws {
        let server = try RedisServerProcess(for: self)
        var configuration = RedisConfiguration(url: try RedisURL(parsing: server.url))
        configuration.reconnectBackoff = (.milliseconds(10), .milliseconds(50))
        let client = RedisClient(configuration: configuration)
        do {
            let keys = 5_000
            let writes = (0..<keys).map {
                ["SET", RedisArgument("key:\($0)"), RedisArgument("value:\($0)")] as [RedisArgument]
            }
            let written = try await client.commands(writes)
            XCTAssertTrue(written.allSatisfy(\.isOK))
            try await expect(client, ["SAVE"], .status("OK"))
            server.kill()
            // 100 µs per key (Redis's key-load-delay, at least): about a second of loading, during which the server answers
            // LOADING (it serves its clients every 1 KiB of the file loaded, not the default 2 MiB).
            let firstAnswer = try server.restart(extra: [
                "--key-load-delay", "100", "--loading-process-events-interval-bytes", "1024",
            ])
            XCTAssertTrue(firstAnswer.hasPrefix("-LOADING"), "the server was not loading: \(firstAnswer)")
            let reply = try await client.command(["GET", "key:\(keys - 1)"], timeout: .seconds(8))
            XCTAssertEqual(reply.string, "value:\(keys - 1)")
            // The client was answered LOADING at least once (the readiness probe's one PING is the other).
            let stats = try await client.command(["INFO", "errorstats"]).string ?? ""
            let loading = stats.split(whereSeparator: \.isNewline).first { $0.hasPrefix("errorstat_LOADING:count=") }
            XCTAssertGreaterThanOrEqual(Int(loading?.split(separator: "=").last ?? "") ?? 0, 2, stats)
        } catch {
            await client.shutdown()
            throw error
        }
        await client.shutdown()
    }

    // MARK: Scripts

    func testEvalScriptFallsBackToEvalOnNoScriptThenUsesEvalSha() async throws {
        let server = try RedisServerProcess(for: self)
        try await withClient(server.url) { client in
            let script = RedisScript("return {KEYS[1], ARGV[1], redis.call('INCRBY', KEYS[1], ARGV[1])}")
            let flushed = try await client.command(["SCRIPT", "FLUSH"]).isOK
            XCTAssertTrue(flushed)
            try await expect(client, ["CONFIG", "RESETSTAT"], .status("OK"))

            let first = try await client.evalScript(script, keys: ["budget"], arguments: ["5"])
            XCTAssertEqual(first, .array([.bytes(Array("budget".utf8)), .bytes(Array("5".utf8)), .integer(5)]))
            let evalshaCalls = try await commandCalls(client, "evalsha")
            XCTAssertEqual(evalshaCalls, 1)
            let evalCalls = try await commandCalls(client, "eval")
            XCTAssertEqual(evalCalls, 1, "EVAL after NOSCRIPT")

            let second = try await client.evalScript(script.source, keys: ["budget"], arguments: ["2"])
            XCTAssertEqual(second.array?.last, .integer(7))
            let evalshaCallsAfter = try await commandCalls(client, "evalsha")
            XCTAssertEqual(evalshaCallsAfter, 2)
            let evalCallsAfter = try await commandCalls(client, "eval")
            XCTAssertEqual(evalCallsAfter, 1, "the script is cached now: no EVAL")

            let failing = await redisError { () async throws(RedisError) in
                try await client.evalScript("return redis.error_reply('BUDGET exhausted')", keys: [], arguments: [])
            }
            XCTAssertEqual(failing?.kind, .server)
            XCTAssertEqual(failing?.message, "BUDGET exhausted")
        }
    }

    // MARK: Shutdown

    func testShutdownFailsPendingCommands() async throws {
        let server = try RedisServerProcess(for: self)
        let client = try RedisClient(url: server.url)
        try await expect(client, ["PING"], .status("PONG"))
        let blocked = Task { () async throws(RedisError) -> RedisValue in
            try await client.command(["BLPOP", "never", "20"], timeout: .seconds(30))
        }
        try await withClient(server.url) { observer in
            try await poll("the BLPOP to block on the server") {
                let info = try await observer.command(["INFO", "clients"]).string ?? ""
                return info.contains("blocked_clients:1")
            }
        }
        let start = ContinuousClock.now
        await client.shutdown()
        var error: RedisError?
        do {
            _ = try await blocked.value
        } catch let thrown {
            error = thrown as? RedisError
        }
        XCTAssertEqual(error?.kind, .shutdown, "\(String(describing: error))")
        XCTAssertLessThan(ContinuousClock.now - start, .seconds(2) * testTimeScale)
        let after = await redisError { () async throws(RedisError) in try await client.command(["PING"]) }
        XCTAssertEqual(after?.kind, .shutdown)
        await client.shutdown()  // idempotent
    }

    // MARK: Helpers

    private func withClient(_ url: String, _ body: (RedisClient) async throws -> Void) async throws {
        let client = try RedisClient(url: url)
        do {
            try await body(client)
        } catch {
            await client.shutdown()
            throw error
        }
        await client.shutdown()
    }

    /// Sends `arguments` and checks the reply.
    private func expect(
        _ client: RedisClient, _ arguments: [RedisArgument], _ expected: RedisValue, file: StaticString = #filePath,
        line: UInt = #line
    ) async throws {
        let reply = try await client.command(arguments)
        XCTAssertEqual(reply, expected, file: file, line: line)
    }

    private func redisError<T>(_ body: () async throws(RedisError) -> T) async -> RedisError? {
        do {
            _ = try await body()
            return nil
        } catch {
            return error
        }
    }

    /// Polls `condition` every 10 ms until it holds, failing after `seconds`.
    private func poll(_ what: String, seconds: Double = 5, _ condition: () async throws -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while ContinuousClock.now < deadline {
            if try await condition() { return }
            try await Task.sleep(for: .milliseconds(10))
        }
        throw RedisServerError("timed out after \(seconds) s waiting for \(what)")
    }

    /// `calls` of `command` in INFO commandstats (0 when never called).
    private func commandCalls(_ client: RedisClient, _ command: String) async throws -> Int {
        let stats = try await client.command(["INFO", "commandstats"]).string ?? ""
        for line in stats.split(whereSeparator: \.isNewline) where line.hasPrefix("cmdstat_\(command):") {
            if let field = line.split(separator: ",").first(where: { $0.contains("calls=") }),
                let value = Int(field.split(separator: "=").last ?? "")
            {
                return value
            }
        }
        return 0
    }

    /// How many READONLY error replies the server has sent (INFO errorstats).
    private func readonlyErrors(_ client: RedisClient) async throws -> Int {
        let stats = try await client.command(["INFO", "errorstats"]).string ?? ""
        for line in stats.split(whereSeparator: \.isNewline) where line.hasPrefix("errorstat_READONLY:count=") {
            return Int(line.split(separator: "=").last ?? "") ?? 0
        }
        return 0
    }
}
