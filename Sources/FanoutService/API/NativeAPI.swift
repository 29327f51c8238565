import Fanout
import FanoutCore
import FanoutRegistry

/// The native API under `/v1/` (README: "HTTP API"). Device endpoints take a device or server key, the others a
/// server key, as `Authorization: Bearer <key>`. Errors: `{"error": "...", "field": "..."}`.
struct NativeAPI {
    let core: ServiceCore

    func handle(_ request: APIRequest, segments: [String]) async -> APIResponse {
        do throws(APIError) {
            let route = try Route(request.method, segments)
            let caller = try core.authenticate(
                key: Self.bearer(request), needs: route.isDeviceRoute ? .device : .server)
            let (headers, refused) = await core.admit(caller, budget: route.isDeviceRoute ? .devices : .api)
            var response: APIResponse
            if refused != nil {
                response = Self.error(APIError(429, "rate limited: this workspace's request budget is spent"))
            } else {
                do throws(APIError) {
                    response = try await serve(route, request, caller)
                } catch {
                    response = Self.error(error)
                }
            }
            response.headers += headers
            return response
        } catch {
            return Self.error(error)
        }
    }

    static func bearer(_ request: APIRequest) -> String? {
        guard let value = request.header("authorization") else { return nil }
        // The scheme is case-insensitive (RFC 9110 section 11.1).
        let lowered = value.lowercased()
        for scheme in ["bearer ", "token "] where value.count > scheme.count && lowered.hasPrefix(scheme) {
            return String(value.dropFirst(scheme.count)).trimmingCharacters(in: .whitespaces)
        }
        return nil
    }

    static func error(_ error: APIError) -> APIResponse {
        var members: [JSONObject.Member] = [.init(key: "error", value: .string(error.message))]
        if let field = error.field { members.append(.init(key: "field", value: .string(field))) }
        return .json(error.status, .object(JSONObject(members)))
    }

    /// The endpoints, by method and path.
    enum Route {
        case registerDevice
        case registerUpdateToken(activity: String)
        case stopUpdateToken(activity: String)
        case registerPushToStart
        case liveActivity(activity: String, event: String)
        case push
        case dispatch(String)
        case dispatchResults(String)
        case activity(String)
        case createChannel(activity: String)
        case deleteChannel(activity: String)
        case status

        init(_ method: String, _ segments: [String]) throws(APIError) {
            switch (method, segments.dropFirst().first, segments.count) {
            case ("POST", "devices", 2): self = .registerDevice
            case ("POST", "push-to-start-tokens", 2): self = .registerPushToStart
            case ("POST", "push", 2): self = .push
            case ("GET", "status", 2): self = .status
            case ("GET", "dispatches", 3): self = .dispatch(segments[2])
            case ("GET", "dispatches", 4) where segments[3] == "results": self = .dispatchResults(segments[2])
            case ("GET", "activities", 3): self = .activity(segments[2])
            case ("POST", "activities", 4) where segments[3] == "tokens":
                self = .registerUpdateToken(activity: segments[2])
            case ("DELETE", "activities", 4) where segments[3] == "tokens":
                self = .stopUpdateToken(activity: segments[2])
            case ("POST", "activities", 4) where segments[3] == "channel":
                self = .createChannel(activity: segments[2])
            case ("DELETE", "activities", 4) where segments[3] == "channel":
                self = .deleteChannel(activity: segments[2])
            case ("POST", "activities", 4) where ["start", "update", "end"].contains(segments[3]):
                self = .liveActivity(activity: segments[2], event: segments[3])
            default: throw APIError(404, "no such endpoint: \(method) /\(segments.joined(separator: "/"))")
            }
            // The id in the path, as the body's ids are checked.
            if segments.count > 2 {
                try APIIdentifier.check(
                    segments[2], field: segments[1] == "dispatches" ? "dispatch_id" : "activity_id")
            }
        }

        var isDeviceRoute: Bool {
            switch self {
            case .registerDevice, .registerUpdateToken, .stopUpdateToken, .registerPushToStart: return true
            default: return false
            }
        }
    }

