import Fanout
import FanoutCore
import FanoutRegistry

/// Pushwoosh's JSON API under `/json/1.3/<method>` (docs/reference/braze-pushwoosh.md, "Pushwoosh"), so that an app on
/// the Pushwoosh SDK and a backend calling Pushwoosh move over by changing the base URL.
///
/// Every answer is a JSON object with `status_code` (the SDK resets its base URL when it is missing), and never a
/// `base_url` (which would move the SDK for good). Success is HTTP 200 with `status_code` 200; a bad argument is
/// HTTP 200 with `status_code` 210 and the reason in `status_message`. Server methods take the server key in the
/// body's `auth`; the SDK's device methods send `Authorization: Token <device key>`.
struct PushwooshAPI {
    let core: ServiceCore

    static let serverMethods: Set<String> = ["startLiveActivity", "updateLiveActivity"]
    static let deviceMethods: Set<String> = [
        "registerDevice", "unregisterDevice", "setActivityToken", "setActivityPushToStartToken",
    ]
    /// Pushwoosh's documented cap on a start's `users`, and on its `devices`, per notification.
    static let maximumAudience = 1000

    func handle(_ request: APIRequest, method: String) async -> APIResponse {
        guard request.method == "POST" else {
            return Self.answer(http: 405, code: 405, message: "use POST")
        }
        let envelope: RequestBody
        do throws(APIError) {
            envelope = try RequestBody.parse(request.body)
        } catch {
            // An argument error like any other (HTTP 200, status_code 210), so the SDK reports it and keeps its base URL.
            return Self.argumentError(error)
        }
        let isServer = Self.serverMethods.contains(method)
        let body: RequestBody
        let caller: Caller
        do throws(APIError) {
            guard let inner = try envelope.object("request") else {
                throw APIError(400, field: "request", "the body must be {\"request\": {...}}")
            }
            // Its fields are named as the SDK and the docs spell them (`hwid`, `notifications[0]...`), without
            // the envelope.
            body = RequestBody(object: inner.object)
            let key = isServer ? try body.string("auth") : NativeAPI.bearer(request) ?? (try? body.string("auth"))
            caller = try core.authenticate(key: key, needs: isServer ? .server : .device)
        } catch {
            if error.status == 401 || error.status == 403 {
                return Self.answer(http: error.status, code: error.status, message: error.message)
            }
            return Self.argumentError(error)
        }
        let (headers, refused) = await core.admit(caller, budget: isServer ? .api : .devices)
        var response: APIResponse
        if refused != nil {
            response = Self.answer(
                http: 429, code: 429, message: "rate limited: this workspace's request budget is spent")
        } else {
            do throws(APIError) {
                response = try await serve(method, body, caller, idempotency: request.idempotencyKey)
            } catch {
                response =
                    error.status >= 500
                    ? Self.answer(http: error.status, code: 500, message: error.message)
                    : Self.argumentError(error)
            }
        }
        response.headers += headers
        return response
    }

    static func answer(http: Int, code: Int, message: String, response: JSONValue = .null) -> APIResponse {
        .json(
            http,
            ["status_code": .integer(Int64(code)), "status_message": .string(message), "response": response])
    }

    static func ok(_ response: JSONValue = .null) -> APIResponse {
        answer(http: 200, code: 200, message: "OK", response: response)
    }

    static func argumentError(_ error: APIError) -> APIResponse {
        answer(http: 200, code: 210, message: "Argument error: \(error.message)")
    }

