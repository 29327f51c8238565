import FanoutCore
package import FanoutPolicy
import Foundation

/// Every workspace's two API quotas (server requests, device registrations), behind one lock: a decision is a few
/// arithmetic operations, so one lock for all is cheaper than a lock per bucket.
package final class RequestQuotas: Sendable {
    package enum Budget: Sendable { case api, devices }

    private struct Key: Hashable { var workspace: String; var budget: Budget }
    private let buckets: FanoutMutex<[Key: RequestQuota]>
    private let clock: any RateClock
    private let wallClock: @Sendable () -> Double

    package init(
        _ configuration: ServiceConfiguration, clock: any RateClock = MonotonicRateClock(),
        wallClock: @escaping @Sendable () -> Double = { Date().timeIntervalSince1970 }
    ) {
        var buckets: [Key: RequestQuota] = [:]
        for workspace in configuration.workspaces.values {
            buckets[Key(workspace: workspace.name, budget: .api)] = RequestQuota(rule: workspace.rateLimit)
            buckets[Key(workspace: workspace.name, budget: .devices)] = RequestQuota(rule: workspace.deviceRateLimit)
        }
        self.buckets = FanoutMutex(buckets)
        self.clock = clock
        self.wallClock = wallClock
    }

    /// The rule of a workspace's budget (nil for an unknown workspace).
    func rule(workspace: String, budget: Budget) -> RequestQuotaRule? {
        buckets.withLock { $0[Key(workspace: workspace, budget: budget)]?.rule }
    }

    /// Counts one request against the workspace's budget.
    package func take(workspace: String, budget: Budget) -> RequestQuotaDecision? {
        let now = clock.nanoseconds()
        let wall = wallClock()
        return buckets.withLock { buckets in
            buckets[Key(workspace: workspace, budget: budget)]?.take(now: now, wallClockSeconds: wall)
        }
    }

    /// What is left of a workspace's API budget, without taking any (the status page).
    package func remaining(workspace: String) -> Int? {
        let now = clock.nanoseconds()
        return buckets.withLock { buckets in
            guard var copy = buckets[Key(workspace: workspace, budget: .api)] else { return nil }
            // Take from a copy: the decision's `remaining` is one less than what is there now.
            let decision = copy.take(now: now, wallClockSeconds: 0)
            return decision.admitted ? decision.remaining + 1 : decision.remaining
        }
    }
}
