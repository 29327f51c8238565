package import Fanout
import Foundation

/// The run's totals: the summary line of docs/SEND.md.
package struct SendSummary: Sendable {
    package var counts: SendCounts
    package var seconds: Double
    /// Notifications finished by this process per second.
    package var rate: Double
    /// Why the run was cut short after sending (the job file could not be read to its end, or a job's recipients
    /// could not all be read): everything sent is recorded, and `--resume` sends the rest. Nil for a whole run.
    package var cutShort: String?
    /// Results this process recorded (`counts` adds those of the runs it resumes).
    package var notificationsThisRun: Int

    package init(
        counts: SendCounts, seconds: Double, rate: Double, cutShort: String? = nil, notificationsThisRun: Int? = nil
    ) {
        self.counts = counts
        self.seconds = seconds
        self.rate = rate
        self.cutShort = cutShort
        self.notificationsThisRun = notificationsThisRun ?? counts.notifications
    }

    /// `{"jobs": 3, "notifications": 250000, "delivered": …, "rate": 85910.0}` on one line.
    package var jsonLine: String {
        let fields: [(String, String)] = [
            ("jobs", "\(counts.jobs)"), ("notifications", "\(counts.notifications)"),
            ("broadcasts", "\(counts.broadcasts)"),
            ("delivered", "\(counts.outcomes.delivered)"),
            ("rejected", "\(counts.outcomes.rejected)"), ("unregistered", "\(counts.outcomes.unregistered)"),
            ("failed", "\(counts.outcomes.failed)"),
            ("expired", "\(counts.outcomes.expired)"), ("rate_limited", "\(counts.outcomes.rateLimited)"),
            ("invalid", "\(counts.outcomes.invalid)"), ("cancelled", "\(counts.outcomes.cancelled)"),
            ("superseded", "\(counts.outcomes.superseded)"), ("demoted", "\(counts.demoted)"),
            ("retries", "\(counts.outcomes.retries)"), ("payload_encodings", "\(counts.payloadEncodings)"),
            ("seconds", String(format: "%.2f", seconds)), ("rate", String(format: "%.1f", rate)),
        ]
        // Only when it applies: a run cut short says so in its summary too (its exit status is 1).
        let cut = cutShort == nil ? [] : [("cut_short", "true")]
        return "{" + (fields + cut).map { "\"\($0.0)\": \($0.1)" }.joined(separator: ", ") + "}"
    }

    /// Whether every notification ended `delivered` (and the run was not cut short).
    package var allDelivered: Bool { cutShort == nil && counts.outcomes.delivered == counts.notifications }
}

/// Totals of a `fanout send` run (cumulative across `--resume`).
package struct SendCounts: Codable, Equatable, Sendable {
    package var jobs = 0
    package var payloadEncodings = 0
    /// Notifications sent at priority 5 by the activity priority-10 guard.
    package var demoted = 0
    /// Broadcast requests among the notifications (results with a `channel`).
    package var broadcasts = 0
    /// Notifications by outcome, and retries.
    package var outcomes = OutcomeCounts()

    package init() {}

    private enum CodingKeys: String, CodingKey {
        case jobs, payloadEncodings, demoted, broadcasts, outcomes
    }

    /// A journal written before broadcasts existed has no `broadcasts`: none were sent.
    package init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        jobs = try container.decode(Int.self, forKey: .jobs)
        payloadEncodings = try container.decode(Int.self, forKey: .payloadEncodings)
        demoted = try container.decodeIfPresent(Int.self, forKey: .demoted) ?? 0
        broadcasts = try container.decodeIfPresent(Int.self, forKey: .broadcasts) ?? 0
        outcomes = try container.decode(OutcomeCounts.self, forKey: .outcomes)
    }

    package var notifications: Int { outcomes.total }
}
