/// The limiter's answer for one request.
public enum RateDecision: Hashable, Sendable {
    /// Send it now, at `priority`: the requested one, or 5 when a priority-10 request was demoted.
    case admit(priority: Int)
    /// Budget out, policy `wait`: decide again at `untilNanoseconds` (the caller's clock), when the tokens will be
    /// there if nothing else takes them first. The limiter reserves nothing for a waiting request.
    case wait(untilNanoseconds: UInt64)
    /// Budget out, policy `reject`: the request is refused (outcome `rate_limited`); a retry after
    /// `retryAfterNanoseconds` (always more than zero) is admitted if nothing else takes the tokens first.
    case reject(retryAfterNanoseconds: UInt64)

    /// Whether the request may be sent now.
    public var isAdmitted: Bool {
        if case .admit = self { return true }
        return false
    }
}
