/// Where the limiter's time comes from: nanoseconds since any fixed origin, never going backwards.
///
/// The limiter takes `now` as an argument on every call, so tests and simulations drive it with made-up times and
/// production code passes a monotonic clock's reading; this protocol is only for the convenience overloads.
public protocol RateClock: Sendable {
    func nanoseconds() -> UInt64
}

/// The process's monotonic clock (`ContinuousClock`), counted from the first time any instance is read.
/// Wall-clock time is not used because it can jump backwards (NTP), which would stall refills.
public struct MonotonicRateClock: RateClock {
    // Lazily initialized once per process; readings are differences from it, so they start near zero.
    private static let origin = ContinuousClock.now

    public init() {}

    public func nanoseconds() -> UInt64 {
        // The origin first: reading it may initialize it, which must not come after `now`.
        let origin = Self.origin
        let elapsed = (ContinuousClock.now - origin).components
        return UInt64(elapsed.seconds) * 1_000_000_000 + UInt64(elapsed.attoseconds / 1_000_000_000)
    }
}
