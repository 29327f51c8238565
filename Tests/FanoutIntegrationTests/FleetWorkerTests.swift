// `FleetWorker` in process (the worker `fanout worker` runs), against a real redis-server and in-process mock-apns:
// what a stop does while every shard slot is busy, and what is sent for a job id enqueued again after its keys were
// deleted. FleetTests runs the `fanout` binary end to end; these look at one worker's behaviour closely.
import Fanout
import FanoutCore
import FanoutRedis
import FanoutTestSupport
import Foundation
import XCTest

@testable import FanoutFleet

final class FleetWorkerTests: XCTestCase {
    /// One worker on its own engine and Redis clients, with `run()` going in a task.
    private final class RunningWorker: Sendable {
        let worker: FleetWorker
        let engine: FanoutEngine
        private let clients: [RedisClient]
        private let task: Task<Void, Never>
        private let returnedFlag: ReturnedFlag

        private final class ReturnedFlag: Sendable {
            let value = FanoutMutex(false)
        }

        /// Whether `run()` has returned.
        var hasReturned: Bool { returnedFlag.value.withLock { $0 } }

        init(worker: FleetWorker, engine: FanoutEngine, clients: [RedisClient]) {
            self.worker = worker
            self.engine = engine
            self.clients = clients
            let flag = ReturnedFlag()
            returnedFlag = flag
            task = Task {
                _ = try? await worker.run()
                flag.value.withLock { $0 = true }
            }
        }

        /// Stops the worker and ends what its engine still holds (so a worker that ignores the stop returns too),
        /// then closes its clients.
        func shutdown() async {
            worker.stop()
            await engine.shutdown(gracePeriod: .zero)
            await task.value
            for client in clients { await client.shutdown() }
        }
    }

    private func startWorker(
        _ name: String, mock: MockHarness, redis: RedisServerProcess,
        configure: (inout FleetWorkerOptions) -> Void = { _ in }
    ) async throws -> RunningWorker {
        var options = FleetWorkerOptions(name: name)
        options.claimIdle = .seconds(1)
        configure(&options)
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let writer = try await FleetConnection.connect(redis.url)
        let reader = try await FleetConnection.connect(redis.url, commandTimeout: options.block + .seconds(10))
        let worker = FleetWorker(
            engine: engine, reader: reader, writer: writer, options: options, log: { print("[\(name)] \($0)") })
        return RunningWorker(worker: worker, engine: engine, clients: [reader, writer])
    }

    /// An alert job of `tokens` at `priority` whose alert is `alert`.
    private static func jobLine(id: String, priority: Int, alert: String, tokens: [String]) -> String {
        let list = tokens.map { "\"\($0)\"" }.joined(separator: ", ")
        return
            #"{"id": "\#(id)", "topic": "com.example.app", "push_type": "alert", "priority": \#(priority), "payload": {"aps": {"alert": "\#(alert)"}}, "tokens": [\#(list)]}"#
    }

