import FanoutCore

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
