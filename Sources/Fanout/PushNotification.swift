public import FanoutCore

/// One notification for one device: its headers and its JSON payload.
public struct PushNotification: Sendable {
    /// Hex device token.
    public var deviceToken: String
    public var headers: NotificationHeaders
    /// The JSON payload, sent as given.
    public var payload: [UInt8]

    public init(deviceToken: String, headers: NotificationHeaders, payload: [UInt8]) {
        self.deviceToken = deviceToken
        self.headers = headers
        self.payload = payload
    }
}
