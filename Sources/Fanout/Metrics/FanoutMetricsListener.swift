/// What an engine tells a metrics system as it works: give one to `FanoutEngineConfiguration.metricsListener` to
/// count an engine's notifications, retries, connections and round trips in your own metrics (Prometheus, StatsD,
/// OpenTelemetry, a log).
///
/// Every method has an empty default, so a listener implements only the events it counts. The engine calls them on
/// its own threads (event loops, results threads, the tasks that feed jobs), several at once: a listener must be
/// thread-safe and quick, as an atomic add is. It must not block, lock for long or do I/O, since a slow listener slows
/// sending down. Nothing is allocated or called per notification when no listener is set.
///
/// ```swift
/// final class DeliveredCounter: FanoutMetricsListener {
///     let delivered = Atomic<Int>(0)
///     func notificationFinished(outcome: NotificationOutcome, reason: String?, latency: Duration?) {
///         if outcome == .delivered { delivered.add(1, ordering: .relaxed) }
///     }
/// }
/// ```
public protocol FanoutMetricsListener: AnyObject, Sendable {
    /// A notification's request was written to an APNs connection. `attempt` is 1 for its first request and counts
    /// up with its retries, as `NotificationResult.attempts` does.
    func notificationSent(attempt: Int)

    /// A notification ended: called exactly once per notification, with the outcome its `NotificationResult` has
    /// (`delivered`, `rejected`, `unregistered`, `failed`, `rate_limited`, ...), APNs's reason or Fanout's own
    /// (`BadDeviceToken`, `DeadlineExceeded`, `NotSent`, ...; nil when there is none, as for `delivered`), and the
    /// time from the notification's first request to APNs's final answer (nil when no answer came: refused before
    /// sending, stopped, or the connection lost).
    func notificationFinished(outcome: NotificationOutcome, reason: String?, latency: Duration?)

    /// A notification is sent again after a transient error (`reason`: APNs's, such as `TooManyRequests` or
    /// `ServiceUnavailable`, or the transport's, such as `Timeout` or a lost connection), or after APNs refused the
    /// provider token (`ExpiredProviderToken`).
    func notificationRetried(reason: String?)

    /// A workspace budget (`FanoutEngineConfiguration.rateLimits`) refused `count` notifications of a job of
    /// `workspace` at `priority`; each also ends `rate_limited` (`notificationFinished`).
    func notificationsRateLimited(workspace: String, priority: Int, count: Int)

    /// The engine's notifications in flight now (sent and not answered yet, or waiting to be sent), after results
    /// were delivered.
    func notificationsInFlight(_ count: Int)

    /// A connection to APNs is open and ready for requests.
    func connectionAdded()

    /// A connection that `connectionAdded` reported has closed.
    func connectionRemoved()

    /// A connection attempt failed before the connection was ready (TCP, TLS, the HTTP/2 preface); the engine tries
    /// again after a backoff. `reason` says what failed.
    func connectionFailed(reason: String)
}

extension FanoutMetricsListener {
    public func notificationSent(attempt: Int) {}
    public func notificationFinished(outcome: NotificationOutcome, reason: String?, latency: Duration?) {}
    public func notificationRetried(reason: String?) {}
    public func notificationsRateLimited(workspace: String, priority: Int, count: Int) {}
    public func notificationsInFlight(_ count: Int) {}
    public func connectionAdded() {}
    public func connectionRemoved() {}
    public func connectionFailed(reason: String) {}
}
