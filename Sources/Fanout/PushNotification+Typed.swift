public import FanoutCore

/// How urgently APNs delivers a notification (`apns-priority`).
public enum NotificationPriority: Int, Sendable, Hashable, CaseIterable {
    /// 10: at once. Draws on a Live Activity's and a device's budget for urgent pushes.
    case immediate = 10
    /// 5: when the device's power allows; what background pushes must use.
    case considerate = 5
    /// 1: prioritises the device's power over all else, and may be dropped under power constraints.
    case low = 1
}

extension PushNotification {
    /// An alert (`apns-push-type: alert`) to the app `bundleID`: the topic is the bundle id.
    ///
    /// ```swift
    /// let result = try await engine.send(.alert(AlertPayload(title: "Goal!", body: "2-1"), to: token, app: "com.acme.app"))
    /// ```
    /// - Throws: `.invalidNotification` when the payload is not valid (an empty alert, a badge below 0, over 4 KB).
    public static func alert(
        _ alert: AlertPayload, to deviceToken: String, app bundleID: String,
        priority: NotificationPriority = .immediate, expiration: Int64? = nil, collapseID: String? = nil
    ) throws(FanoutError) -> PushNotification {
        try typed(
            .alert, bundleID: bundleID, deviceToken: deviceToken, priority: priority, expiration: expiration,
            collapseID: collapseID, payload: { () throws(PayloadError) in try alert.encode() })
    }

    /// A background update (`apns-push-type: background`, `content-available`): APNs requires priority 5, so it
    /// has none to choose.
    public static func background(
        _ payload: BackgroundPayload = BackgroundPayload(), to deviceToken: String, app bundleID: String,
        expiration: Int64? = nil, collapseID: String? = nil
    ) throws(FanoutError) -> PushNotification {
        try typed(
            .background, bundleID: bundleID, deviceToken: deviceToken, priority: .considerate, expiration: expiration,
            collapseID: collapseID, payload: { () throws(PayloadError) in try payload.encode() })
    }

    /// A Live Activity start, update or end (`apns-push-type: liveactivity`) to an activity's push token (or, for a
    /// start, a push-to-start token): the topic is `<bundleID>.push-type.liveactivity`.
    public static func liveActivity(
        _ content: LiveActivityContent, to deviceToken: String, app bundleID: String,
        priority: NotificationPriority = .immediate, expiration: Int64? = nil, collapseID: String? = nil
    ) throws(FanoutError) -> PushNotification {
        try typed(
            .liveactivity, bundleID: bundleID, deviceToken: deviceToken, priority: priority, expiration: expiration,
            collapseID: collapseID, payload: { () throws(PayloadError) in try content.encode() })
    }

    /// Any push type with a payload given as JSON, for what the typed constructors do not cover (`voip`,
    /// `complication`, `location`, `widgets`, ...): the topic gets the suffix the push type requires
    /// (`PushType.topic(forBundleID:)`).
    public static func raw(
        _ pushType: PushType, payload: RawJSON, to deviceToken: String, app bundleID: String,
        priority: NotificationPriority? = nil, expiration: Int64? = nil, collapseID: String? = nil
    ) throws(FanoutError) -> PushNotification {
        try typed(
            pushType, bundleID: bundleID, deviceToken: deviceToken, priority: priority, expiration: expiration,
            collapseID: collapseID, payload: { () throws(PayloadError) in payload.bytes })
    }

    private static func typed(
        _ pushType: PushType, bundleID: String, deviceToken: String, priority: NotificationPriority?,
        expiration: Int64?, collapseID: String?, payload: () throws(PayloadError) -> [UInt8]
    ) throws(FanoutError) -> PushNotification {
        let bytes: [UInt8]
        do {
            bytes = try payload()
        } catch {
            throw FanoutError(.invalidNotification, "\(error)")
        }
        return PushNotification(
            deviceToken: deviceToken,
            headers: NotificationHeaders(
                pushType: pushType, topic: pushType.topic(forBundleID: bundleID), priority: priority?.rawValue,
                expiration: expiration, collapseID: collapseID),
            payload: bytes)
    }
}
