import FanoutRedis
import FanoutTestSupport
import Foundation
import XCTest

/// The client against a real Redis Cluster started by each test (RedisClusterProcess: redis-server with
/// `--cluster-enabled yes` on free ports, joined by `redis-cli --cluster create`): no mock.
final class RedisClusterTests: XCTestCase {
    // MARK: Slots (no server)

    func testSlotsFollowTheSpecificationsCRC16AndHashTags() {
        XCTAssertEqual(RedisClusterSlot.crc16(Array("123456789".utf8)), 0x31C3)
        XCTAssertEqual(RedisClusterSlot.slot(of: Array("123456789".utf8)), 12739)
        // Only the first {...} with something inside counts.
        let tagged = RedisClusterSlot.slot(of: Array("user1000".utf8))
        XCTAssertEqual(RedisClusterSlot.slot(of: Array("{user1000}.following".utf8)), tagged)
        XCTAssertEqual(RedisClusterSlot.slot(of: Array("{user1000}.followers".utf8)), tagged)
        XCTAssertEqual(
            RedisClusterSlot.slot(of: Array("foo{}{bar}".utf8)), RedisClusterSlot.slot(of: Array("foo{}{bar}".utf8)))
        XCTAssertNotEqual(
            RedisClusterSlot.slot(of: Array("foo{}{bar}".utf8)), RedisClusterSlot.slot(of: Array("bar".utf8)))
        XCTAssertEqual(
            RedisClusterSlot.slot(of: Array("foo{{bar}}zap".utf8)), RedisClusterSlot.slot(of: Array("{bar".utf8)))
        XCTAssertEqual(
            RedisClusterSlot.slot(of: Array("foo{bar}{zap}".utf8)), RedisClusterSlot.slot(of: Array("bar".utf8)))
        XCTAssertEqual(RedisClusterSlot.slot(of: [UInt8]()), 0)
    }

    func testClusterURLs() throws {
        let url = try RedisURL(parsing: "redis+cluster://fanout:s3cr%40t@10.0.0.1:7000,10.0.0.2,[::1]:7002")
        XCTAssertTrue(url.isCluster)
        XCTAssertEqual(
            url.seeds,
            [
                RedisNodeAddress(host: "10.0.0.1", port: 7000), RedisNodeAddress(host: "10.0.0.2", port: 6379),
                RedisNodeAddress(host: "::1", port: 7002),
            ])
        XCTAssertEqual(url.user, "fanout")
        XCTAssertEqual(url.password, "s3cr@t")
        XCTAssertEqual(url.description, "redis+cluster://fanout:***@10.0.0.1:7000,10.0.0.2:6379,[::1]:7002")
        XCTAssertEqual(url.node(url.seeds[2]), RedisURL(host: "::1", port: 7002, user: "fanout", password: "s3cr@t"))
        XCTAssertFalse(try RedisURL(parsing: "redis://h:1").isCluster)
        for bad in ["redis+cluster://h:1/2", "redis://h:1,h:2", "redis+cluster://h:1,", "redis+cluster://"] {
            XCTAssertThrowsError(try RedisURL(parsing: bad), bad) { error in
                XCTAssertEqual((error as? RedisError)?.kind, .invalidURL, bad)
            }
        }
    }

    // MARK: Not a cluster

    func testAClusterURLToAServerWithoutClusterSupportFailsAtTheDeadlineSayingWhy() async throws {
        let server = try RedisServerProcess(for: self)
        try await withClient("redis+cluster://127.0.0.1:\(server.port)") { client in
            let start = ContinuousClock.now
            let error = await redisError { () async throws(RedisError) in
                try await client.command(["GET", "k"], timeout: .milliseconds(500))
            }
            XCTAssertEqual(error?.kind, .unavailable, "\(String(describing: error))")
            XCTAssertTrue(error?.message.contains("cluster support disabled") ?? false, "\(String(describing: error))")
            XCTAssertLessThan(ContinuousClock.now - start, .seconds(2) * testTimeScale)
        }
    }

