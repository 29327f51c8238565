/// An APNs-style refusal of a request: the status and reason mock-apns answers with.
public struct APNsRejection: Error, Hashable, Sendable, CustomStringConvertible {
    public let status: Int
    public let reason: APNsReason

    public init(status: Int, reason: APNsReason) {
        self.status = status
        self.reason = reason
    }

    /// A rejection with the status APNs uses for a known reason (400 for a reason this version does not know).
    public init(_ reason: APNsReason) {
        self.init(status: APNsReason.statusFor(reason) ?? 400, reason: reason)
    }

    public var description: String { "\(status) \(reason)" }
}
