/// What one unit of a workspace's budget is.
///
/// Braze counts API requests, so one job (one update to many tokens) is one request by default. A workspace that pays
/// per delivered notification counts each token instead; the caller turns a job into a cost with `cost(ofJobWith:)`.
public enum RateCountingUnit: String, Hashable, Sendable {
    /// One job is one request, whatever its number of tokens (the default).
    case job
    /// Every notification (one token of a job) is one request.
    case notification

    /// The cost to pass to `WorkspaceRateLimiter.decide(priority:cost:now:)` for a job (or a chunk of one) that
    /// holds `notifications` tokens.
    public func cost(ofJobWith notifications: Int) -> Int {
        switch self {
        case .job: return 1
        case .notification: return notifications
        }
    }
}

/// What the limiter answers when a priority's budget is out.
public enum RateLimitPolicy: String, Hashable, Sendable {
    /// `RateDecision.wait(untilNanoseconds:)`: hold the request until its tokens are there (the job-file driver's
    /// default, because a batch job would rather finish late than drop notifications).
    case wait
    /// `RateDecision.reject(retryAfterNanoseconds:)`: refuse now and say when a retry can succeed; the notification's
    /// outcome is `rate_limited` (the library's default, because a gateway must answer its own caller promptly).
    case reject
    /// Priority 10 only: when the priority-10 budget is out but priority 5 has room to spare, admit the request at
    /// priority 5 (`RateDecision.admit(priority: 5)`): a Live Activity update that arrives a little later is better
    /// than one that does not arrive. "Room to spare" is what priority 5 could borrow (idle capacity under its
    /// ceiling), never priority 5's own reservation, so demoted updates cannot starve priority-5 traffic. When there
    /// is no such room, the request gets what priority 5's policy gives (`wait` or `reject`), with priority 10's
    /// retry time.
    case demote
}

/// One priority's share of a workspace budget.
public struct PriorityBudget: Hashable, Sendable {
    /// Requests per hour reserved for this priority: it gets them however hard the other priorities push.
    public var guaranteedPerHour: Int
    /// Requests per hour this priority may reach at most, borrowing the workspace's unused capacity above its
    /// guarantee. At least `guaranteedPerHour` and at most the workspace's `requestsPerHour`.
    public var ceilingPerHour: Int
    /// What happens to a request of this priority when its budget is out.
    public var policy: RateLimitPolicy

    public init(guaranteedPerHour: Int, ceilingPerHour: Int, policy: RateLimitPolicy) {
        self.guaranteedPerHour = guaranteedPerHour
        self.ceilingPerHour = ceilingPerHour
        self.policy = policy
    }
}

/// A workspace's rate budget: a total rate with a burst, split into per-priority guarantees and ceilings.
///
/// Defaults (the README's table), as shares of `requestsPerHour` (250,000 per hour, burst 60 seconds):
///
/// | priority | guaranteed          | ceiling             |
/// |----------|---------------------|---------------------|
/// | 10       | 50% (125,000 / h)   | 80% (200,000 / h)   |
/// | 5        | 40% (100,000 / h)   | 100% (250,000 / h)  |
/// | 1        | 10% (25,000 / h)    | 100% (250,000 / h)  |
///
/// Why these: the guarantees add up to the whole budget, so under full contention every priority gets exactly its
/// share and bulk priority-5 traffic can never push priority 10 below half the budget. Priority 10 is capped at 80%
/// so that a flood of time-sensitive updates still leaves a fifth of the budget to everything else (iOS, too, throttles
/// apps that send too many priority-10 Live Activity updates). Priorities 5 and 1 may borrow everything that is
/// idle. Every bucket's burst is `burstSeconds` of its own rate. A request is one job (`RateCountingUnit.job`); the
/// policy is `reject` for the library (`RateBudget.default`) and `wait` for the job-file driver
/// (`RateBudget.jobFileDefault`).
public struct RateBudget: Hashable, Sendable {
    /// The workspace's sustained rate: every priority together never exceeds it (plus one burst).
    public var requestsPerHour: Int
    /// How many seconds of its rate a bucket can save up while idle and then spend at once. At least 1.
    public var burstSeconds: Int
    /// What one request is. The limiter itself only sees costs; this tells the caller how to compute them.
    public var countingUnit: RateCountingUnit
    /// Priority 10 (immediate delivery; Live Activity updates that must show now).
    public var priority10: PriorityBudget
    /// Priority 5 (power-considerate delivery; bulk and background-friendly traffic).
    public var priority5: PriorityBudget
    /// Priority 1 (lowest; may be delayed or coalesced by APNs).
    public var priority1: PriorityBudget

