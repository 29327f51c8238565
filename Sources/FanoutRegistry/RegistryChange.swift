/// One write to the registry. Stores apply a batch of them atomically: all or nothing.
public enum RegistryChange: Sendable, Hashable {
    /// Adds, rotates or (with an empty token) stops a Live Activity update token.
    case updateToken(UpdateTokenRegistration)
    /// Removes the update token of `deviceID` for the activity, or every token of the activity when `deviceID` is nil
    /// (reason `stopped`).
    case stopUpdateTokens(app: String, activityID: String, deviceID: String?)
    /// Adds, rotates or (with an empty token) removes a push-to-start token.
    case pushToStartToken(PushToStartRegistration)
    /// Records a device, its user and its regular push token.
    case device(DeviceRegistration)
    /// Marks an activity started (active), creating it if needed; an ended one becomes active again.
    case startActivity(app: String, activityID: String, attributesType: String?)
    /// Marks an activity ended. Its tokens stay until `dismissalDate` (Unix milliseconds; the end plus the default
    /// dismissal delay, 4 hours, when nil), then are removed with reason `ended`; a date already past removes them now.
    case endActivity(app: String, activityID: String, dismissalDate: Int64?)
    /// Records the `timestamp` (Unix seconds) of content sent to an activity; the activity keeps the greatest.
    case contentSent(app: String, activityID: String, timestamp: Int64)
    /// Sets (or with nil clears) an activity's broadcast channel id, creating the activity if needed, with the
    /// channel's `message-storage-policy` (0 or 1) when the binder knows it: a broadcast to a channel that keeps the
    /// latest message is sent with an expiration that lets APNs keep it (0 would make it a single attempt). With
    /// `onlyIfUnbound`, an activity that has a channel already keeps it (two creations at once: the first to bind
    /// wins, and the other finds it bound on reading it back). `environment` is where the channel was created
    /// (`BroadcastChannelClient.environment`: `production`, `development`, or another management host's
    /// `HOST:PORT`), nil when the binder does not know: a channel exists in one APNs environment only, and a prune
    /// against another must not take its "not found" for the channel being gone.
    case channel(
        app: String, activityID: String, channelID: String?, storagePolicy: Int? = nil, onlyIfUnbound: Bool = false,
        environment: String? = nil)
    /// APNs answered 410 for `token`: remove it wherever `app` registered it before `timestamp` (the 410 body's Unix
    /// milliseconds); a registration at or after it means the device registered it again and it stays (each store
    /// keeps the exact time of a token's latest registration). Nil removes it at once (410 `ExpiredToken` carries no
    /// timestamp).
    ///
    /// `topic` is the `apns-topic` the notification was sent with: APNs answers for that topic only, so the token
    /// is removed only from the registrations that topic reaches (`RemovalScope`: an app's Live Activity tokens for
    /// `<bundle>.push-type.liveactivity`, its devices' push tokens for `<bundle>`), and stays wherever another app,
    /// another workspace's say, or another kind of registration holds it. Nil removes it from every registration.
    case unregistered(token: String, timestamp: Int64?, topic: String? = nil)
    /// APNs answered `BadDeviceToken` or `DeviceTokenNotForTopic` for `token` sent with `topic`: remove it at once
    /// from the registrations that topic reaches (nil: from every one). `DeviceTokenNotForTopic` says the token is
    /// not for this topic; it may well be another app's, or this app's token of another kind.
    case invalidToken(token: String, topic: String? = nil)
}
