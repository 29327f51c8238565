import Fanout
import FanoutCore
import FanoutJobFormat
import Foundation

/// The typed fields of a Live Activity push that every API flavour gathers, in the job-line spelling.
struct LiveActivityFields {
    var event: String
    var timestamp: Int64
    var contentState: JSONValue?
    var staleDate: Int64?
    var dismissalDate: Int64?
    var relevanceScore: Double?
    /// `{"title": …, "body": …, "sound": …}` (job-line alert keys).
    var alert: JSONValue?
    var attributesType: String?
    var attributes: JSONValue?

    var jobLineObject: JSONValue {
        var members: [JSONObject.Member] = [
            .init(key: "event", value: .string(event)), .init(key: "timestamp", value: .integer(timestamp)),
        ]
        func add(_ key: String, _ value: JSONValue?) {
            if let value { members.append(.init(key: key, value: value)) }
        }
        add("content_state", contentState)
        add("stale_date", staleDate.map(JSONValue.integer))
        add("dismissal_date", dismissalDate.map(JSONValue.integer))
        add("relevance_score", relevanceScore.flatMap(JSONValue.double))
        add("alert", alert)
        add("attributes_type", attributesType.map(JSONValue.string))
        add("attributes", attributes)
        return .object(JSONObject(members))
    }
}

/// Which devices of an app a dispatch selects.
enum DeviceSelection {
    case users([String])
    case devices([String])
    case all

    var jobLineMember: JSONObject.Member {
        switch self {
        case .users(let users): return .init(key: "users", value: .array(users.map(JSONValue.string)))
        case .devices(let devices): return .init(key: "devices", value: .array(devices.map(JSONValue.string)))
        case .all: return .init(key: "all", value: .bool(true))
        }
    }
}

/// Who a dispatch goes to.
enum DispatchAudience {
    /// Every live update token of the activity (update, end).
    case activity(String)
    /// Push-to-start tokens of the selected devices; the new activity is registered under `activityID`, which the
    /// engine writes into the attributes where the SDK of the API that took the start reads it (`attribute`).
    case pushToStart(
        activityID: String, attributesType: String?, selection: DeviceSelection, attribute: ActivityIDAttribute)
    /// The selected devices' regular push tokens.
    case devices(DeviceSelection)
    /// Hex tokens given by the caller.
    case tokens([String])
    /// A start of `activityID` sent to hex tokens given by the caller. The job line names only the tokens (a line
    /// names its recipients one way, and `activity_id` beside `tokens` would be a second), so the activity is the
    /// spec's: its timestamp follows the activity's last one and its dispatch runs in the activity's order. (A
    /// dispatch resumed after a restart finds its activity in its line, so this one then runs in no order.)
    case startTokens(activityID: String, tokens: [String])
}

/// An accepted API call, as the job line the dispatcher runs: the same format and parser as `fanout send`'s job
/// files, so a dispatch can be replayed, inspected and resumed like a job.
struct DispatchSpec {
    var app: AppConfiguration
    /// `start`, `update`, `end` or `push`.
    var kind: String
    var members: [JSONObject.Member]
    /// The activity a Live Activity dispatch updates, ends or starts.
    var activityID: String?
    /// The caller gave the content's `timestamp`; otherwise `ServiceCore.accept` assigns one.
    var timestampGiven = false
    /// How the request that asked for it spells the line's fields, for refusals.
    var fieldNames: RequestFieldNames

    /// The job's id inside the line; the dispatcher replaces it with the dispatch id when it runs the line.
    static let placeholderID = "dispatch"

    static func liveActivity(
        app: AppConfiguration, fields: LiveActivityFields, priority: Int, audience: DispatchAudience,
        fieldNames: RequestFieldNames
    ) -> DispatchSpec {
        var members: [JSONObject.Member] = [
            .init(key: "id", value: .string(placeholderID)), .init(key: "workspace", value: .string(app.workspace)),
            .init(key: "topic", value: .string(PushType.liveactivity.topic(forBundleID: app.bundleID))),
            .init(key: "push_type", value: "liveactivity"),
            .init(key: "priority", value: .integer(Int64(priority))),
            .init(key: "live_activity", value: fields.jobLineObject),
        ]
        members += audienceMembers(audience, app: app)
        var activityID: String?
        switch audience {
        case .activity(let id): activityID = id
        case .pushToStart(let id, _, _, _): activityID = id
        case .startTokens(let id, _): activityID = id
        case .devices, .tokens: activityID = nil
        }
        return DispatchSpec(
            app: app, kind: fields.event, members: members, activityID: activityID, fieldNames: fieldNames)
    }

