import FanoutCore
// One rate budget per workspace for the fleet, against a real redis-server. Each "worker" is a
// FleetRateBudget with its own Redis client; both the workers' clock and the server's time are fake, so a minute of
// traffic runs in a moment.
import FanoutFleet
import FanoutPolicy
import FanoutRedis
import FanoutTestSupport
import Foundation
import XCTest

final class FleetRateBudgetTests: XCTestCase {
    /// The workers' clock (ns) and the server's (ms since 1970), moved together.
    private final class FakeClock: RateClock {
        private let elapsed = FanoutMutex<UInt64>(1_000_000_000)
        private let origin = Int64(Date().timeIntervalSince1970 * 1000)
        func nanoseconds() -> UInt64 { elapsed.withLock { $0 } }
        var serverMilliseconds: Int64 { origin + Int64(nanoseconds() / 1_000_000) }
        func advance(milliseconds: UInt64) { elapsed.withLock { $0 += milliseconds * 1_000_000 } }
    }

    /// 600 per minute with a burst of 100 (10 s), the default split (priority 10: 50% guaranteed, 80% ceiling).
    private let split = RateBudget(requestsPerHour: 36_000, burstSeconds: 10)
    /// 600 per minute, burst 100, no reservations: any priority may take the whole burst.
    private let flat = RateBudget(
        requestsPerHour: 36_000, burstSeconds: 10, countingUnit: .job,
        priority10: PriorityBudget(guaranteedPerHour: 0, ceilingPerHour: 36_000, policy: .reject),
        priority5: PriorityBudget(guaranteedPerHour: 0, ceilingPerHour: 36_000, policy: .reject),
        priority1: PriorityBudget(guaranteedPerHour: 0, ceilingPerHour: 36_000, policy: .reject))
    private let unitsPerRequest: Int64 = 3_600_000

    private var redis: RedisServerProcess!

    private func client() throws -> RedisClient {
        if redis == nil { redis = try RedisServerProcess(for: self) }
        let client = try RedisClient(url: redis.url)
        addTeardownBlock { await client.shutdown() }
        return client
    }

    private func makeWorkers(
        _ count: Int, budget: RateBudget, clock: FakeClock, leaseDuration: Duration = .seconds(10),
        chunk: Int? = nil
    ) throws -> [FleetRateBudget] {
        let limits = try RateLimiterRegistry(defaultBudget: budget)
        return try (0..<count).map { index in
            var options = FleetRateBudget.Options(leaseID: "worker-\(index)")
            options.leaseDuration = leaseDuration
            options.clock = clock
            options.serverMilliseconds = { clock.serverMilliseconds }
            if let chunk { options.chunk = { _, maximumCost, _ in min(chunk, maximumCost) } }
            return FleetRateBudget(client: try client(), limits: limits, options: options)
        }
    }

    private func level(_ field: String, workspace: String = "ws") async throws -> Int64? {
        try await client().command(["HGET", RedisArgument("fanout:budget:{\(workspace)}"), RedisArgument(field)])
            .integer
    }

    /// Admits as many requests as the worker's budget allows now, up to `limit`.
    private func drain(_ worker: FleetRateBudget, priority: Int, now: UInt64, limit: Int = 1000) async -> Int {
        var admitted = 0
        while admitted < limit {
            guard case .admit = await worker.decide(workspace: "ws", priority: priority, cost: 1, now: now) else {
                break
            }
            admitted += 1
        }
        return admitted
    }

