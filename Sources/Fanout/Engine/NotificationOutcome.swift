/// How one notification ended: exactly one per (job, token).
public struct NotificationOutcome: Hashable, Sendable, CustomStringConvertible {
    /// Which outcome, as a small number: comparing, hashing and copying an outcome (several times per
    /// notification, in the engine's counts and results) then touches no String.
    private let code: UInt8

    /// The outcome's name in results (`"delivered"`, `"rate_limited"`, ...).
    public var name: String {
        switch code {
        case 0: "delivered"
        case 1: "rejected"
        case 2: "unregistered"
        case 3: "failed"
        case 4: "expired"
        case 5: "rate_limited"
        case 6: "invalid"
        case 7: "cancelled"
        default: "superseded"
        }
    }
    public var description: String { name }

    /// APNs accepted it (200).
    public static var delivered: NotificationOutcome { NotificationOutcome(code: 0) }
    /// APNs refused it for good (a request or configuration error); do not resend unchanged.
    public static var rejected: NotificationOutcome { NotificationOutcome(code: 1) }
    /// The token should be dropped: 410, BadDeviceToken or DeviceTokenNotForTopic from APNs, or a token Fanout found
    /// malformed (BadDeviceToken, never sent).
    public static var unregistered: NotificationOutcome { NotificationOutcome(code: 2) }
    /// Transient errors until the retry budget ran out, or never sent (shutdown).
    public static var failed: NotificationOutcome { NotificationOutcome(code: 3) }
    /// Its `apns-expiration` passed before delivery.
    public static var expired: NotificationOutcome { NotificationOutcome(code: 4) }
    /// Refused by the workspace's rate budget.
    public static var rateLimited: NotificationOutcome { NotificationOutcome(code: 5) }
    /// The job failed validation (one per job, no token).
    public static var invalid: NotificationOutcome { NotificationOutcome(code: 6) }
    /// The caller cancelled before an answer came: not sent, or its stream was reset (CANCEL). A
    /// notification whose stream was open may still have reached the device.
    public static var cancelled: NotificationOutcome { NotificationOutcome(code: 7) }
    /// A newer update (greater `timestamp`) for the same activity replaced it before it was sent.
    public static var superseded: NotificationOutcome { NotificationOutcome(code: 8) }

    /// In code order (a stored outcome is its index here: `DispatchSchema`).
    public static let all: [NotificationOutcome] = [
        delivered, rejected, unregistered, failed, expired, rateLimited, invalid, cancelled, superseded,
    ]

    /// Every outcome, for an exhaustive `switch` (`switch result.outcome.kind { ... }`). The results file and the
    /// APIs name them as `name` does: `delivered`, `rejected`, `unregistered`, `failed`, `expired`,
    /// `rate_limited`, `invalid`, `cancelled`, `superseded`.
    public enum Kind: Sendable, Hashable, CaseIterable {
        case delivered, rejected, unregistered, failed, expired, rateLimited, invalid, cancelled, superseded
    }

    /// Which outcome this is, to switch over.
    public var kind: Kind {
        switch code {
        case 0: .delivered
        case 1: .rejected
        case 2: .unregistered
        case 3: .failed
        case 4: .expired
        case 5: .rateLimited
        case 6: .invalid
        case 7: .cancelled
        default: .superseded
        }
    }

    /// The outcome a results line names (`"rate_limited"`, ...); an unknown name reads as `invalid`.
    public init(named name: String) {
        self = NotificationOutcome.all.first { $0.name == name } ?? .invalid
    }

    private init(code: UInt8) {
        self.code = code
    }
}