    private func serve(_ route: Route, _ request: APIRequest, _ caller: Caller) async throws(APIError) -> APIResponse {
        switch route {
        case .registerDevice:
            let body = try RequestBody.parse(request.body)
            try body.rejectUnknown(["app", "device_id", "user_id", "push_token"])
            let app = try core.app(try body.string("app"), of: caller)
            let registration = DeviceRegistration(
                app: app.bundleID, deviceID: try body.requiredIdentifier("device_id"),
                userID: try body.identifier("user_id"), pushToken: try body.string("push_token"))
            return Self.applied(try await core.register([.device(registration)], fields: .nativeRegistration))
        case .registerUpdateToken(let activity):
            let body = try RequestBody.parse(request.body)
            try body.rejectUnknown(["app", "token", "device_id", "user_id"])
            let app = try core.app(try body.string("app"), of: caller)
            let token = try body.string("token") ?? ""
            let change: RegistryChange =
                token.isEmpty
                ? .stopUpdateTokens(
                    app: app.bundleID, activityID: activity,
                    deviceID: try Self.stoppedDevice(try body.identifier("device_id"), caller))
                : .updateToken(
                    UpdateTokenRegistration(
                        app: app.bundleID, activityID: activity, deviceID: try body.identifier("device_id"),
                        userID: try body.identifier("user_id"), token: token))
            return Self.applied(try await core.register([change], fields: .nativeRegistration))
        case .stopUpdateToken(let activity):
            let body = request.body.isEmpty ? RequestBody(object: JSONObject()) : try RequestBody.parse(request.body)
            try body.rejectUnknown(["app", "device_id"])
            let app = try core.app(try body.string("app") ?? request.query["app"], of: caller)
            let queryDevice = request.query["device_id"]
            if let queryDevice { try APIIdentifier.check(queryDevice, field: "device_id") }
            let device = try Self.stoppedDevice(try body.identifier("device_id") ?? queryDevice, caller)
            return Self.applied(
                try await core.register(
                    [.stopUpdateTokens(app: app.bundleID, activityID: activity, deviceID: device)],
                    fields: .nativeRegistration))
        case .registerPushToStart:
            let body = try RequestBody.parse(request.body)
            try body.rejectUnknown(["app", "device_id", "user_id", "attributes_type", "token"])
            let app = try core.app(try body.string("app"), of: caller)
            let registration = PushToStartRegistration(
                app: app.bundleID, deviceID: try body.requiredIdentifier("device_id"),
                userID: try body.identifier("user_id"), attributesType: try body.identifier("attributes_type"),
                token: try body.requiredString("token"))
            return Self.applied(try await core.register([.pushToStartToken(registration)], fields: .nativeRegistration))
        case .liveActivity(let activity, let event):
            let body = try RequestBody.parse(request.body)
            let spec = try liveActivitySpec(body, activity: activity, event: event, caller: caller)
            return Self.accepted(
                try await core.accept(spec, caller: caller, idempotency: request.idempotencyKey))
        case .push:
            let body = try RequestBody.parse(request.body)
            let spec = try pushSpec(body, caller: caller)
            return Self.accepted(
                try await core.accept(spec, caller: caller, idempotency: request.idempotencyKey))
        case .dispatch(let id):
            return .json(200, try await core.dispatch(id, of: caller).json)
        case .dispatchResults(let id):
            return try await results(id, request, caller)
        case .activity(let id):
            return try await activity(id, app: request.query["app"], caller)
        case .status:
            return .json(200, await StatusReport.make(core, workspace: caller.workspace))
        case .createChannel(let activity):
            return try await createChannel(activity, request, caller)
        case .deleteChannel(let activity):
            return try await deleteChannel(activity, request, caller)
        }
    }

    /// The device a stop is for. The device key ships inside the app, so with it a stop must name its device;
    /// stopping every device's tokens of an activity (nil) takes a server key.
    static func stoppedDevice(_ device: String?, _ caller: Caller) throws(APIError) -> String? {
        if device == nil && caller.kind == .device {
            throw APIError(400, field: "device_id", "device_id is required with a device key")
        }
        return device
    }

    static func applied(_ result: RegistryApplyResult) -> APIResponse {
        .json(
            200,
            [
                "status": "ok", "added": .integer(Int64(result.added)), "rotated": .integer(Int64(result.rotated)),
                "removed": .integer(Int64(result.removed)), "unchanged": .integer(Int64(result.unchanged)),
            ])
    }

    static func accepted(_ record: DispatchRecord) -> APIResponse {
        var response = APIResponse.json(
            202,
            [
                "dispatch_id": .string(record.id), "state": .string(record.state.rawValue),
                "url": .string("/v1/dispatches/\(record.id)"),
            ])
        response.headers.append(("location", "/v1/dispatches/\(record.id)"))
        return response
    }

    // MARK: Live Activities

