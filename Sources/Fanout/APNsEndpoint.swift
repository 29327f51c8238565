/// Where notifications go: Apple's production or sandbox host, or any other (mock-apns).
public struct APNsEndpoint: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// `api.push.apple.com:443`.
    public static let production = APNsEndpoint(host: "api.push.apple.com", port: 443)
    /// `api.sandbox.push.apple.com:443`.
    public static let sandbox = APNsEndpoint(host: "api.sandbox.push.apple.com", port: 443)

    /// The `:authority` value: the host, with the port when it is not 443.
    public var authority: String {
        let shownHost = host.contains(":") ? "[\(host)]" : host
        return port == 443 ? shownHost : "\(shownHost):\(port)"
    }

    public var description: String { authority }

    /// The APNs environment of Apple's hosts, push and channel management alike: `production` or `development`
    /// (the sandbox); nil for any other host.
    package var apnsEnvironment: String? {
        switch host {
        case "api.push.apple.com", "api-manage-broadcast.push.apple.com": "production"
        case "api.sandbox.push.apple.com", "api-manage-broadcast.sandbox.push.apple.com": "development"
        default: nil
        }
    }
}
