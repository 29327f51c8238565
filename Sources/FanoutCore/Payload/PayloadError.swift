/// A payload that cannot be built or sent, with the field at fault.
///
/// Fields are named as the job file names them (`live_activity.content_state`, `live_activity.alert.title`), or by
/// their APNs key for payloads built in code (`aps.badge`), so an `invalid` result points at the line to fix.
public struct PayloadError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The field at fault, for example `live_activity.attributes`; `payload` for the payload as a whole.
    public let field: String
    /// What is wrong, for example `only allowed with event "start"`.
    public let message: String

    public init(field: String, message: String) {
        self.field = field
        self.message = message
    }

    /// `field: message`, for example `live_activity.attributes: only allowed with event "start"`.
    public var description: String { "\(field): \(message)" }
}

/// The APNs payload size limits (docs/reference/apns.md, "Payload size limits").
public enum PayloadLimits {
    /// The largest payload APNs accepts for `pushType`: 4096 bytes, 5120 for VoIP.
    public static func limit(for pushType: PushType) -> Int {
        pushType.payloadSizeLimit
    }

    /// Throws when `bytes` is empty or larger than APNs accepts for `pushType`, for example
    /// `payload: 4200 bytes, over the 4096-byte limit for liveactivity`.
    public static func check(_ bytes: some Collection<UInt8>, pushType: PushType) throws(PayloadError) {
        let count = bytes.count
        guard count > 0 else { throw PayloadError(field: "payload", message: "empty") }
        let limit = pushType.payloadSizeLimit
        guard count <= limit else {
            throw PayloadError(
                field: "payload", message: "\(count) bytes, over the \(limit)-byte limit for \(pushType)")
        }
    }
}
