import Fanout
import FanoutJobFormat

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
        }
        self.init(
            id: parsed.id, workspace: parsed.workspace, headers: parsed.headers, payload: payload,
            recipients: recipients)
    }
}
