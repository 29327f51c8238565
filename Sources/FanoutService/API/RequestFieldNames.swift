/// Where the fields of a dispatch's job line came from in the API request that asked for it, so that a refusal from
/// the job-line checks (`DispatchSpec.validate`) names the request's field (`content_state`, `audience.tokens[2]`,
/// `notifications[0].live_activity.content-state`) and not the job line's (`live_activity.content_state`,
/// `tokens[2]`), which the caller never wrote.
struct RequestFieldNames: Sendable {
    /// Job-line field paths and what the request calls them, longest first. An empty request name is the request
    /// as a whole: the refusal then names no field.
    private let renames: [(job: String, request: String)]

    init(_ renames: [(job: String, request: String)]) {
        self.renames = renames.sorted { $0.job.count > $1.job.count }
    }

    /// No renames: the request spells its fields as the job line does.
    static let jobLine = RequestFieldNames([])

    /// `field` and `message` (which starts with the field, as `JobLineError`'s does) in the request's names.
    func rename(field: String?, message: String) -> (field: String?, message: String) {
        guard let field, let rename = renames.first(where: { Self.field(field, isIn: $0.job) }) else {
            return (field, message)
        }
        let rest = field.dropFirst(rename.job.count)
        let renamed = rename.request.isEmpty ? String(rest.drop { $0 == "." }) : rename.request + rest
        guard message.hasPrefix(field) else { return (renamed.isEmpty ? nil : renamed, message) }
        var text = message.dropFirst(field.count)
        if renamed.isEmpty { text = text.drop { $0 == ":" || $0 == " " } }
        return (renamed.isEmpty ? nil : renamed, renamed + text)
    }

    /// Whether `field` is `path` or inside it (`path.key`, `path[3]`).
    private static func field(_ field: String, isIn path: String) -> Bool {
        guard field.hasPrefix(path) else { return false }
        let next = field.dropFirst(path.count).first
        return next == nil || next == "." || next == "["
    }

    /// The audience fields of the native API (`audience.users`, `.devices`, `.tokens`) as a job line spells them.
    static let nativeAudience: [(job: String, request: String)] = [
        ("tokens", "audience.tokens"), ("push_to_start.users", "audience.users"),
        ("push_to_start.devices", "audience.devices"), ("users", "audience.users"), ("devices", "audience.devices"),
    ]

    /// The native API's Live Activity fields are the job line's `live_activity` members, at the top of the body
    /// (`live_activity.content_state` is `content_state`; the object itself, the request as a whole).
    static let nativeLiveActivity = RequestFieldNames([("live_activity", "")] + nativeAudience)

    static let nativePush = RequestFieldNames(nativeAudience)

    /// The native registration endpoints (`/v1/devices`, `/v1/activities/{id}/tokens`, `/v1/push-to-start-tokens`):
    /// what the registry's checks call `device`, `user` and a push-to-start registration's `push_to_start_token`.
    static let nativeRegistration = RequestFieldNames([
        ("device", "device_id"), ("user", "user_id"), ("push_to_start_token", "token"),
    ])

    /// The Pushwoosh SDK's device methods (`registerDevice`, `setActivityToken`, `setActivityPushToStartToken`):
    /// the registry's `device`, `user` and tokens as the SDK spells them.
    static let pushwooshRegistration = RequestFieldNames([
        ("device", "hwid"), ("user", "userId"), ("token", "activity_token"),
        ("push_to_start_token", "activity_push_to_start_token"),
    ])

    /// Braze's `messages/live_activity/start` and `update` bodies.
    static let braze = RequestFieldNames([
        ("live_activity.relevance_score", "notification.relevance_score"),
        ("live_activity.alert", "notification.alert"),
        ("live_activity.attributes_type", "activity_attributes_type"),
        // The rest (`content_state`, `stale_date`, `dismissal_date`) are spelt as in the job line, at the top.
        ("live_activity.attributes", "activity_attributes"), ("live_activity", ""),
        ("push_to_start.users", "external_user_ids"), ("priority", "notification.apns_priority"),
    ])

    /// One entry of a Pushwoosh `startLiveActivity` or `updateLiveActivity` request, at `entry`
    /// (`notifications[0]`).
    static func pushwoosh(entry: String) -> RequestFieldNames {
        RequestFieldNames([
            ("live_activity.content_state", "\(entry).live_activity.content-state"),
            ("live_activity.stale_date", "\(entry).live_activity.stale-date"),
            ("live_activity.dismissal_date", "\(entry).live_activity.dismissal-date"),
            ("live_activity.relevance_score", "\(entry).live_activity.relevance-score"),
            ("live_activity.alert.title", "\(entry).title"), ("live_activity.alert.body", "\(entry).content"),
            ("live_activity.attributes_type", "\(entry).live_activity.attributes-type"),
            ("live_activity.attributes", "\(entry).live_activity.attributes"), ("live_activity", entry),
            ("tokens", "\(entry).devices"), ("push_to_start.users", "\(entry).users"),
            ("push_to_start.devices", "\(entry).devices"), ("activity_id", "\(entry).live_activity_id"),
        ])
    }
}
