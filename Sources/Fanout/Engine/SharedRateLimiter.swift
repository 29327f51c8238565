/// Where an engine's rate decisions come from instead of `FanoutEngineConfiguration.rateLimits`' own buckets.
///
/// A fleet of workers shares one budget per workspace (`FleetRateBudget` in FanoutFleet): the buckets live in Redis
/// and each worker spends capacity leased to it in chunks, so most decisions are answered from memory. The budgets
/// themselves (counting unit, largest cost) are still read from `rateLimits`, which must hold the same budgets.
package protocol SharedRateLimiter: Sendable {
    /// Decides `cost` requests of `workspace` at `priority`, as `WorkspaceRateLimiter.decide(priority:cost:now:)`
    /// does: `now` and the times in the answer are on the caller's clock (`MonotonicRateClock`). May wait for I/O.
    func decide(workspace: String, priority: Int, cost: Int, now: UInt64) async -> RateDecision
}
