/// An app whose tokens the registry holds: its bundle id (the APNs topic without a suffix) and the workspace whose
/// rate budget its sends draw on.
public struct RegistryApp: Sendable, Hashable {
    public var bundleID: String
    public var workspace: String

    public init(bundleID: String, workspace: String = "default") {
        self.bundleID = bundleID
        self.workspace = workspace
    }
}

/// A Live Activity update token as the app's SDK reports it (from `activity.pushTokenUpdates`).
///
/// Registering again for the same (app, activity, device) replaces the token (rotation); an empty token stops the
/// activity's token on that device (Pushwoosh's stop signal). With no device id, each token is its own registration.
public struct UpdateTokenRegistration: Sendable, Hashable {
    /// The app's bundle id.
    public var app: String
    /// The caller's activity id (Braze `activity_id`, Pushwoosh `live_activity_id`), at most 256 bytes.
    public var activityID: String
    /// The device (Pushwoosh `hwid`); nil when unknown.
    public var deviceID: String?
    /// The user, recorded on the device when a device id is given.
    public var userID: String?
    /// The token as hex (64–200 digits, any case); empty to stop.
    public var token: String
    /// When the device registered it (Unix milliseconds); nil for now. Update tokens expire a fixed time after it.
    public var registeredAt: Int64?

    public init(
        app: String, activityID: String, deviceID: String? = nil, userID: String? = nil, token: String,
        registeredAt: Int64? = nil
    ) {
        self.app = app
        self.activityID = activityID
        self.deviceID = deviceID
        self.userID = userID
        self.token = token
        self.registeredAt = registeredAt
    }
}

/// A push-to-start token (iOS 17.2+, `Activity<T>.pushToStartTokenUpdates`): one per device and attributes type.
public struct PushToStartRegistration: Sendable, Hashable {
    public var app: String
    public var deviceID: String
    public var userID: String?
    /// The Swift `ActivityAttributes` type the token starts; nil when the SDK does not say (such a token is offered
    /// for every type).
    public var attributesType: String?
    /// The token as hex; empty to remove it.
    public var token: String
    /// When the device reported it (Unix milliseconds); nil for now.
    public var updatedAt: Int64?

    public init(
        app: String, deviceID: String, userID: String? = nil, attributesType: String? = nil, token: String,
        updatedAt: Int64? = nil
    ) {
        self.app = app
        self.deviceID = deviceID
        self.userID = userID
        self.attributesType = attributesType
        self.token = token
        self.updatedAt = updatedAt
    }
}

/// A device of an app: its user and its regular push token (for alert and background pushes).
public struct DeviceRegistration: Sendable, Hashable {
    public var app: String
    public var deviceID: String
    /// The user; nil leaves the recorded user unchanged.
    public var userID: String?
    /// The regular push token as hex; nil leaves the recorded token unchanged, empty removes it.
    public var pushToken: String?
    /// When the device reported the token (Unix milliseconds); nil for now.
    public var registeredAt: Int64?

    public init(
        app: String, deviceID: String, userID: String? = nil, pushToken: String? = nil, registeredAt: Int64? = nil
    ) {
        self.app = app
        self.deviceID = deviceID
        self.userID = userID
        self.pushToken = pushToken
        self.registeredAt = registeredAt
    }
}

/// One registration of any of the three kinds (an import line, a `register` call, an ingest API request).
public enum Registration: Sendable, Hashable {
    case updateToken(UpdateTokenRegistration)
    case pushToStart(PushToStartRegistration)
    case device(DeviceRegistration)

    /// The change that records it.
    public var change: RegistryChange {
        switch self {
        case .updateToken(let registration): return .updateToken(registration)
        case .pushToStart(let registration): return .pushToStartToken(registration)
        case .device(let registration): return .device(registration)
        }
    }

    public var app: String {
        switch self {
        case .updateToken(let registration): return registration.app
        case .pushToStart(let registration): return registration.app
        case .device(let registration): return registration.app
        }
    }
}

// MARK: - What reads return

