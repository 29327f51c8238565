package import FanoutCore

/// A job as one job line describes it: plain values, checked and ready to send. `FanoutJobFile` turns it into the
/// engine's `FanoutJob`; this module stays pure Swift (FanoutCore only), so the parser can be fuzzed on its own.
package struct ParsedJob: Sendable {
    /// A job's payload as a line gives it.
    package enum Payload: Sendable {
        /// `payload`: a complete APNs JSON object, sent as written.
        case raw([UInt8])
        /// `live_activity`: the typed fields of a Live Activity update.
        case liveActivity(LiveActivityContent)

        /// The JSON bytes, as the engine will encode them.
        package func encode() throws(PayloadError) -> [UInt8] {
            switch self {
            case .raw(let bytes): return bytes
            case .liveActivity(let content): return try content.encode()
            }
        }
    }

    /// Who a job goes to.
    package enum Recipients: Sendable, Equatable {
        /// `tokens`: validated lowercase hex tokens.
        case tokens([String])
        /// `tokens_file`: the path, resolved against the job file's directory, of a file that could be opened.
        case file(path: String)
        /// `activity_id`: every live update token of the activity, from the registry.
        case activity(app: String, id: String)
        /// `push_to_start`: the push-to-start tokens of the selected devices; `activityID` (the job's
        /// `activity_id`, if any) is written into the start payload's attributes.
        case pushToStart(app: String, attributesType: String?, selection: Selection, activityID: String?)
        /// `users` or `devices`: the selected devices' regular push tokens.
        case devices(app: String, selection: Selection)
        /// `channel_id`: one broadcast to the channel (`channel_storage_policy` 0 or 1 when known).
        case channel(app: String, id: String, storagePolicy: Int?)
    }

    /// Which devices of an app: by user id, by device id, or all of them.
    package enum Selection: Sendable, Equatable {
        case users([String])
        case devices([String])
        case all
    }

    package var id: String
    package var workspace: String
    package var headers: NotificationHeaders
    package var payload: Payload
    package var recipients: Recipients
    /// `push_to_start.activity_id_attribute`: the keys, from `attributes` down, under which a start that names its
    /// `activity_id` carries it (`["brazeActivityId"]`); nil: the engine's default (`activityId`).
    package var activityIDAttribute: [String]?

    package init(
        id: String, workspace: String, headers: NotificationHeaders, payload: Payload, recipients: Recipients
    ) {
        self.id = id
        self.workspace = workspace
        self.headers = headers
        self.payload = payload
        self.recipients = recipients
    }
}
