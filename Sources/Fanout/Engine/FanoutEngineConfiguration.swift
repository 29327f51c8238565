public import FanoutPolicy
public import FanoutRegistry
import Foundation

/// How a `FanoutEngine` sends: where, with which credentials, and how wide.
///
/// `FanoutEngine(configuration:)` refuses a setting out of the range its documentation gives with
/// `FanoutError(.configuration)`, naming the field and the range.
///
/// One engine talks to one endpoint with one team's credentials (APNs allows one team per
/// connection); run one engine per team.
/// Who gives each notification its `apns-id`.
public enum APNsIDAssignment: Sendable, Hashable {
    /// APNs: the request carries none, and APNs assigns one and returns it in its answer, which every result then
    /// carries. What APNs does with a request without an id, and what Pushy and APNSwift send by default.
    case apns
    /// Fanout: each notification gets a random version 4 UUID before it is first sent, kept across its retries, so a
    /// caller can correlate a notification before its answer, and a resend after a lost connection keeps its id.
    case fanout
}

public struct FanoutEngineConfiguration: Sendable {
    /// Takes a warning the engine carries on through: a message and its fields (no secrets).
    public typealias WarningHandler = @Sendable (_ message: String, _ fields: [String: String]) -> Void

    public var endpoint: APNsEndpoint
    public var credentials: ProviderCredentials?
    /// PEM CA file to trust instead of the system store. Verification stays on.
    public var caFile: String?
    /// The HTTP proxy to reach APNs through; nil (the default): directly. The library does not read `HTTPS_PROXY`
    /// itself: `APNsProxy.fromEnvironment(for:)` does, for a caller that wants it.
    public var proxy: APNsProxy?
    /// Event-loop threads (1 to 1,024); default: the number of cores.
    public var loops: Int
    /// Connections per loop (1 to 1,024).
    public var connectionsPerLoop: Int
    /// Upper bound on streams per connection (the server's MAX_CONCURRENT_STREAMS also applies); at least 1.
    public var maxConcurrentStreams: Int
    /// Notifications in flight in the whole engine (queued on loops or on the wire), for jobs and, apart, for
    /// `send`s: each waits while its own is reached, so a job whose results are slow to be taken (a slow `onResult`)
    /// never holds a `send` back; at least 1. Default: enough to keep every connection's window full twice over.
    public var maxInFlight: Int?
    /// `send` calls under way at once (in flight, or waiting for room in flight) in the whole engine. A call past it
    /// throws `.overloaded` at once, without sending, instead of waiting: each waiting call holds about 12 KB, so a
    /// gateway's burst faster than APNs answers would otherwise grow without bound. Jobs (`run`, `submit`) are not
    /// counted; at least 1. Default: 8 times the in-flight limit, at least 16,384 (about 200 MB of waiting calls).
    public var maxPendingSends: Int?
    /// Workspace rate budgets, opt-in: nil (the default) sends whatever the engine is given, as fast as APNs takes
    /// it. `RateLimiterRegistry()` gives every workspace 250,000 requests an hour (counted per job, refused with
    /// `rate_limited` when out), as `fanout send` and `fanout serve` do by default.
    public var rateLimits: RateLimiterRegistry?
    /// Where rate decisions are made instead of `rateLimits`' in-process buckets (`fanout worker` shares one budget
    /// per workspace through Redis). Used only while `rateLimits` is set, which still gives the budgets. Nil: in
    /// process.
    package var sharedRateLimits: (any SharedRateLimiter)?
    /// The token registry that `Recipients.activity`, `.pushToStart` and `.devices` are read from, and
    /// that tokens APNs invalidates are pruned from as their results arrive. Nil: jobs must name tokens.
    public var registry: (any RegistryStore)?
    /// Where the engine reports trouble it carries on through, for the process's log at warning level: a message and
    /// its fields (no secrets). Today: a batch of invalidated tokens the registry refused to remove (busy past its
    /// timeout, or any other error), with how many and why. Nil: not reported.
    public var warningHandler: WarningHandler?
    /// Where push-to-start jobs write their activity id inside `attributes` (default `activityId`), unless the job
    /// says where (`FanoutJob.activityIDAttribute`).
    public var activityIDAttribute: ActivityIDAttribute
    /// The priority-10 guard, per app (bundle id): at most this many priority-10 updates per activity
    /// over a rolling hour; later ones go out at priority 5 and count as `demoted`. Alerts and `end`
    /// events keep priority 10. Off (empty) by default: Apple publishes no number for the budget a
    /// device allows (it depends on the device and on NSSupportsLiveActivitiesFrequentUpdates), so a
    /// limit is a choice each app makes from what it sees (throttled updates arriving late).
    public var priority10UpdatesPerHour: [String: Int]
    /// Who gives each notification its `apns-id` (default `.apns`: APNs assigns it, and the result carries it).
    /// `fanout send`, `fanout worker` and `fanout serve` use `.fanout`, so that a resent notification keeps its id
    /// in their results. A `send` whose headers carry an `apnsID` sends that one either way.
    public var apnsIDs: APNsIDAssignment
    /// Told of every notification's requests, retries and outcome, of connections and of in-flight work, for the
    /// caller's own metrics (`FanoutMetricsListener`). Nil (the default): nothing is reported, at no cost.
    public var metricsListener: (any FanoutMetricsListener)?
    /// Attempts per notification for errors that may have reached APNs (5xx, 429, lost connections,
    /// timeouts); at least 1.
    public var maxAttempts: Int
    /// Retries allowed per first attempt over a 10-second window, per loop; past it, transient
    /// errors fail fast (`failed`, RetryBudgetExhausted) instead of hammering a failing endpoint. A finite number, at
    /// least 0.
    public var retryBudgetRatio: Double
    /// Backoff of those retries: full jitter over `min(retryCap, retryBase * 2^attempt)`. Each 0 to 1 day.
    public var retryBase: Duration
    public var retryCap: Duration
    /// How long one request may wait for APNs's answer. A stream past it is reset (CANCEL) and treated
    /// like a lost connection: retried with the same `apns-id` (it counts as an attempt), and after the
    /// last attempt it ends `failed` with reason `Timeout`; 1 ms to 1 day. Nil: wait as long as the connection lives.
    public var requestTimeout: Duration?
    /// How long `send(_:)` may take in all when the call gives no timeout of its own: waiting for budget and room in
    /// flight, every attempt and backoff; past it the notification ends `failed` with reason `DeadlineExceeded`.
    /// 1 ms to 1 day; nil: no deadline (bounded only by `maxAttempts` × `requestTimeout` and the backoffs). Jobs
    /// (`run`, `submit`) have no default deadline: a large one takes as long as its tokens need.
    public var sendTimeout: Duration?
    /// Connection attempts in a row that may fail before a loop fails its waiting notifications (1 to 1,000,000).
    public var maxConnectAttempts: Int
    /// How long one connection attempt (TCP and TLS) may take; 1 ms to 1 day.
    public var connectTimeout: Duration
    /// PING a connection after this long without hearing from the server; 1 ms to 1 day.
    public var pingInterval: Duration
    /// Provider-token refresh age and minimum minting interval (APNs: 20 to 60 minutes). Every engine and channel
    /// client of a process that signs with one key shares one token (`ProviderCredentials.makeTokenCache`): the first
    /// made for the key sets these for all of them.
    public var tokenRefresh: Duration
    public var tokenMinimumInterval: Duration
    /// Where the provider token comes from instead of a cache of the engine's own (`fanout worker` shares one token
    /// per team through Redis). Nil: the engine mints its own from `credentials`, refreshed after `tokenRefresh`.
    package var tokenSource: (any ProviderTokenSource)?
    /// After `ServiceUnavailable`, a connection is replaced only once it has been up this long (at most one new
    /// connection per slot that often while APNs is overloaded). Shorter only in tests.
    package var overloadReconnectInterval: Duration = .seconds(5)
    /// The id of each connection's first stream: 1, but a test starts near HTTP/2's last (2^31 - 1) so that
    /// connections run out of stream ids after a few requests, drain, and are replaced.
    package var firstStreamID: Int32 = 1

