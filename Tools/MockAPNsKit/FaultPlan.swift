import Synchronization

/// Decides, for the n-th request the mock receives (counted across all loops), which fault it
/// meets. Decisions depend only on `--seed` and n, so a run is repeatable for a given seed and
/// request order.
final class FaultPlan: Sendable {
    /// What happens to one request.
    struct Decision {
        /// Reset with REFUSED_STREAM, unprocessed.
        var refuse = false
        /// Accepted and never answered.
        var blackhole = false
        /// Drop the TCP connection without answering.
        var drop = false
        /// Answer, then send GOAWAY on this connection.
        var goaway = false
        /// Answer with this error instead of validating further.
        var failure: InjectedFailure?
    }

    private let options: MockOptions
    private let sequence = Atomic<UInt64>(0)
    /// Whether any fault is asked for.
    private let hasFaults: Bool

    init(options: MockOptions) {
        self.options = options
        hasFaults =
            options.refuseEvery > 0 || options.blackholeEvery > 0 || options.blackholeAfter != nil
            || options.dropEvery > 0 || options.goawayEvery > 0 || !options.failures.isEmpty
    }

    func next() -> Decision {
        // Without faults the sequence number is never read: leave the counter every loop shares alone.
        guard hasFaults else { return Decision() }
        let n = sequence.add(1, ordering: .relaxed).newValue
        var decision = Decision()
        if options.refuseEvery > 0 && n % UInt64(options.refuseEvery) == 0 {
            decision.refuse = true
            return decision
        }
        if (options.blackholeEvery > 0 && n % UInt64(options.blackholeEvery) == 0)
            || (options.blackholeAfter.map { n > UInt64($0) } ?? false)
        {
            decision.blackhole = true
            return decision
        }
        if options.dropEvery > 0 && n % UInt64(options.dropEvery) == 0 {
            decision.drop = true
            return decision
        }
        decision.goaway = options.goawayEvery > 0 && n % UInt64(options.goawayEvery) == 0
        if !options.failures.isEmpty {
            var draw = Self.uniform(seed: options.seed, n: n)
            for failure in options.failures {
                if draw < failure.rate {
                    decision.failure = failure
                    break
                }
                draw -= failure.rate
            }
        }
        return decision
    }

    /// A uniform draw in [0, 1) from (seed, n): SplitMix64's finaliser.
    static func uniform(seed: UInt64, n: UInt64) -> Double {
        var z = seed &+ n &* 0x9E37_79B9_7F4A_7C15
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        z ^= z >> 31
        return Double(z >> 11) / Double(1 << 53)
    }
}
