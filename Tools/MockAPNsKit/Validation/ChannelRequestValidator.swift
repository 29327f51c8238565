import FanoutCore

/// A channel-management request that passed `ChannelRequestValidator`: what it asks for, not yet applied.
package struct ChannelRequest: Hashable, Sendable {
    package enum Operation: Hashable, Sendable {
        /// POST `/1/apps/{bundleId}/channels`.
        case create(ChannelStoragePolicy)
        /// GET `/1/apps/{bundleId}/channels` with `apns-channel-id`.
        case read(channelID: String)
        /// DELETE `/1/apps/{bundleId}/channels` with `apns-channel-id`.
        case delete(channelID: String)
        /// GET `/1/apps/{bundleId}/all-channels`.
        case list
    }

    /// The plain bundle id from the path.
    package var bundleID: String
    package var operation: Operation
    /// The request's `apns-request-id`; nil when absent, in which case the server generates one.
    package var requestID: String?

    package init(bundleID: String, operation: Operation, requestID: String? = nil) {
        self.bundleID = bundleID
        self.operation = operation
        self.requestID = requestID
    }
}

/// Checks a channel-management request (docs/reference/broadcast-channels.md, "Channel management API") for the mock's
/// management listener. Pure: it says what the request asks for; whether the channel exists, and the per-app limit,
/// are the store's to answer
/// (`ChannelNotRegistered`, `CannotCreateChannelConfig`).
///
/// Checks run in this order and the first failure wins (Apple documents no order):
///
/// | Check | Status | Reason |
/// |---|---|---|
/// | path is not `/1/apps/<bundle id>/channels` or `/1/apps/<bundle id>/all-channels` | 404 | `BadPath` |
/// | bundle id carries a push-type suffix (`.push-type.liveactivity`) | 400 | `TopicDisallowed` |
/// | `channels` with a method other than POST, GET, DELETE; `all-channels` with one other than GET | 405 | `MethodNotAllowed` |
/// | a header the API reads appears twice | 400 | `DuplicateHeaders` |
/// | `apns-request-id` not a lowercase UUID | 400 | `BadMessageId` |
/// | read, delete: `apns-channel-id` absent or empty | 400 | `MissingChannelId` |
/// | read, delete: `apns-channel-id` not base64 | 400 | `BadChannelId` |
/// | create: body not a JSON object (empty, malformed, a key twice) | 400 | `BadRequestPayload` |
/// | create: a key other than `message-storage-policy` and `push-type` | 400 | `BadRequestParams` |
/// | create: `push-type` absent | 400 | `MissingPushType` |
/// | create: `push-type` not the string `LiveActivity` in any case | 400 | `InvalidPushType` |
/// | create: `message-storage-policy` absent, or not the number 0 or 1 | 400 | `BadRequestParams` |
///
/// Decisions where Apple's behaviour is unconfirmed: `push-type` is matched without regard to case (Apple's sample
/// sends `LiveActivity`, node-apn `liveactivity`); the policy must be a JSON number (node-apn's string `'1'` is
/// refused, so that a client the mock accepts sends what Apple's sample sends); a request body on GET or DELETE is
/// ignored.
package struct ChannelRequestValidator: Sendable {
    static let pathPrefix = "/1/apps/"

    package init() {}

    package func check(
        method: String, path: String, headers: [(name: String, value: String)], body: some Collection<UInt8>
    ) -> Result<ChannelRequest, APNsRejection> {
        guard path.hasPrefix(Self.pathPrefix) else { return .failure(APNsRejection(.badPath)) }
        let rest = path.dropFirst(Self.pathPrefix.count)
        guard let slash = rest.lastIndex(of: "/") else { return .failure(APNsRejection(.badPath)) }
        let resource = rest[rest.index(after: slash)...]
        guard resource == "channels" || resource == "all-channels" else { return .failure(APNsRejection(.badPath)) }
        let bundleID: String
        switch BroadcastRules.bundleID(rest[..<slash]) {
        case .success(let id): bundleID = id
        case .failure(let rejection): return .failure(rejection)
        }
        let isList = resource == "all-channels"
        switch method {
        case "GET": break
        case "POST" where !isList, "DELETE" where !isList: break
        default: return .failure(APNsRejection(.methodNotAllowed))
        }

        let received: BroadcastHeaders
        switch BroadcastHeaders.collect(headers) {
        case .success(let collected): received = collected
        case .failure(let rejection): return .failure(rejection)
        }
        if let requestID = received.requestID, !BroadcastRules.isValidRequestID(requestID) {
            return .failure(APNsRejection(.badMessageId))
        }
        func request(_ operation: ChannelRequest.Operation) -> Result<ChannelRequest, APNsRejection> {
            .success(ChannelRequest(bundleID: bundleID, operation: operation, requestID: received.requestID))
        }
        if isList { return request(.list) }
        if method == "POST" {
            switch Self.storagePolicy(inCreateBody: body) {
            case .success(let policy): return request(.create(policy))
            case .failure(let rejection): return .failure(rejection)
            }
        }
        switch received.requiredChannelID() {
        case .success(let channelID):
            return request(method == "GET" ? .read(channelID: channelID) : .delete(channelID: channelID))
        case .failure(let rejection):
            return .failure(rejection)
        }
    }

    /// The body of a create: `{"message-storage-policy": 0|1, "push-type": "LiveActivity"}`.
    static func storagePolicy(inCreateBody body: some Collection<UInt8>) -> Result<ChannelStoragePolicy, APNsRejection>
    {
        var pushType = PushTypeField.missing
        var policy: Int64?
        var policyPresent = false
        var unknownKey = false
        do {
            try JSONParser.withParser(over: body, rules: .strict) { parser throws(JSONParseError) in
                guard try parser.peekKind() == .object else {
                    throw JSONParseError(offset: 0, message: "not an object")
                }
                try parser.readObject { key, parser throws(JSONParseError) in
                    if parser.string(key, equals: "message-storage-policy") {
                        policyPresent = true
                        if try parser.peekKind() == .number {
                            policy = try parser.readInteger()
                        } else {
                            policy = nil
                            try parser.skipValue()
                        }
                    } else if parser.string(key, equals: "push-type") {
                        if try parser.peekKind() == .string {
                            let value = try parser.readStringValue()
                            pushType = BroadcastRules.isLiveActivity(value) ? .liveActivity : .other
                        } else {
                            try parser.skipValue()
                            pushType = .other
                        }
                    } else {
                        unknownKey = true
                        try parser.skipValue()
                    }
                }
                try parser.finish()
            }
        } catch {
            return .failure(APNsRejection(.badRequestPayload))
        }
        if unknownKey { return .failure(APNsRejection(.badRequestParams)) }
        switch pushType {
        case .missing: return .failure(APNsRejection(.missingPushType))
        case .other: return .failure(APNsRejection(.invalidPushType))
        case .liveActivity: break
        }
        guard policyPresent, let policy, let known = ChannelStoragePolicy(rawValue: Int(policy)) else {
            return .failure(APNsRejection(.badRequestParams))
        }
        return .success(known)
    }
}

/// What a create body's `push-type` held.
private enum PushTypeField { case missing, liveActivity, other }
