import FanoutCore

/// A `RegistryChange` after `RegistryValidation.validate`: tokens lowercase hex, ids checked, times not negative.
/// `App` is what a store knows an app by once it has resolved it (the bundle id itself, or SQLite's row).
package enum ValidatedChange<App> {
    case updateToken(
        app: App, activityID: String, deviceID: String?, userID: String?, token: String, registeredAt: Int64?)
    case stopUpdateTokens(app: App, activityID: String, deviceID: String?)
    /// `attributesType` "" matches every type.
    case pushToStart(
        app: App, deviceID: String, userID: String?, attributesType: String, token: String, updatedAt: Int64?)
    case device(app: App, deviceID: String, userID: String?, pushToken: String?, registeredAt: Int64?)
    case startActivity(app: App, activityID: String, attributesType: String?)
    case endActivity(app: App, activityID: String, dismissalDate: Int64?)
    case contentSent(app: App, activityID: String, timestamp: Int64)
    case channel(
        app: App, activityID: String, channelID: String?, storagePolicy: Int?, onlyIfUnbound: Bool,
        environment: String?)
    /// Remove `token` from the registrations `scope` reaches (nil: all) where it was registered strictly before
    /// `before` (nil: whenever). For a 410, `before` is its timestamp. The
    /// scope's app stays a bundle id, unresolved: an app the store does not know has nothing to remove.
    case removeToken(token: String, before: Int64?, scope: RemovalScope?)

    /// The app the change is for (nil for a removal by token, which is every app's).
    package var app: App? {
        switch self {
        case .updateToken(let app, _, _, _, _, _), .stopUpdateTokens(let app, _, _),
            .pushToStart(let app, _, _, _, _, _), .device(let app, _, _, _, _), .startActivity(let app, _, _),
            .endActivity(let app, _, _), .contentSent(let app, _, _), .channel(let app, _, _, _, _, _):
            return app
        case .removeToken: return nil
        }
    }

    /// The same change with its app resolved by `resolve`.
    package func resolvingApp<Resolved>(_ resolve: (App) throws(RegistryError) -> Resolved) throws(RegistryError)
        -> ValidatedChange<Resolved>
    {
        switch self {
        case .updateToken(let app, let activityID, let deviceID, let userID, let token, let registeredAt):
            return .updateToken(
                app: try resolve(app), activityID: activityID, deviceID: deviceID, userID: userID, token: token,
                registeredAt: registeredAt)
        case .stopUpdateTokens(let app, let activityID, let deviceID):
            return .stopUpdateTokens(app: try resolve(app), activityID: activityID, deviceID: deviceID)
        case .pushToStart(let app, let deviceID, let userID, let attributesType, let token, let updatedAt):
            return .pushToStart(
                app: try resolve(app), deviceID: deviceID, userID: userID, attributesType: attributesType,
                token: token, updatedAt: updatedAt)
        case .device(let app, let deviceID, let userID, let pushToken, let registeredAt):
            return .device(
                app: try resolve(app), deviceID: deviceID, userID: userID, pushToken: pushToken,
                registeredAt: registeredAt)
        case .startActivity(let app, let activityID, let attributesType):
            return .startActivity(app: try resolve(app), activityID: activityID, attributesType: attributesType)
        case .endActivity(let app, let activityID, let dismissalDate):
            return .endActivity(app: try resolve(app), activityID: activityID, dismissalDate: dismissalDate)
        case .contentSent(let app, let activityID, let timestamp):
            return .contentSent(app: try resolve(app), activityID: activityID, timestamp: timestamp)
        case .channel(let app, let activityID, let channelID, let storagePolicy, let onlyIfUnbound, let environment):
            return .channel(
                app: try resolve(app), activityID: activityID, channelID: channelID, storagePolicy: storagePolicy,
                onlyIfUnbound: onlyIfUnbound, environment: environment)
        case .removeToken(let token, let before, let scope):
            return .removeToken(token: token, before: before, scope: scope)
        }
    }
}

