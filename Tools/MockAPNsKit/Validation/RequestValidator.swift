import FanoutCore

/// Checks a device-push request the way APNs does (apns-reference sections 2, 5 and 6) and answers with APNs's status
/// and reason. mock-apns runs it once per request; the JWT is checked separately, with crypto, by the mock.
///
/// Checks run in this order and the first failure wins (APNs does not document its own order):
///
/// | Check | Status | Reason |
/// |---|---|---|
/// | `:method` is not `POST` | 405 | `MethodNotAllowed` |
/// | path is not `/3/device/<token>` | 404 | `BadPath` |
/// | token empty (`/3/device/` or `/3/device`) | 400 | `MissingDeviceToken` |
/// | token not 64...200 hex digits of even length | 400 | `BadDeviceToken` |
/// | a header APNs reads appears twice | 400 | `DuplicateHeaders` |
/// | `apns-push-type` unknown | 400 | `InvalidPushType` |
/// | `apns-topic` absent or empty | 400 | `MissingTopic` |
/// | topic lacks the push type's suffix (e.g. liveactivity without `.push-type.liveactivity`) | 400 | `BadTopic` |
/// | `apns-priority` not 1, 5 or 10, or 10 on a background push | 400 | `BadPriority` |
/// | `apns-expiration` not a non-negative integer | 400 | `BadExpirationDate` |
/// | `apns-collapse-id` over 64 bytes | 400 | `BadCollapseId` |
/// | `apns-id` not a canonical UUID | 400 | `BadMessageId` |
/// | empty body | 400 | `PayloadEmpty` |
/// | body over 4096 bytes (5120 for voip) | 413 | `PayloadTooLarge` |
/// | body not a JSON object, or no `aps` object where the push type needs one (see below) | 400 | `BadPayload` |
/// | liveactivity: `aps.event` not start/update/end | 400 | `BadPayload` |
/// | liveactivity: `aps.timestamp` missing or not a non-negative integer | 400 | `BadPayload` |
/// | liveactivity: `attributes-type` or `attributes` on an event other than start | 400 | `BadPayload` |
/// | liveactivity: both `input-push-token` and `input-push-channel` | 400 | `BadPayload` |
///
/// Decisions where APNs's behaviour is not documented:
/// - A topic that does not fit the push type gets `BadTopic`, not `DeviceTokenNotForTopic`: the latter says the token
///   belongs to another topic, which only a real token registry can know.
/// - Malformed bodies get `BadPayload`, which APNs does not list for device pushes (see `APNsReason.badPayload`).
///   `aps` is required for alert, background, liveactivity and widgets; the PushKit and system types (voip,
///   complication, fileprovider, location, pushtotalk, mdm) carry app-defined JSON and need only a JSON object.
/// - Of the Live Activity keys in apns-reference section 6, only the rules in the table are enforced:
///   `input-push-token` and `input-push-channel` are not refused on update/end, and `start` does not demand
///   `attributes`.
/// - Only duplicates of the headers APNs reads (pseudo-headers, `authorization` and the `apns-*` request headers)
///   count; APNs ignores unknown headers, so their duplicates are ignored too.
/// - A missing `apns-push-type` is treated as `alert`. A missing `apns-priority` is the type's default, so a
///   background push without one passes; only an explicit 10 is refused.
/// - `apns-topic` is always required, as with token authentication.
/// - Header names are compared exactly: HTTP/2 requires them in lowercase and nghttp2 enforces it.
package struct APNsRequestValidator: Sendable {
    static let devicePathPrefix = Array("/3/device".utf8)

    package init() {}

    /// Nil when the request is one APNs would accept, otherwise its status and reason.
    package func validate(
        method: String, path: String, headers: [(name: String, value: String)], body: some Collection<UInt8>
    ) -> APNsRejection? {
        if case .failure(let rejection) = check(method: method, path: path, headers: headers, body: body) {
            return rejection
        }
        return nil
    }

    /// Validates the request and, when it passes, returns its parsed headers.
    package func check(
        method: String, path: String, headers: [(name: String, value: String)], body: some Collection<UInt8>
    ) -> Result<ValidatedDeviceRequest, APNsRejection> {
        guard method == "POST" else { return .failure(APNsRejection(.methodNotAllowed)) }
        let deviceToken: DeviceToken
        switch APNsRequestValidator.deviceToken(inPath: path) {
        case .success(let token): deviceToken = token
        case .failure(let rejection): return .failure(rejection)
        }

        let received: ReceivedHeaders
        switch ReceivedHeaders.collect(headers) {
        case .success(let collected): received = collected
        case .failure(let rejection): return .failure(rejection)
        }

        var pushType = PushType.alert
        if let value = received.pushType {
            guard let known = PushType(rawValue: value) else { return .failure(APNsRejection(.invalidPushType)) }
            pushType = known
        }
        guard let topic = received.topic, !topic.isEmpty else { return .failure(APNsRejection(.missingTopic)) }
        guard pushType.acceptsTopic(topic) else { return .failure(APNsRejection(.badTopic)) }

        var priority = pushType.defaultPriority
        if let value = received.priority {
            switch value {
            case "1": priority = 1
            case "5": priority = 5
            case "10": priority = 10
            default: return .failure(APNsRejection(.badPriority))
            }
            guard pushType.allowsPriority(priority) else { return .failure(APNsRejection(.badPriority)) }
        }
        var expiration: Int64?
        if let value = received.expiration {
            guard let parsed = ASCIIBytes.parseNonNegativeInt64(value.utf8) else {
                return .failure(APNsRejection(.badExpirationDate))
            }
            expiration = parsed
        }
        if let collapseID = received.collapseID, collapseID.utf8.count > NotificationHeaders.maximumCollapseIDBytes {
            return .failure(APNsRejection(.badCollapseId))
        }
        if let apnsID = received.apnsID, !APNsID.isValid(apnsID) {
            return .failure(APNsRejection(.badMessageId))
        }

        if let rejection = APNsRequestValidator.checkBody(body, pushType: pushType) {
            return .failure(rejection)
        }

        return .success(
            ValidatedDeviceRequest(
                deviceToken: deviceToken, pushType: pushType, topic: topic, priority: priority, expiration: expiration,
                collapseID: received.collapseID, apnsID: received.apnsID,
                bearerToken: received.authorization.flatMap(APNsRequestValidator.bearerToken(fromAuthorization:))))
    }

    /// The device token in a `/3/device/<token>` path, or the rejection APNs gives for the path.
    package static func deviceToken(inPath path: String) -> Result<DeviceToken, APNsRejection> {
        var path = path
        // One contiguous pass over the bytes: generic slices of String.UTF8View are several times slower.
        return path.withUTF8 { bytes -> Result<DeviceToken, APNsRejection> in
            guard bytes.starts(with: devicePathPrefix) else { return .failure(APNsRejection(.badPath)) }
            let afterPrefix = UnsafeBufferPointer(rebasing: bytes[devicePathPrefix.count...])
            if afterPrefix.isEmpty { return .failure(APNsRejection(.missingDeviceToken)) }
            guard afterPrefix.first == UInt8(ascii: "/") else { return .failure(APNsRejection(.badPath)) }
            let token = UnsafeBufferPointer(rebasing: afterPrefix[1...])
            if token.isEmpty { return .failure(APNsRejection(.missingDeviceToken)) }
            guard let deviceToken = DeviceToken(utf8: token) else { return .failure(APNsRejection(.badDeviceToken)) }
            return .success(deviceToken)
        }
    }

    /// The JWT of the first `authorization: bearer <jwt>` header; nil when there is none, the scheme is not `bearer`
    /// (compared without regard to case) or the credential is empty.
    package static func bearerToken(in headers: [(name: String, value: String)]) -> String? {
        for header in headers where header.name == APNsHeaderName.authorization {
            return bearerToken(fromAuthorization: header.value)
        }
        return nil
    }

    /// The JWT of an `authorization` header value of the form `bearer <jwt>`.
    package static func bearerToken(fromAuthorization value: String) -> String? {
        let bytes = value.utf8
        let scheme = "bearer".utf8
        guard bytes.count > scheme.count, ASCIIBytes.equalsIgnoringCase(bytes.prefix(scheme.count), scheme) else {
            return nil
        }
        let rest = bytes.dropFirst(scheme.count)
        guard rest.first == UInt8(ascii: " ") else { return nil }
        let credential = rest.drop { $0 == UInt8(ascii: " ") }
        guard !credential.isEmpty else { return nil }
        return String(Substring(credential))
    }

    /// The body rules: presence, size limit, then JSON structure and the Live Activity keys.
    static func checkBody(_ body: some Collection<UInt8>, pushType: PushType) -> APNsRejection? {
        let count = body.count
        if count == 0 { return APNsRejection(.payloadEmpty) }
        if count > pushType.payloadSizeLimit { return APNsRejection(.payloadTooLarge) }
        guard let shape = PayloadShape.inspect(body) else { return APNsRejection(.badPayload) }
        if pushType.requiresAPSDictionary, !shape.hasAPSObject { return APNsRejection(.badPayload) }
        if pushType == .liveactivity {
            switch shape.event {
            case .start, .update, .end: break
            case .missing, .notAString, .unknown: return APNsRejection(.badPayload)
            }
            guard shape.hasTimestamp, shape.timestampIsInteger else { return APNsRejection(.badPayload) }
            if shape.event != .start, shape.hasAttributesType || shape.hasAttributes {
                return APNsRejection(.badPayload)
            }
            if shape.hasInputPushToken, shape.hasInputPushChannel { return APNsRejection(.badPayload) }
        }
        return nil
    }
}
