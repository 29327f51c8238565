package import FanoutCore

/// Checks a device-push request the way APNs does and answers with APNs's status and reason (docs/reference/apns.md:
/// "Request headers", "Status codes and reasons", "Payload size limits", "Live Activity payloads"). mock-apns runs
/// it once per request; the JWT is checked separately, with crypto, by the mock.
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
/// - Of the Live Activity keys in docs/reference/apns.md, "Live Activity payloads", only the rules in the table are
///   enforced: `input-push-token` and `input-push-channel` are not refused on update/end, and `start` does not
///   demand `attributes`.
/// - Only duplicates of the headers APNs reads (pseudo-headers, `authorization` and the `apns-*` request headers)
///   count; APNs ignores unknown headers, so their duplicates are ignored too.
/// - A missing `apns-push-type` is treated as `alert`. A missing `apns-priority` is the type's default, so a
///   background push without one passes; only an explicit 10 is refused.
/// - `apns-topic` is always required, as with token authentication.
/// - Header names are compared exactly: HTTP/2 requires them in lowercase and nghttp2 enforces it.
package struct APNsRequestValidator: Sendable {
    static let devicePathPrefix = "/3/device"

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

    /// Validates the request and, when it passes, returns its parsed headers. The same check as `check(_:body:)`,
    /// over a head built from the strings.
    package func check(
        method: String, path: String, headers: [(name: String, value: String)], body: some Collection<UInt8>
    ) -> Result<ValidatedDeviceRequest, APNsRejection> {
        let head = HeaderView(method: method, path: path, headers: headers)
        let checked =
            body.withContiguousStorageIfAvailable { check(head, body: $0) }
            ?? Array(body).withUnsafeBufferPointer { check(head, body: $0) }
        return checked.map { $0.validated(in: head) }
    }

    /// Validates a request from its bytes (what mock-apns runs per request: no `String` per header) and, when it
    /// passes, returns where its fields sit in `head.bytes`.
    /// - Parameter shapes: a loop's cache of the last body's shape (the same payload goes to many tokens).
    package func check(
        _ head: HeaderView, body: UnsafeBufferPointer<UInt8>, shapes: PayloadShapeCache? = nil
    ) -> Result<CheckedDeviceRequest, APNsRejection> {
        head.bytes.withUnsafeBufferPointer { bytes in check(head, bytes: bytes, body: body, shapes: shapes) }
    }

    private func check(
        _ head: HeaderView, bytes: UnsafeBufferPointer<UInt8>, body: UnsafeBufferPointer<UInt8>,
        shapes: PayloadShapeCache?
    ) -> Result<CheckedDeviceRequest, APNsRejection> {
        func slice(_ range: Range<Int>) -> UnsafeBufferPointer<UInt8> { UnsafeBufferPointer(rebasing: bytes[range]) }
        guard slice(head.method).equals("POST") else { return .failure(APNsRejection(.methodNotAllowed)) }
        let token: Range<Int>
        switch APNsRequestValidator.deviceToken(inPath: slice(head.path)) {
        case .success(let range):
            token = range.lowerBound + head.path.lowerBound..<range.upperBound + head.path.lowerBound
        case .failure(let rejection): return .failure(rejection)
        }

        let received: ReceivedHeaders
        switch ReceivedHeaders.collect(head, bytes: bytes) {
        case .success(let collected): received = collected
        case .failure(let rejection): return .failure(rejection)
        }

        var pushType = PushType.alert
        if let value = received.pushType {
            guard let known = PushType(utf8: slice(value)) else {
                return .failure(APNsRejection(.invalidPushType))
            }
            pushType = known
        }
        guard let topic = received.topic, !topic.isEmpty else { return .failure(APNsRejection(.missingTopic)) }
        guard APNsRequestValidator.topic(slice(topic), fits: pushType) else {
            return .failure(APNsRejection(.badTopic))
        }

        var priority = pushType.defaultPriority
        if let value = received.priority {
            let text = slice(value)
            if text.equals("1") {
                priority = 1
            } else if text.equals("5") {
                priority = 5
            } else if text.equals("10") {
                priority = 10
            } else {
                return .failure(APNsRejection(.badPriority))
            }
            guard pushType.allowsPriority(priority) else { return .failure(APNsRejection(.badPriority)) }
        }
        var expiration: Int64?
        if let value = received.expiration {
            guard let parsed = ASCIIBytes.parseNonNegativeInt64(slice(value)) else {
                return .failure(APNsRejection(.badExpirationDate))
            }
            expiration = parsed
        }
        if let collapseID = received.collapseID, collapseID.count > NotificationHeaders.maximumCollapseIDBytes {
            return .failure(APNsRejection(.badCollapseId))
        }
        if let apnsID = received.apnsID, !APNsID.isValid(utf8: slice(apnsID)) {
            return .failure(APNsRejection(.badMessageId))
        }

        if let rejection = APNsRequestValidator.checkBody(body, pushType: pushType, shapes: shapes) {
            return .failure(rejection)
        }

        return .success(
            CheckedDeviceRequest(
                token: token, pushType: pushType, topic: topic, priority: priority, expiration: expiration,
                collapseID: received.collapseID, apnsID: received.apnsID, authorization: received.authorization))
    }

    /// Whether `topic` has the shape `pushType` needs (`PushType.acceptsTopic`, over bytes): not empty, and when the
    /// type needs a suffix, a non-empty bundle id before it.
    static func topic(_ topic: UnsafeBufferPointer<UInt8>, fits pushType: PushType) -> Bool {
        guard var suffix = pushType.requiredTopicSuffix else { return !topic.isEmpty }
        return suffix.withUTF8 { suffix in
            topic.count > suffix.count
                && UnsafeBufferPointer(rebasing: topic[(topic.count - suffix.count)...]).equals(suffix)
        }
    }

    /// The device token in a `/3/device/<token>` path, or the rejection APNs gives for the path.
    package static func deviceToken(inPath path: String) -> Result<DeviceToken, APNsRejection> {
        var path = path
        return path.withUTF8 { bytes in
            deviceToken(inPath: bytes).map { DeviceToken(utf8: UnsafeBufferPointer(rebasing: bytes[$0]))! }
        }
    }

    /// Where the device token sits in a `/3/device/<token>` path (valid, as sent, not lowercased), or the rejection
    /// APNs gives for the path.
    static func deviceToken(inPath bytes: UnsafeBufferPointer<UInt8>) -> Result<Range<Int>, APNsRejection> {
        let prefix = devicePathPrefix.utf8.count
        guard bytes.count >= prefix, UnsafeBufferPointer(rebasing: bytes[..<prefix]).equals(devicePathPrefix) else {
            return .failure(APNsRejection(.badPath))
        }
        if bytes.count == prefix { return .failure(APNsRejection(.missingDeviceToken)) }
        guard bytes[prefix] == UInt8(ascii: "/") else { return .failure(APNsRejection(.badPath)) }
        let token = prefix + 1..<bytes.count
        if token.isEmpty { return .failure(APNsRejection(.missingDeviceToken)) }
        guard DeviceToken.isValid(utf8: UnsafeBufferPointer(rebasing: bytes[token])) else {
            return .failure(APNsRejection(.badDeviceToken))
        }
        return .success(token)
    }

    /// The JWT of the first `authorization: bearer <jwt>` header; nil when there is none, the scheme is not `bearer`
    /// (compared without regard to case) or the credential is empty.
    package static func bearerToken(in headers: [(name: String, value: String)]) -> String? {
        for header in headers where header.name == APNsHeaderName.authorization {
            return bearerToken(fromAuthorization: header.value)
        }
        return nil
    }

    /// `bearerToken(in:)` over a request's head.
    package static func bearerToken(in head: HeaderView) -> String? {
        withAuthorization(in: head) { value in
            value.flatMap { bearerToken(fromAuthorization: String(decoding: $0, as: UTF8.self)) }
        }
    }

    /// The first `authorization` header's value, as sent; nil when there is none.
    package static func authorizationBytes(in head: HeaderView) -> [UInt8]? {
        withAuthorization(in: head) { $0.map(Array.init) }
    }

    /// Whether the first `authorization` header's value is `expected`, byte for byte (false when there is none).
    package static func authorization(in head: HeaderView, equals expected: [UInt8]) -> Bool {
        withAuthorization(in: head) { value in
            guard let value else { return false }
            return expected.withUnsafeBufferPointer { value.equals($0) }
        }
    }

    /// Calls `body` with the first `authorization` header's value (nil when there is none), lent from the head's
    /// bytes for the call only.
    private static func withAuthorization<Result>(
        in head: HeaderView, _ body: (UnsafeBufferPointer<UInt8>?) -> Result
    ) -> Result {
        head.bytes.withUnsafeBufferPointer { bytes in
            for field in head.fields
            where UnsafeBufferPointer(rebasing: bytes[field.name]).equals(APNsHeaderName.authorization) {
                return body(UnsafeBufferPointer(rebasing: bytes[field.value]))
            }
            return body(nil)
        }
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
    static func checkBody(
        _ body: UnsafeBufferPointer<UInt8>, pushType: PushType, shapes: PayloadShapeCache? = nil
    ) -> APNsRejection? {
        let count = body.count
        if count == 0 { return APNsRejection(.payloadEmpty) }
        if count > pushType.payloadSizeLimit { return APNsRejection(.payloadTooLarge) }
        let inspected = if let shapes { shapes.shape(of: body) } else { PayloadShape.inspect(body) }
        guard let shape = inspected else { return APNsRejection(.badPayload) }
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