    private func liveActivitySpec(_ body: RequestBody, activity: String, event: String, caller: Caller)
        throws(APIError) -> DispatchSpec
    {
        var known: Set<String> = [
            "app", "content_state", "stale_date", "relevance_score", "alert", "priority", "timestamp",
        ]
        known.formUnion(event == "start" ? ["attributes_type", "attributes", "audience"] : ["dismissal_date"])
        try body.rejectUnknown(known)
        let app = try core.app(try body.string("app"), of: caller)
        var fields = LiveActivityFields(
            event: event, timestamp: try body.integer("timestamp") ?? ServiceCore.nowSeconds(),
            contentState: body.value("content_state"), staleDate: try body.date("stale_date"),
            dismissalDate: event == "start" ? nil : try body.date("dismissal_date"),
            relevanceScore: try body.number("relevance_score"), alert: body.value("alert"))
        let priority = Int(try body.integer("priority") ?? 10)
        guard event == "start" else {
            var spec = DispatchSpec.liveActivity(
                app: app, fields: fields, priority: priority, audience: .activity(activity),
                fieldNames: .nativeLiveActivity)
            spec.timestampGiven = body.value("timestamp") != nil
            return spec
        }
        let attributesType = try body.requiredIdentifier("attributes_type")
        fields.attributesType = attributesType
        fields.attributes = JSONValue.object(try body.object("attributes")?.object ?? JSONObject())
            .setting(.string(activity), at: ActivityIDAttribute.fanout.path[...])
        let audience = try self.audience(try body.object("audience"), field: "audience")
        let dispatchAudience: DispatchAudience
        switch audience {
        case .tokens(let tokens): dispatchAudience = .startTokens(activityID: activity, tokens: tokens)
        case .selection(let selection):
            dispatchAudience = .pushToStart(
                activityID: activity, attributesType: attributesType, selection: selection, attribute: .fanout)
        }
        var spec = DispatchSpec.liveActivity(
            app: app, fields: fields, priority: priority, audience: dispatchAudience, fieldNames: .nativeLiveActivity)
        spec.timestampGiven = body.value("timestamp") != nil
        return spec
    }

    enum Audience {
        case selection(DeviceSelection)
        case tokens([String])
    }

    /// `{"users": [...]}`, `{"devices": [...]}`, `{"tokens": [...]}` or `{"all": true}` (the default when absent).
    private func audience(_ body: RequestBody?, field: String, allowAll: Bool = true) throws(APIError) -> Audience {
        guard let body else {
            guard allowAll else { throw APIError(400, field: field, "\(field) is required (users, devices or tokens)") }
            return .selection(.all)
        }
        try body.rejectUnknown(allowAll ? ["users", "devices", "tokens", "all"] : ["users", "devices", "tokens"])
        var ways: [Audience] = []
        if let users = try body.identifiers("users") { ways.append(.selection(.users(users))) }
        if let devices = try body.identifiers("devices") { ways.append(.selection(.devices(devices))) }
        if let tokens = try body.strings("tokens") { ways.append(.tokens(tokens)) }
        if try body.bool("all") == true { ways.append(.selection(.all)) }
        guard ways.count == 1 else {
            throw APIError(
                400, field: field, "\(field) needs exactly one of users, devices, tokens\(allowAll ? " or all" : "")")
        }
        return ways[0]
    }

    // MARK: Regular pushes

    /// The push types APNs delivers to an app's regular device token (the one `registerForRemoteNotifications`
    /// gives and the registry keeps per device).
    private static let regularTokenPushTypes: Set<String> = ["alert", "background"]

    private func pushSpec(_ body: RequestBody, caller: Caller) throws(APIError) -> DispatchSpec {
        try body.rejectUnknown(["app", "push_type", "payload", "alert", "priority", "collapse_id", "audience"])
        let app = try core.app(try body.string("app"), of: caller)
        let pushType = try body.string("push_type") ?? "alert"
        let payload: JSONValue
        switch (body.value("payload"), try body.object("alert")) {
        case (let raw?, nil): payload = raw
        case (nil, let alert?): payload = ["aps": ["alert": .object(alert.object)]]
        default: throw APIError(400, field: "payload", "give exactly one of payload (an APNs JSON object) or alert")
        }
        let priority = Int(try body.integer("priority") ?? (pushType == "background" ? 5 : 10))
        let audience: DispatchAudience
        switch try self.audience(try body.object("audience"), field: "audience", allowAll: false) {
        case .tokens(let tokens): audience = .tokens(tokens)
        case .selection(let selection):
            // Users and devices reach the devices' regular push tokens, the only kind the registry holds. Another
            // push type (voip, location, ...) goes to a token of its own: APNs would answer each one
            // DeviceTokenNotForTopic, and that answer removes the regular token from the registry.
            guard Self.regularTokenPushTypes.contains(pushType) else {
                throw APIError(
                    400, field: "push_type",
                    "push_type \(quoted(pushType)) is not sent to a device's regular push token, the token that "
                        + "audience users and devices reach (alert or background); send it to its own tokens with "
                        + "audience.tokens")
            }
            audience = .devices(selection)
        }
        return .push(
            app: app, pushType: pushType, payload: payload, priority: priority,
            collapseID: try body.identifier("collapse_id"), audience: audience, fieldNames: .nativePush)
    }

