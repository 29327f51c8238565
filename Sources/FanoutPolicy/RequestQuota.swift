/// A per-workspace API request quota as Braze publishes it: a rate per hour with a burst, and the three numbers every
/// response carries (`X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`).
///
/// A token bucket: it holds at most `burst` requests and refills at `requestsPerHour`. A request takes one token or
/// is refused with the time until one is there (`Retry-After`). Time is passed in (nanoseconds on any monotonic
/// origin) so tests drive it; the reset time is reported on the wall clock the caller gives.
package struct RequestQuotaRule: Sendable, Hashable {
    package var requestsPerHour: Int
    /// Requests that may arrive at once after a quiet spell.
    package var burst: Int

    package init(requestsPerHour: Int, burst: Int) {
        precondition(requestsPerHour > 0 && burst > 0, "a quota needs a positive rate and burst")
        self.requestsPerHour = requestsPerHour
        self.burst = burst
    }

    /// `burstSeconds` of the hourly rate (at least one request).
    package init(requestsPerHour: Int, burstSeconds: Int) {
        self.init(requestsPerHour: requestsPerHour, burst: max(1, requestsPerHour * burstSeconds / 3600))
    }
}

/// What one request was told.
package struct RequestQuotaDecision: Sendable, Hashable {
    package var admitted: Bool
    /// `X-RateLimit-Limit`: the hourly rate.
    package var limit: Int
    /// `X-RateLimit-Remaining`: whole requests left in the bucket after this one.
    package var remaining: Int
    /// `X-RateLimit-Reset`: Unix seconds at which the bucket is full again.
    package var resetAtUnixSeconds: Int64
    /// `Retry-After` for a refused request: whole seconds until one request is admitted (at least 1).
    package var retryAfterSeconds: Int

    /// A decision taken elsewhere (a bucket shared by several processes, in Redis).
    package init(admitted: Bool, limit: Int, remaining: Int, resetAtUnixSeconds: Int64, retryAfterSeconds: Int) {
        self.admitted = admitted
        self.limit = limit
        self.remaining = remaining
        self.resetAtUnixSeconds = resetAtUnixSeconds
        self.retryAfterSeconds = retryAfterSeconds
    }
}

/// One workspace's bucket. Not thread-safe by itself: the caller holds it in a lock (`RequestQuotas`).
package struct RequestQuota: Sendable {
    package let rule: RequestQuotaRule
    /// Tokens in micro-requests, so that refills of a slow rate are not lost to rounding.
    private var microTokens: Int64
    private var lastRefill: UInt64?

    private static let scale: Int64 = 1_000_000

    package init(rule: RequestQuotaRule) {
        self.rule = rule
        microTokens = Int64(rule.burst) * Self.scale
    }

    /// Takes one request if there is one.
    /// - Parameters:
    ///   - now: monotonic nanoseconds.
    ///   - wallClockSeconds: Unix seconds now, for the reset time.
    package mutating func take(now: UInt64, wallClockSeconds: Double) -> RequestQuotaDecision {
        refill(to: now)
        let admitted = microTokens >= Self.scale
        if admitted { microTokens -= Self.scale }
        let capacity = Int64(rule.burst) * Self.scale
        let perSecond = Double(rule.requestsPerHour) / 3600
        let secondsToFull = Double(capacity - microTokens) / Double(Self.scale) / perSecond
        let secondsToOne = max(0, Double(Self.scale - microTokens) / Double(Self.scale) / perSecond)
        return RequestQuotaDecision(
            admitted: admitted, limit: rule.requestsPerHour, remaining: Int(microTokens / Self.scale),
            resetAtUnixSeconds: Int64((wallClockSeconds + secondsToFull).rounded(.up)),
            retryAfterSeconds: admitted ? 0 : max(1, Int(secondsToOne.rounded(.up))))
    }

    private mutating func refill(to now: UInt64) {
        defer { lastRefill = max(lastRefill ?? now, now) }
        guard let last = lastRefill, now > last else { return }
        let capacity = Int64(rule.burst) * Self.scale
        // micro-requests = ns × (requests/hour) × 1e6 / 3.6e12 ns per hour; in two steps to stay inside Int64.
        let elapsed = Double(now - last)
        let added = elapsed * Double(rule.requestsPerHour) / 3.6e12 * Double(Self.scale)
        microTokens = min(capacity, microTokens + Int64(min(added, Double(capacity))))
    }
}
