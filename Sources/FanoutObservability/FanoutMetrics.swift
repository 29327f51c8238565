package import Fanout

/// The metrics the `fanout` commands and `fanout serve` publish at `/metrics`: an engine's `FanoutMetricsListener`
/// that counts its events in one `MetricsRegistry`, under these names:
///
/// - `fanout_notifications_total{outcome,reason}`: notifications by final outcome and APNs reason (`reason=""`
///   when there is none, as for `delivered`).
/// - `fanout_retries_total`: notifications sent again after a transient error.
/// - `fanout_notifications_in_flight`: notifications sent and not yet answered.
/// - `fanout_open_connections`: APNs connections open now.
/// - `fanout_rate_limited_total{workspace,priority}`: requests a workspace budget refused or delayed.
/// - `fanout_apns_round_trip_seconds`: time from writing a request to APNs's answer.
/// - `fanout_certificate_expiry_seconds{certificate}`: when each provider certificate in use expires, in seconds
///   since 1970 (labelled with its first topic, else its common name); absent with signing keys.
///
/// Every update is an atomic add; an outcome without a reason takes no lock.
///
/// Several `FanoutMetrics` may be made on one registry (one per engine, when a process runs one engine per APNs team
/// behind one metrics endpoint): they share the families, so the counters and the histogram add up across engines.
/// One `FanoutMetrics` may also be shared by several engines, as `fanout serve` does. Either way,
/// `fanout_notifications_in_flight` is set by each engine to its own count, so with several engines it shows the
/// last one to update it, not the sum.
package final class FanoutMetrics: FanoutMetricsListener {
    package let registry: MetricsRegistry
    package let notifications: MetricFamily<MetricCounter>
    package let retries: MetricCounter
    package let inFlight: MetricGauge
    package let openConnections: MetricGauge
    /// Connection attempts that failed before the connection was ready (TCP, a proxy's refusal, TLS, the preface).
    package let connectionFailures: MetricCounter
    package let rateLimited: MetricFamily<MetricCounter>
    package let apnsRoundTrip: MetricHistogram
    /// `fanout_notifications_total{outcome=..., reason=""}` for each outcome, looked up without a lock.
    private let withoutReason: [NotificationOutcome: MetricCounter]

    /// The round-trip histogram's bounds, in seconds: 1 ms to 10 s.
    package static let roundTripBuckets: [Double] = [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
    ]

    /// Registers Fanout's metrics in `registry`, or takes them as they are when another `FanoutMetrics` already
    /// registered them there (shared: counts from both add up).
    package init(registry: MetricsRegistry = MetricsRegistry()) {
        self.registry = registry
        notifications = registry.counter(
            "fanout_notifications_total", help: "Notifications by final outcome and APNs reason.",
            labelNames: ["outcome", "reason"])
        retries = registry.counter("fanout_retries_total", help: "Notifications sent again after a transient error.")
        inFlight = registry.gauge(
            "fanout_notifications_in_flight", help: "Notifications sent to APNs and not yet answered.")
        openConnections = registry.gauge("fanout_open_connections", help: "Connections to APNs open now.")
        connectionFailures = registry.counter(
            "fanout_connection_failures_total",
            help: "Connection attempts to APNs that failed before the connection was ready (TCP, proxy, TLS).")
        rateLimited = registry.counter(
            "fanout_rate_limited_total", help: "Requests refused or delayed by a workspace rate budget.",
            labelNames: ["workspace", "priority"])
        apnsRoundTrip = registry.histogram(
            "fanout_apns_round_trip_seconds", help: "Time from sending a request to APNs's answer.",
            buckets: Self.roundTripBuckets)
        // Every outcome is scraped (at zero) from the start, so that rates over it are defined.
        var withoutReason: [NotificationOutcome: MetricCounter] = [:]
        for outcome in NotificationOutcome.all {
            withoutReason[outcome] = notifications.labels(outcome.name, "")
        }
        self.withoutReason = withoutReason
    }

    /// Counts one notification that ended with `outcome`, and APNs's (or Fanout's) reason if any.
    package func record(_ outcome: NotificationOutcome, reason: String? = nil) {
        if reason == nil || reason == "", let counter = withoutReason[outcome] {
            counter.increment()
        } else {
            notifications.labels(outcome.name, reason ?? "").increment()
        }
    }

    /// Counts one request that a workspace budget refused or delayed.
    package func recordRateLimited(workspace: String, priority: Int) {
        rateLimited.labels(workspace, String(priority)).increment()
    }

    /// Sets `fanout_certificate_expiry_seconds` for `certificate`: its expiry as seconds since 1970, so that an
    /// alert compares it with `time()`.
    package func recordCertificate(_ certificate: ProviderCertificate) {
        let expiry = registry.gauge(
            "fanout_certificate_expiry_seconds",
            help: "When each provider certificate in use expires, in seconds since 1970.", labelNames: ["certificate"])
        expiry.labels(certificate.topics.first ?? certificate.commonName).set(Int(certificate.notAfter))
    }

    /// Records one APNs round trip.
    package func observeRoundTrip(seconds: Double) {
        apnsRoundTrip.observe(seconds)
    }

    // MARK: FanoutMetricsListener

    package func notificationFinished(outcome: NotificationOutcome, reason: String?, latency: Duration?) {
        record(outcome, reason: reason)
        if let latency { apnsRoundTrip.observe(latency) }
    }

    package func notificationRetried(reason: String?) {
        retries.increment()
    }

    package func notificationsRateLimited(workspace: String, priority: Int, count: Int) {
        rateLimited.labels(workspace, String(priority)).increment(by: count)
    }

    package func notificationsInFlight(_ count: Int) {
        inFlight.set(count)
    }

    package func connectionAdded() {
        openConnections.increment()
    }

    package func connectionRemoved() {
        openConnections.decrement()
    }

    package func connectionFailed(reason: String) {
        connectionFailures.increment()
    }
}
