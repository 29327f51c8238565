package import Fanout
import FanoutCore
package import FanoutRedis

/// One rate budget per workspace for the whole fleet: the workspace's token buckets live in Redis, and each worker
/// leases capacity from them in chunks, so that most decisions are answered from memory.
///
/// | Key | Type | What |
/// |---|---|---|
/// | `fanout:budget:{WS}` | hash | the levels `w`, `g1`..`g3`, `c1`..`c3` (priorities 10, 5, 1) and `t`, the time (ms, the server's clock) they were computed for; expires once idle for a burst (a missing hash is full buckets) |
/// | `fanout:budget:{WS}:lease:ID` | hash | lease kind → units granted to lease holder ID; expires `leaseDuration` after the last grant |
///
/// Both keys carry the workspace as a hash tag, so each script runs on one Redis Cluster slot.
///
/// - **The buckets** are `WorkspaceRateLimiter`'s, with the same model and the same exact integer arithmetic, kept in
///   milliseconds instead of microseconds (one request is 3.6 × 10⁶ units, a rate of r per hour adds r units per
///   millisecond), so that levels stay exact in Lua's doubles.
/// - **A lease** of n units at priority p is n admissions at p taken at once (from C_p, from W, and from G_p as far as
///   it goes). A priority-10 `demote` lease that does not fit is taken as a demoted lease instead (from C_5's headroom
///   and W's shared part). The worker spends the units locally, with no round trip, until they run out or the lease
///   expires (`leaseDuration`, counted from before the request on the worker's clock); expired units are dropped, not
///   spent and not returned: the buckets refill by themselves.
/// - **Returning** (`returnLeases`, on shutdown) gives unexpired unspent units back to W and C_p (not to G_p, which
///   keeps the invariants W ≥ ΣG and C ≥ G), while the lease record in Redis still exists.
///
/// Over any window, the fleet admits at most what one in-process limiter would, plus the units outstanding in leases
/// at the window's start (at most about one chunk per worker, workspace and priority).
package final class FleetRateBudget: SharedRateLimiter {
    package struct Options: Sendable {
        /// Names this holder's lease record (`fanout:budget:{WS}:lease:ID`); unique per worker.
        package var leaseID: String
        /// A lease's units may be spent this long after they were asked for; the record in Redis lives as long.
        package var leaseDuration: Duration = .seconds(10)
        /// Units asked for at once for a workspace's priority. Default: one second of the priority's ceiling, at most
        /// a tenth of its largest cost, at least 1.
        package var chunk: (@Sendable (_ budget: RateBudget, _ maximumCost: Int, _ priority: Int) -> Int)?
        /// The server's time in ms, passed to the scripts instead of Redis `TIME` (tests). Nil: `TIME`.
        package var serverMilliseconds: (@Sendable () -> Int64)?
        /// The worker's clock, for `returnLeases` (the same clock as `decide`'s `now`).
        package var clock: any RateClock = MonotonicRateClock()
        /// When Redis cannot be asked: wait or reject for this long (the budget cannot be checked, so nothing is sent).
        package var retryAfterFailure: Duration = .seconds(1)

        package init(leaseID: String) { self.leaseID = leaseID }

        package static func defaultChunk(budget: RateBudget, maximumCost: Int, priority: Int) -> Int {
            max(1, min(maximumCost / 10, budget[priority: priority].ceilingPerHour / 3600))
        }
    }

    /// Lease kinds: 0, 1, 2 for priorities 10, 5, 1; 3 for demoted priority-10 requests (sent at 5).
    private struct LeaseKey: Hashable {
        let workspace: String
        let kind: Int
    }

    private struct Lease {
        var units = 0
        var expiresAt: UInt64 = 0
    }

    private struct Local {
        var leases: [LeaseKey: Lease] = [:]
        /// After Redis said no: until when, and for how many units, the answer stands (no round trip meanwhile).
        var refusedUntil: [LeaseKey: (until: UInt64, units: Int)] = [:]
        var leaseRequests = 0
        /// Workspaces with a lease record in Redis (deleted by `returnLeases`).
        var leasedWorkspaces: Set<String> = []
        var failing = false
    }

    private let client: RedisClient
    private let limits: RateLimiterRegistry
    private let options: Options
    private let log: @Sendable (String) -> Void
    private let local = FanoutMutex(Local())

    /// - Parameters:
    ///   - client: the worker's Redis client (not the one blocked in XREADGROUP).
    ///   - limits: the budgets (`rate_limits` of the config file); every worker of the fleet must have the same.
    package init(
        client: RedisClient, limits: RateLimiterRegistry, options: Options,
        log: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.client = client
        self.limits = limits
        self.options = options
        self.log = log
    }

    /// Round trips made for leases so far.
    package var leaseRequests: Int { local.withLock { $0.leaseRequests } }

    /// Unexpired units held for `workspace` at `priority` (`demoted`: the demoted priority-10 lease).
    package func heldUnits(workspace: String, priority: Int, demoted: Bool = false, now: UInt64) -> Int {
        let key = LeaseKey(workspace: workspace, kind: demoted ? 3 : Self.index(ofPriority: priority))
        return local.withLock { local in
            guard let lease = local.leases[key], lease.expiresAt > now else { return 0 }
            return lease.units
        }
    }

    package func decide(workspace: String, priority: Int, cost: Int, now: UInt64) async -> RateDecision {
        if cost <= 0 { return .admit(priority: priority) }
        let budget = limits.budget(for: workspace)
        let index = Self.index(ofPriority: priority)
        var policy = budget[priority: priority].policy
        let demotes = priority == 10 && policy == .demote
        if demotes { policy = budget.priority5.policy }
        let own = LeaseKey(workspace: workspace, kind: index)
        let demoted = LeaseKey(workspace: workspace, kind: 3)
        for _ in 0..<3 {
            // From memory first: the priority's own lease, then (demote) a demoted one.
            let held = local.withLock { local -> (admitted: Int?, held: Int, refusedUntil: UInt64?) in
                if Self.take(cost, from: own, in: &local.leases, now: now) { return (priority, 0, nil) }
                if demotes && Self.take(cost, from: demoted, in: &local.leases, now: now) { return (5, 0, nil) }
                let units = local.leases[own].map { $0.expiresAt > now ? $0.units : 0 } ?? 0
                // Redis said when `units` would fit: a request at least as large is answered the same until then.
                if let refused = local.refusedUntil[own], refused.until > now, cost - units >= refused.units {
                    return (nil, units, refused.until)
                }
                return (nil, units, nil)
            }
            if let admitted = held.admitted { return .admit(priority: admitted) }
            if let until = held.refusedUntil {
                return policy == .wait ? .wait(untilNanoseconds: until) : .reject(retryAfterNanoseconds: until - now)
            }

            let maximumCost = limits.limiter(for: workspace).maximumCost(priority: priority)
            let chunk = (options.chunk ?? Options.defaultChunk)(budget, maximumCost, priority)
            let minimum = max(1, cost - held.held)
            let want = min(max(minimum, chunk), maximumCost)
            let grant: (units: Int, kind: Int, waitMillis: Int)
            do throws(RedisError) {
                grant = try await lease(
                    workspace: workspace, budget: budget, index: index, minimum: minimum, want: want, demote: demotes)
            } catch {
                let first = local.withLock { local in
                    defer { local.failing = true }
                    return !local.failing
                }
                if first {
                    log("rate budget: cannot lease from Redis (\(error.message)); nothing is admitted meanwhile")
                }
                let retry =
                    UInt64(options.retryAfterFailure.components.seconds) * 1_000_000_000
                    + UInt64(options.retryAfterFailure.components.attoseconds / 1_000_000_000)
                return policy == .wait ? .wait(untilNanoseconds: now + retry) : .reject(retryAfterNanoseconds: retry)
            }
            if grant.kind < 0 {
                let wait = UInt64(max(1, grant.waitMillis)) * 1_000_000
                local.withLock { $0.refusedUntil[own] = (now + wait, minimum) }
                return policy == .wait ? .wait(untilNanoseconds: now + wait) : .reject(retryAfterNanoseconds: wait)
            }
            let expiresAt =
                now + UInt64(options.leaseDuration.components.seconds) * 1_000_000_000
                + UInt64(options.leaseDuration.components.attoseconds / 1_000_000_000)
            let key = LeaseKey(workspace: workspace, kind: grant.kind)
            let admitted = local.withLock { local -> Int? in
                local.failing = false
                local.refusedUntil[own] = nil
                local.leasedWorkspaces.insert(workspace)
                var lease = local.leases[key] ?? Lease()
                if lease.expiresAt <= now { lease.units = 0 }
                lease.units += grant.units
                lease.expiresAt = expiresAt
                local.leases[key] = lease
                return Self.take(cost, from: key, in: &local.leases, now: now) ? (grant.kind == 3 ? 5 : priority) : nil
            }
            if let admitted { return .admit(priority: admitted) }
            // Another task spent the units meanwhile: ask again.
        }
        return policy == .wait ? .wait(untilNanoseconds: now + 1_000_000) : .reject(retryAfterNanoseconds: 1_000_000)
    }

    /// Gives every unexpired, unspent unit back to the fleet's buckets (call on shutdown, after the engine has
    /// stopped). Units whose lease record has expired in Redis are not returned. Returns the units given back.
    /// - Parameter timeout: how long the whole return may take (each Redis call gets what is left of it), so that a
    ///   worker stopping while Redis hangs does not wait out a deadline per workspace. What is not given back by then
    ///   expires with its lease (`leaseDuration`), as a dead worker's does.
    @discardableResult
    package func returnLeases(timeout: Duration = .seconds(10)) async -> Int {
        let end = ContinuousClock.now + timeout
        /// What is left of `timeout`; nil once it is over.
        func remaining() -> Duration? {
            let left = end - ContinuousClock.now
            return left > .zero ? left : nil
        }
        let now = options.clock.nanoseconds()
        let (held, workspaces) = local.withLock { local -> ([(LeaseKey, Int)], Set<String>) in
            defer {
                local.leases.removeAll()
                local.leasedWorkspaces.removeAll()
            }
            let held = local.leases.filter { $0.value.units > 0 && $0.value.expiresAt > now }
            return (held.map { ($0.key, $0.value.units) }, local.leasedWorkspaces)
        }
        var returned = 0
        for (key, units) in held {
            guard let left = remaining() else {
                log("rate budget: \(units) unit(s) of \(key.workspace) not returned in \(timeout); they expire")
                continue
            }
            let budget = limits.budget(for: key.workspace)
            do throws(RedisError) {
                let reply = try await client.evalScript(
                    Self.returnScript, keys: keys(key.workspace),
                    arguments: budgetArguments(budget) + [RedisArgument(key.kind), RedisArgument(units)],
                    timeout: left)
                returned += Int(reply.integer ?? 0)
            } catch {
                log("rate budget: could not return \(units) unit(s) of \(key.workspace): \(error.message)")
            }
        }
        // The records of spent leases too: nothing of this holder is left in Redis (a record left expires).
        for workspace in workspaces {
            guard let left = remaining() else { break }
            _ = try? await client.command(["DEL", keys(workspace)[1]], timeout: left)
        }
        return returned
    }

    // MARK: - Redis

    private func keys(_ workspace: String) -> [RedisArgument] {
        [
            RedisArgument("fanout:budget:{\(workspace)}"),
            RedisArgument("fanout:budget:{\(workspace)}:lease:\(options.leaseID)"),
        ]
    }

    /// ARGV 1...9 of both scripts: the server time (or "" for `TIME`), then the budget.
    private func budgetArguments(_ budget: RateBudget) -> [RedisArgument] {
        [
            RedisArgument(options.serverMilliseconds.map { String($0()) } ?? ""),
            RedisArgument(budget.requestsPerHour), RedisArgument(budget.burstSeconds * 1000),
            RedisArgument(budget.priority10.guaranteedPerHour), RedisArgument(budget.priority5.guaranteedPerHour),
            RedisArgument(budget.priority1.guaranteedPerHour), RedisArgument(budget.priority10.ceilingPerHour),
            RedisArgument(budget.priority5.ceilingPerHour), RedisArgument(budget.priority1.ceilingPerHour),
        ]
    }

    private func lease(
        workspace: String, budget: RateBudget, index: Int, minimum: Int, want: Int, demote: Bool
    ) async throws(RedisError) -> (units: Int, kind: Int, waitMillis: Int) {
        local.withLock { $0.leaseRequests += 1 }
        let ttl =
            options.leaseDuration.components.seconds * 1000
            + options.leaseDuration.components.attoseconds / 1_000_000_000_000_000
        let reply = try await client.evalScript(
            Self.leaseScript, keys: keys(workspace),
            arguments: budgetArguments(budget) + [
                RedisArgument(index), RedisArgument(minimum), RedisArgument(want), RedisArgument(demote ? 1 : 0),
                RedisArgument(Int(max(1, ttl))),
            ])
        guard let values = reply.array?.compactMap(\.integer), values.count == 3 else {
            throw RedisError(.server, "unexpected reply to the lease script: \(reply)")
        }
        return (Int(values[0]), Int(values[1]), Int(values[2]))
    }

    private static func take(_ cost: Int, from key: LeaseKey, in leases: inout [LeaseKey: Lease], now: UInt64) -> Bool {
        guard var lease = leases[key] else { return false }
        guard lease.expiresAt > now else {
            leases[key] = nil  // expired: its units are dropped, never spent
            return false
        }
        guard lease.units >= cost else { return false }
        lease.units -= cost
        leases[key] = lease
        return true
    }

    private static func index(ofPriority priority: Int) -> Int {
        switch priority {
        case 10: 0
        case 5: 1
        case 1: 2
        default: preconditionFailure("APNs priorities are 10, 5 and 1, not \(priority)")
        }
    }

    /// Shared by both scripts. KEYS: the bucket hash, the lease record. ARGV[1]: the time in ms ("" for `TIME`);
    /// ARGV[2...9]: requestsPerHour, the burst in ms, guaranteed per hour (10, 5, 1), ceiling per hour (10, 5, 1).
    /// Loads the levels (a missing hash is full buckets) and refills them to now, as `RateBuckets.refill` does.
    /// Numbers are written with `%.0f`: Redis would write a Lua number with 14 significant digits.
    static let prelude = """
        local U = 3600000
        local now = tonumber(ARGV[1])
        if not now then
          local t = redis.call('TIME')
          now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        end
        local R = tonumber(ARGV[2])
        local B = tonumber(ARGV[3])
        local gr = {tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])}
        local cr = {tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])}
        local wcap = R * B
        local gcap = {gr[1] * B, gr[2] * B, gr[3] * B}
        local ccap = {cr[1] * B, cr[2] * B, cr[3] * B}
        local s = redis.call('HMGET', KEYS[1], 'w', 'g1', 'g2', 'g3', 'c1', 'c2', 'c3', 't')
        local w, g, c, last
        if s[8] then
          w = tonumber(s[1])
          g = {tonumber(s[2]), tonumber(s[3]), tonumber(s[4])}
          c = {tonumber(s[5]), tonumber(s[6]), tonumber(s[7])}
          last = tonumber(s[8])
        else
          w = wcap
          g = {gcap[1], gcap[2], gcap[3]}
          c = {ccap[1], ccap[2], ccap[3]}
          last = now
        end
        local e = 0
        if now > last then
          e = math.min(now - last, B)
          last = now
        end
        w = math.min(w + R * e, wcap)
        for q = 1, 3 do
          g[q] = math.min(g[q] + gr[q] * e, gcap[q])
          c[q] = math.min(c[q] + cr[q] * e, ccap[q])
        end
        local function n(x) return string.format('%.0f', x) end
        local function save()
          redis.call('HSET', KEYS[1], 'w', n(w), 'g1', n(g[1]), 'g2', n(g[2]), 'g3', n(g[3]),
            'c1', n(c[1]), 'c2', n(c[2]), 'c3', n(c[3]), 't', n(last))
          redis.call('PEXPIRE', KEYS[1], B + 60000)
        end

        """

    /// Leases units. ARGV[10]: the priority's index (0, 1, 2 for 10, 5, 1); ARGV[11]: the fewest units worth taking;
    /// ARGV[12]: the most; ARGV[13]: 1 to take a demoted lease when priority 10's does not fit; ARGV[14]: the lease
    /// record's expiry (ms). Returns {units, kind, 0} (kind 3: demoted), or {0, -1, ms until the fewest units fit
    /// at the priority, as `RateBuckets.microsUntilAdmissible` computes it}.
    static let leaseScript = RedisScript(
        prelude + """
            local i = tonumber(ARGV[10]) + 1
            local minimum = tonumber(ARGV[11])
            local want = tonumber(ARGV[12])
            local ttl = tonumber(ARGV[14])
            local function grant(units, kind)
              save()
              redis.call('HINCRBY', KEYS[2], kind, units)
              redis.call('PEXPIRE', KEYS[2], ttl)
              return {units, kind, 0}
            end
            local others = g[1] + g[2] + g[3] - g[i]
            local k = math.floor(math.min(c[i], w - others) / U)
            if k >= minimum then
              k = math.min(k, want)
              local u = k * U
              c[i] = c[i] - u
              w = w - u
              g[i] = g[i] - math.min(g[i], u)
              return grant(k, i - 1)
            end
            if ARGV[13] == '1' then
              local kd = math.floor(math.min(c[2] - g[2], w - g[1] - g[2] - g[3]) / U)
              if kd >= minimum then
                kd = math.min(kd, want)
                c[2] = c[2] - kd * U
                w = w - kd * U
                return grant(kd, 3)
              end
            end
            save()
            local units = minimum * U
            local wait = 0
            if c[i] < units then wait = math.ceil((units - c[i]) / cr[i]) end
            local a, b = 1, 2
            if i == 1 then a, b = 2, 3 elseif i == 2 then a, b = 1, 3 end
            local function available(t)
              return w + R * t - math.min(g[a] + gr[a] * t, gcap[a]) - math.min(g[b] + gr[b] * t, gcap[b])
            end
            if available(0) >= units then return {0, -1, math.max(1, wait)} end
            local last1, last2 = -1, -1
            if g[a] < gcap[a] then last1 = math.floor((gcap[a] - g[a]) / gr[a]) end
            if g[b] < gcap[b] then last2 = math.floor((gcap[b] - g[b]) / gr[b]) end
            local start = 0
            for step = 1, 2 do
              local stop = math.min(last1, last2)
              if step == 2 then stop = math.max(last1, last2) end
              if stop >= start then
                local slope = R
                if last1 >= stop then slope = slope - gr[a] end
                if last2 >= stop then slope = slope - gr[b] end
                local at = available(start)
                if at >= units then return {0, -1, math.max(1, wait, start)} end
                if slope > 0 and at + slope * (stop - start) >= units then
                  return {0, -1, math.max(1, wait, start + math.ceil((units - at) / slope))}
                end
                start = stop + 1
              end
            end
            local at = available(start)
            if at >= units then return {0, -1, math.max(1, wait, start)} end
            return {0, -1, math.max(1, wait, start + math.ceil((units - at) / R))}
            """)

    /// Returns unspent units. ARGV[10]: the lease kind; ARGV[11]: the units. Only as many as the lease record (still
    /// there, not expired) says were granted; they go back to W and to the kind's ceiling bucket, capped at their
    /// capacities. The record's field is removed. Returns the units given back.
    static let returnScript = RedisScript(
        prelude + """
            local kind = tonumber(ARGV[10])
            local granted = tonumber(redis.call('HGET', KEYS[2], ARGV[10]) or '0')
            local units = math.min(granted, tonumber(ARGV[11]))
            redis.call('HDEL', KEYS[2], ARGV[10])
            if units <= 0 then return 0 end
            local q = kind + 1
            if kind == 3 then q = 2 end
            w = math.min(w + units * U, wcap)
            c[q] = math.min(c[q] + units * U, ccap[q])
            save()
            return units
            """)
}
