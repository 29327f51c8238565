public import FanoutPolicy
import Foundation

/// How a `FanoutEngine` sends: where, with which credentials, and how wide.
///
/// One engine talks to one endpoint with one team's credentials (APNs allows one team per
/// connection); run one engine per team.
public struct FanoutEngineConfiguration: Sendable {
    public var endpoint: APNsEndpoint
    public var credentials: ProviderCredentials?
    /// PEM CA file to trust instead of the system store. Verification stays on.
    public var caFile: String?
    /// Event-loop threads; default: the number of cores.
    public var loops: Int
    /// Connections per loop.
    public var connectionsPerLoop: Int
    /// Upper bound on streams per connection (the server's MAX_CONCURRENT_STREAMS also applies).
    public var maxConcurrentStreams: Int
    /// Notifications in flight in the whole engine (queued on loops or on the wire). Submission
    /// waits while it is reached. Default: enough to keep every connection's window full twice over.
    public var maxInFlight: Int?
    /// Workspace rate budgets (250,000 requests/hour per workspace by default, counted per job,
    /// refused with `rate_limited` when out). Nil: no limit.
    public var rateLimits: RateLimiterRegistry?
    /// Where the engine counts outcomes, retries, in-flight work, connections and round trips
    /// (served by `MetricsEndpoint`); nil: not counted.
    public var metrics: FanoutMetrics?
    /// Attempts per notification for errors that may have reached APNs (5xx, 429, lost connections).
    public var maxAttempts: Int
    /// Retries allowed per first attempt over a 10-second window, per loop; past it, transient
    /// errors fail fast (`failed`, RetryBudgetExhausted) instead of hammering a failing endpoint.
    public var retryBudgetRatio: Double
    /// Backoff of those retries: full jitter over `min(cap, base * 2^attempt)`.
    public var retryBaseMilliseconds: UInt64
    public var retryCapMilliseconds: UInt64
    /// Connection attempts in a row that may fail before a loop fails its waiting notifications.
    public var maxConnectAttempts: Int
    public var connectTimeoutMilliseconds: UInt64
    /// PING a connection after this long without hearing from the server.
    public var pingIntervalMilliseconds: UInt64
    /// Provider-token refresh age and minimum minting interval, in seconds (APNs: 20 to 60 minutes).
    public var tokenRefreshSeconds: Int64
    public var tokenMinimumIntervalSeconds: Int64

    public init(endpoint: APNsEndpoint, credentials: ProviderCredentials? = nil, caFile: String? = nil) {
        self.endpoint = endpoint
        self.credentials = credentials
        self.caFile = caFile
        loops = max(1, ProcessInfo.processInfo.activeProcessorCount)
        connectionsPerLoop = 1
        maxConcurrentStreams = 1000
        maxInFlight = nil
        metrics = nil
        rateLimits = try! RateLimiterRegistry()  // the default budget is valid
        maxAttempts = 8
        retryBudgetRatio = 0.2
        retryBaseMilliseconds = 100
        retryCapMilliseconds = 5_000
        maxConnectAttempts = 5
        connectTimeoutMilliseconds = 10_000
        pingIntervalMilliseconds = 15_000
        tokenRefreshSeconds = 3000
        tokenMinimumIntervalSeconds = 1200
    }

    var effectiveMaxInFlight: Int {
        maxInFlight ?? max(1024, 2 * loops * connectionsPerLoop * maxConcurrentStreams)
    }
}