/// The result of one notification, as the results file records it.
public struct NotificationResult: Sendable {
    public var jobID: String
    /// Hex device token; nil for a job-level `invalid` result.
    public var token: String? {
        get { tokenValue?.string }
        set { tokenValue = newValue.map(RecipientToken.init) }
    }
    /// The token as the engine keeps it: 64 lowercase hex digits as 32 bytes, spelled only when read as a String
    /// above or written by a results writer (`ResultLine`), as the ids below are.
    package var tokenValue: RecipientToken?
    public var outcome: NotificationOutcome
    /// The last HTTP status from APNs, if any answer came.
    public var status: Int?
    /// APNs's reason, or Fanout's own for results without an answer (e.g. "NotSent").
    public var reason: String?
    public var apnsID: String? {
        get { apnsIDValue?.string }
        set { apnsIDValue = newValue.map(APNsIdentifier.init) }
    }
    public var apnsUniqueID: String? {
        get { apnsUniqueIDValue?.string }
        set { apnsUniqueIDValue = newValue.map(APNsIdentifier.init) }
    }
    /// The same ids as the engine keeps them: a UUID as 16 bytes, spelled only when read as a String above or
    /// written by a results writer (`ResultLine`), so that results nobody prints make no String for them.
    package var apnsIDValue: APNsIdentifier?
    package var apnsUniqueIDValue: APNsIdentifier?
    /// Attempts that reached APNs or may have (refused and unprocessed streams do not count).
    public var attempts: Int
    /// From the first send to the final answer, on the loop's high-resolution clock (read once per batch of
    /// answers, so its resolution is a loop turn: microseconds on a busy loop). Zero for a result never sent.
    public var latency: Duration {
        get { .nanoseconds(latencyNanoseconds) }
        set {
            let (seconds, attoseconds) = newValue.components
            latencyNanoseconds = seconds * 1_000_000_000 + attoseconds / 1_000_000_000
        }
    }
    /// `latency` in milliseconds, as the results file's `latency_ms` gives it.
    public var latencyMilliseconds: Double { Double(latencyNanoseconds) / 1_000_000 }
    package var latencyNanoseconds: Int64 = 0
    /// The 410 body's `timestamp` (milliseconds since the epoch).
    public var timestamp: Int64?
    /// For `rate_limited`: seconds until the workspace budget would admit it.
    public var retryAfterSeconds: Double?
    /// The recipient's position in its job (0-based, in recipient order); -1 for job-level results.
    public var position: Int = -1
    /// A broadcast's channel id (its `token` is nil).
    public var channel: String?

    public init(
        jobID: String, token: String?, outcome: NotificationOutcome, status: Int? = nil, reason: String? = nil,
        apnsID: String? = nil, apnsUniqueID: String? = nil, attempts: Int = 0, latency: Duration = .zero,
        timestamp: Int64? = nil, retryAfterSeconds: Double? = nil
    ) {
        self.jobID = jobID
        tokenValue = token.map(RecipientToken.init)
        self.outcome = outcome
        self.status = status
        self.reason = reason
        apnsIDValue = apnsID.map(APNsIdentifier.init)
        apnsUniqueIDValue = apnsUniqueID.map(APNsIdentifier.init)
        self.attempts = attempts
        self.timestamp = timestamp
        self.retryAfterSeconds = retryAfterSeconds
        self.latency = latency
    }
}

extension NotificationResult {
    /// Every field as the engine has it, in one expression.
    package init(
        jobID: String, tokenValue: RecipientToken?, outcome: NotificationOutcome, status: Int?, reason: String?,
        apnsIDValue: APNsIdentifier?, apnsUniqueIDValue: APNsIdentifier?, attempts: Int, latencyNanoseconds: Int64,
        timestamp: Int64?, position: Int, channel: String?
    ) {
        self.jobID = jobID
        self.tokenValue = tokenValue
        self.outcome = outcome
        self.status = status
        self.reason = reason
        self.apnsIDValue = apnsIDValue
        self.apnsUniqueIDValue = apnsUniqueIDValue
        self.attempts = attempts
        self.latencyNanoseconds = latencyNanoseconds
        self.timestamp = timestamp
        self.position = position
        self.channel = channel
    }
}

/// What a caller should do about a result: the outcome and APNs's reason, read together.
public enum NotificationAction: Sendable, Hashable, CaseIterable {
    /// Nothing: delivered, or ended by the caller's own choice (cancelled, superseded, expired as asked).
    case none
    /// Drop the token: APNs (410, BadDeviceToken, DeviceTokenNotForTopic) or Fanout found it dead or malformed.
    case dropToken
    /// Send it again later: a passing failure (5xx, APNs's 429 `TooManyRequests`, a timeout or deadline, a lost
    /// connection) or the workspace's own budget (`rate_limited`, see `retryAfterSeconds`).
    case retryLater
    /// Fix the notification: its headers or payload were refused (`BadTopic`, `PayloadTooLarge`, an `invalid` job).
    case fixRequest
    /// Fix the sender's credentials or environment: the provider token, key, team or certificate was refused.
    case fixCredentials
}