    /// The default split (see the type's documentation) of `requestsPerHour`, with `policy` for every priority
    /// (`demote` applies to priority 10 only; priorities 5 and 1 then `reject`).
    public init(
        requestsPerHour: Int = 250_000, burstSeconds: Int = 60, countingUnit: RateCountingUnit = .job,
        policy: RateLimitPolicy = .reject
    ) {
        func share(_ percent: Int) -> Int { requestsPerHour / 100 * percent + requestsPerHour % 100 * percent / 100 }
        let lowPolicy: RateLimitPolicy = policy == .demote ? .reject : policy
        self.init(
            requestsPerHour: requestsPerHour, burstSeconds: burstSeconds, countingUnit: countingUnit,
            priority10: PriorityBudget(guaranteedPerHour: share(50), ceilingPerHour: share(80), policy: policy),
            priority5: PriorityBudget(guaranteedPerHour: share(40), ceilingPerHour: share(100), policy: lowPolicy),
            priority1: PriorityBudget(guaranteedPerHour: share(10), ceilingPerHour: share(100), policy: lowPolicy))
    }

    /// A budget with an explicit split.
    public init(
        requestsPerHour: Int, burstSeconds: Int, countingUnit: RateCountingUnit, priority10: PriorityBudget,
        priority5: PriorityBudget, priority1: PriorityBudget
    ) {
        self.requestsPerHour = requestsPerHour
        self.burstSeconds = burstSeconds
        self.countingUnit = countingUnit
        self.priority10 = priority10
        self.priority5 = priority5
        self.priority1 = priority1
    }

    /// The library's default: 250,000 jobs per hour, 60-second burst, the default split, `reject` when out.
    public static let `default` = RateBudget()

    /// The job-file driver's default: as `default`, but `wait` when out.
    public static let jobFileDefault = RateBudget(policy: .wait)

    /// The priorities a budget has, highest first (APNs accepts exactly these).
    public static let priorities = [10, 5, 1]

    /// The budget of priority 10, 5 or 1.
    public subscript(priority priority: Int) -> PriorityBudget {
        get {
            switch priority {
            case 10: return priority10
            case 5: return priority5
            case 1: return priority1
            default: preconditionFailure("APNs priorities are 10, 5 and 1, not \(priority)")
            }
        }
        set {
            switch priority {
            case 10: priority10 = newValue
            case 5: priority5 = newValue
            case 1: priority1 = newValue
            default: preconditionFailure("APNs priorities are 10, 5 and 1, not \(priority)")
            }
        }
    }

    /// The same budget with every priority's policy set to `policy` (`demote` only on priority 10; the others `reject`).
    public func with(policy: RateLimitPolicy) -> RateBudget {
        var copy = self
        copy.priority10.policy = policy
        copy.priority5.policy = policy == .demote ? .reject : policy
        copy.priority1.policy = policy == .demote ? .reject : policy
        return copy
    }

    /// Checks that the limiter can enforce this budget exactly; call it on budgets read from configuration.
    /// `WorkspaceRateLimiter` requires a valid budget.
    public func validate() throws(RateBudgetError) {
        if requestsPerHour < 1 { throw RateBudgetError("requestsPerHour must be at least 1, not \(requestsPerHour)") }
        if burstSeconds < 1 { throw RateBudgetError("burstSeconds must be at least 1, not \(burstSeconds)") }
        // Bucket levels are kept in Int64 as rate × burst in microseconds (see RateBuckets); keep a factor of 4 spare.
        if requestsPerHour > Int.max / 4 / RateBuckets.microsPerSecond / burstSeconds {
            throw RateBudgetError("requestsPerHour × burstSeconds is too large (\(requestsPerHour) × \(burstSeconds))")
        }
        var guaranteed = 0
        for priority in Self.priorities {
            let budget = self[priority: priority]
            if budget.guaranteedPerHour < 0 {
                throw RateBudgetError("priority \(priority): guaranteedPerHour must not be negative")
            }
            if budget.ceilingPerHour < max(1, budget.guaranteedPerHour) || budget.ceilingPerHour > requestsPerHour {
                throw RateBudgetError(
                    "priority \(priority): ceilingPerHour (\(budget.ceilingPerHour)) must be at least 1 and "
                        + "guaranteedPerHour (\(budget.guaranteedPerHour)), and at most requestsPerHour "
                        + "(\(requestsPerHour))")
            }
            if budget.policy == .demote && priority != 10 {
                throw RateBudgetError("priority \(priority): only priority 10 can be demoted")
            }
            guaranteed += budget.guaranteedPerHour
        }
        if guaranteed > requestsPerHour {
            throw RateBudgetError(
                "the guarantees add up to \(guaranteed) per hour, more than requestsPerHour (\(requestsPerHour))")
        }
        let config = RateBuckets.Config(self)
        for priority in Self.priorities where config.maximumCost(priority: priority) < 1 {
            throw RateBudgetError("priority \(priority): a burst of \(burstSeconds) s does not hold one request")
        }
    }
}

/// Why a `RateBudget` cannot be enforced.
public struct RateBudgetError: Error, Hashable, Sendable, CustomStringConvertible {
    public let message: String

    init(_ message: String) {
        self.message = message
    }

    public var description: String { message }
}