    func testARefusedPasswordFailsAtOnceAsOnOneServer() async throws {
        let server = try RedisServerProcess(for: self, extra: ["--requirepass", "right"])
        try await withClient("redis+cluster://:wrong@127.0.0.1:\(server.port)") { client in
            let start = ContinuousClock.now
            let error = await redisError { () async throws(RedisError) in
                try await client.command(["GET", "k"], timeout: .seconds(10))
            }
            XCTAssertEqual(error?.kind, .authenticationFailed, "\(String(describing: error))")
            XCTAssertFalse(error?.message.contains("wrong") ?? true)
            XCTAssertLessThan(ContinuousClock.now - start, .seconds(2) * testTimeScale)
        }
    }

    // MARK: A cluster

    func testCommandsPipelinesScriptsAndTransactionsAcrossThreePrimaries() async throws {
        let cluster = try RedisClusterProcess(for: self)
        // The first seed has nothing listening: the map comes from the next.
        let deadSeed = try RedisServerProcess.freeLoopbackPort()
        let url = cluster.url.replacingOccurrences(
            of: "redis+cluster://", with: "redis+cluster://127.0.0.1:\(deadSeed),")
        try await withClient(url) { client in
            // The client's slots are the server's.
            for key in ["123456789", "{user1000}.following", "fanout:job:{j7}:meta", "k\u{00e9}y", "a{}b"] {
                let server = try cluster.cli(cluster.servers[0].port, ["CLUSTER", "KEYSLOT", key])
                XCTAssertEqual(String(RedisClusterSlot.slot(of: Array(key.utf8))), server, key)
            }
            // Keys spread over every primary, one command each.
            for index in 0..<300 {
                let set = try await client.command(["SET", RedisArgument("key:\(index)"), RedisArgument(index)])
                XCTAssertTrue(set.isOK, "\(set)")
            }
            for index in stride(from: 0, to: 300, by: 7) {
                let value = try await client.command(["GET", RedisArgument("key:\(index)")])
                XCTAssertEqual(value.integer, Int64(index))
            }
            let primaries = try cluster.nodes().filter(\.isPrimary)
            XCTAssertEqual(primaries.count, 3)
            var total = 0
            for primary in primaries {
                let size = Int(try cluster.cli(primary.port, ["DBSIZE"])) ?? 0
                XCTAssertGreaterThan(size, 50, "primary \(primary.port) holds \(size) of the 300 keys")
                total += size
            }
            XCTAssertEqual(total, 300)

            // A pipeline across slots and nodes: the replies in the batch's order, an error reply in its place.
            var batch: [[RedisArgument]] = []
            for round in 0..<10 {
                for index in 0..<100 { batch.append(["INCR", RedisArgument("counter:\(index)")]) }
                if round == 4 { batch.append(["INCR", "key:text"]) }
            }
            _ = try await client.command(["SET", "key:text", "text"])
            let replies = try await client.commands(batch)
            XCTAssertEqual(replies.count, batch.count)
            for (position, reply) in replies.enumerated() {
                if position == 500 {
                    guard case .error(let message) = reply else { return XCTFail("\(reply)") }
                    XCTAssertTrue(message.hasPrefix("ERR value is not an integer"), message)
                    continue
                }
                let round = position > 500 ? (position - 1) / 100 : position / 100
                XCTAssertEqual(reply, .integer(Int64(round + 1)), "reply \(position)")
            }
            let reads = try await client.commands((0..<100).map { ["GET", RedisArgument("counter:\($0)")] })
            XCTAssertEqual(reads.map(\.integer), [Int64?](repeating: 10, count: 100))

            // A script on a hash-tagged key: EVALSHA after a NOSCRIPT falls back to EVAL on the key's node.
            let flushed = try await client.command(["SCRIPT", "FLUSH"])
            XCTAssertTrue(flushed.isOK, "\(flushed)")
            let script = RedisScript(
                "redis.call('INCRBY', KEYS[1], ARGV[1]) return redis.call('GET', KEYS[1]) .. ':' .. KEYS[2]")
            let keys: [RedisArgument] = ["fanout:job:{j7}:count", "fanout:job:{j7}:meta"]
            let first = try await client.evalScript(script, keys: keys, arguments: ["5"])
            XCTAssertEqual(first.string, "5:fanout:job:{j7}:meta")
            let second = try await client.evalScript(script, keys: keys, arguments: ["2"])
            XCTAssertEqual(second.string, "7:fanout:job:{j7}:meta")
            // SCRIPT LOAD reaches every primary.
            let loaded = try await client.command(["SCRIPT", "LOAD", RedisArgument(script.source)])
            XCTAssertEqual(loaded.string, script.sha1)
            for primary in primaries {
                XCTAssertEqual(
                    try cluster.cli(primary.port, ["SCRIPT", "EXISTS", script.sha1]), "1", "\(primary.port)")
            }
            // SCRIPT LOAD then EVALSHA in one pipeline (the registry's pattern): each node loads before it runs.
            let other = RedisScript("return redis.call('INCR', KEYS[1])")
            var loadAndRun: [[RedisArgument]] = [["SCRIPT", "LOAD", RedisArgument(other.source)]]
            for index in 0..<30 { loadAndRun.append(["EVALSHA", RedisArgument(other.sha1), 1, "script:\(index)"]) }
            let ran = try await client.commands(loadAndRun)
            XCTAssertEqual(ran[0].string, other.sha1)
            XCTAssertEqual(Array(ran.dropFirst()), Array(repeating: .integer(1), count: 30))
            // A script whose keys are in two slots is refused by Redis.
            let crossScript = await redisError { () async throws(RedisError) in
                try await client.evalScript(script, keys: ["{a}x", "{b}x"], arguments: ["1"])
            }
            XCTAssertEqual(crossScript?.kind, .server)
            XCTAssertTrue(crossScript?.message.hasPrefix("CROSSSLOT") ?? false, "\(String(describing: crossScript))")

            // A transaction in one slot runs on its node; one across slots is refused before anything is sent.
            let transaction = try await client.commands([
                ["MULTI"], ["SET", "{t}a", "1"], ["INCR", "{t}a"], ["EXEC"], ["GET", "{t}a"],
            ])
            XCTAssertEqual(transaction[3], .array([.status("OK"), .integer(2)]))
            XCTAssertEqual(transaction[4].integer, 2)
            let spanning = await redisError { () async throws(RedisError) in
                try await client.commands([["MULTI"], ["SET", "{t}b", "1"], ["SET", "{u}b", "1"], ["EXEC"]])
            }
            XCTAssertEqual(spanning?.kind, .crossSlot)
            XCTAssertTrue(spanning?.message.hasPrefix("CROSSSLOT") ?? false, "\(String(describing: spanning))")
            let unterminated = await redisError { () async throws(RedisError) in
                try await client.commands([["MULTI"], ["SET", "{t}b", "1"]])
            }
            XCTAssertEqual(unterminated?.kind, .unsupported)
            let untouched = try await client.command(["GET", "{t}b"])
            XCTAssertEqual(untouched, .null)

            // A WAIT right after a write goes with it, to the write's node on its connection (WAIT counts the
            // replicas that hold that connection's writes): one per write here, each on the node of its write.
            let waitsBefore = try primaries.map { try commandCalls(cluster, $0.port, "wait") }
            var waitBatch: [[RedisArgument]] = []
            var expectedWaits: [Int: Int] = [:]
            for index in 0..<12 {
                let key = "waited:\(index)"
                waitBatch += [["SET", RedisArgument(key), "1"], ["WAIT", "0", "0"]]
                let node = try cluster.primary(servingSlot: RedisClusterSlot.slot(of: Array(key.utf8)))
                expectedWaits[node.port, default: 0] += 1
            }
            XCTAssertGreaterThan(expectedWaits.count, 1, "the writes are on several primaries")
            let waited = try await client.commands(waitBatch)
            XCTAssertEqual(waited.count, 24)
            for (index, reply) in waited.enumerated() {
                XCTAssertEqual(reply, index % 2 == 0 ? .status("OK") : .integer(0), "reply \(index)")
            }
            for (primary, before) in zip(primaries, waitsBefore) {
                let after = try commandCalls(cluster, primary.port, "wait")
                XCTAssertEqual(after - before, expectedWaits[primary.port] ?? 0, "WAITs on \(primary.port)")
            }

            // Keyless commands go to a node.
            let pong = try await client.command(["PING"])
            XCTAssertEqual(pong, .status("PONG"))
            let time = try await client.command(["TIME"])
            XCTAssertEqual(time.array?.count, 2)
            // FLUSHALL empties every primary.
            let flushedAll = try await client.command(["FLUSHALL"])
            XCTAssertTrue(flushedAll.isOK, "\(flushedAll)")
            for primary in primaries { XCTAssertEqual(try cluster.cli(primary.port, ["DBSIZE"]), "0") }
        }
    }