    static func push(
        app: AppConfiguration, pushType: String, payload: JSONValue, priority: Int, collapseID: String?,
        audience: DispatchAudience, fieldNames: RequestFieldNames
    ) -> DispatchSpec {
        var members: [JSONObject.Member] = [
            .init(key: "id", value: .string(placeholderID)), .init(key: "workspace", value: .string(app.workspace)),
            .init(key: "topic", value: .string(pushType == "voip" ? app.bundleID + ".voip" : app.bundleID)),
            .init(key: "push_type", value: .string(pushType)),
            .init(key: "priority", value: .integer(Int64(priority))), .init(key: "payload", value: payload),
        ]
        if let collapseID { members.append(.init(key: "collapse_id", value: .string(collapseID))) }
        members += audienceMembers(audience, app: app)
        return DispatchSpec(app: app, kind: "push", members: members, fieldNames: fieldNames)
    }

    private static func audienceMembers(_ audience: DispatchAudience, app: AppConfiguration) -> [JSONObject.Member] {
        let appMember = JSONObject.Member(key: "app", value: .string(app.bundleID))
        switch audience {
        case .activity(let id):
            return [appMember, .init(key: "activity_id", value: .string(id))]
        case .pushToStart(let activityID, let attributesType, let selection, let attribute):
            var selector: [JSONObject.Member] = [selection.jobLineMember]
            if let attributesType { selector.append(.init(key: "attributes_type", value: .string(attributesType))) }
            selector.append(
                .init(key: "activity_id_attribute", value: .array(attribute.path.map(JSONValue.string))))
            return [
                appMember, .init(key: "activity_id", value: .string(activityID)),
                .init(key: "push_to_start", value: .object(JSONObject(selector))),
            ]
        case .devices(let selection):
            switch selection {
            case .users, .devices: return [appMember, selection.jobLineMember]
            case .all: return [appMember, .init(key: "devices", value: .array([]))]
            }
        case .tokens(let tokens), .startTokens(_, let tokens):
            return [.init(key: "tokens", value: .array(tokens.map(JSONValue.string)))]
        }
    }

    /// Replaces the `live_activity.timestamp`.
    mutating func setTimestamp(_ timestamp: Int64) {
        guard let index = members.firstIndex(where: { $0.key == "live_activity" }) else { return }
        members[index].value = members[index].value.setting(.integer(timestamp), at: ["timestamp"])
    }

    /// The job line's bytes.
    var jobLine: [UInt8] { JSONValue.object(JSONObject(members)).encoded() }

    /// The checks `ServiceCore.accept` makes, before the content timestamp is assigned (with `now` standing in for
    /// an activity's timestamp not given yet), so that a request of several dispatches can refuse a bad one before
    /// it accepts any. `accept` checks again with the timestamp it assigns.
    func check(now: Int64) throws(APIError) {
        var stamped = self
        if activityID != nil && !timestampGiven { stamped.setTimestamp(now) }
        try stamped.validate(now: now)
    }

    /// Checks the line with the job-file parser, so a dispatch that is accepted can run; the refusal names the
    /// request's field at fault (`fieldNames`).
    func validate(now: Int64) throws(APIError) {
        switch JobLineParser().parse(line: jobLine, lineNumber: 1, jobFileDirectory: "", now: now) {
        case .success: return
        case .failure(let error):
            let named = fieldNames.rename(field: error.field, message: error.message)
            throw APIError(400, field: named.field, named.message)
        }
    }
}

extension JSONValue {
    /// Sets `value` at a key path inside an object (creating objects on the way), as the SDKs read their activity
    /// id from the push-to-start attributes (`pushwoosh.activityId`, `brazeActivityId`).
    func setting(_ value: JSONValue, at path: ArraySlice<String>) -> JSONValue {
        guard let key = path.first else { return value }
        var members = objectValue.map { Array($0) } ?? []
        if let index = members.firstIndex(where: { $0.key == key }) {
            members[index].value = members[index].value.setting(value, at: path.dropFirst())
        } else {
            members.append(.init(key: key, value: JSONValue.null.setting(value, at: path.dropFirst())))
        }
        return .object(JSONObject(members))
    }
}
