public import FanoutCore

extension FanoutJob {
    /// A Live Activity job: fixes `apns-push-type: liveactivity` and the topic
    /// `<bundleID>.push-type.liveactivity`, so the pair cannot be got wrong.
    /// - Parameters:
    ///   - id: the job's id, in its results.
    ///   - workspace: whose rate budget it draws on (`FanoutEngineConfiguration.rateLimits`).
    ///   - bundleID: the app's bundle id; the topic is made from it.
    ///   - content: the event (`start`, `update`, `end`), its content state and alert.
    ///   - priority: 10 delivers at once but draws on the device's budget; 5 does not.
    ///   - expiration: `apns-expiration` in UNIX seconds (0: deliver once without storing); nil: no header.
    ///   - collapseID: `apns-collapse-id`; nil: none.
    ///   - recipients: the activities' push tokens (or push-to-start tokens, for a `start`).
    public static func liveActivity(
        id: String, workspace: String = "default", bundleID: String, content: LiveActivityContent, priority: Int = 10,
        expiration: Int64? = nil, collapseID: String? = nil, recipients: Recipients
    ) -> FanoutJob {
        FanoutJob(
            id: id, workspace: workspace,
            headers: NotificationHeaders(
                pushType: .liveactivity, topic: PushType.liveactivity.topic(forBundleID: bundleID), priority: priority,
                expiration: expiration, collapseID: collapseID),
            payload: .liveActivity(content), recipients: recipients)
    }

    /// A regular alert job to the app itself (topic = bundle id).
    public static func alert(
        id: String, workspace: String = "default", bundleID: String, alert: AlertPayload, priority: Int = 10,
        expiration: Int64? = nil, collapseID: String? = nil, recipients: Recipients
    ) -> FanoutJob {
        FanoutJob(
            id: id, workspace: workspace,
            headers: NotificationHeaders(
                pushType: .alert, topic: bundleID, priority: priority, expiration: expiration, collapseID: collapseID),
            payload: .alert(alert), recipients: recipients)
    }
}