    func testAskDuringASlotMigrationThenMovedOnceTheSlotHasMoved() async throws {
        let cluster = try RedisClusterProcess(for: self)
        try await withClient(cluster.url) { client in
            let slot = RedisClusterSlot.slot(of: Array("m".utf8))
            let replies = try await client.commands([["SET", "{m}a", "1"], ["SET", "{m}b", "2"]])
            XCTAssertEqual(replies, [.status("OK"), .status("OK")])
            let source = try cluster.primary(servingSlot: slot)
            let destination = try cluster.nodes().first { $0.isPrimary && $0.port != source.port }!
            try cluster.beginSlotMigration(slot, to: destination.port)
            try cluster.migrate(keys: ["{m}a"], from: source.port, to: destination.port)

            // {m}a has moved, {m}b not yet: the source answers ASK for the first and the value for the second.
            let asksBefore = try errorCount(cluster, source.port, "ASK")
            let askingBefore = try commandCalls(cluster, destination.port, "asking")
            let a = try await client.command(["GET", "{m}a"])
            XCTAssertEqual(a.integer, 1)
            let b = try await client.command(["GET", "{m}b"])
            XCTAssertEqual(b.integer, 2)
            // A new key of a migrating slot is written on the destination.
            let set = try await client.command(["SET", "{m}c", "3"])
            XCTAssertTrue(set.isOK, "\(set)")
            // In a pipeline, and a transaction as a whole (its EXEC refused by the source, run on the destination).
            let mixed = try await client.commands([["GET", "{m}a"], ["GET", "{m}b"], ["GET", "{m}c"]])
            XCTAssertEqual(mixed.map(\.integer), [1, 2, 3])
            let transaction = try await client.commands([["MULTI"], ["SET", "{m}d", "4"], ["EXEC"]])
            XCTAssertEqual(transaction[2], .array([.status("OK")]))
            XCTAssertGreaterThanOrEqual(try errorCount(cluster, source.port, "ASK") - asksBefore, 4)
            XCTAssertGreaterThanOrEqual(try commandCalls(cluster, destination.port, "asking") - askingBefore, 4)
            // ASK does not change the client's map: {m}b is still read from the source.
            XCTAssertEqual(Int(try cluster.cli(source.port, ["EXISTS", "{m}b"])), 1)

            // A multi-key command over keys on both sides is answered TRYAGAIN: retried until the deadline...
            let start = ContinuousClock.now
            let busy = await redisError { () async throws(RedisError) in
                try await client.command(["MGET", "{m}a", "{m}b"], timeout: .milliseconds(300))
            }
            XCTAssertEqual(busy?.kind, .timeout, "\(String(describing: busy))")
            XCTAssertTrue(busy?.message.contains("TRYAGAIN") ?? false, "\(String(describing: busy))")
            XCTAssertLessThan(ContinuousClock.now - start, .seconds(2) * testTimeScale)
            // ... and answered once the rest has moved (then ASK sends it to the destination).
            let tryAgainBefore = try errorCount(cluster, source.port, "TRYAGAIN")
            let waiting = Task { () async throws(RedisError) -> RedisValue in
                try await client.command(["MGET", "{m}a", "{m}b"], timeout: .seconds(10))
            }
            try await poll("the MGET answered TRYAGAIN") {
                try errorCount(cluster, source.port, "TRYAGAIN") > tryAgainBefore
            }
            try cluster.migrate(keys: ["{m}b"], from: source.port, to: destination.port)
            let both = try await waiting.value
            XCTAssertEqual(both.array?.map(\.integer), [1, 2])

            // The slot is assigned to the destination: the source answers MOVED, once.
            try cluster.finishSlotMigration(slot, to: destination.port, from: source.port)
            let movedBefore = try errorCount(cluster, source.port, "MOVED")
            let afterMove = try await client.commands([
                ["GET", "{m}a"], ["GET", "{m}b"], ["GET", "{m}c"], ["GET", "{m}d"],
            ])
            XCTAssertEqual(afterMove.map(\.integer), [1, 2, 3, 4])
            for _ in 0..<20 {
                let value = try await client.command(["GET", "{m}b"])
                XCTAssertEqual(value.integer, 2)
            }
            let moved = try errorCount(cluster, source.port, "MOVED") - movedBefore
            XCTAssertGreaterThanOrEqual(moved, 1)
            XCTAssertLessThanOrEqual(moved, 4, "the map was updated after the first MOVED")
            let onDestination = try cluster.cli(destination.port, ["CLUSTER", "COUNTKEYSINSLOT", String(slot)])
            XCTAssertEqual(onDestination, "4")
        }
    }

