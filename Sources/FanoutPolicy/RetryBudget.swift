/// Caps retries at a share of first attempts over a sliding window, so a failing endpoint is not
/// hammered: past the cap, notifications fail fast instead of retrying (the gRPC and Finagle
/// "retry budget"). A small floor lets a quiet sender still retry.
///
/// Not thread-safe: each engine loop keeps its own, so the hot path takes no lock.
package struct RetryBudget: Sendable {
    /// Retries allowed per first attempt in the window (0.2: at most 20% extra load).
    package let ratio: Double
    /// Retries always allowed per window, whatever the traffic.
    package let floor: Int
    private let bucketNanoseconds: UInt64
    private var firstAttempts: [Int]
    private var retries: [Int]
    private var bucketStart: [UInt64]

    /// - Parameters:
    ///   - windowSeconds: length of the sliding window, kept in one-second buckets.
    package init(ratio: Double = 0.2, floor: Int = 10, windowSeconds: Int = 10) {
        precondition(ratio >= 0 && floor >= 0 && windowSeconds >= 1)
        self.ratio = ratio
        self.floor = floor
        bucketNanoseconds = 1_000_000_000
        firstAttempts = Array(repeating: 0, count: windowSeconds)
        retries = Array(repeating: 0, count: windowSeconds)
        bucketStart = Array(repeating: .max, count: windowSeconds)
    }

    private mutating func bucket(_ now: UInt64) -> Int {
        let slot = now / bucketNanoseconds
        let index = Int(slot % UInt64(firstAttempts.count))
        if bucketStart[index] != slot {
            bucketStart[index] = slot
            firstAttempts[index] = 0
            retries[index] = 0
        }
        return index
    }

    /// Counts a notification's first send.
    package mutating func recordFirstAttempt(now: UInt64) {
        firstAttempts[bucket(now)] += 1
    }

    /// Whether one more retry fits in the budget; when it does, it is counted.
    package mutating func tryRetry(now: UInt64) -> Bool {
        let current = bucket(now)
        let slot = now / bucketNanoseconds
        let span = UInt64(firstAttempts.count - 1)
        let oldest = slot >= span ? slot - span : 0
        var first = 0
        var retried = 0
        for index in firstAttempts.indices where bucketStart[index] != .max && bucketStart[index] >= oldest {
            first += firstAttempts[index]
            retried += retries[index]
        }
        guard Double(retried + 1) <= ratio * Double(first) + Double(floor) else { return false }
        retries[current] += 1
        return true
    }
}
