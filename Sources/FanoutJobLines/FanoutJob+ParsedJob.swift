package import Fanout
package import FanoutJobFormat

extension FanoutJob {
    /// The engine's job for a parsed job line.
    package init(_ parsed: ParsedJob) {
        let payload: JobPayload
        switch parsed.payload {
        case .raw(let bytes): payload = .raw(bytes)
        case .liveActivity(let content): payload = .liveActivity(content)
        }
        let recipients: Recipients
        switch parsed.recipients {
        case .tokens(let tokens): recipients = .tokens(tokens)
        case .file(let path): recipients = .file(path: path)
        case .activity(let app, let id): recipients = .activity(app: app, id: id)
        case .pushToStart(let app, let attributesType, let selection, let activityID):
            recipients = .pushToStart(
                app: app, attributesType: attributesType, selection: RecipientSelection(selection),
                activityID: activityID)
        case .devices(let app, let selection): recipients = .devices(app: app, selection: RecipientSelection(selection))
        case .channel(let app, let id, let policy):
            recipients = .channel(app: app, id: id, storagePolicy: policy.flatMap(ChannelStoragePolicy.init(rawValue:)))
        }
        self.init(
            id: parsed.id, workspace: parsed.workspace, headers: parsed.headers, payload: payload,
            recipients: recipients)
        // The parser refused an empty path or key (`push_to_start.activity_id_attribute`), so this is never nil for one.
        activityIDAttribute = parsed.activityIDAttribute.flatMap { ActivityIDAttribute(path: $0) }
    }
}

extension RecipientSelection {
    init(_ selection: ParsedJob.Selection) {
        switch selection {
        case .users(let users): self = .users(users)
        case .devices(let devices): self = .devices(devices)
        case .all: self = .all
        }
    }
}
