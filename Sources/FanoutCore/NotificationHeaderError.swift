/// A device-push header that APNs would reject, caught before the request is sent.
///
/// It carries the header's name and the reason APNs would have answered with, so a job that fails validation is
/// reported in the same words as one APNs rejected.
public struct NotificationHeaderError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The header at fault, for example `apns-collapse-id`.
    public let field: String
    /// The reason APNs would give, for example `BadCollapseId`.
    public let reason: APNsReason
    /// What is wrong, in words.
    public let message: String

    public init(field: String, reason: APNsReason, message: String) {
        self.field = field
        self.reason = reason
        self.message = message
    }

    public var description: String { "\(field): \(message) (\(reason))" }
}