    /// Enqueues `lines` with `FleetEnqueuer`, as `fanout enqueue` does, and checks every one was enqueued.
    private func enqueue(_ lines: [String], redis: RedisServerProcess, shardSize: Int = 1_000) async throws {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "fleet-worker")
        let path = "\(directory)/jobs-\(UUID().uuidString).jsonl"
        try (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: true, encoding: .utf8)
        let client = try await FleetConnection.connect(redis.url)
        var reports: [FleetEnqueuer.Report] = []
        do {
            try await FleetEnqueuer(client: client, shardSize: shardSize).enqueue(jobsPath: path) { reports.append($0) }
        } catch {
            await client.shutdown()
            throw error
        }
        await client.shutdown()
        XCTAssertEqual(reports.count, lines.count)
        for report in reports {
            guard case .enqueued = report else { return XCTFail("not enqueued: \(report)") }
        }
    }

    /// Waits (at most `timeout`) for `job` to be done; returns its status then, or nil if it was not done in time.
    private func waitUntilDone(_ job: String, client: RedisClient, timeout: Duration = .seconds(30)) async throws
        -> FleetReader.JobStatus?
    {
        let deadline = ContinuousClock.now + timeout * testTimeScale
        while ContinuousClock.now < deadline {
            if let status = try await FleetReader(client: client).status(job: job), status.isDone { return status }
            try await Task.sleep(for: .milliseconds(50))
        }
        return nil
    }

    /// The job's results lines, parsed, in job order.
    private func results(_ job: String, client: RedisClient) async throws -> [[String: Any]] {
        var output: [UInt8] = []
        _ = try await FleetReader(client: client).writeResults(job: job) { output += $0 }
        return try String(decoding: output, as: UTF8.self).split(separator: "\n").map { line in
            try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        }
    }

    /// README: on SIGTERM the worker "reads no more shards and lets the ones it is sending finish (within 10 s)", and
    /// what is not finished is left pending for another worker. With every slot held by a shard whose streams the
    /// mock never answers, the stop must still be seen at once: `run()` returns after the grace period, not after the
    /// shard's requests time out. The shard is left unacknowledged with nothing written, and another worker claims it
    /// and sends each of its tokens once.
    func testAStopWhileEverySlotIsBusyReturnsAfterTheGraceAndLeavesTheShardToAnotherWorker() async throws {
        let redis = try RedisServerProcess(for: self)
        let holding = try MockHarness { $0.blackholeEvery = 1 }
        defer { holding.stop() }
        let answering = try MockHarness()
        defer { answering.stop() }
        let client = try await FleetConnection.connect(redis.url)
        let tokens = (0..<3).map { testDeviceToken($0) }
        try await enqueue([Self.jobLine(id: "held", priority: 10, alert: "hi", tokens: tokens)], redis: redis)

        let grace = Duration.seconds(1)
        let first = try await startWorker("first", mock: holding, redis: redis) {
            $0.concurrentShards = 1
            $0.stopGrace = grace
        }
        // Its one slot is busy: the shard's first stream is held by the mock (the engine's request timeout, 30 s,
        // is far off).
        let busy = await eventually { holding.stats.snapshot()["streams_blackholed"] as? Int ?? 0 >= 1 }
        XCTAssertTrue(busy, "the shard never reached the mock")
        let stoppedAt = ContinuousClock.now
        first.worker.stop()
        let margin = Duration.seconds(2) * testTimeScale
        let returned = await eventually(timeout: grace + margin) { first.hasReturned }
        let elapsed = ContinuousClock.now - stoppedAt
        await first.shutdown()
        XCTAssertTrue(returned, "run() had not returned \(elapsed) after stop() with a grace of \(grace)")
        guard returned else { return await client.shutdown() }
        XCTAssertGreaterThanOrEqual(elapsed, grace, "the shard being sent got its grace period")

        // Left pending, and nothing of it written: a cancelled notification is not a result.
        let pending = try await client.command(["XPENDING", RedisArgument(FleetKeys.stream), "fanout-workers"])
        XCTAssertEqual(pending.array?.first, .integer(1), "\(pending)")
        let unfinished = try await FleetReader(client: client).status(job: "held")
        XCTAssertEqual(unfinished?.shardsDone, 0)
        XCTAssertEqual(unfinished?.counts.outcomes.delivered, 0)
        XCTAssertEqual(unfinished?.counts.outcomes.failed, 0)
        XCTAssertEqual(unfinished?.counts.outcomes.cancelled, 0)

        // Another worker claims it once it is idle past --claim-idle, and sends each token once.
        let second = try await startWorker("second", mock: answering, redis: redis)
        let done = try await waitUntilDone("held", client: client)
        await second.shutdown()
        XCTAssertNotNil(done, "the second worker did not finish the shard")
        XCTAssertEqual(done?.counts.outcomes.delivered, tokens.count)
        XCTAssertEqual(done?.counts.outcomes.failed, 0)
        let lines = try await results("held", client: client)
        XCTAssertEqual(lines.compactMap { $0["token"] as? String }, tokens, "one result per token, in job order")
        XCTAssertEqual(
            lines.compactMap { $0["outcome"] as? String }, Array(repeating: "delivered", count: tokens.count))
        XCTAssertEqual(answering.stats.accepted, tokens.count)
        XCTAssertEqual(answering.stats.snapshot()["distinct_tokens"] as? Int, tokens.count)
        await client.shutdown()
    }

    /// Redis replication is asynchronous: a failover can lose results the old primary had acknowledged. The loss is
    /// made here on one redis-server: the shard's marks, results and counts are saved while it sends, and put back (in
    /// one transaction) a while later, before it completes, as if the replica that took over had only the saved copy.
    /// The completion finds fewer marks than the worker wrote and is refused; the worker sends the lost positions
    /// again, and every token ends with one result and one count. (Without the check the shard completed with those
    /// positions missing from its results.)
    func testResultsLostInAFailoverAreSentAgainBeforeTheShardCompletes() async throws {
        let redis = try RedisServerProcess(for: self)
        // 10 streams at a time, 20 ms each: about 500 notifications a second, so the shard sends for about 4 s.
        let mock = try MockHarness {
            $0.maxStreams = 10
            $0.latencyMilliseconds = 20
            $0.capturePayloads = true
        }
        defer { mock.stop() }
        let client = try await FleetConnection.connect(redis.url)
        let tokens = (0..<2_000).map { testDeviceToken($0) }
        try await enqueue(
            [Self.jobLine(id: "lossy", priority: 10, alert: "hi", tokens: tokens)], redis: redis, shardSize: 2_000)
        let keys = FleetKeys(job: "lossy")
        let saved = [keys.marks(shard: 0), keys.results(shard: 0), keys.counts]
        func marked() async throws -> Int {
            guard case .bytes(let marks) = try await client.command(["GET", keys.marks(shard: 0)]) else { return 0 }
            return marks.count(where: { $0 == UInt8(ascii: "1") })
        }
        func waitForMarks(_ count: Int) async throws {
            let deadline = ContinuousClock.now + .seconds(30) * testTimeScale
            while try await marked() < count {
                guard ContinuousClock.now < deadline else { throw ProcessSupportError("\(count) results not written") }
                try await Task.sleep(for: .milliseconds(2))
            }
        }
        let worker = try await startWorker("lossy", mock: mock, redis: redis) {
            $0.flushInterval = .milliseconds(100)
        }
        try await waitForMarks(300)
        let copy = try await client.commands(
            [["MULTI"]] + saved.map { ["DUMP", $0] } + [["GET", keys.marks(shard: 0)], ["EXEC"]])
        let replies = try XCTUnwrap(copy.last?.array, "\(copy)")
        let dumps = Array(replies.prefix(saved.count))
        guard case .bytes(let savedMarks) = replies.last else { return XCTFail("no marks saved: \(replies)") }
        let kept = savedMarks.count(where: { $0 == UInt8(ascii: "1") })
        try await waitForMarks(1_200)
        var restore: [[RedisArgument]] = [["MULTI"]]
        for (key, dump) in zip(saved, dumps) {
            if case .bytes(let bytes) = dump {
                restore.append(["RESTORE", key, "0", RedisArgument(bytes: bytes), "REPLACE"])
            } else {
                restore.append(["DEL", key])
            }
        }
        restore.append(["EXEC"])
        _ = try await client.commands(restore)
        let before = try await FleetReader(client: client).status(job: "lossy")
        XCTAssertEqual(before?.shardsDone, 0, "the loss came before the shard completed")

        let done = try await waitUntilDone("lossy", client: client)
        await worker.shutdown()
        XCTAssertNotNil(done, "the shard did not complete")
        XCTAssertEqual(done?.counts.outcomes.delivered, tokens.count, "every token counted once")
        let lines = try await results("lossy", client: client).compactMap { $0["token"] as? String }
        XCTAssertEqual(lines.count, tokens.count, "one result per token")
        XCTAssertTrue(lines == tokens, "in job order, none missing: \(Set(tokens).subtracting(lines).count) missing")
        let payloads = mock.stats.payloadsByToken
        XCTAssertEqual(Set(payloads.keys), Set(tokens), "every token reached the mock")
        let twice = payloads.values.reduce(0) { $0 + $1.count - 1 }
        XCTAssertGreaterThan(twice, 0, "the lost positions were sent again")
        XCTAssertLessThanOrEqual(twice, tokens.count - kept, "only positions whose results were lost")
        print("lost-results test: \(kept) results kept of the saved copy; \(twice) notifications sent again")
        await client.shutdown()
    }

    /// Whether a consumer exists in the group (a worker's first XREADGROUP ran), waiting a little.
    private func consumerIsReading(_ client: RedisClient) async -> Bool {
        await eventuallyAsync {
            let consumers = try? await client.command(
                ["XINFO", "CONSUMERS", RedisArgument(FleetKeys.stream), RedisArgument(FleetKeys.group)])
            return consumers?.array?.isEmpty == false
        }
    }

    /// A stop does not wait for the blocked read in progress, but Redis may still answer it with a shard, which it
    /// then holds pending under this worker's name. Such a shard is the worker's to send within the grace period: a
    /// graceful stop leaves nothing pending for another worker to claim `claimIdle` later.
    func testAShardTheBlockedReadBringsAfterTheStopIsSentBeforeTheWorkerReturns() async throws {
        let redis = try RedisServerProcess(for: self)
        let mock = try MockHarness()
        defer { mock.stop() }
        let client = try await FleetConnection.connect(redis.url)
        let worker = try await startWorker("reader", mock: mock, redis: redis) { $0.block = .seconds(5) }
        func blockedClients() async -> Int {
            guard case .bytes(let info)? = try? await client.command(["INFO", "clients"]) else { return 0 }
            let line = String(decoding: info, as: UTF8.self).split(whereSeparator: \.isNewline)
                .first { $0.hasPrefix("blocked_clients:") }
            return line.flatMap { Int($0.dropFirst("blocked_clients:".count)) } ?? 0
        }
        let blocked = await eventuallyAsync { await blockedClients() == 1 }
        XCTAssertTrue(blocked, "the worker's read never blocked")

        worker.worker.stop()
        let tokens = (0..<3).map { testDeviceToken($0) }
        try await enqueue([Self.jobLine(id: "late", priority: 10, alert: "hi", tokens: tokens)], redis: redis)
        let returned = await eventually(timeout: .seconds(10) * testTimeScale) { worker.hasReturned }
        await worker.shutdown()
        XCTAssertTrue(returned, "run() did not return after the stop")

        let pending = try await client.command(["XPENDING", RedisArgument(FleetKeys.stream), "fanout-workers"])
        XCTAssertEqual(pending.array?.first, .integer(0), "nothing left pending: \(pending)")
        let status = try await FleetReader(client: client).status(job: "late")
        XCTAssertEqual(status?.isDone, true, "the shard the read brought was sent")
        XCTAssertEqual(status?.counts.outcomes.delivered, tokens.count)
        XCTAssertEqual(mock.stats.accepted, tokens.count)
        await client.shutdown()
    }

    /// README: on SIGTERM the worker reads no more shards and exits. With Redis hung (SIGSTOP) and no shard being sent,
    /// the stop must not wait for the Redis call in progress, whose deadline is 10 s away (11 s for the blocked
    /// read): `run()` returns within a second or two.
    func testAStopWhileRedisHangsReturnsPromptlyWhenNoShardIsBeingSent() async throws {
        let redis = try RedisServerProcess(for: self)
        let mock = try MockHarness()
        defer { mock.stop() }
        let client = try await FleetConnection.connect(redis.url)
        let worker = try await startWorker("idle", mock: mock, redis: redis)
        // Reading: the consumer exists once its first XREADGROUP ran.
        let reading = await consumerIsReading(client)
        XCTAssertTrue(reading, "the worker never read from the stream")
        await client.shutdown()

        redis.stopAnswering()
        let stoppedAt = ContinuousClock.now
        worker.worker.stop()
        let returned = await eventually(timeout: .seconds(2) * testTimeScale) { worker.hasReturned }
        let elapsed = ContinuousClock.now - stoppedAt
        redis.resumeAnswering()
        await worker.shutdown()
        XCTAssertTrue(returned, "run() had not returned \(elapsed) after stop() with Redis hung")
    }

    /// With Redis hung while a shard is being sent, its finished results still buffered (the first two tokens
    /// answered, the third held by the mock), a stop must end within the grace period and a moment to write them,
    /// not at the end of the write's Redis deadline (10 s). The shard is left pending, not acknowledged: once Redis
    /// answers again, another worker claims it, and each token ends with one result line, delivered.
    func testAStopWhileRedisHangsEndsAfterTheGraceAndLeavesTheShardToAnotherWorker() async throws {
        let redis = try RedisServerProcess(for: self)
        let holding = try MockHarness { $0.blackholeAfter = 2 }
        defer { holding.stop() }
        let answering = try MockHarness()
        defer { answering.stop() }
        let client = try await FleetConnection.connect(redis.url)
        let tokens = (0..<5).map { testDeviceToken($0) }
        try await enqueue([Self.jobLine(id: "held", priority: 10, alert: "hi", tokens: tokens)], redis: redis)

        let grace = Duration.seconds(1)
        let first = try await startWorker("first", mock: holding, redis: redis) {
            $0.concurrentShards = 1
            $0.stopGrace = grace
            // Nothing is written before the stop: the two results wait in the shard's buffer.
            $0.flushInterval = .seconds(60)
        }
        let busy = await eventually {
            holding.stats.accepted >= 2 && holding.stats.snapshot()["streams_blackholed"] as? Int ?? 0 >= 1
        }
        XCTAssertTrue(busy, "the shard never reached the mock")

        redis.stopAnswering()
        let stoppedAt = ContinuousClock.now
        first.worker.stop()
        let returned = await eventually(timeout: grace + .seconds(2) * testTimeScale) { first.hasReturned }
        let elapsed = ContinuousClock.now - stoppedAt
        redis.resumeAnswering()
        await first.shutdown()
        XCTAssertTrue(
            returned, "run() had not returned \(elapsed) after stop() with a grace of \(grace) and Redis hung")
        XCTAssertGreaterThanOrEqual(elapsed, grace, "the shard being sent got its grace period")

        let pending = try await client.command(["XPENDING", RedisArgument(FleetKeys.stream), "fanout-workers"])
        XCTAssertEqual(pending.array?.first, .integer(1), "the shard is still pending: \(pending)")
        let second = try await startWorker("second", mock: answering, redis: redis)
        let done = try await waitUntilDone("held", client: client)
        await second.shutdown()
        XCTAssertNotNil(done, "the second worker did not finish the shard")
        XCTAssertEqual(done?.counts.outcomes.delivered, tokens.count, "each token counted once")
        XCTAssertEqual(done?.counts.outcomes.failed, 0)
        let lines = try await results("held", client: client)
        XCTAssertEqual(lines.compactMap { $0["token"] as? String }, tokens, "one result per token, in job order")
        XCTAssertEqual(Set(lines.compactMap { $0["outcome"] as? String }), ["delivered"])
        await client.shutdown()
    }

    /// Two live workers under one name read each other's pending shards and both send them (the default name,
    /// host-PID, is the same for containers on host networking). A worker holds its name in Redis while it runs (the
    /// heartbeat refreshes the hold, also while it holds no shard): a second one under that name is refused with one
    /// line; once the first has gone (its hold deleted at a clean exit) the name is free at once.
    func testASecondLiveWorkerUnderTheSameNameIsRefused() async throws {
        let redis = try RedisServerProcess(for: self)
        let mock = try MockHarness()
        defer { mock.stop() }
        let client = try await FleetConnection.connect(redis.url)
        let first = try await startWorker("same", mock: mock, redis: redis)
        let reading = await consumerIsReading(client)
        XCTAssertTrue(reading, "the first worker never read from the stream")

        // Past the first one's claim-idle (1 s), idle all along: its hold is still refreshed. Redis says when the hold
        // as it stands now would expire; wait until then, and it must still be there (a heartbeat extended it).
        let outlived = try await holdOutlivesItsExpiry("same", client: client)
        XCTAssertTrue(outlived, "the idle worker's hold on its name was not refreshed")
        let engine = try makeEngine(for: mock, loops: 1, connections: 1)
        let writer = try await FleetConnection.connect(redis.url)
        let reader = try await FleetConnection.connect(redis.url, commandTimeout: .seconds(11))
        var options = FleetWorkerOptions(name: "same")
        options.claimIdle = .seconds(1)
        let second = FleetWorker(
            engine: engine, reader: reader, writer: writer, options: options, log: { print("[same 2] \($0)") })
        let outcome = FanoutMutex<String?>(nil)
        let run = Task {
            do throws(FleetError) {
                _ = try await second.run()
                outcome.withLock { $0 = "returned" }
            } catch {
                outcome.withLock { $0 = error.message }
            }
        }
        let ended = await eventually(timeout: .seconds(3) * testTimeScale) { outcome.withLock { $0 } != nil }
        second.stop()
        await engine.shutdown(gracePeriod: .zero)
        await run.value
        await reader.shutdown()
        await writer.shutdown()
        XCTAssertTrue(ended, "the second worker under the same name was not refused")
        XCTAssertEqual(
            outcome.withLock { $0 },
            "another worker named same is running on this Redis; give each worker its own --name")

        // A clean exit frees the name at once.
        first.worker.stop()
        await first.worker.releaseName(timeout: .seconds(1))
        await first.shutdown()
        let again = try await FleetWorkerName.claim("same", expiry: .seconds(1), client: client)
        await again.release(client: client, timeout: .seconds(1))
        await client.shutdown()
    }

    /// A worker that died holds its name until the hold expires, after its claim-idle (the same time after which
    /// others claim its shards); then the name is free.
    func testADeadWorkersNameIsFreeOnceItsHoldExpires() async throws {
        let redis = try RedisServerProcess(for: self)
        let client = try await FleetConnection.connect(redis.url)
        _ = try await FleetWorkerName.claim("dead", expiry: .milliseconds(500), client: client)
        do throws(FleetError) {
            _ = try await FleetWorkerName.claim("dead", expiry: .milliseconds(500), client: client)
            XCTFail("a name still held was taken")
        } catch {
            XCTAssertTrue(error.message.hasPrefix("another worker named dead is running"), error.message)
        }
        // Nobody refreshes it: Redis drops the key once its 500 ms are up.
        let expired = await eventuallyAsync {
            (try? await client.command(["EXISTS", RedisArgument(FleetWorkerName.key("dead"))])) == .integer(0)
        }
        XCTAssertTrue(expired, "the dead worker's hold did not expire")
        let taken = try await FleetWorkerName.claim("dead", expiry: .milliseconds(500), client: client)
        XCTAssertEqual(taken.name, "dead")
        await client.shutdown()
    }

    /// A worker restarted under its name after a clean stop that left a shard pending (the grace period was over)
    /// reads that shard back at once: with a claim-idle of 60 s, no other worker could have claimed it yet.
    func testAWorkerRestartedUnderItsNameResumesItsPendingShardAtOnce() async throws {
        let redis = try RedisServerProcess(for: self)
        let holding = try MockHarness { $0.blackholeEvery = 1 }
        defer { holding.stop() }
        let answering = try MockHarness()
        defer { answering.stop() }
        let client = try await FleetConnection.connect(redis.url)
        let tokens = (0..<3).map { testDeviceToken($0) }
        try await enqueue([Self.jobLine(id: "resumed", priority: 10, alert: "hi", tokens: tokens)], redis: redis)
        let first = try await startWorker("again", mock: holding, redis: redis) {
            $0.claimIdle = .seconds(60)
            $0.stopGrace = .milliseconds(200)
        }
        let busy = await eventually { holding.stats.snapshot()["streams_blackholed"] as? Int ?? 0 >= 1 }
        XCTAssertTrue(busy, "the shard never reached the mock")
        first.worker.stop()
        let returned = await eventually(timeout: .seconds(5) * testTimeScale) { first.hasReturned }
        XCTAssertTrue(returned)
        await first.worker.releaseName(timeout: .seconds(1))
        await first.shutdown()

        let restartedAt = ContinuousClock.now
        let second = try await startWorker("again", mock: answering, redis: redis) { $0.claimIdle = .seconds(60) }
        let done = try await waitUntilDone("resumed", client: client, timeout: .seconds(20))
        let elapsed = ContinuousClock.now - restartedAt
        await second.shutdown()
        XCTAssertNotNil(done, "the restarted worker did not resume its shard")
        XCTAssertEqual(done?.counts.outcomes.delivered, tokens.count)
        XCTAssertLessThan(elapsed, .seconds(20), "resumed at once, not after the claim-idle")
        await client.shutdown()
    }

    /// A shard whose job line this version cannot parse gets the job's one `invalid` result; when that cannot be
    /// written (here the results key holds a string, so the script fails with WRONGTYPE every time), a stop still
    /// ends the worker after the grace period, leaving the shard pending. Before, that write was retried for ever
    /// (`giveUp` never said yes): the worker never exited, and once the stop's write window was over it spun at once.
    func testAStopEndsAWorkerThatCannotWriteAnUnparsableLinesResult() async throws {
        let redis = try RedisServerProcess(for: self)
        let mock = try MockHarness()
        defer { mock.stop() }
        let client = try await FleetConnection.connect(redis.url)
        try await enqueue(
            [Self.jobLine(id: "garbled", priority: 10, alert: "hi", tokens: [testDeviceToken(1)])], redis: redis)
        _ = try await client.command(["HSET", "fanout:job:{garbled}", "line", "{not a job line"])
        _ = try await client.command(["SET", "fanout:job:{garbled}:results", "not a hash"])

        let grace = Duration.seconds(1)
        let worker = try await startWorker("garbled", mock: mock, redis: redis) { $0.stopGrace = grace }
        let deadline = ContinuousClock.now + .seconds(10) * testTimeScale
        var claimed = false
        while !claimed && ContinuousClock.now < deadline {
            let pending = try await client.command(["XPENDING", RedisArgument(FleetKeys.stream), "fanout-workers"])
            claimed = pending.array?.first == .integer(1)
            if !claimed { try await Task.sleep(for: .milliseconds(20)) }
        }
        XCTAssertTrue(claimed, "the worker never took the shard")
        worker.worker.stop()
        let returned = await eventually(timeout: grace + .seconds(3) * testTimeScale) { worker.hasReturned }
        // Left running if not: its shutdown would wait for ever.
        guard returned else { return XCTFail("run() had not returned after the grace period, the result unwritable") }
        await worker.shutdown()
        XCTAssertEqual(mock.stats.requests, 0, "nothing of an unparsable line is sent")
        let pending = try await client.command(["XPENDING", RedisArgument(FleetKeys.stream), "fanout-workers"])
        XCTAssertEqual(pending.array?.first, .integer(1), "the shard is left pending: \(pending)")
        await client.shutdown()
    }

    /// Deletes every key of `job` and its id from the job list, as a user who is done with a job does (README: a job's
    /// results stay in Redis until you delete its keys).
    private func deleteJob(_ job: String, client: RedisClient) async throws {
        let keys = try await client.command(["KEYS", RedisArgument("fanout:job:{\(job)}*")]).array ?? []
        XCTAssertFalse(keys.isEmpty, "job \(job) has keys to delete")
        _ = try await client.command(["DEL"] + keys.compactMap(\.string).map { RedisArgument($0) })
        _ = try await client.command(["LREM", RedisArgument(FleetKeys.jobList), "0", RedisArgument(job)])
    }

    /// A job id whose keys were deleted can be enqueued again; a worker that sent the first job must send the second
    /// with the second's line (its priority and payload), not the line it read for the first.
    func testAJobIDEnqueuedAgainAfterItsKeysWereDeletedIsSentWithTheNewLine() async throws {
        let redis = try RedisServerProcess(for: self)
        let mock = try MockHarness { $0.capturePayloads = true }
        defer { mock.stop() }
        let client = try await FleetConnection.connect(redis.url)
        let worker = try await startWorker("reuser", mock: mock, redis: redis)
        let first = testDeviceToken(1)
        let second = testDeviceToken(2)

        try await enqueue([Self.jobLine(id: "reused", priority: 10, alert: "first", tokens: [first])], redis: redis)
        let firstDone = try await waitUntilDone("reused", client: client)
        XCTAssertEqual(firstDone?.counts.outcomes.delivered, 1)
        try await deleteJob("reused", client: client)
        try await enqueue([Self.jobLine(id: "reused", priority: 5, alert: "second", tokens: [second])], redis: redis)
        let secondDone = try await waitUntilDone("reused", client: client)
        await worker.shutdown()

        XCTAssertEqual(secondDone?.counts.outcomes.delivered, 1)
        let byPriority = mock.stats.snapshot()["accepted_by_priority"] as? [String: Int]
        XCTAssertEqual(byPriority, ["10": 1, "5": 1], "the second job went out at its own priority")
        let payloads = mock.stats.payloadsByToken
        XCTAssertEqual(
            payloads[first].map { $0.map { String(decoding: $0, as: UTF8.self) } }, [#"{"aps":{"alert":"first"}}"#])
        XCTAssertEqual(
            payloads[second].map { $0.map { String(decoding: $0, as: UTF8.self) } }, [#"{"aps":{"alert":"second"}}"#])
        let lines = try await results("reused", client: client)
        XCTAssertEqual(lines.compactMap { $0["token"] as? String }, [second], "the new job's results only")
        await client.shutdown()
    }

    /// A job deleted before it was sent leaves its shard entries on the stream. Enqueued again under the same id, cut
    /// into other shards, the old entries must not be sent with the new enqueue's tokens: the old shard 0 (one token)
    /// read the new shard 0's two tokens, so a token went out twice beside the new entry, or, when the old entry
    /// completed shard 0 first, the new shard's second token never went out.
    func testShardEntriesOfADeletedEnqueueAreNotSentWithTheNewEnqueueOfItsID() async throws {
        let redis = try RedisServerProcess(for: self)
        let mock = try MockHarness()
        defer { mock.stop() }
        let client = try await FleetConnection.connect(redis.url)
        let old = [testDeviceToken(1), testDeviceToken(2)]
        let new = [testDeviceToken(3), testDeviceToken(4)]
        try await enqueue(
            [Self.jobLine(id: "reused", priority: 10, alert: "old", tokens: old)], redis: redis, shardSize: 1)
        try await deleteJob("reused", client: client)
        try await enqueue(
            [Self.jobLine(id: "reused", priority: 5, alert: "new", tokens: new)], redis: redis, shardSize: 2)
        let length = try await client.command(["XLEN", RedisArgument(FleetKeys.stream)])
        XCTAssertEqual(length, .integer(3), "the old enqueue's two entries and the new one's")

        let worker = try await startWorker("reuser", mock: mock, redis: redis)
        let done = try await waitUntilDone("reused", client: client)
        // The old entries are acknowledged without sending; wait for the stream to be empty before stopping.
        let drained = await eventuallyAsync {
            (try? await client.command(["XLEN", RedisArgument(FleetKeys.stream)])) == .integer(0)
        }
        await worker.shutdown()

        XCTAssertTrue(drained, "every entry, old and new, was acknowledged and deleted")
        XCTAssertEqual(done?.counts.outcomes.delivered, new.count)
        let lines = try await results("reused", client: client)
        XCTAssertEqual(lines.compactMap { $0["token"] as? String }, new, "one result per token of the new enqueue")
        XCTAssertEqual(mock.stats.snapshot()["accepted_by_priority"] as? [String: Int], ["5": 2])
        XCTAssertEqual(mock.stats.accepted, new.count, "nothing of the deleted enqueue was sent")
        await client.shutdown()
    }

    /// Whether the hold on `name` is still there past the moment it would expire unrefreshed: reads its time to live
    /// (PTTL) now, then watches the key until that moment has passed. False as soon as the key is gone.
    private func holdOutlivesItsExpiry(_ name: String, client: RedisClient) async throws -> Bool {
        let key = RedisArgument(FleetWorkerName.key(name))
        guard let ttl = try await client.command(["PTTL", key]).integer, ttl > 0 else { return false }
        // Counted from the reply (after Redis read its clock), plus the millisecond PTTL rounds off: not before the
        // real expiry.
        let expiry = ContinuousClock.now + .milliseconds(ttl + 1)
        while true {
            // The time first: a key that is there after this moment is there past the expiry.
            let asked = ContinuousClock.now
            let left = try await client.command(["PTTL", key]).integer ?? -2
            guard left > 0 else { return false }
            if asked > expiry { return true }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Polls the async `condition` every 20 ms until it holds or `timeout` passes; returns whether it held.
    private func eventuallyAsync(timeout: Duration = .seconds(10), _ condition: () async -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + timeout * testTimeScale
        while ContinuousClock.now < deadline {
            if await condition() { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return await condition()
    }
}