extension RegistryValidation {
    /// Checks one change's fields; throws `invalidInput` naming the field. Whether its app is defined is the store's
    /// to check (`ValidatedChange.resolvingApp`).
    package static func validate(_ change: RegistryChange) throws(RegistryError) -> ValidatedChange<String> {
        typealias V = RegistryValidation
        switch change {
        case .updateToken(let registration):
            return .updateToken(
                app: registration.app, activityID: try V.identifier(registration.activityID, field: "activity_id"),
                deviceID: try V.optionalIdentifier(registration.deviceID, field: "device"),
                userID: try V.optionalIdentifier(registration.userID, field: "user"),
                token: try V.token(registration.token, field: "token", allowEmpty: true),
                registeredAt: try V.time(registration.registeredAt, field: "registered_at"))
        case .stopUpdateTokens(let app, let activityID, let deviceID):
            return .stopUpdateTokens(
                app: app, activityID: try V.identifier(activityID, field: "activity_id"),
                deviceID: try V.optionalIdentifier(deviceID, field: "device"))
        case .pushToStartToken(let registration):
            return .pushToStart(
                app: registration.app, deviceID: try V.identifier(registration.deviceID, field: "device"),
                userID: try V.optionalIdentifier(registration.userID, field: "user"),
                attributesType: try V.optionalIdentifier(registration.attributesType, field: "attributes_type") ?? "",
                token: try V.token(registration.token, field: "push_to_start_token", allowEmpty: true),
                updatedAt: try V.time(registration.updatedAt, field: "registered_at"))
        case .device(let registration):
            return .device(
                app: registration.app, deviceID: try V.identifier(registration.deviceID, field: "device"),
                userID: try V.optionalIdentifier(registration.userID, field: "user"),
                pushToken: try registration.pushToken.map { (token) throws(RegistryError) in
                    try V.token(token, field: "push_token", allowEmpty: true)
                },
                registeredAt: try V.time(registration.registeredAt, field: "registered_at"))
        case .startActivity(let app, let activityID, let attributesType):
            return .startActivity(
                app: app, activityID: try V.identifier(activityID, field: "activity_id"),
                attributesType: try V.optionalIdentifier(attributesType, field: "attributes_type"))
        case .endActivity(let app, let activityID, let dismissalDate):
            return .endActivity(
                app: app, activityID: try V.identifier(activityID, field: "activity_id"),
                dismissalDate: try V.time(dismissalDate, field: "dismissal_date"))
        case .contentSent(let app, let activityID, let timestamp):
            return .contentSent(
                app: app, activityID: try V.identifier(activityID, field: "activity_id"), timestamp: timestamp)
        case .channel(let app, let activityID, let channelID, let storagePolicy, let onlyIfUnbound, let environment):
            if let storagePolicy, storagePolicy != 0 && storagePolicy != 1 {
                throw RegistryError(
                    .invalidInput, field: "storage_policy", "storage_policy must be 0 or 1, not \(storagePolicy)")
            }
            return .channel(
                app: app, activityID: try V.identifier(activityID, field: "activity_id"),
                channelID: try V.optionalIdentifier(channelID, field: "channel_id"),
                storagePolicy: channelID == nil ? nil : storagePolicy, onlyIfUnbound: onlyIfUnbound,
                environment: channelID == nil
                    ? nil : try V.optionalIdentifier(environment, field: "channel_environment"))
        case .unregistered(let token, let timestamp, let topic):
            // Removed only where registered strictly before the 410's timestamp: each store holds the latest
            // registration's exact time, so a registration at or after it means the device registered it again.
            return .removeToken(
                token: try V.token(token, field: "token", allowEmpty: false),
                before: try V.time(timestamp, field: "timestamp"),
                scope: try V.optionalIdentifier(topic, field: "topic").map(RemovalScope.init(topic:)))
        case .invalidToken(let token, let topic):
            return .removeToken(
                token: try V.token(token, field: "token", allowEmpty: false), before: nil,
                scope: try V.optionalIdentifier(topic, field: "topic").map(RemovalScope.init(topic:)))
        }
    }
}

/// The registrations a token APNs refused for one `apns-topic` is removed from: APNs answers for that topic only.
/// `<bundle>.push-type.liveactivity` reaches the app's Live Activity tokens (update and push-to-start); any other
/// topic is taken as a bundle id whose devices' regular push tokens it reaches (a topic no app has, such as a VoIP
/// one, reaches nothing the registry holds).
package struct RemovalScope: Sendable, Hashable {
    package enum Kind: Sendable, Hashable {
        /// Update and push-to-start tokens.
        case liveActivity
        /// Devices' regular push tokens.
        case devicePush
    }

    /// The bundle id.
    package let app: String
    package let kind: Kind

    package init(topic: String) {
        // The push type's own rule for its topic: a non-empty bundle id followed by the suffix.
        if PushType.liveactivity.acceptsTopic(topic), let suffix = PushType.liveactivity.requiredTopicSuffix {
            app = String(topic.dropLast(suffix.count))
            kind = .liveActivity
        } else {
            app = topic
            kind = .devicePush
        }
    }
}