    // MARK: Reads

    private func results(_ id: String, _ request: APIRequest, _ caller: Caller) async throws(APIError) -> APIResponse {
        let after = Int(request.query["after"] ?? "") ?? Int.min
        // Pages of at most 100,000 lines (about 20 MB), 10,000 by default: a response is held whole in memory.
        let limit = min(max(Int(request.query["limit"] ?? "") ?? 10_000, 1), 100_000)
        func localResults() throws(APIError) -> (lines: [UInt8], last: Int)? {
            do {
                return try core.store.results(id: id, workspace: caller.workspace, after: after, limit: limit)
            } catch {
                throw core.unavailable("the dispatch store", error)
            }
        }
        var page: (lines: [UInt8], last: Int)?
        let local: DispatchRecord?
        do {
            local = try core.store.dispatch(id: id, workspace: caller.workspace)
        } catch {
            throw core.unavailable("the dispatch store", error)
        }
        if let local, core.isCurrent(local) {
            page = try localResults()
        } else if let shared = core.sharedDispatches {
            // Another instance's dispatch (or one this instance's copy stopped short of): its published results.
            do {
                page = try await shared.results(id: id, workspace: caller.workspace, after: after, limit: limit)
            } catch {
                throw APIError(503, "the shared dispatch results cannot be read now; retry later")
            }
        }
        // Nothing published: the copy this instance has, however far it got.
        if page == nil, local != nil { page = try localResults() }
        guard let page else { throw APIError.notFound }
        return APIResponse(
            status: 200,
            headers: [("content-type", "application/x-ndjson"), ("x-fanout-last-position", String(page.last))],
            body: page.lines)
    }

    // MARK: Broadcast channels

    /// `POST /v1/activities/{id}/channel` `{"storage_policy": 0|1}`: a broadcast channel for the activity, created at
    /// APNs and bound in the registry (201), or the one already bound (200). Updates and ends by activity id then
    /// send one broadcast to it besides the token pushes, and starts subscribe to it.
    private func createChannel(_ activity: String, _ request: APIRequest, _ caller: Caller) async throws(APIError)
        -> APIResponse
    {
        let body = request.body.isEmpty ? RequestBody(object: JSONObject()) : try RequestBody.parse(request.body)
        try body.rejectUnknown(["app", "storage_policy"])
        let app = try core.app(try body.string("app"), of: caller)
        let policyValue = try body.integer("storage_policy") ?? 1
        guard let policy = ChannelStoragePolicy(rawValue: Int(policyValue)) else {
            throw APIError(400, field: "storage_policy", "storage_policy must be 0 (nothing stored) or 1")
        }
        guard let client = core.channels.client(forApp: app.bundleID) else {
            throw APIError(
                409, field: "app", "app \(quoted(app.bundleID)) has no channel management host (manage_endpoint)")
        }
        /// The activity's channel as the registry has it, and its policy when it was bound with one (null: unknown).
        func bound(_ status: Int) async -> APIResponse? {
            guard let record = try? await core.registry.activity(app: app.bundleID, activityID: activity),
                let channel = record.channelID
            else { return nil }
            return .json(
                status,
                [
                    "activity_id": .string(activity), "channel_id": .string(channel),
                    "storage_policy": record.channelStoragePolicy.map { .integer(Int64($0)) } ?? .null,
                ])
        }
        do {
            _ = try await client.createChannel(
                forActivity: activity, app: app.bundleID, storagePolicy: policy, registry: core.registry)
        } catch {
            // Bound already (or by a request that came in meanwhile): that channel, as if it had come first.
            if error.reason == BroadcastChannelClient.alreadyBound, let answer = await bound(200) { return answer }
            throw APIError(error.status == nil ? 503 : 502, "APNs refused the channel: \(error.message)")
        }
        // Ours, or the channel of a request whose binding came first (createChannel then deleted ours).
        if let answer = await bound(201) { return answer }
        throw APIError(503, "the channel binding could not be read back; retry later")
    }