    func testCommandsGoOnAfterAPrimaryIsKilledAndItsReplicaPromoted() async throws {
        let cluster = try RedisClusterProcess(for: self, replicasPerPrimary: 1, nodeTimeoutMilliseconds: 1000)
        try await withClient(cluster.url) { client in
            let batch = (0..<90).map { ["SET", RedisArgument("key:\($0)"), RedisArgument($0)] as [RedisArgument] }
            let written = try await client.commands(batch)
            XCTAssertTrue(written.allSatisfy(\.isOK))
            // Wait for the replicas to hold what their primaries hold (replication is asynchronous).
            let nodes = try cluster.nodes()
            for replica in nodes where !replica.isPrimary {
                let primary = nodes.first { $0.id == replica.primaryID }!
                try await poll("replica \(replica.port) in sync") {
                    try cluster.cli(replica.port, ["DBSIZE"]) == cluster.cli(primary.port, ["DBSIZE"])
                }
            }
            let slot = RedisClusterSlot.slot(of: Array("key:0".utf8))
            let victim = try cluster.primary(servingSlot: slot)
            let heir = nodes.first { $0.primaryID == victim.id }!

            // A steady stream of INCRs on the victim's slot, before, during and after the failover.
            let counterKey = "{key:0}:counter"
            XCTAssertEqual(RedisClusterSlot.slot(of: Array(counterKey.utf8)), slot)
            let stop = ManagedAtomicFlag()
            let writer = Task { () -> (successes: Int, lost: Int, other: [String]) in
                var successes = 0
                var lost = 0
                var other: [String] = []
                while !stop.isSet {
                    do throws(RedisError) {
                        _ = try await client.command(["INCR", RedisArgument(counterKey)], timeout: .seconds(20))
                        successes += 1
                    } catch {
                        // In flight when the primary died: it may have run, the client says so and does not re-send.
                        if error.kind == .connectionLost { lost += 1 } else { other.append(error.message) }
                    }
                }
                return (successes, lost, other)
            }
            try await poll("INCRs before the kill") {
                (try await client.command(["GET", RedisArgument(counterKey)]).integer ?? 0) >= 100
            }
            let killed = ContinuousClock.now
            cluster.server(port: victim.port)!.kill()

            // Commands on the victim's slots wait for the new primary, within their deadline.
            // The first may be written before the client has read the dead connection's EOF: it fails as lost
            // (it may have run), and the caller, as any caller would, sends it again.
            let value = try await commandSentAgainIfLost(client, ["GET", "key:0"], timeout: .seconds(20))
            let failover = ContinuousClock.now - killed
            XCTAssertEqual(value.integer, 0)
            XCTAssertLessThan(failover, .seconds(20))
            let set = try await client.command(["SET", "key:0", "after"], timeout: .seconds(5))
            XCTAssertTrue(set.isOK)
            // Every key, whichever primary serves it, in one pipeline.
            let reads = try await client.commands((1..<90).map { ["GET", RedisArgument("key:\($0)")] })
            XCTAssertEqual(reads.map(\.integer), (1..<90).map { Int64?(Int64($0)) })
            let afterFailover = try await client.command(["GET", RedisArgument(counterKey)]).integer ?? 0
            try await poll("INCRs after the failover") {
                (try await client.command(["GET", RedisArgument(counterKey)]).integer ?? 0) >= afterFailover + 100
            }
            stop.set()
            let outcome = await writer.value
            XCTAssertEqual(outcome.other, [], "only commands in flight at the kill may fail")
            XCTAssertLessThanOrEqual(outcome.lost, 2)
            XCTAssertGreaterThan(outcome.successes, 0)
            let promoted = try cluster.primary(servingSlot: slot)
            XCTAssertEqual(promoted.port, heir.port, "the victim's replica serves its slots")
            print(
                "failover: GET answered \(failover) after the SIGKILL; \(outcome.successes) INCRs, \(outcome.lost) lost"
            )
        }
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

    /// `command`, sent once more when it fails as lost (it may have run; a read may be sent again).
    private func commandSentAgainIfLost(
        _ client: RedisClient, _ arguments: [RedisArgument], timeout: Duration
    ) async throws(RedisError) -> RedisValue {
        do {
            return try await client.command(arguments, timeout: timeout)
        } catch {
            guard error.kind == .connectionLost else { throw error }
            return try await client.command(arguments, timeout: timeout)
        }
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
    private func poll(_ what: String, seconds: Double = 10, _ condition: () async throws -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while ContinuousClock.now < deadline {
            if try await condition() { return }
            try await Task.sleep(for: .milliseconds(10))
        }
        throw RedisServerError("timed out after \(seconds) s waiting for \(what)")
    }

    /// `calls` of `command` in the node's INFO commandstats (0 when never called).
    private func commandCalls(_ cluster: RedisClusterProcess, _ port: Int, _ command: String) throws -> Int {
        let stats = try cluster.cli(port, ["INFO", "commandstats"])
        for line in stats.split(whereSeparator: \.isNewline) where line.hasPrefix("cmdstat_\(command):") {
            if let field = line.split(separator: ",").first(where: { $0.contains("calls=") }),
                let value = Int(field.split(separator: "=").last ?? "")
            {
                return value
            }
        }
        return 0
    }

    /// How many `prefix` error replies (MOVED, ASK) the node has sent (INFO errorstats).
    private func errorCount(_ cluster: RedisClusterProcess, _ port: Int, _ prefix: String) throws -> Int {
        let stats = try cluster.cli(port, ["INFO", "errorstats"])
        for line in stats.split(whereSeparator: \.isNewline) where line.hasPrefix("errorstat_\(prefix):count=") {
            return Int(line.split(separator: "=").last ?? "") ?? 0
        }
        return 0
    }
}

/// A flag one task sets and another reads.
private final class ManagedAtomicFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    var isSet: Bool { lock.withLock { value } }
    func set() { lock.withLock { value = true } }
}