    private func serve(_ method: String, _ body: RequestBody, _ caller: Caller, idempotency: IdempotencyKey?)
        async throws(APIError) -> APIResponse
    {
        switch method {
        case "startLiveActivity", "updateLiveActivity":
            let app = try application(body, caller)
            guard let notifications = body.value("notifications")?.arrayValue, !notifications.isEmpty else {
                throw APIError(400, field: "notifications", "notifications is required (a non-empty array)")
            }
            // Check every entry (its fields, then what `accept` checks: the payload's size and the rest) before
            // accepting any, so a bad one leaves nothing half done: Pushwoosh's clients send no Idempotency-Key,
            // and a request resent after a refusal must not start an activity twice.
            var specs: [DispatchSpec] = []
            let now = ServiceCore.nowSeconds()
            for (index, element) in notifications.enumerated() {
                let field = "notifications[\(index)]"
                guard let object = element.objectValue else {
                    throw APIError(400, field: field, "\(field) must be an object")
                }
                let entry = RequestBody(object: object, path: field)
                let spec =
                    method == "startLiveActivity"
                    ? try await startSpec(entry, app: app) : try updateSpec(entry, app: app)
                do throws(APIError) {
                    try spec.check(now: now)
                } catch {
                    // The job-line checks name a field of the entry already (`RequestFieldNames.pushwoosh`).
                    if let named = error.field, named.hasPrefix(field) { throw error }
                    throw APIError(error.status, field: field, "\(field): \(error.message)")
                }
                specs.append(spec)
            }
            var messages: [JSONValue] = []
            for (index, spec) in specs.enumerated() {
                let key = idempotency.map { specs.count == 1 ? $0 : $0.numbered(index) }
                do throws(APIError) {
                    messages.append(.string(try await core.accept(spec, caller: caller, idempotency: key).id))
                } catch {
                    guard !messages.isEmpty else { throw error }
                    // The entries before it are committed and will be sent: say so, with their ids, so that a
                    // retry resends only the rest.
                    let server = error.status >= 500
                    return Self.answer(
                        http: server ? error.status : 200, code: server ? 500 : 210,
                        message: "notifications[\(index)]: \(error.message); the \(messages.count) before it were "
                            + "accepted and will be sent (their ids are in response.Messages): resend the request "
                            + "from notifications[\(index)] on, or, with an Idempotency-Key, the whole request with "
                            + "the same key (the accepted entries are then answered, not sent again)",
                        response: ["Messages": .array(messages)])
                }
            }
            return Self.ok(["Messages": .array(messages)])
        case "registerDevice":
            let app = try application(body, caller)
            let registration = DeviceRegistration(
                app: app.bundleID, deviceID: try body.requiredIdentifier("hwid"),
                userID: try body.identifier("userId"), pushToken: try body.string("push_token"))
            _ = try await core.register([.device(registration)], fields: .pushwooshRegistration)
            return Self.ok()
        case "unregisterDevice":
            let app = try application(body, caller)
            // An empty token removes the device's push token (nil would leave it as it is).
            let registration = DeviceRegistration(
                app: app.bundleID, deviceID: try body.requiredIdentifier("hwid"),
                userID: try body.identifier("userId"), pushToken: "")
            _ = try await core.register([.device(registration)], fields: .pushwooshRegistration)
            return Self.ok()
        case "setActivityToken":
            let app = try application(body, caller)
            let activityID = try body.identifier("activity_id") ?? ""
            let token = try body.string("activity_token") ?? ""
            // The device key ships inside the app: with it, a stop names its device (it cannot stop everyone's).
            let device = try body.requiredIdentifier("hwid")
            if token.isEmpty {
                // The SDK's stop: an empty or missing token. Without an activity id it stops the device's tokens
                // of every activity it has; with one, just that activity's.
                guard !activityID.isEmpty else {
                    _ = try await core.register(
                        try await stopAll(app: app.bundleID, device: device), fields: .pushwooshRegistration)
                    return Self.ok()
                }
                _ = try await core.register(
                    [
                        .stopUpdateTokens(app: app.bundleID, activityID: activityID, deviceID: device)
                    ], fields: .pushwooshRegistration)
                return Self.ok()
            }
            guard !activityID.isEmpty else {
                throw APIError(400, field: "activity_id", "activity_id is required with an activity_token")
            }
            _ = try await core.register(
                [
                    .updateToken(
                        UpdateTokenRegistration(
                            app: app.bundleID, activityID: activityID, deviceID: device,
                            userID: try body.identifier("userId"),
                            token: token))
                ], fields: .pushwooshRegistration)
            return Self.ok()
        case "setActivityPushToStartToken":
            let app = try application(body, caller)
            let registration = PushToStartRegistration(
                app: app.bundleID, deviceID: try body.requiredIdentifier("hwid"),
                userID: try body.identifier("userId"), attributesType: nil,
                token: try body.requiredString("activity_push_to_start_token"))
            _ = try await core.register([.pushToStartToken(registration)], fields: .pushwooshRegistration)
            return Self.ok()
        default:
            // Any other SDK method (setTags, applicationOpen, pushStat, ...): answered, not acted on.
            return Self.ok()
        }
    }

