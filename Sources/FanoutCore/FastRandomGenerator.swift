/// xoshiro256** (Blackman and Vigna): a fast, non-cryptographic generator for ids on hot paths
/// (`apns-id`, mock-apns's `apns-unique-id`), seeded once from the system's generator. One per
/// thread: it is a value type with no locking. Never use it for keys or secrets.
package struct FastRandomGenerator: RandomNumberGenerator, Sendable {
    private var state: (UInt64, UInt64, UInt64, UInt64)

    /// Seeded from the system's cryptographic generator.
    package init() {
        var system = SystemRandomNumberGenerator()
        self.init(seed: system.next())
    }

    /// Seeded deterministically (SplitMix64 expands the seed into the state).
    package init(seed: UInt64) {
        var splitMix = seed
        func next() -> UInt64 {
            splitMix &+= 0x9E37_79B9_7F4A_7C15
            var z = splitMix
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        state = (next(), next(), next(), next())
    }

    package mutating func next() -> UInt64 {
        let result = rotate(state.1 &* 5, 7) &* 9
        let shifted = state.1 << 17
        state.2 ^= state.0
        state.3 ^= state.1
        state.1 ^= state.2
        state.0 ^= state.3
        state.2 ^= shifted
        state.3 = rotate(state.3, 45)
        return result
    }

    private func rotate(_ value: UInt64, _ count: UInt64) -> UInt64 {
        (value << count) | (value >> (64 - count))
    }
}
