/// The `reason` string of an APNs error response (also used in GOAWAY debug data).
///
/// A struct over the raw string, not an enum: APNs adds reasons over time, and an unknown one must survive intact into
/// results files and logs. The static members are the device-push reasons, each with the status APNs sends it with
/// and the class that tells the engine what to do (docs/reference/apns.md, "Status codes and reasons").
public struct APNsReason: Hashable, Sendable, CustomStringConvertible {
    /// The string exactly as APNs sent it.
    public let rawValue: String

    public init(_ rawValue: String) {
        self.rawValue = rawValue
    }

    public init(rawValue: String) {
        self.rawValue = rawValue
    }

    public var description: String { rawValue }

    // MARK: 400

    public static let badCollapseId = APNsReason("BadCollapseId")
    public static let badDeviceToken = APNsReason("BadDeviceToken")
    public static let badExpirationDate = APNsReason("BadExpirationDate")
    public static let badMessageId = APNsReason("BadMessageId")
    public static let badPriority = APNsReason("BadPriority")
    public static let badTopic = APNsReason("BadTopic")
    public static let deviceTokenNotForTopic = APNsReason("DeviceTokenNotForTopic")
    public static let duplicateHeaders = APNsReason("DuplicateHeaders")
    public static let idleTimeout = APNsReason("IdleTimeout")
    public static let invalidPushType = APNsReason("InvalidPushType")
    public static let missingDeviceToken = APNsReason("MissingDeviceToken")
    public static let missingTopic = APNsReason("MissingTopic")
    public static let payloadEmpty = APNsReason("PayloadEmpty")
    public static let topicDisallowed = APNsReason("TopicDisallowed")
    /// Not an APNs reason: Apple documents none for a device-push body that is not JSON, has no `aps` dictionary, or
    /// breaks the Live Activity rules. mock-apns answers such bodies with 400 `BadPayload`, and Fanout treats it as a
    /// configuration error like the other 400s.
    public static let badPayload = APNsReason("BadPayload")

    // MARK: 403

    public static let badCertificate = APNsReason("BadCertificate")
    public static let badCertificateEnvironment = APNsReason("BadCertificateEnvironment")
    public static let expiredProviderToken = APNsReason("ExpiredProviderToken")
    public static let forbidden = APNsReason("Forbidden")
    public static let invalidProviderToken = APNsReason("InvalidProviderToken")
    public static let missingProviderToken = APNsReason("MissingProviderToken")
    public static let unrelatedKeyIdInToken = APNsReason("UnrelatedKeyIdInToken")
    public static let badEnvironmentKeyIdInToken = APNsReason("BadEnvironmentKeyIdInToken")
    /// The spelling APNSwift also lists for `BadEnvironmentKeyIdInToken`; classified the same way.
    public static let badEnvironmentKeyInToken = APNsReason("BadEnvironmentKeyInToken")

    // MARK: 404, 405, 410, 413

    public static let badPath = APNsReason("BadPath")
    public static let methodNotAllowed = APNsReason("MethodNotAllowed")
    public static let expiredToken = APNsReason("ExpiredToken")
    public static let unregistered = APNsReason("Unregistered")
    public static let payloadTooLarge = APNsReason("PayloadTooLarge")

    // MARK: 429, 500, 503

    public static let tooManyProviderTokenUpdates = APNsReason("TooManyProviderTokenUpdates")
    public static let tooManyRequests = APNsReason("TooManyRequests")
    public static let internalServerError = APNsReason("InternalServerError")
    public static let serviceUnavailable = APNsReason("ServiceUnavailable")
    public static let shutdown = APNsReason("Shutdown")

    /// Every reason this version knows.
    public static var allKnown: [APNsReason] {
        knownReasons.keys.sorted().map { APNsReason($0) }
    }

    /// Whether this reason is one of the static members.
    public var isKnown: Bool {
        APNsReason.knownReasons[rawValue] != nil
    }

    /// The class of a known reason; nil for an unknown one, whose class depends on the status it came with (use
    /// `ReasonClass(status:reason:)` or `APNsResponse.reasonClass`).
    public var reasonClass: ReasonClass? {
        APNsReason.knownReasons[rawValue]?.reasonClass
    }

    /// Whether the device token must be dropped: the 410 reasons plus `BadDeviceToken` and `DeviceTokenNotForTopic`.
    public var invalidatesToken: Bool {
        reasonClass == .permanent
    }

    /// Whether the remedy includes a new connection: the provider-token reasons (APNs wedges the connection),
    /// `IdleTimeout`, `ServiceUnavailable` and `Shutdown` (the "Action" column of docs/reference/apns.md,
    /// "Status codes and reasons").
    public var requiresNewConnection: Bool {
        APNsReason.knownReasons[rawValue]?.requiresNewConnection ?? false
    }

    /// The HTTP status APNs answers this reason with, or nil for a reason this version does not know. mock-apns uses
    /// it to reply exactly as APNs would.
    public static func statusFor(_ reason: APNsReason) -> Int? {
        knownReasons[reason.rawValue]?.status
    }

    struct Entry: Sendable {
        let status: Int
        let reasonClass: ReasonClass
        let requiresNewConnection: Bool

        init(_ status: Int, _ reasonClass: ReasonClass, newConnection: Bool = false) {
            self.status = status
            self.reasonClass = reasonClass
            self.requiresNewConnection = newConnection
        }
    }

    /// docs/reference/apns.md, "Status codes and reasons", as data.
    static let knownReasons: [String: Entry] = [
        "BadCollapseId": Entry(400, .configuration),
        "BadDeviceToken": Entry(400, .permanent),
        "BadExpirationDate": Entry(400, .configuration),
        "BadMessageId": Entry(400, .configuration),
        "BadPriority": Entry(400, .configuration),
        "BadTopic": Entry(400, .configuration),
        "DeviceTokenNotForTopic": Entry(400, .permanent),
        "DuplicateHeaders": Entry(400, .configuration),
        "IdleTimeout": Entry(400, .transient, newConnection: true),
        "InvalidPushType": Entry(400, .configuration),
        "MissingDeviceToken": Entry(400, .configuration),
        "MissingTopic": Entry(400, .configuration),
        "PayloadEmpty": Entry(400, .configuration),
        "TopicDisallowed": Entry(400, .configuration),
        "BadPayload": Entry(400, .configuration),
        "BadCertificate": Entry(403, .configuration),
        "BadCertificateEnvironment": Entry(403, .configuration),
        "ExpiredProviderToken": Entry(403, .providerTokenRefresh, newConnection: true),
        "Forbidden": Entry(403, .configuration),
        "InvalidProviderToken": Entry(403, .configuration),
        "MissingProviderToken": Entry(403, .configuration),
        "UnrelatedKeyIdInToken": Entry(403, .providerTokenRefresh, newConnection: true),
        "BadEnvironmentKeyIdInToken": Entry(403, .configuration),
        "BadEnvironmentKeyInToken": Entry(403, .configuration),
        "BadPath": Entry(404, .configuration),
        "MethodNotAllowed": Entry(405, .configuration),
        "ExpiredToken": Entry(410, .permanent),
        "Unregistered": Entry(410, .permanent),
        "PayloadTooLarge": Entry(413, .configuration),
        "TooManyProviderTokenUpdates": Entry(429, .providerTokenThrottled),
        "TooManyRequests": Entry(429, .transient),
        "InternalServerError": Entry(500, .transient),
        "ServiceUnavailable": Entry(503, .transient, newConnection: true),
        "Shutdown": Entry(503, .transient, newConnection: true),
    ]
}
