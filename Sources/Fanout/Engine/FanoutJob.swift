import FanoutCore

/// One update for many devices: the headers and payload every recipient shares, and the recipients.
public struct FanoutJob: Sendable {
    public var id: String
    public var workspace: String
    /// Push type, topic, priority, expiration and collapse id, shared by every token. `apnsID` and
    /// `bearerToken` are ignored: each notification gets its own id, the engine adds the token.
    public var headers: NotificationHeaders
    /// The encoded JSON payload, shared read-only by every stream of the job.
    public var payload: [UInt8]
    public var recipients: Recipients

    public init(
        id: String, workspace: String = "default", headers: NotificationHeaders, payload: [UInt8],
        recipients: Recipients
    ) {
        self.id = id
        self.workspace = workspace
        self.headers = headers
        self.payload = payload
        self.recipients = recipients
    }
}

/// Who a job goes to. A file is streamed, never loaded whole, so a job may name millions of tokens.
public enum Recipients: Sendable {
    /// Hex tokens given inline.
    case tokens([String])
    /// A file of hex tokens, one per line (blank lines skipped).
    case file(path: String)
}