    /// The app whose `pushwoosh_application` code is `application`, in the caller's workspace.
    private func application(_ body: RequestBody, _ caller: Caller) throws(APIError) -> AppConfiguration {
        let code = try body.requiredString("application")
        guard let app = core.app(where: { $0.pushwooshApplication == code }, of: caller) else {
            throw APIError(400, field: "application", "unknown application \(quoted(code))")
        }
        return app
    }

    /// Stop changes for every activity the device holds a live token of.
    private func stopAll(app: String, device: String) async throws(APIError) -> [RegistryChange] {
        var changes: [RegistryChange] = []
        var cursor: RegistryCursor?
        do {
            repeat {
                let page = try await core.registry.updateTokens(
                    app: app, deviceID: device, after: cursor, limit: 1000, now: core.registry.clock.now())
                for record in page.items where !changes.contains(where: { Self.activity(of: $0) == record.activityID })
                {
                    changes.append(.stopUpdateTokens(app: app, activityID: record.activityID, deviceID: device))
                }
                cursor = page.next
            } while cursor != nil
        } catch {
            throw core.unavailable("the registry", error)
        }
        return changes
    }

    private static func activity(of change: RegistryChange) -> String? {
        if case .stopUpdateTokens(_, let activityID, _) = change { return activityID }
        return nil
    }

    // MARK: Live Activities

    /// A `startLiveActivity` entry: `live_activity` {`content-state`, `attributes-type`, `attributes`},
    /// `live_activity_id`, and the audience: `devices` (the devices' push tokens, or HWIDs), `users`, or neither
    /// (every push-to-start token of the app). `filter`/`filter_code` (Pushwoosh segments) are not supported.
    private func startSpec(_ entry: RequestBody, app: AppConfiguration) async throws(APIError) -> DispatchSpec {
        try rejectFilters(entry)
        let activityID = try entry.requiredIdentifier("live_activity_id")
        let live = try entry.requiredObject("live_activity")
        if let event = try live.string("event"), event != "start" {
            throw APIError(400, field: live.field("event"), "\(live.field("event")) must be \"start\" here")
        }
        guard let contentState = live.value("content-state") else {
            throw APIError(400, field: live.field("content-state"), "\(live.field("content-state")) is required")
        }
        let attributesType = try live.requiredIdentifier("attributes-type")
        let attributes = JSONValue.object(try live.object("attributes")?.object ?? JSONObject())
            .setting(.string(activityID), at: ActivityIDAttribute.pushwoosh.path[...])
        var alert: JSONValue?
        var title = try entry.string("title")
        if title == nil { title = try live.string("title") }
        if let title {
            let content = try entry.string("content") ?? ""
            alert = ["title": .string(title), "body": .string(content)]
        }
        // No Pushwoosh source lists a start's `dismissal-date`; APNs reads one on `end` only, so it is not sent, but
        // it is checked as every date is: an impossible one is refused, not ignored.
        _ = try live.date("dismissal-date")
        let fields = LiveActivityFields(
            event: "start", timestamp: ServiceCore.nowSeconds(), contentState: contentState,
            staleDate: try live.date("stale-date"), relevanceScore: try live.number("relevance-score"), alert: alert,
            attributesType: attributesType, attributes: attributes)
        let audience: DispatchAudience
        if let users = try Self.capped(try entry.identifiers("users"), field: entry.field("users")) {
            // Old docs: users win over devices.
            audience = .pushToStart(
                activityID: activityID, attributesType: attributesType, selection: .users(users), attribute: .pushwoosh)
        } else if let devices = try Self.capped(try entry.identifiers("devices"), field: entry.field("devices")) {
            audience = try await devicesAudience(
                devices, app: app.bundleID, activityID: activityID, type: attributesType)
        } else {
            audience = .pushToStart(
                activityID: activityID, attributesType: attributesType, selection: .all, attribute: .pushwoosh)
        }
        return .liveActivity(
            app: app, fields: fields, priority: 10, audience: audience, fieldNames: .pushwoosh(entry: entry.path))
    }