    func testTwoWorkersTogetherNeverAdmitMoreThanTheWorkspaceBudget() async throws {
        let clock = FakeClock()
        let workers = try makeWorkers(2, budget: split, clock: clock)
        // Worker 0 pushes priority 10 as hard as it can, worker 1 priority 5, for 60 s in 100 ms steps.
        var admittedAt: [(ms: Int, p10: Int, p5: Int)] = []
        for step in 0..<600 {
            let now = clock.nanoseconds()
            let p10 = await drain(workers[0], priority: 10, now: now)
            let p5 = await drain(workers[1], priority: 5, now: now)
            admittedAt.append((step * 100, p10, p5))
            if step == 0 {
                // The burst is spent a chunk per round trip (plus the one that is refused).
                let trips = workers[0].leaseRequests + workers[1].leaseRequests
                XCTAssertEqual(p10 + p5, 90, "priority 10 takes its 50, priority 5 the 40 left unreserved")
                XCTAssertLessThanOrEqual(trips, 50 / 5 + 40 / 4 + 2)
            }
            clock.advance(milliseconds: 100)
        }
        // At most one chunk outstanding per worker: priority 10's is 5 (a tenth of its 50-request largest cost, under
        // one second of its ceiling), priority 5's 4.
        let margin = 5 + 4
        let total = admittedAt.reduce(0) { $0 + $1.p10 + $1.p5 }
        let p10 = admittedAt.reduce(0) { $0 + $1.p10 }
        let p5 = admittedAt.reduce(0) { $0 + $1.p5 }
        // 60 s at 10 per second, plus the 100-request burst.
        XCTAssertLessThanOrEqual(total, 600 + 100 + margin, "the fleet stays within the workspace's budget")
        XCTAssertGreaterThanOrEqual(total, 600 - margin, "and uses it")
        // Every 10-second window: at most the window's 100 plus one burst of 100.
        for start in 0..<(admittedAt.count - 100) {
            let window = admittedAt[start..<(start + 100)].reduce(0) { $0 + $1.p10 + $1.p5 }
            XCTAssertLessThanOrEqual(window, 100 + 100 + margin, "window at \(start * 100) ms")
        }
        // Priority 10 stays under its 80% ceiling (plus its burst); priority 5 keeps at least its 40% guarantee.
        XCTAssertLessThanOrEqual(p10, 480 + 80 + 5)
        XCTAssertGreaterThanOrEqual(p5, 240 - 4)
    }

    func testTheSameTrafficThroughOneWorkerAndThroughTheInProcessLimiterIsAdmittedAlike() async throws {
        let clock = FakeClock()
        let worker = try makeWorkers(1, budget: split, clock: clock, chunk: 1)[0]
        let local = WorkspaceRateLimiter(budget: split)
        var fleet = 0
        var inProcess = 0
        for _ in 0..<300 {
            let now = clock.nanoseconds()
            for priority in [10, 5, 1] {
                fleet += await drain(worker, priority: priority, now: now, limit: 20)
                var admitted = 0
                while admitted < 20, local.decide(priority: priority, cost: 1, now: now).isAdmitted { admitted += 1 }
                inProcess += admitted
            }
            clock.advance(milliseconds: 100)
        }
        // With a chunk of one, every decision is the in-process one, made in Redis (ms instead of µs).
        XCTAssertEqual(fleet, inProcess)
    }

    func testALeaseIsReturnedOnShutdown() async throws {
        let clock = FakeClock()
        let worker = try makeWorkers(1, budget: flat, clock: clock, chunk: 20)[0]
        let now = clock.nanoseconds()
        guard case .admit(priority: 5) = await worker.decide(workspace: "ws", priority: 5, cost: 1, now: now) else {
            return XCTFail("the first request is admitted")
        }
        XCTAssertEqual(worker.heldUnits(workspace: "ws", priority: 5, now: now), 19)
        let afterLease = try await level("w")
        XCTAssertEqual(afterLease, 80 * unitsPerRequest, "the lease took 20 of the 100-request burst")
        let returned = await worker.returnLeases()
        XCTAssertEqual(returned, 19)
        let afterReturn = try await level("w")
        XCTAssertEqual(afterReturn, 99 * unitsPerRequest, "the bucket has the unspent 19 back")
        XCTAssertEqual(worker.heldUnits(workspace: "ws", priority: 5, now: now), 0)
        let record = try await client().command(["EXISTS", "fanout:budget:{ws}:lease:worker-0"]).integer
        XCTAssertEqual(record, 0)
    }

    /// A worker stopping while Redis hangs (SIGSTOP) does not wait a command deadline (5 s here, 10 s in `fanout
    /// worker`) per lease and per workspace to give its units back: the whole return ends by its timeout, and what
    /// was not given back expires with the lease.
    func testReturningLeasesToAHungRedisEndsByItsTimeout() async throws {
        let clock = FakeClock()
        let worker = try makeWorkers(1, budget: flat, clock: clock, chunk: 20)[0]
        guard case .admit = await worker.decide(workspace: "ws", priority: 5, cost: 1, now: clock.nanoseconds()) else {
            return XCTFail("the first request is admitted")
        }
        redis.stopAnswering()
        let started = ContinuousClock.now
        let returned = await worker.returnLeases(timeout: .milliseconds(500))
        let elapsed = ContinuousClock.now - started
        redis.resumeAnswering()
        XCTAssertEqual(returned, 0)
        XCTAssertLessThan(elapsed, .seconds(2) * testTimeScale, "returnLeases waited \(elapsed) on a hung Redis")
    }

