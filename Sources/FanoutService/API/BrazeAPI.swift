import Fanout
import FanoutCore

/// Braze's Live Activity endpoints, `POST /messages/live_activity/start` and `/update`
/// (docs/reference/braze-pushwoosh.md, "Braze"), so that a backend calling Braze moves over by changing the base URL.
/// Server key as `Authorization: Bearer`.
/// Success is `201 {"message": "success"}` (plus the `dispatch_id`); a bad body is `400 {"error": "..."}` as
/// these endpoints document it; the other refusals use Braze's `{"message": "..."}` envelope.
struct BrazeAPI {
    let core: ServiceCore

    /// Braze's cap on `external_user_ids` plus `user_aliases` per request.
    static let maximumUsers = 50

    func handle(_ request: APIRequest, endpoint: String) async -> APIResponse {
        guard endpoint == "start" || endpoint == "update" else {
            return .json(404, ["message": "Not Found"])
        }
        guard request.method == "POST" else { return .json(405, ["message": "Method Not Allowed"]) }
        let caller: Caller
        do throws(APIError) {
            caller = try core.authenticate(key: NativeAPI.bearer(request), needs: .server)
        } catch {
            return .json(error.status, ["message": .string(error.status == 401 ? "Invalid API key" : "Access Denied")])
        }
        let (headers, refused) = await core.admit(caller, budget: .api)
        var response: APIResponse
        if refused != nil {
            response = .json(429, ["message": "Rate Limited"])
        } else {
            do throws(APIError) {
                let body = try RequestBody.parse(request.body)
                let spec = endpoint == "start" ? try startSpec(body, caller) : try updateSpec(body, caller)
                let record = try await core.accept(
                    spec, caller: caller, idempotency: request.idempotencyKey)
                response = .json(201, ["message": "success", "dispatch_id": .string(record.id)])
            } catch {
                response =
                    error.status == 400
                    ? .json(400, ["error": .string(error.message)])
                    : .json(error.status, ["message": .string(error.message)])
            }
        }
        response.headers += headers
        return response
    }

    private func app(_ body: RequestBody, _ caller: Caller) throws(APIError) -> AppConfiguration {
        let appID = try body.requiredString("app_id")
        guard let app = core.app(where: { $0.brazeAppID == appID }, of: caller) else {
            throw APIError(400, field: "app_id", "unknown app_id \(quoted(appID))")
        }
        return app
    }

    /// The `apple_push` object's parts a Live Activity uses: the alert, the priority and the relevance score.
    private struct ApplePush {
        var alert: JSONValue?
        var priority = 10
        var relevanceScore: Double?

        init(_ body: RequestBody?, alertRequired: Bool) throws(APIError) {
            guard let body else {
                if alertRequired {
                    throw APIError(
                        400, field: "notification", "notification is required, with alert.title and alert.body")
                }
                return
            }
            switch body.value("alert") {
            case nil:
                if alertRequired {
                    throw APIError(400, field: "notification.alert", "notification.alert needs a title and a body")
                }
            case .string(let text)?:
                if alertRequired {
                    throw APIError(400, field: "notification.alert", "notification.alert needs a title and a body")
                }
                alert = ["body": .string(text)]
            case .object(let object)?:
                let fields = RequestBody(object: object, path: "notification.alert")
                let title = try fields.string("title")
                let text = try fields.string("body")
                if alertRequired && (title ?? "").isEmpty || alertRequired && (text ?? "").isEmpty {
                    throw APIError(400, field: "notification.alert", "notification.alert needs a title and a body")
                }
                var members: [JSONObject.Member] = []
                if let title { members.append(.init(key: "title", value: .string(title))) }
                if let text { members.append(.init(key: "body", value: .string(text))) }
                if let sound = fields.value("sound") ?? body.value("sound") {
                    members.append(.init(key: "sound", value: sound))
                }
                alert = .object(JSONObject(members))
            default:
                throw APIError(400, field: "notification.alert", "notification.alert must be a string or an object")
            }
            if let value = try body.integer("apns_priority") {
                guard (1...10).contains(value) else {
                    throw APIError(
                        400, field: "notification.apns_priority", "notification.apns_priority must be 1 to 10")
                }
                priority = value >= 10 ? 10 : 5
            } else if body.value("content-available") != nil {
                priority = 5
            }
            relevanceScore = try body.number("relevance_score")
        }
    }

    private func startSpec(_ body: RequestBody, _ caller: Caller) throws(APIError) -> DispatchSpec {
        let app = try app(body, caller)
        for key in ["user_aliases", "segment_id", "custom_audience"] where body.value(key) != nil {
            throw APIError(400, field: key, "\(key) is not supported: Fanout targets external_user_ids")
        }
        guard let users = try body.identifiers("external_user_ids"), !users.isEmpty else {
            throw APIError(400, field: "external_user_ids", "No Recipients: external_user_ids is required")
        }
        guard users.count <= Self.maximumUsers else {
            throw APIError(
                400, field: "external_user_ids",
                "The max number of external_ids and aliases per request was exceeded (\(Self.maximumUsers))")
        }
        let activityID = try body.requiredIdentifier("activity_id")
        let attributesType = try body.requiredIdentifier("activity_attributes_type")
        guard let attributes = try body.object("activity_attributes") else {
            throw APIError(400, field: "activity_attributes", "activity_attributes is required (an object)")
        }
        guard let contentState = body.value("content_state") else {
            throw APIError(400, field: "content_state", "content_state is required")
        }
        let push = try ApplePush(try body.object("notification"), alertRequired: true)
        // Older revisions of the start documented a `dismissal_date`. APNs reads one on `end` only, so it is not sent,
        // but it is checked as every date is: an impossible one is refused, not ignored.
        _ = try body.date("dismissal_date")
        let fields = LiveActivityFields(
            event: "start", timestamp: ServiceCore.nowSeconds(), contentState: contentState,
            staleDate: try body.date("stale_date"), relevanceScore: push.relevanceScore, alert: push.alert,
            attributesType: attributesType,
            attributes: JSONValue.object(attributes.object)
                .setting(.string(activityID), at: ActivityIDAttribute.braze.path[...]))
        return .liveActivity(
            app: app, fields: fields, priority: push.priority,
            audience: .pushToStart(
                activityID: activityID, attributesType: attributesType, selection: .users(users), attribute: .braze),
            fieldNames: .braze)
    }

    private func updateSpec(_ body: RequestBody, _ caller: Caller) throws(APIError) -> DispatchSpec {
        let app = try app(body, caller)
        let activityID = try body.requiredIdentifier("activity_id")
        guard let contentState = body.value("content_state") else {
            throw APIError(400, field: "content_state", "content_state is required")
        }
        let end = try body.bool("end_activity") ?? false
        let push = try ApplePush(try body.object("notification"), alertRequired: false)
        // Checked either way; without end_activity Braze's dismissal_date changes nothing APNs sees (an update
        // carries none).
        let dismissalDate = try body.date("dismissal_date")
        let fields = LiveActivityFields(
            event: end ? "end" : "update", timestamp: ServiceCore.nowSeconds(), contentState: contentState,
            staleDate: try body.date("stale_date"), dismissalDate: end ? dismissalDate : nil,
            relevanceScore: push.relevanceScore, alert: push.alert)
        return .liveActivity(
            app: app, fields: fields, priority: push.priority, audience: .activity(activityID), fieldNames: .braze)
    }
}
