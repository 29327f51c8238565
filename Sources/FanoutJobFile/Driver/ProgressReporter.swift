import CommandLineSupport
import Fanout
import FanoutCore
package import FanoutJobLines
import Foundation
import Synchronization

/// Progress of a long run on stderr: on a terminal, one line redrawn four times a second
/// (notifications done, rate, outcomes so far); otherwise a plain line every five seconds.
///
/// `@unchecked Sendable`: the timer source is set in `start()` and taken in `stop()` under `lock`.
package final class ProgressReporter: @unchecked Sendable {
    package enum Mode: String, Sendable {
        case auto, always, never
    }

    private let mode: Mode
    private let counts: @Sendable () -> SendCounts
    private let lock = NSLock()
    private var timer: DispatchSourceTimer?
    private let started = DispatchTime.now()
    private let interactive: Bool
    /// Notifications the whole run will have, once a background count of the job file is done
    /// (-1 until then).
    private let total = Atomic<Int>(-1)
    /// With `--follow`: the bytes of the job file not read yet.
    private let queueLag = FanoutMutex<(@Sendable () -> FollowedQueueLag.Reading)?>(nil)

    package init(mode: Mode, counts: @escaping @Sendable () -> SendCounts) {
        self.mode = mode
        self.counts = counts
        interactive = isatty(STDERR_FILENO) == 1
    }

    /// Shows, with `--follow`, how far the job file's producers are ahead: the job lines and bytes written and not
    /// read yet, and how long the oldest has waited.
    func showQueueLag(_ lag: @escaping @Sendable () -> FollowedQueueLag.Reading) {
        queueLag.withLock { $0 = lag }
    }

    /// Sets the run's total, enabling the done/total fraction and the ETA.
    package func setTotal(_ value: Int) {
        total.store(value, ordering: .relaxed)
    }

    package func start() {
        guard mode == .always || (mode == .auto) else { return }
        let source = DispatchSource.makeTimerSource(queue: .global())
        let interval: DispatchTimeInterval = interactive ? .milliseconds(250) : .seconds(5)
        source.schedule(deadline: .now() + interval, repeating: interval)
        source.setEventHandler { [self] in report(final: false) }
        source.resume()
        lock.withLock { timer = source }
    }

    package func stop() {
        let source = lock.withLock { () -> DispatchSourceTimer? in
            defer { timer = nil }
            return timer
        }
        guard let source else { return }
        source.cancel()
        report(final: true)
    }

    private func report(final: Bool) {
        let counts = counts()
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - started.uptimeNanoseconds) / 1e9
        let rate = Double(counts.notifications) / max(seconds, 1e-3)
        let known = total.load(ordering: .relaxed)
        var done = "\(counts.notifications)"
        if known > 0 {
            let remaining = max(0, known - counts.notifications)
            let eta = rate > 0 ? Double(remaining) / rate : 0
            done = String(
                format: "%d/%d (%.0f%%, ETA %.0f s)", counts.notifications, known,
                100 * Double(counts.notifications) / Double(known), eta)
        }
        let outcomes = String(
            format:
                "%d delivered, %d rejected, %d unregistered, %d failed, %d expired, %d rate_limited, %d invalid, %d cancelled, %d superseded",
            counts.outcomes.delivered, counts.outcomes.rejected, counts.outcomes.unregistered, counts.outcomes.failed,
            counts.outcomes.expired, counts.outcomes.rateLimited,
            counts.outcomes.invalid, counts.outcomes.cancelled, counts.outcomes.superseded)
        var text = String(
            format: "%d jobs, %@ notifications (%.0f/s): %@, %d retries, %.0f s", counts.jobs, done, rate, outcomes,
            counts.outcomes.retries, seconds)
        if let lag = queueLag.withLock({ $0 }).map({ $0() }) {
            text += ", queue: \(lag.jobs) jobs (\(lag.bytes) bytes) unread"
            if let age = lag.oldestAge { text += String(format: ", oldest %.1f s", age / .seconds(1)) }
        }
        let line = interactive ? "\r\u{1B}[2K" + text + (final ? "\n" : "") : "fanout: " + text + "\n"
        StandardStream.error.write(line)
    }
}
