import FanoutCore
import Synchronization

/// The rate limiters of all workspaces: one `WorkspaceRateLimiter` per workspace name, created on first use with the
/// workspace's override budget or the default one.
///
/// Lookups take no lock. The limiters live in a fixed table of insert-only linked lists whose links are
/// `AtomicLazyReference`s (set once, then read with a plain atomic load): a reader walks its list with loads only,
/// and a new workspace is appended with one compare-and-swap; when two threads add the same workspace at once, one
/// wins and the other uses the winner's limiter. Limiters are never replaced or removed, so a caller may keep the
/// limiter it got (a job driver looks it up once per job) and it stays the workspace's limiter. Workspaces are few
/// (configuration, not traffic), so entries are never reclaimed.
public final class RateLimiterRegistry: Sendable {
    /// The budget of every workspace without an override.
    public let defaultBudget: RateBudget
    /// Budgets for particular workspaces, by name.
    public let overrides: [String: RateBudget]

    private final class Entry: Sendable {
        let workspace: String
        let limiter: WorkspaceRateLimiter
        let next = AtomicLazyReference<Entry>()

        init(workspace: String, limiter: WorkspaceRateLimiter) {
            self.workspace = workspace
            self.limiter = limiter
        }
    }

    private final class Slot: Sendable {
        let head = AtomicLazyReference<Entry>()
    }

    private let slots: [Slot]
    private let slotMask: Int
    #if FANOUT_TSAN
        /// ThreadSanitizer does not see `AtomicLazyReference`'s publication of an entry: it reported an entry's
        /// fields, written before the compare-and-swap that published it, against their reads on another thread
        /// after the load that found it. A `FANOUT_TSAN` build (`scripts/sanitize.sh`) walks and extends the lists
        /// under this lock, a pthread mutex there, which orders them as the atomics do; other builds take no lock.
        private let tsanOrder = FanoutMutex(())
    #endif

    /// A registry; every budget must be valid (`RateBudget.validate()`).
    ///
    /// - Parameters:
    ///   - defaultBudget: for workspaces not in `overrides` (default: 250,000 per hour, burst 60 s, `reject`).
    ///   - overrides: per-workspace budgets.
    /// - Throws: `RateBudgetError` naming the workspace whose budget cannot be enforced.
    public init(defaultBudget: RateBudget = .default, overrides: [String: RateBudget] = [:]) throws(RateBudgetError) {
        for (workspace, budget) in [("(default)", defaultBudget)] + overrides.map({ ($0.key, $0.value) }) {
            do {
                try budget.validate()
            } catch {
                throw RateBudgetError("workspace \(workspace): \(error.message)")
            }
        }
        self.defaultBudget = defaultBudget
        self.overrides = overrides
        // A power of two comfortably above the expected number of workspaces keeps the lists a few entries long.
        let count = 256
        slots = (0..<count).map { _ in Slot() }
        slotMask = count - 1
    }

    /// The budget `workspace` gets.
    public func budget(for workspace: String) -> RateBudget {
        overrides[workspace] ?? defaultBudget
    }

    /// The workspace's limiter, created on first use. Always the same instance for the same name.
    public func limiter(for workspace: String) -> WorkspaceRateLimiter {
        #if FANOUT_TSAN
            return tsanOrder.withLock { _ in lookUp(workspace) }
        #else
            return lookUp(workspace)
        #endif
    }

    private func lookUp(_ workspace: String) -> WorkspaceRateLimiter {
        let slot = slots[workspace.hashValue & slotMask]
        // Built at most once per call, and only when the name is not in the list yet; a candidate that loses a race
        // is dropped unused.
        var candidate: Entry?
        func makeEntry() -> Entry {
            if let candidate { return candidate }
            let entry = Entry(workspace: workspace, limiter: WorkspaceRateLimiter(budget: budget(for: workspace)))
            candidate = entry
            return entry
        }
        var entry = slot.head.load() ?? slot.head.storeIfNil(makeEntry())
        while true {
            if entry.workspace == workspace { return entry.limiter }
            // The list's last entry: append ours, or continue from whatever another thread appended first.
            entry = entry.next.load() ?? entry.next.storeIfNil(makeEntry())
        }
    }

    /// `limiter(for: workspace).decide(priority:cost:now:)`.
    public func decide(workspace: String, priority: Int, cost: Int = 1, now: UInt64) -> RateDecision {
        limiter(for: workspace).decide(priority: priority, cost: cost, now: now)
    }
}
