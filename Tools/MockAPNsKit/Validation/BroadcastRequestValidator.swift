import FanoutCore

/// A broadcast send that passed `BroadcastRequestValidator`.
package struct ValidatedBroadcast: Hashable, Sendable {
    /// The plain bundle id from the path.
    package var bundleID: String
    package var channelID: String
    /// The storage policy of the channel it was sent on.
    package var policy: ChannelStoragePolicy
    package var priority: Int
    package var expiration: Int64
    /// The request's `apns-request-id`; nil when absent, in which case the server generates one.
    package var requestID: String?

    package init(
        bundleID: String, channelID: String, policy: ChannelStoragePolicy, priority: Int, expiration: Int64,
        requestID: String? = nil
    ) {
        self.bundleID = bundleID
        self.channelID = channelID
        self.policy = policy
        self.priority = priority
        self.expiration = expiration
        self.requestID = requestID
    }
}

/// Checks a broadcast send, `POST /4/broadcasts/apps/{bundleId}` on the push listener, as
/// docs/reference/broadcast-channels.md, "Broadcast send", describes APNs's rules, and answers with APNs's status and
/// reason. Pure: the one piece of state it needs, the
/// channel's storage policy, comes from the `channelPolicy` lookup, so the fuzzer can drive it.
///
/// Checks run in this order and the first failure wins (Apple documents no order):
///
/// | Check | Status | Reason |
/// |---|---|---|
/// | `:method` is not `POST` | 405 | `MethodNotAllowed` |
/// | path is not `/4/broadcasts/apps/<bundle id>` (empty id, or one with `/`) | 404 | `BadPath` |
/// | bundle id carries a push-type suffix (`.push-type.liveactivity`) | 400 | `TopicDisallowed` |
/// | a header the API reads appears twice | 400 | `DuplicateHeaders` |
/// | `apns-topic` present at all | 400 | `TopicDisallowed` |
/// | `apns-request-id` not a lowercase UUID, or `apns-id` not a UUID | 400 | `BadMessageId` |
/// | `apns-channel-id` absent or empty | 400 | `MissingChannelId` |
/// | `apns-channel-id` not base64 (see `ChannelID.isWellFormed`) | 400 | `BadChannelId` |
/// | `apns-push-type` absent or empty | 400 | `MissingPushType` |
/// | `apns-push-type` not `liveactivity` in any case | 400 | `InvalidPushType` |
/// | `apns-priority` absent, or not 1, 5 or 10 | 400 | `BadPriority` |
/// | `apns-expiration` absent, or not a non-negative integer | 400 | `BadExpirationDate` |
/// | the channel does not exist in this environment | 400 | `ChannelNotRegistered` |
/// | `apns-expiration` not 0 on a policy-0 (No Message Stored) channel | 400 | `BadExpirationDate` |
/// | empty body | 400 | `PayloadEmpty` |
/// | body over 5,120 bytes | 413 | `PayloadTooLarge` |
/// | body not a JSON object with an `aps` object | 400 | `BadRequestPayload` |
/// | `aps.event` not `update` or `end` (`start` included) | 400 | `BadRequestPayload` |
/// | `aps.timestamp` missing or not a non-negative integer | 400 | `BadRequestPayload` |
/// | `attributes-type` or `attributes` in `aps` | 400 | `BadRequestPayload` |
///
/// Decisions where Apple's behaviour is unconfirmed (the mock is strict, so a client it accepts works either way):
/// - `apns-topic` is refused with `TopicDisallowed`: Apple's header table, curl samples and ActivityKit's channel
///   header list all leave it out, and the bundle id travels in the path.
/// - `event: "start"` is refused with `BadRequestPayload`: a broadcast cannot start a Live Activity.
/// - `apns-priority` and `apns-expiration` are required, as Apple's table says, although Apple's own curl sample
///   leaves the expiration out.
/// - An expiration later than now + 8 hours on a policy-1 channel is accepted (clamping or refusing is unknown).
/// - `apns-collapse-id` is ignored. `apns-request-id` in upper case is refused as `BadMessageId`, the reason
///   Apple gives for a malformed `apns-id`.
package struct BroadcastRequestValidator: Sendable {
    static let pathPrefix = "/4/broadcasts/apps/"
    /// Apple's limit for a broadcast payload: 5 KB.
    package static let payloadSizeLimit = 5120

    package init() {}

    /// Whether the path belongs to the broadcast API (`/4/...`): mock-apns routes on it before the device validator
    /// runs, with a byte comparison and no parsing, so the broadcast API adds no parsing to the device path.
    @inline(__always)
    package static func isBroadcastPath(_ path: String) -> Bool {
        path.utf8.starts(with: "/4/".utf8)
    }

    /// Validates the request and, when it passes, returns its parsed headers.
    /// - Parameter channelPolicy: the storage policy of channel `channelID` of app `bundleID` in this environment,
    ///   nil when there is no such channel.
    package func check(
        method: String, path: String, headers: [(name: String, value: String)], body: some Collection<UInt8>,
        channelPolicy: (_ bundleID: String, _ channelID: String) -> ChannelStoragePolicy?
    ) -> Result<ValidatedBroadcast, APNsRejection> {
        guard method == "POST" else { return .failure(APNsRejection(.methodNotAllowed)) }
        guard path.hasPrefix(Self.pathPrefix) else { return .failure(APNsRejection(.badPath)) }
        let bundleID: String
        switch BroadcastRules.bundleID(path.dropFirst(Self.pathPrefix.count)) {
        case .success(let id): bundleID = id
        case .failure(let rejection): return .failure(rejection)
        }

        let received: BroadcastHeaders
        switch BroadcastHeaders.collect(headers) {
        case .success(let collected): received = collected
        case .failure(let rejection): return .failure(rejection)
        }
        if received.topic != nil { return .failure(APNsRejection(.topicDisallowed)) }
        if let rejection = received.checkIDs() { return .failure(rejection) }
        let channelID: String
        switch received.requiredChannelID() {
        case .success(let id): channelID = id
        case .failure(let rejection): return .failure(rejection)
        }
        guard let pushType = received.pushType, !pushType.isEmpty else {
            return .failure(APNsRejection(.missingPushType))
        }
        guard BroadcastRules.isLiveActivity(pushType) else { return .failure(APNsRejection(.invalidPushType)) }

        let priority: Int
        switch received.priority {
        case "1": priority = 1
        case "5": priority = 5
        case "10": priority = 10
        default: return .failure(APNsRejection(.badPriority))
        }
        guard let expirationText = received.expiration,
            let expiration = ASCIIBytes.parseNonNegativeInt64(expirationText.utf8)
        else { return .failure(APNsRejection(.badExpirationDate)) }

        guard let policy = channelPolicy(bundleID, channelID) else {
            return .failure(APNsRejection(.channelNotRegistered))
        }
        if policy == .noMessageStored, expiration != 0 { return .failure(APNsRejection(.badExpirationDate)) }

        if let rejection = Self.checkBody(body) { return .failure(rejection) }
        return .success(
            ValidatedBroadcast(
                bundleID: bundleID, channelID: channelID, policy: policy, priority: priority, expiration: expiration,
                requestID: received.requestID))
    }

    /// The body rules: presence, the 5 KB limit, then a Live Activity update or end.
    static func checkBody(_ body: some Collection<UInt8>) -> APNsRejection? {
        let count = body.count
        if count == 0 { return APNsRejection(.payloadEmpty) }
        if count > payloadSizeLimit { return APNsRejection(.payloadTooLarge) }
        guard let shape = PayloadShape.inspect(body), shape.hasAPSObject else {
            return APNsRejection(.badRequestPayload)
        }
        switch shape.event {
        case .update, .end: break
        case .start, .missing, .notAString, .unknown: return APNsRejection(.badRequestPayload)
        }
        guard shape.hasTimestamp, shape.timestampIsInteger else { return APNsRejection(.badRequestPayload) }
        if shape.hasAttributesType || shape.hasAttributes { return APNsRejection(.badRequestPayload) }
        return nil
    }
}
