/// What a sender should do about a failed notification, derived from APNs's status and reason
/// (the "Class" and "Action" columns of docs/reference/apns.md, "Status codes and reasons").
///
/// A struct over an internal enum so that a class can be added without breaking callers' `switch`es.
public struct ReasonClass: Hashable, Sendable, CustomStringConvertible {
    enum Kind: String, Sendable {
        case permanent, configuration, transient, providerTokenRefresh, providerTokenThrottled
    }

    let kind: Kind

    private init(_ kind: Kind) {
        self.kind = kind
    }

    /// The token is dead for this topic: drop it and never resend (`BadDeviceToken`, `DeviceTokenNotForTopic`,
    /// `Unregistered`, `ExpiredToken`, and any other 410).
    public static let permanent = ReasonClass(.permanent)

    /// The request or the sender's configuration is wrong: resending it unchanged gets the same answer, so report it
    /// and do not retry (bad headers, credentials, paths, payload too large, and unknown 4xx reasons).
    public static let configuration = ReasonClass(.configuration)

    /// APNs or the connection had a passing problem: resend with backoff, on a new connection where
    /// `APNsReason.requiresNewConnection` says so (`TooManyRequests`, `IdleTimeout`, 5xx).
    public static let transient = ReasonClass(.transient)

    /// The JWT or the key no longer fits this connection (`ExpiredProviderToken`, `UnrelatedKeyIdInToken`): mint or
    /// pick the right token, open a new connection, then resend. Apple's table calls these "TRANSIENT (self-heal)";
    /// they get their own class because the remedy is a credential step, not a plain backoff.
    public static let providerTokenRefresh = ReasonClass(.providerTokenRefresh)

    /// `TooManyProviderTokenUpdates`: the sender changed its JWT too often. The notification itself was fine, so it is
    /// retried later, but with the token already cached, and never by minting another one (which makes it worse).
    /// Apple's table lists this as "FIX-CONFIG / TRANSIENT"; its own class lets the engine both retry and alert.
    public static let providerTokenThrottled = ReasonClass(.providerTokenThrottled)

    public var description: String { kind.rawValue }

    /// Whether the same notification may be sent again (after the class's remedy).
    public var isRetryable: Bool {
        switch kind {
        case .permanent, .configuration: return false
        case .transient, .providerTokenRefresh, .providerTokenThrottled: return true
        }
    }

    /// The class of an error response: a known reason's own class, otherwise by status (410 permanent, 429 and 5xx
    /// transient, any other status configuration), so that a reason Apple adds later is still handled sensibly.
    public init(status: Int, reason: APNsReason?) {
        if let known = reason?.reasonClass {
            self = known
        } else {
            self = ReasonClass.forStatus(status)
        }
    }

    /// The fallback used for unknown reasons.
    static func forStatus(_ status: Int) -> ReasonClass {
        switch status {
        case 410: return .permanent
        case 429, 500...599: return .transient
        default: return .configuration
        }
    }
}