    func testADeadWorkersLeaseExpiresAndTheBucketRefills() async throws {
        let clock = FakeClock()
        let workers = try makeWorkers(2, budget: flat, clock: clock, leaseDuration: .milliseconds(300), chunk: 100)
        let now = clock.nanoseconds()
        // Worker 0 leases the whole burst, spends one request, and dies without returning the rest.
        guard case .admit = await workers[0].decide(workspace: "ws", priority: 10, cost: 1, now: now) else {
            return XCTFail("the first request is admitted")
        }
        let record = try await client().command(["HGET", "fanout:budget:{ws}:lease:worker-0", "0"]).integer
        XCTAssertEqual(record, 100)
        // Worker 1 finds nothing left, and is told when one request will be there (100 ms at 10 per second).
        let refused = await workers[1].decide(workspace: "ws", priority: 10, cost: 1, now: now)
        XCTAssertEqual(refused, .reject(retryAfterNanoseconds: 100_000_000))

        // The record expires in Redis (300 ms after the grant, on Redis's clock): the dead worker's units can no
        // longer be given back.
        let deadline = ContinuousClock.now + .seconds(5) * testTimeScale
        var gone = try await client().command(["EXISTS", "fanout:budget:{ws}:lease:worker-0"]).integer
        while gone != 0 && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
            gone = try await client().command(["EXISTS", "fanout:budget:{ws}:lease:worker-0"]).integer
        }
        XCTAssertEqual(gone, 0, "the dead worker's lease record did not expire")
        let returned = await workers[0].returnLeases()
        XCTAssertEqual(returned, 0, "an expired lease is not returned")

        // The bucket refills by itself: after a burst's time, worker 1 gets the whole burst.
        clock.advance(milliseconds: 10_000)
        let later = await drain(workers[1], priority: 10, now: clock.nanoseconds())
        XCTAssertEqual(later, 100)
    }

    func testAnExpiredLeaseIsNotSpent() async throws {
        let clock = FakeClock()
        let worker = try makeWorkers(1, budget: flat, clock: clock, leaseDuration: .seconds(1), chunk: 100)[0]
        guard case .admit = await worker.decide(workspace: "ws", priority: 5, cost: 1, now: clock.nanoseconds()) else {
            return XCTFail("the first request is admitted")
        }
        clock.advance(milliseconds: 1000)
        // The 99 units left are dropped: the next request leases afresh from the (refilled by 10) bucket.
        XCTAssertEqual(worker.heldUnits(workspace: "ws", priority: 5, now: clock.nanoseconds()), 0)
        let admitted = await drain(worker, priority: 5, now: clock.nanoseconds())
        XCTAssertEqual(admitted, 10)
    }

    func testDemoteLeasesPriorityFiveHeadroomWhenPriorityTenIsOut() async throws {
        let clock = FakeClock()
        // Guarantees of 70% leave 30% shared: priority 10 takes its ceiling's 50, then 10 more are demoted.
        let budget = RateBudget(
            requestsPerHour: 36_000, burstSeconds: 10, countingUnit: .job,
            priority10: PriorityBudget(guaranteedPerHour: 10_800, ceilingPerHour: 18_000, policy: .demote),
            priority5: PriorityBudget(guaranteedPerHour: 10_800, ceilingPerHour: 36_000, policy: .reject),
            priority1: PriorityBudget(guaranteedPerHour: 3_600, ceilingPerHour: 36_000, policy: .reject))
        let worker = try makeWorkers(1, budget: budget, clock: clock, chunk: 1)[0]
        let local = WorkspaceRateLimiter(budget: budget)
        let now = clock.nanoseconds()
        var fleet: [RateDecision] = []
        var inProcess: [RateDecision] = []
        for _ in 0..<100 {
            fleet.append(await worker.decide(workspace: "ws", priority: 10, cost: 1, now: now))
            inProcess.append(local.decide(priority: 10, cost: 1, now: now))
        }
        XCTAssertEqual(fleet.filter { $0 == .admit(priority: 10) }.count, 50)
        XCTAssertEqual(fleet.filter { $0 == .admit(priority: 5) }.count, 10)
        XCTAssertEqual(fleet, inProcess)
    }
}
