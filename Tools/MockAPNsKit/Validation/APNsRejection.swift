package import FanoutCore

/// An APNs-style refusal of a request: the status and reason mock-apns answers with.
package struct APNsRejection: Error, Hashable, Sendable, CustomStringConvertible {
    package let status: Int
    package let reason: APNsReason

    package init(status: Int, reason: APNsReason) {
        self.status = status
        self.reason = reason
    }

    /// A rejection with the status APNs uses for a known reason (400 for a reason this version does not know).
    package init(_ reason: APNsReason) {
        self.init(status: APNsReason.statusFor(reason) ?? 400, reason: reason)
    }

    package var description: String { "\(status) \(reason)" }
}
