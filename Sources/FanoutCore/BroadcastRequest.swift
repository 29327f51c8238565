/// A broadcast push (iOS 18): one request to a channel, which APNs delivers to every Live Activity subscribed to
/// it (docs/reference/broadcast-channels.md, "Broadcast send"). `POST /4/broadcasts/apps/{bundle id}` on the ordinary
/// push host, with `apns-channel-id`, `apns-push-type: liveactivity`, `apns-priority` and `apns-expiration`, and no
/// `apns-topic`.
public enum BroadcastRequest {
    /// The largest broadcast payload APNs accepts (5 KB); larger gets 413 `PayloadTooLarge`.
    public static let maximumPayloadBytes = 5_120

    /// `:path` for an app's broadcasts: the bare bundle id, without a push-type suffix.
    public static func path(bundleID: String) -> String { "/4/broadcasts/apps/" + bundleID }

    /// Whether `id` has the form of a channel id (standard base64, as APNs returns it).
    public static func isValidChannelID(_ id: String) -> Bool {
        id.utf8.count <= 256 && LiveActivityContent.isBase64(id)
    }

    /// The request's headers less `authorization` and `apns-request-id`, in the order they are sent. Errors name
    /// the header at fault.
    package static func headerFields(
        bundleID: String, channelID: String, priority: Int, expiration: Int64, authority: String
    ) throws(NotificationHeaderError) -> [HeaderField] {
        guard !bundleID.isEmpty, !bundleID.utf8.contains(where: ASCIIBytes.isForbiddenInHeaderValue),
            !bundleID.contains("/"), !bundleID.hasSuffix(PushType.liveactivity.topic(forBundleID: ""))
        else {
            throw NotificationHeaderError(
                field: ":path", reason: .badTopic, message: "\"\(bundleID)\" is not a bare bundle id")
        }
        guard isValidChannelID(channelID) else {
            throw NotificationHeaderError(
                field: APNsHeaderName.channelID, reason: .badTopic,
                message: "\"\(channelID)\" is not a base64 channel id")
        }
        guard [1, 5, 10].contains(priority) else {
            throw NotificationHeaderError(
                field: APNsHeaderName.priority, reason: .badPriority, message: "\(priority) is not 1, 5 or 10")
        }
        guard expiration >= 0 else {
            throw NotificationHeaderError(
                field: APNsHeaderName.expiration, reason: .badExpirationDate,
                message: "\(expiration) is negative; use 0 or UNIX seconds")
        }
        return [
            HeaderField(name: APNsHeaderName.method, value: "POST"),
            HeaderField(name: APNsHeaderName.scheme, value: "https"),
            HeaderField(name: APNsHeaderName.authority, value: authority),
            HeaderField(name: APNsHeaderName.pushType, value: PushType.liveactivity.rawValue),
            HeaderField(name: APNsHeaderName.channelID, value: channelID),
            HeaderField(name: APNsHeaderName.priority, value: String(priority)),
            HeaderField(name: APNsHeaderName.expiration, value: String(expiration)),
        ]
    }
}
