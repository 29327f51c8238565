public import FanoutCore

/// One notification for one device: its headers and its JSON payload.
public struct PushNotification: Sendable {
    /// Hex device token.
    public var deviceToken: String
    public var headers: NotificationHeaders
    /// The payload: one JSON object, sent as given. Anything else (empty, not JSON, an array) is refused by `send`
    /// with `.invalidNotification`, and nothing is sent.
    public var payload: [UInt8]
    /// The workspace whose budget it draws on, when the engine has budgets (`configuration.rateLimits`).
    public var workspace = "default"

    public init(deviceToken: String, headers: NotificationHeaders, payload: [UInt8]) {
        self.deviceToken = deviceToken
        self.headers = headers
        self.payload = payload
    }
}
