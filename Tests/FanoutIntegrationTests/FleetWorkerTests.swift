// `FleetWorker` in process (the worker `fanout worker` runs), against a real redis-server and in-process mock-apns:
// what a stop does while every shard slot is busy, and what is sent for a job id enqueued again after its keys were
// deleted. FleetTests runs the `fanout` binary end to end; these look at one worker's behaviour closely.
import Fanout
import FanoutRedis
import FanoutTestSupport
import Foundation
import Synchronization
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
            let value = Mutex(false)
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
    private func enqueue(_ lines: [String], redis: RedisServerProcess) async throws {
        let directory = try ProcessSupport.temporaryDirectory(for: self, "fleet-worker")
        let path = "\(directory)/jobs-\(UUID().uuidString).jsonl"
        try (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: true, encoding: .utf8)
        let client = try await FleetConnection.connect(redis.url)
        var reports: [FleetEnqueuer.Report] = []
        do {
            try await FleetEnqueuer(client: client, shardSize: 1_000).enqueue(jobsPath: path) { reports.append($0) }
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
}
