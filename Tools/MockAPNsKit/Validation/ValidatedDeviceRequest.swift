package import FanoutCore

/// A device-push request that passed `APNsRequestValidator`, with its headers already parsed, so that mock-apns can
/// check the JWT, record the token and echo the `apns-id` without reading the headers a second time.
package struct ValidatedDeviceRequest: Hashable, Sendable {
    /// The token from the path, lowercased.
    package var deviceToken: DeviceToken
    /// `apns-push-type`, or `alert` when the header was absent (APNs infers the type; Fanout always sends it).
    package var pushType: PushType
    package var topic: String
    /// `apns-priority`, or the push type's default when absent.
    package var priority: Int
    package var expiration: Int64?
    package var collapseID: String?
    /// The request's `apns-id`; nil when absent, in which case the server generates one.
    package var apnsID: String?
    /// The JWT from `authorization: bearer <jwt>`; nil when absent or not a bearer credential.
    package var bearerToken: String?
}

/// A device-push request that passed `APNsRequestValidator.check(_:body:)`: the parsed values, and where the rest sit
/// in the head's bytes, so that mock-apns makes a `String` of a field only when it needs one.
package struct CheckedDeviceRequest: Sendable {
    /// The device token in the path, as sent (valid; not lowercased).
    package var token: Range<Int>
    package var pushType: PushType
    package var topic: Range<Int>
    package var priority: Int
    package var expiration: Int64?
    package var collapseID: Range<Int>?
    package var apnsID: Range<Int>?
    /// The `authorization` header's value, whatever its scheme.
    package var authorization: Range<Int>?

    /// The request with its fields as values (`head` is the one checked).
    package func validated(in head: HeaderView) -> ValidatedDeviceRequest {
        head.bytes.withUnsafeBufferPointer { bytes in
            func string(_ range: Range<Int>) -> String { String(decoding: bytes[range], as: UTF8.self) }
            return ValidatedDeviceRequest(
                deviceToken: DeviceToken(utf8: UnsafeBufferPointer(rebasing: bytes[token]))!, pushType: pushType,
                topic: string(topic), priority: priority, expiration: expiration, collapseID: collapseID.map(string),
                apnsID: apnsID.map(string),
                bearerToken: authorization.flatMap { APNsRequestValidator.bearerToken(fromAuthorization: string($0)) })
        }
    }
}
