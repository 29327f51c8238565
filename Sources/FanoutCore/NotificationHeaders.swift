/// The request headers of one device push (docs/reference/apns.md, "Request headers"), checked against the rules
/// APNs enforces and laid out in the order and with the HPACK indexing Apple recommends ("HPACK").
public struct NotificationHeaders: Hashable, Sendable {
    /// The largest `apns-collapse-id` APNs accepts, in UTF-8 bytes.
    public static let maximumCollapseIDBytes = 64

    public var pushType: PushType
    /// `apns-topic`: the bundle ID plus the push type's suffix.
    public var topic: String
    /// `apns-priority` (1, 5 or 10); nil means the push type's default.
    public var priority: Int?
    /// `apns-expiration` in UNIX seconds; 0 means deliver once without storing, nil omits the header.
    public var expiration: Int64?
    /// `apns-collapse-id`, at most 64 bytes.
    public var collapseID: String?
    /// `apns-id`, a canonical UUID; nil lets APNs generate one.
    public var apnsID: String?
    /// The provider JWT, without the `bearer ` prefix; nil on certificate connections. The engine adds its own token
    /// to each connection's requests, so a gateway never sets it; mock-apns's tests do.
    package var bearerToken: String?

    public init(
        pushType: PushType, topic: String, priority: Int? = nil, expiration: Int64? = nil, collapseID: String? = nil,
        apnsID: String? = nil
    ) {
        self.init(
            pushType: pushType, topic: topic, priority: priority, expiration: expiration, collapseID: collapseID,
            apnsID: apnsID, bearerToken: nil)
    }

    package init(
        pushType: PushType, topic: String, priority: Int? = nil, expiration: Int64? = nil, collapseID: String? = nil,
        apnsID: String? = nil, bearerToken: String?
    ) {
        self.pushType = pushType
        self.topic = topic
        self.priority = priority
        self.expiration = expiration
        self.collapseID = collapseID
        self.apnsID = apnsID
        self.bearerToken = bearerToken
    }

    /// The priority APNs will apply: the explicit one, or the push type's default (5 for background, else 10).
    public var effectivePriority: Int { priority ?? pushType.defaultPriority }

    /// The `:path` of a device push to `token`.
    public static func path(for token: DeviceToken) -> String {
        "/3/device/" + token.hex
    }

    /// Checks the rules APNs would reject the request for, so that a bad job fails once, before any token is sent.
    public func validate() throws(NotificationHeaderError) {
        guard !topic.isEmpty else {
            throw NotificationHeaderError(field: APNsHeaderName.topic, reason: .missingTopic, message: "is empty")
        }
        // First, and in its own words: such a topic may have the right suffix, and the message must not echo it (a CR
        // or LF would break the log line it lands in).
        guard !topic.utf8.contains(where: ASCIIBytes.isForbiddenInHeaderValue) else {
            throw NotificationHeaderError(
                field: APNsHeaderName.topic, reason: .badTopic,
                message: "contains control characters (CR, LF or another byte below 0x20 but tab, or DEL)")
        }
        guard pushType.acceptsTopic(topic) else {
            let suffix = pushType.requiredTopicSuffix ?? ""
            throw NotificationHeaderError(
                field: APNsHeaderName.topic, reason: .badTopic,
                message: "\"\(topic)\" is not a bundle ID followed by \"\(suffix)\", as push type \(pushType) requires")
        }
        if let priority, !pushType.allowsPriority(priority) {
            let message =
                pushType == .background && priority == 10
                ? "10 is not allowed for background pushes (use 5 or 1)" : "\(priority) is not 1, 5 or 10"
            throw NotificationHeaderError(field: APNsHeaderName.priority, reason: .badPriority, message: message)
        }
        if let expiration, expiration < 0 {
            throw NotificationHeaderError(
                field: APNsHeaderName.expiration, reason: .badExpirationDate,
                message: "\(expiration) is negative; use 0 or UNIX seconds")
        }
        if let collapseID {
            let count = collapseID.utf8.count
            guard count <= NotificationHeaders.maximumCollapseIDBytes else {
                throw NotificationHeaderError(
                    field: APNsHeaderName.collapseID, reason: .badCollapseId,
                    message: "is \(count) bytes; APNs allows at most \(NotificationHeaders.maximumCollapseIDBytes)")
            }
            guard !collapseID.utf8.contains(where: ASCIIBytes.isForbiddenInHeaderValue) else {
                throw NotificationHeaderError(
                    field: APNsHeaderName.collapseID, reason: .badCollapseId, message: "contains control characters")
            }
        }
        if let apnsID, !APNsID.isValid(apnsID) {
            throw NotificationHeaderError(
                field: APNsHeaderName.apnsID, reason: .badMessageId,
                message: "\"\(apnsID)\" is not a canonical UUID (8-4-4-4-12 hex digits)")
        }
        if let bearerToken, bearerToken.isEmpty || bearerToken.utf8.contains(where: ASCIIBytes.isForbiddenInHeaderValue)
        {
            throw NotificationHeaderError(
                field: APNsHeaderName.authorization, reason: .invalidProviderToken,
                message: "the bearer token is empty or contains control characters")
        }
    }

    /// Validates, then lists the request's headers: the pseudo-headers first (as HTTP/2 requires), then
    /// `authorization`, `apns-push-type`, `apns-topic` and the optional ones that are set.
    ///
    /// `:path`, `authorization` and `apns-id` are marked `neverIndex`, as Apple asks. `apns-priority` is sent when
    /// given, and also when the push type's default is not APNs's implicit 10 (background), because an omitted
    /// priority means 10, which APNs rejects for background pushes.
    package func headerFields(deviceToken: DeviceToken, authority: String) throws(NotificationHeaderError)
        -> [HeaderField]
    {
        try validate()
        var fields = [HeaderField]()
        fields.reserveCapacity(11)
        fields.append(HeaderField(name: APNsHeaderName.method, value: "POST"))
        fields.append(HeaderField(name: APNsHeaderName.scheme, value: "https"))
        fields.append(
            HeaderField(name: APNsHeaderName.path, value: NotificationHeaders.path(for: deviceToken), neverIndex: true))
        fields.append(HeaderField(name: APNsHeaderName.authority, value: authority))
        if let bearerToken {
            fields.append(
                HeaderField(name: APNsHeaderName.authorization, value: "bearer " + bearerToken, neverIndex: true))
        }
        fields.append(HeaderField(name: APNsHeaderName.pushType, value: pushType.rawValue))
        fields.append(HeaderField(name: APNsHeaderName.topic, value: topic))
        if priority != nil || pushType.defaultPriority != 10 {
            fields.append(HeaderField(name: APNsHeaderName.priority, value: String(effectivePriority)))
        }
        if let expiration {
            fields.append(HeaderField(name: APNsHeaderName.expiration, value: String(expiration)))
        }
        if let collapseID {
            fields.append(HeaderField(name: APNsHeaderName.collapseID, value: collapseID))
        }
        if let apnsID {
            fields.append(HeaderField(name: APNsHeaderName.apnsID, value: apnsID, neverIndex: true))
        }
        return fields
    }
}