    public init(endpoint: APNsEndpoint, credentials: ProviderCredentials? = nil, caFile: String? = nil) {
        self.endpoint = endpoint
        self.credentials = credentials
        self.caFile = caFile
        loops = min(1024, max(1, ProcessInfo.processInfo.activeProcessorCount))
        connectionsPerLoop = 1
        maxConcurrentStreams = 1000
        maxInFlight = nil
        maxPendingSends = nil
        registry = nil
        warningHandler = nil
        activityIDAttribute = .fanout
        priority10UpdatesPerHour = [:]
        metricsListener = nil
        apnsIDs = .apns
        rateLimits = nil
        maxAttempts = 8
        retryBudgetRatio = 0.2
        retryBase = .milliseconds(100)
        retryCap = .seconds(5)
        requestTimeout = .seconds(30)
        sendTimeout = .seconds(30)
        maxConnectAttempts = 5
        connectTimeout = .seconds(10)
        pingInterval = .seconds(15)
        tokenRefresh = .seconds(3000)
        tokenMinimumInterval = .seconds(1200)
        tokenSource = nil
        sharedRateLimits = nil
    }

    var effectiveMaxInFlight: Int {
        maxInFlight ?? max(1024, 2 * loops * connectionsPerLoop * maxConcurrentStreams)
    }