extension NotificationResult {
    /// APNs's reason as the typed `APNsReason` (an unknown one keeps its text); nil when APNs gave none (Fanout's own
    /// reasons: `NotSent`, `Cancelled`, `DeadlineExceeded`, ...).
    public var apnsReason: APNsReason? {
        guard status != nil, let reason else { return nil }
        return APNsReason(reason)
    }

    /// The recipient's position in its job (0-based, in recipient order); nil for a job-level result.
    public var recipientIndex: Int? { position >= 0 ? position : nil }

    /// What to do about this result.
    public var action: NotificationAction {
        switch outcome.kind {
        case .delivered, .cancelled, .superseded, .expired: return .none
        case .unregistered: return .dropToken
        case .failed, .rateLimited: return .retryLater
        case .invalid: return .fixRequest
        case .rejected:
            guard let reason = apnsReason else { return .fixRequest }
            if Self.credentialReasons.contains(reason) || status == 403 { return .fixCredentials }
            return .fixRequest
        }
    }

    /// Refusals that name the sender's credentials or environment rather than the notification.
    private static let credentialReasons: Set<APNsReason> = [
        .badCertificate, .badCertificateEnvironment, .expiredProviderToken, .forbidden, .invalidProviderToken,
        .missingProviderToken, .unrelatedKeyIdInToken, .badEnvironmentKeyIdInToken, .badEnvironmentKeyInToken,
        .topicDisallowed,
    ]
}

/// Counts of one job's (or a whole run's) outcomes.
public struct OutcomeCounts: Codable, Sendable, Equatable {
    public var delivered = 0
    public var rejected = 0
    public var unregistered = 0
    public var failed = 0
    public var expired = 0
    public var rateLimited = 0
    public var invalid = 0
    public var cancelled = 0
    public var superseded = 0
    /// Attempts beyond the first, summed over notifications.
    public var retries = 0

    public init() {}

    public var total: Int {
        delivered + rejected + unregistered + failed + expired + rateLimited + invalid + cancelled + superseded
    }

    public mutating func add(_ result: NotificationResult) {
        add(result.outcome, retries: max(0, result.attempts - 1))
    }

    /// Adds another set of counts (a batch counted apart) to these.
    mutating func add(_ other: OutcomeCounts) {
        delivered += other.delivered
        rejected += other.rejected
        unregistered += other.unregistered
        failed += other.failed
        expired += other.expired
        rateLimited += other.rateLimited
        invalid += other.invalid
        cancelled += other.cancelled
        superseded += other.superseded
        retries += other.retries
    }

    /// Counts one notification that ended with `outcome` after `retries` attempts beyond the first.
    public mutating func add(_ outcome: NotificationOutcome, retries extra: Int = 0) {
        switch outcome {
        case .delivered: delivered += 1
        case .rejected: rejected += 1
        case .unregistered: unregistered += 1
        case .failed: failed += 1
        case .expired: expired += 1
        case .rateLimited: rateLimited += 1
        case .cancelled: cancelled += 1
        case .superseded: superseded += 1
        default: invalid += 1
        }
        retries += extra
    }
}

/// A device token APNs said to drop (410, BadDeviceToken, DeviceTokenNotForTopic).
public struct InvalidatedToken: Sendable, Equatable {
    public var token: String
    public var reason: String
    /// The 410 body's `timestamp` (milliseconds since the epoch): drop the token unless the device
    /// registered it again later than this.
    public var timestamp: Int64?
    public var jobID: String
    /// The `apns-topic` it was sent with: APNs refused the token for that topic, and a registry prunes it only from
    /// the registrations that topic reaches (`RegistryChange.invalidToken`).
    public var topic: String
}
