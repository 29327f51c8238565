/// A device-push request that passed `APNsRequestValidator`, with its headers already parsed, so that mock-apns can
/// check the JWT, record the token and echo the `apns-id` without reading the headers a second time.
public struct ValidatedDeviceRequest: Hashable, Sendable {
    /// The token from the path, lowercased.
    public var deviceToken: DeviceToken
    /// `apns-push-type`, or `alert` when the header was absent (APNs infers the type; Fanout always sends it).
    public var pushType: PushType
    public var topic: String
    /// `apns-priority`, or the push type's default when absent.
    public var priority: Int
    public var expiration: Int64?
    public var collapseID: String?
    /// The request's `apns-id`; nil when absent, in which case the server generates one.
    public var apnsID: String?
    /// The JWT from `authorization: bearer <jwt>`; nil when absent or not a bearer credential.
    public var bearerToken: String?
}
