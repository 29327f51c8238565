/// The names of the HTTP/2 headers a device push uses (docs/reference/apns.md, "Request headers"), spelled once.
///
/// HTTP/2 requires lowercase header names, so these are the exact bytes on the wire.
package enum APNsHeaderName {
    package static let method = ":method"
    package static let scheme = ":scheme"
    package static let path = ":path"
    package static let authority = ":authority"
    package static let authorization = "authorization"
    package static let pushType = "apns-push-type"
    package static let topic = "apns-topic"
    package static let priority = "apns-priority"
    package static let expiration = "apns-expiration"
    package static let collapseID = "apns-collapse-id"
    package static let apnsID = "apns-id"
    /// Broadcast pushes and channel management: the base64 channel id.
    package static let channelID = "apns-channel-id"
    /// Broadcast pushes and channel management: the request's UUID, echoed in the answer.
    package static let requestID = "apns-request-id"
    /// Response only (sandbox): the id to look up in the Push Notifications Console.
    package static let apnsUniqueID = "apns-unique-id"
}
