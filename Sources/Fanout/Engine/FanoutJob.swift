public import FanoutCore
public import FanoutRegistry

/// One update for many devices: the headers and payload every recipient shares, and the recipients.
public struct FanoutJob: Sendable {
    public var id: String
    public var workspace: String
    /// Push type, topic, priority, expiration and collapse id, shared by every token. `apnsID` and
    /// `bearerToken` are ignored: each notification gets its own id, the engine adds the token.
    public var headers: NotificationHeaders
    /// The payload, encoded once by the engine and shared read-only by every stream of the job.
    public var payload: JobPayload
    public var recipients: Recipients
    /// Recipients already done in an earlier run (`fanout send --resume`): skipped, not sent, not
    /// reported again.
    public var alreadyDone: ResumePoint?
    /// Where a push-to-start job that names its activity writes the id inside `attributes`; nil: the engine's
    /// `configuration.activityIDAttribute`. One engine may serve apps on several SDKs (`fanout serve` answers
    /// Fanout's, Pushwoosh's and Braze's APIs), so each job may say where its app's SDK reads the id.
    public var activityIDAttribute: ActivityIDAttribute?
    /// What this job does when its workspace budget (`configuration.rateLimits`) is out: nil follows the budget's
    /// own policy; `.wait` holds it until the budget admits it (bounded by the call's deadline), `.reject` ends the
    /// rest at once `rate_limited` with a retry-after. No effect without budgets.
    public var overBudget: OverBudget?
    /// The `apns-id` of the one notification of a `send` (the caller's own id); nil: one per token.
    var singleNotificationID: APNsIdentifier?

    public init(
        id: String, workspace: String = "default", headers: NotificationHeaders, payload: JobPayload,
        recipients: Recipients
    ) {
        self.id = id
        self.workspace = workspace
        self.headers = headers
        self.payload = payload
        self.recipients = recipients
    }
}

/// What a call does when its workspace's budget is out, chosen per job or per `send`.
public enum OverBudget: Sendable, Hashable {
    /// Wait until the budget admits it, within the call's deadline (past it: `failed`, `DeadlineExceeded`).
    case wait
    /// End `rate_limited` at once, with `retryAfterSeconds` saying when the budget would admit it.
    case reject
}

/// Who a job goes to. A file and the registry are read in pages while sending, never loaded whole, so a
/// job may name millions of tokens.
public enum Recipients: Sendable {
    /// Hex tokens given inline.
    case tokens([String])
    /// A file of hex tokens, one per line (blank lines skipped).
    case file(path: String)
    /// Hex tokens streamed from the caller's own `AsyncSequence` (a database cursor), pulled while sending.
    case sequence(TokenSequence)
    /// Every live update token of an activity in the engine's registry (`update` and `end` events).
    case activity(app: String, id: String)
    /// The push-to-start tokens of the selected devices for an attributes type (`start` events).
    /// With `activityID`, the id is written into the payload's `attributes` (see `ActivityIDAttribute` and
    /// `FanoutJob.activityIDAttribute`) so that the app registers the new activity's update token under it.
    case pushToStart(app: String, attributesType: String?, selection: RecipientSelection, activityID: String? = nil)
    /// The regular push tokens of the selected devices (alert and background pushes).
    case devices(app: String, selection: RecipientSelection)
    /// One broadcast to a channel (iOS 18): APNs delivers it to every Live Activity subscribed. `update` and `end`
    /// only. With the channel's storage policy known, a non-zero expiration on a no-storage channel is refused
    /// before sending (APNs would answer `BadExpirationDate`).
    case channel(app: String, id: String, storagePolicy: ChannelStoragePolicy? = nil)
}

/// A broadcast channel's message storage policy, fixed when the channel is created.
public enum ChannelStoragePolicy: Int, Sendable, Hashable {
    /// Nothing stored: `apns-expiration` must be 0; a higher publishing budget (frequent updates).
    case noMessageStored = 0
    /// The latest message is kept up to 8 hours for devices that are offline.
    case mostRecentMessageStored = 1
}

/// Where a push-to-start job writes its activity id inside `attributes`: a path of one or more keys, none empty.
public struct ActivityIDAttribute: Sendable, Hashable {
    /// The keys from `attributes` down, e.g. `["pushwoosh", "activityId"]`. Never empty, and no key is empty.
    public private(set) var path: [String]

    /// Nil when `path` is empty or one of its keys is empty: there is nowhere to write the id. Failable, as
    /// `DeviceToken(_:)` is, because a path may come from a gateway's own settings (which SDK an app uses) at run
    /// time, where a mistake must be an answer and not a crash; spell out one of the SDKs' paths with `.fanout`,
    /// `.pushwoosh` or `.braze`.
    public init?(path: [String]) {
        guard !path.isEmpty, !path.contains(where: \.isEmpty) else { return nil }
        self.path = path
    }

    /// `"activityId": "<id>"`: Fanout's default.
    public static let fanout = ActivityIDAttribute(path: ["activityId"])!
    /// `"pushwoosh": {"activityId": "<id>"}`, which the Pushwoosh SDK reads.
    public static let pushwoosh = ActivityIDAttribute(path: ["pushwoosh", "activityId"])!
    /// `"brazeActivityId": "<id>"`, which the Braze SDK reads.
    public static let braze = ActivityIDAttribute(path: ["brazeActivityId"])!
}

/// A job's payload: given as JSON bytes, or built from typed fields. Either way it is encoded once
/// per job, however many tokens the job has.
public enum JobPayload: Sendable {
    /// A complete APNs JSON object, sent as given. Checked once per job: anything but one well-formed JSON object
    /// makes the job invalid (`.invalidNotification`, field `payload`), and nothing is sent.
    case raw([UInt8])
    /// A Live Activity `aps` dictionary built from typed fields.
    case liveActivity(LiveActivityContent)
    /// A regular alert.
    case alert(AlertPayload)
    /// A background (content-available) push.
    case background(BackgroundPayload)

    /// The JSON bytes. Errors name the field at fault.
    public func encode() throws(PayloadError) -> [UInt8] {
        switch self {
        case .raw(let bytes): return bytes
        case .liveActivity(let content): return try content.encode()
        case .alert(let alert): return try alert.encode()
        case .background(let background): return try background.encode()
        }
    }
}

/// Which recipients of a job an earlier run finished, by their position in the job (0-based, in
/// recipient order): every position below `prefix`, the positions in `beyondPrefix`, and tokens
/// whose results were written after the last checkpoint (`tokensDone`, counted, since a token may
/// appear twice in a job).
public struct ResumePoint: Sendable {
    public var prefix: Int
    public var beyondPrefix: Set<Int>
    public var tokensDone: [String: Int]
    /// Told the position of each recipient skipped because of `tokensDone` (whose positions the
    /// earlier run's checkpoint did not record yet).
    public var skippedByToken: (@Sendable (Int) -> Void)?

    public init(
        prefix: Int = 0, beyondPrefix: Set<Int> = [], tokensDone: [String: Int] = [:],
        skippedByToken: (@Sendable (Int) -> Void)? = nil
    ) {
        self.prefix = prefix
        self.beyondPrefix = beyondPrefix
        self.tokensDone = tokensDone
        self.skippedByToken = skippedByToken
    }
}
