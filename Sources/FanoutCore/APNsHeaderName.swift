/// The names of the HTTP/2 headers a device push uses (apns-reference section 2), spelled once.
///
/// HTTP/2 requires lowercase header names, so these are the exact bytes on the wire.
public enum APNsHeaderName {
    public static let method = ":method"
    public static let scheme = ":scheme"
    public static let path = ":path"
    public static let authority = ":authority"
    public static let authorization = "authorization"
    public static let pushType = "apns-push-type"
    public static let topic = "apns-topic"
    public static let priority = "apns-priority"
    public static let expiration = "apns-expiration"
    public static let collapseID = "apns-collapse-id"
    public static let apnsID = "apns-id"
    /// Response only (sandbox): the id to look up in the Push Notifications Console.
    public static let apnsUniqueID = "apns-unique-id"
}