    /// `users` or `devices` within Pushwoosh's cap (`maximumAudience`).
    private static func capped(_ entries: [String]?, field: String) throws(APIError) -> [String]? {
        guard let entries, entries.count > maximumAudience else { return entries }
        throw APIError(
            400, field: field,
            "\(field) has \(entries.count) entries; Pushwoosh takes at most \(maximumAudience) per notification "
                + "(send more in several notifications)")
    }

    /// `devices` names devices, each by its push token (Pushwoosh's `devices`: the devices' tokens) or by its HWID
    /// (the older docs allow both): an entry that is the push token of one of the app's devices (as `registerDevice`
    /// recorded it) stands for that device, any other for the device of that HWID. The start goes to those devices'
    /// push-to-start tokens, never to the push tokens themselves: APNs starts a Live Activity remotely only through a
    /// push-to-start token.
    func devicesAudience(_ devices: [String], app: String, activityID: String, type: String)
        async throws(APIError) -> DispatchAudience
    {
        let tokens = devices.filter { DeviceToken($0) != nil }
        var byToken: [String: String] = [:]
        if !tokens.isEmpty {
            do {
                for record in try await core.registry.devices(app: app, pushTokens: tokens) {
                    if let token = record.pushToken { byToken[token] = record.deviceID }
                }
            } catch {
                throw core.unavailable("the registry", error)
            }
        }
        var seen = Set<String>()
        let ids = devices.map { byToken[$0.lowercased()] ?? $0 }.filter { seen.insert($0).inserted }
        return .pushToStart(
            activityID: activityID, attributesType: type, selection: .devices(ids), attribute: .pushwoosh)
    }

    /// An `updateLiveActivity` entry: `live_activity` {`event`: update|end, `content-state`, `dismissal-date`,
    /// `stale-date`, `relevance-score`} and `live_activity_id`.
    private func updateSpec(_ entry: RequestBody, app: AppConfiguration) throws(APIError) -> DispatchSpec {
        try rejectFilters(entry)
        let activityID = try entry.requiredIdentifier("live_activity_id")
        let live = try entry.requiredObject("live_activity")
        let event = try live.requiredString("event")
        guard event == "update" || event == "end" else {
            throw APIError(400, field: live.field("event"), "\(live.field("event")) must be \"update\" or \"end\"")
        }
        let contentState = live.value("content-state")
        if event == "update" && contentState == nil {
            throw APIError(
                400, field: live.field("content-state"), "\(live.field("content-state")) is required for update")
        }
        let fields = LiveActivityFields(
            event: event, timestamp: ServiceCore.nowSeconds(),
            contentState: contentState, staleDate: try live.date("stale-date"),
            dismissalDate: try live.date("dismissal-date"), relevanceScore: try live.number("relevance-score"))
        return .liveActivity(
            app: app, fields: fields, priority: 10, audience: .activity(activityID),
            fieldNames: .pushwoosh(entry: entry.path))
    }

    private func rejectFilters(_ entry: RequestBody) throws(APIError) {
        for key in ["filter", "filter_code"] where entry.value(key) != nil {
            throw APIError(
                400, field: entry.field(key),
                "\(entry.field(key)) is not supported: Fanout has no segments; name devices or users")
        }
    }
}
