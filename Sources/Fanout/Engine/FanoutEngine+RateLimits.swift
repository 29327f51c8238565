import FanoutCore
import FanoutPolicy

/// What the workspace budget says about some notifications of a job.
enum Admission {
    /// Send them, as this prepared job (another priority when demoted).
    case send(PreparedJob)
    /// Refused: record them as `rate_limited`.
    case rateLimited(retryAfterSeconds: Double)
    /// The engine shut down while waiting for budget.
    case notSent
    /// The caller cancelled while waiting for budget.
    case cancelled
}

extension FanoutEngine {
    /// Asks the job's workspace budget for `cost` requests at the job's priority. Under `wait` it
    /// sleeps (in short slices, to notice a shutdown; a cancelled task stops at once) until the budget
    /// admits them; under `demote`
    /// a priority-10 job may be admitted at priority 5.
    func admit(
        _ job: FanoutJob, prepared: PreparedJob, demoted: inout PreparedJob?, cost: Int, run: FanoutRun,
        isShuttingDown: () -> Bool
    ) async -> Admission {
        guard let limits = configuration.rateLimits else { return .send(prepared) }
        let priority = job.headers.effectivePriority
        let clock = MonotonicRateClock()
        while true {
            let now = clock.nanoseconds()
            let decision =
                if let shared = configuration.sharedRateLimits {
                    await shared.decide(workspace: job.workspace, priority: priority, cost: cost, now: now)
                } else {
                    limits.decide(workspace: job.workspace, priority: priority, cost: cost, now: now)
                }
            // Not admitted: how long until the budget would admit it, and whether to wait that long (the budget's
            // policy, unless the call chose for itself with `overBudget`).
            let untilAdmitted: UInt64
            var waits = false
            switch decision {
            case .admit(let admitted) where admitted == priority:
                return .send(prepared)
            case .admit(let admitted):
                let lower = demoted ?? PreparedJob(demoting: prepared, to: admitted)
                demoted = lower
                return .send(lower)
            case .reject(let retryAfter):
                untilAdmitted = retryAfter
            case .wait(let until):
                untilAdmitted = until > now ? until - now : 0
                waits = true
            }
            if let choice = job.overBudget { waits = choice == .wait }
            guard waits else { return .rateLimited(retryAfterSeconds: Double(untilAdmitted) / 1e9) }
            if isShuttingDown() { return .notSent }
            // Cancelled, or its deadline passed (`FanoutRun.expire`): the caller's task may still be running.
            if run.isCancelled { return .cancelled }
            // Short naps, so that a deadline or a cancel ends the wait within 20 ms.
            do {
                try await Task.sleep(nanoseconds: min(max(untilAdmitted, 1_000_000), 20_000_000))
            } catch {
                return .cancelled  // Task.sleep throws only when the task is cancelled
            }
        }
    }

    /// The most requests one decision may ask for at this job's priority (a burst smaller than the
    /// workspace's, since other priorities' reservations are kept); nil without limits.
    func maximumRateCost(for job: FanoutJob) -> Int? {
        guard let limits = configuration.rateLimits else { return nil }
        return limits.limiter(for: job.workspace).maximumCost(priority: job.headers.effectivePriority)
    }
}