/// A live update token of an activity.
public struct UpdateTokenRecord: Sendable, Hashable {
    public var activityID: String
    public var deviceID: String?
    /// Lowercase hex.
    public var token: String
    /// Unix milliseconds.
    public var registeredAt: Int64
    /// When it stops being live (Unix milliseconds): registration plus the token lifetime.
    public var expiresAt: Int64

    public init(activityID: String, deviceID: String?, token: String, registeredAt: Int64, expiresAt: Int64) {
        self.activityID = activityID
        self.deviceID = deviceID
        self.token = token
        self.registeredAt = registeredAt
        self.expiresAt = expiresAt
    }
}

/// A push-to-start token.
public struct PushToStartRecord: Sendable, Hashable {
    public var deviceID: String
    public var userID: String?
    public var attributesType: String?
    public var token: String
    public var updatedAt: Int64

    public init(deviceID: String, userID: String?, attributesType: String?, token: String, updatedAt: Int64) {
        self.deviceID = deviceID
        self.userID = userID
        self.attributesType = attributesType
        self.token = token
        self.updatedAt = updatedAt
    }
}

/// A device and its regular push token, if it has one.
public struct DeviceRecord: Sendable, Hashable {
    public var deviceID: String
    public var userID: String?
    public var pushToken: String?
    /// When the push token was registered (Unix milliseconds); nil without one.
    public var pushTokenRegisteredAt: Int64?

    public init(deviceID: String, userID: String?, pushToken: String?, pushTokenRegisteredAt: Int64?) {
        self.deviceID = deviceID
        self.userID = userID
        self.pushToken = pushToken
        self.pushTokenRegisteredAt = pushTokenRegisteredAt
    }
}

/// Whether an activity still takes updates.
public enum ActivityState: String, Sendable, Hashable {
    /// Started (or first seen through a token registration) and not ended.
    case active
    /// An `end` was sent; its tokens stay until its dismissal date, then are removed.
    case ended
}

/// An activity: what the engine needs to address it and to order its updates.
public struct ActivityRecord: Sendable, Hashable {
    public var activityID: String
    /// The `ActivityAttributes` type name, when known.
    public var attributesType: String?
    public var state: ActivityState
    /// The `timestamp` (Unix seconds, as in the `aps` dictionary) of the newest content sent, for latest-wins.
    public var lastContentTimestamp: Int64?
    /// When the activity ended (Unix milliseconds).
    public var endedAt: Int64?
    /// When an ended activity's tokens are removed (Unix milliseconds).
    public var dismissalDate: Int64?
    /// The iOS 18 broadcast channel (base64), for the broadcast issue.
    public var channelID: String?
    /// The channel's `message-storage-policy` (0: no message stored, 1: the most recent one), when it was bound with
    /// it; nil when unknown.
    public var channelStoragePolicy: Int?
    /// The APNs environment the channel was created in (`production`, `development`, or a management host's
    /// `HOST:PORT`), when it was bound with it; nil when unknown.
    public var channelEnvironment: String?

    public init(
        activityID: String, attributesType: String?, state: ActivityState, lastContentTimestamp: Int64?,
        endedAt: Int64?, dismissalDate: Int64?, channelID: String?, channelStoragePolicy: Int? = nil,
        channelEnvironment: String? = nil
    ) {
        self.channelStoragePolicy = channelStoragePolicy
        self.channelEnvironment = channelEnvironment
        self.activityID = activityID
        self.attributesType = attributesType
        self.state = state
        self.lastContentTimestamp = lastContentTimestamp
        self.endedAt = endedAt
        self.dismissalDate = dismissalDate
        self.channelID = channelID
    }
}

/// Whose push-to-start tokens or devices a read wants.
public enum RecipientSelection: Sendable, Hashable {
    /// The devices of these users (Pushwoosh `users`, Braze `external_user_ids`).
    case users([String])
    /// These devices (Pushwoosh `devices` / hwids).
    case devices([String])
    /// Every device of the app.
    case all
}