    /// `DELETE /v1/activities/{id}/channel`: deletes the activity's channel at APNs and unbinds it.
    private func deleteChannel(_ activity: String, _ request: APIRequest, _ caller: Caller) async throws(APIError)
        -> APIResponse
    {
        let app = try core.app(request.query["app"], of: caller)
        guard let client = core.channels.client(forApp: app.bundleID),
            (try? await core.registry.activity(app: app.bundleID, activityID: activity)?.channelID) != nil
        else { throw APIError.notFound }
        // Gone at APNs already counts as deleted; one created in another environment than the app's management
        // host is left bound (this host would only say it does not exist).
        let deleted: String
        do {
            deleted = try await client.deleteChannel(forActivity: activity, app: app.bundleID, registry: core.registry)
        } catch  where error.reason == BroadcastChannelClient.otherEnvironment {
            throw APIError(409, "\(error.message)")
        } catch  where error.status == nil && error.reason == nil {
            core.logger.error("channel not deleted", fields: ["error": error.message])
            throw APIError(503, "the channel cannot be deleted now; retry later")
        } catch {
            throw APIError(502, "APNs refused: \(error.message)")
        }
        return .json(200, ["activity_id": .string(activity), "deleted": .string(deleted)])
    }

    private func activity(_ id: String, app bundleID: String?, _ caller: Caller) async throws(APIError) -> APIResponse {
        let app = try core.app(bundleID, of: caller)
        let record: ActivityRecord?
        var live = 0
        do {
            record = try await core.registry.activity(app: app.bundleID, activityID: id)
            live = try await core.registry.liveUpdateTokenCount(
                app: app.bundleID, activityID: id, now: core.registry.clock.now())
        } catch {
            throw core.unavailable("the registry", error)
        }
        guard let record else { throw APIError.notFound }
        var members: [JSONObject.Member] = [
            .init(key: "activity_id", value: .string(id)), .init(key: "app", value: .string(app.bundleID)),
            .init(key: "state", value: .string(record.state.rawValue)),
            .init(key: "live_tokens", value: .integer(Int64(live))),
        ]
        if let type = record.attributesType { members.append(.init(key: "attributes_type", value: .string(type))) }
        if let channel = record.channelID { members.append(.init(key: "channel_id", value: .string(channel))) }
        return .json(200, .object(JSONObject(members)))
    }
}

extension DispatchRecord {
    /// `GET /v1/dispatches/{id}` (docs/SERVE.md): the summary's counts (docs/SEND.md), the state and the timing.
    var json: JSONValue {
        let counts = self.counts
        var members: [JSONObject.Member] = [
            .init(key: "id", value: .string(id)), .init(key: "state", value: .string(state.rawValue)),
            .init(key: "app", value: .string(app)), .init(key: "kind", value: .string(kind)),
            .init(key: "notifications", value: .integer(Int64(notifications))),
        ]
        for (name, value) in [
            ("delivered", counts.delivered), ("rejected", counts.rejected), ("unregistered", counts.unregistered),
            ("failed", counts.failed), ("expired", counts.expired), ("rate_limited", counts.rateLimited),
            ("invalid", counts.invalid), ("cancelled", counts.cancelled), ("superseded", counts.superseded),
            ("retries", counts.retries), ("payload_encodings", payloadEncodings), ("demoted", demoted),
            ("broadcasts", broadcasts),
        ] {
            members.append(.init(key: name, value: .integer(Int64(value))))
        }
        func time(_ key: String, _ milliseconds: Int64?) {
            members.append(.init(key: key, value: milliseconds.map { .integer($0) } ?? .null))
        }
        time("created_at_ms", createdAt)
        time("started_at_ms", startedAt)
        time("finished_at_ms", finishedAt)
        let end = finishedAt ?? ServiceCore.nowMilliseconds()
        let seconds = startedAt.map { Double(max(0, end - $0)) / 1000 } ?? 0
        members.append(.init(key: "seconds", value: JSONValue.double(seconds) ?? .null))
        let rate = seconds > 0 ? Double(notifications) / seconds : 0
        members.append(.init(key: "rate", value: JSONValue.double(rate.rounded()) ?? .null))
        return .object(JSONObject(members))
    }
}