    var effectiveMaxPendingSends: Int { maxPendingSends ?? max(16_384, 8 * effectiveMaxInFlight) }

    /// The longest time any setting may be: a day. The loops count time in milliseconds in 64 bits, and a time
    /// anywhere near `Duration`'s range would overflow there, on the loop thread, at the first send.
    static let longestDuration = Duration.seconds(86_400)

    /// Refuses a time below 1 ms (or below 0 with `allowsZero`) or above `longestDuration`, naming `field`.
    static func checkTime(_ field: String, _ value: Duration, allowsZero: Bool = false) throws(FanoutError) {
        let shortest: Duration = allowsZero ? .zero : .milliseconds(1)
        guard value < shortest || value > longestDuration else { return }
        throw FanoutError(
            .configuration, "\(field) must be \(allowsZero ? "0" : "1 ms") to 1 day (86,400 s), not \(value)")
    }

    /// Refuses, with `FanoutError(.configuration)` naming the field and its range, a setting the engine cannot run
    /// with: a count below 1 (or so large that the engine's sums of them overflow), a retry budget ratio that is
    /// negative or not a number, and a time that is not positive (backoffs: negative) or longer than a day.
    /// `FanoutEngine.init` calls it before it starts anything.
    func validate() throws(FanoutError) {
        func refuse(_ field: String, _ range: String, _ value: String) -> FanoutError {
            FanoutError(.configuration, "\(field) must be \(range), not \(value)")
        }
        func check(_ field: String, _ value: Int, in range: ClosedRange<Int>) throws(FanoutError) {
            guard !range.contains(value) else { return }
            let text =
                range.upperBound == .max ? "at least \(range.lowerBound)" : "\(range.lowerBound) to \(range.upperBound)"
            throw refuse(field, text, "\(value)")
        }
        func check(_ field: String, _ value: Duration, allowsZero: Bool = false) throws(FanoutError) {
            try Self.checkTime(field, value, allowsZero: allowsZero)
        }
        try check("loops", loops, in: 1...1024)
        try check("connectionsPerLoop", connectionsPerLoop, in: 1...1024)
        try check("maxConcurrentStreams", maxConcurrentStreams, in: 1...Int(Int32.max))
        if let maxInFlight { try check("maxInFlight", maxInFlight, in: 1...Int(Int32.max)) }
        if let maxPendingSends { try check("maxPendingSends", maxPendingSends, in: 1...Int.max) }
        try check("maxAttempts", maxAttempts, in: 1...Int.max)
        try check("maxConnectAttempts", maxConnectAttempts, in: 1...1_000_000)
        guard retryBudgetRatio.isFinite && retryBudgetRatio >= 0 else {
            throw refuse(
                "retryBudgetRatio", "a finite number of at least 0 (0.2: 20% of first attempts)", "\(retryBudgetRatio)")
        }
        try check("retryBase", retryBase, allowsZero: true)
        try check("retryCap", retryCap, allowsZero: true)
        if let requestTimeout { try check("requestTimeout", requestTimeout) }
        if let sendTimeout { try check("sendTimeout", sendTimeout) }
        try check("connectTimeout", connectTimeout)
        try check("pingInterval", pingInterval)
        try check("overloadReconnectInterval", overloadReconnectInterval, allowsZero: true)
    }
}
