extension Duration {
    /// Whole milliseconds, rounded down (0 for a negative duration); what libuv's clock and timers count in.
    package var wholeMilliseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0 else { return 0 }
        return UInt64(seconds) * 1000 + UInt64(attoseconds / 1_000_000_000_000_000)
    }

    /// Whole nanoseconds, rounded down (0 for a negative duration); what monotonic clock readings count in.
    package var wholeNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0 else { return 0 }
        return UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
    }
}
