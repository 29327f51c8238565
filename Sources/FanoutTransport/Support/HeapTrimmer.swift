import CFanoutShims
import FanoutCore
import Foundation
import Synchronization

/// Gives freed heap back to the kernel after a burst (`malloc_trim(0)`, through `CFanoutShims_malloc_trim`).
///
/// glibc keeps what a process frees for its next allocations and returns only the free pages at the top of each
/// arena. After thousands of connections opened and closed at once, their buffers leave free pages all over the
/// arenas, so the process kept most of the burst's peak: 184 MB after five floods of 5,000 idle connections against
/// 32 MB at start, though every connection was closed. `malloc_trim` walks every arena and releases the free pages.
///
/// A trim is asked for when a burst is over (`HTTPServer` asks when its open connections fall back), runs on a
/// background queue (it takes each arena's lock for the walk, so never on a loop thread), and runs at most once per
/// `minimumInterval`: a request within it is put off to its end, and requests meanwhile are merged into that one.
package final class HeapTrimmer: Sendable {
    /// One per process: the heap is the process's.
    package static let shared = HeapTrimmer()

    /// The shortest time between two trims.
    package static let minimumInterval: Duration = .seconds(10)

    private struct State {
        var lastTrim: ContinuousClock.Instant?
        var scheduled = false
        var trims = 0
    }
    private let state = FanoutMutex(State())
    private let queue = DispatchQueue(label: "fanout-heap-trim", qos: .utility)

    private init() {}

    /// Trims done so far (for tests and logs).
    package var trims: Int { state.withLock { $0.trims } }

    /// Asks for a trim: now (on the background queue), or at the end of `minimumInterval` after the last one. Cheap
    /// to call from a loop thread: a lock and, at most once per interval, a dispatch.
    package func trimSoon() {
        let delay: Duration? = state.withLock { state in
            guard !state.scheduled else { return nil }
            state.scheduled = true
            guard let last = state.lastTrim else { return .zero }
            let elapsed = ContinuousClock.now - last
            return elapsed >= Self.minimumInterval ? .zero : Self.minimumInterval - elapsed
        }
        guard let delay else { return }
        let (seconds, attoseconds) = delay.components
        let nanoseconds = Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
        queue.asyncAfter(deadline: .now() + .nanoseconds(nanoseconds)) { [self] in trim() }
    }

    private func trim() {
        _ = CFanoutShims_malloc_trim(0)
        state.withLock { state in
            state.lastTrim = ContinuousClock.now
            state.scheduled = false
            state.trims += 1
        }
    }
}
