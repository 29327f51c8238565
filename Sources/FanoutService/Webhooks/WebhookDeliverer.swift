import FanoutCore
import FanoutObservability
import FanoutTransport
import Foundation
import Synchronization

/// Delivers one lane of an endpoint's events (`concurrency` lanes; an activity's events all in one), oldest first,
/// one at a time, on a thread of its own (blocking HTTP, never an engine's loop or a request's task): an event is
/// POSTed until the endpoint answers 2xx, then deleted from the outbox and the next one is sent. A failure (another
/// status, a timeout, a refused connection) waits `retryDelay · 2^(attempts-1)`, capped at `maxRetryDelay`, and
/// sends the same event again, so the endpoint gets each lane's events in order, each at least once. A dead or slow
/// endpoint holds back only its own lanes.
final class WebhookDeliverer: Sendable {
    private let endpoint: WebhookEndpointConfiguration
    private let lane: Int
    /// The signing key (the config's secret); never logged.
    private let secret: [UInt8]
    private let outbox: WebhookOutbox
    private let metrics: WebhookMetrics
    private let logger: FanoutLogger
    private let signal = DispatchSemaphore(value: 0)
    private let exited = DispatchSemaphore(value: 0)
    private let stopping = Atomic<Bool>(false)
    private let label: String
    /// The dispatch store's passive WAL checkpoint (the outbox's connection never checkpoints in a commit).
    private let checkpoint: @Sendable () -> Void

    init(
        endpoint: WebhookEndpointConfiguration, lane: Int, secret: [UInt8], outbox: WebhookOutbox,
        metrics: WebhookMetrics, logger: FanoutLogger, checkpoint: @escaping @Sendable () -> Void
    ) {
        self.checkpoint = checkpoint
        self.lane = lane
        self.endpoint = endpoint
        self.secret = secret
        self.outbox = outbox
        self.metrics = metrics
        self.logger = logger
        label = endpoint.metricLabel
    }

    func start() {
        let thread = Thread { [self] in
            run()
            exited.signal()
        }
        thread.name = "fanout-webhook"
        thread.start()
    }

    /// New events are pending.
    func wake() {
        signal.signal()
    }

    func stop() {
        stopping.store(true, ordering: .relaxed)
        signal.signal()
    }

    /// Waits until `deadline` at most for the thread to end (a delivery in flight may take its own timeout; it stays
    /// pending).
    func join(until deadline: ContinuousClock.Instant) {
        let left = max(.zero, deadline - ContinuousClock.now)
        let (seconds, attoseconds) = left.components
        _ = exited.wait(timeout: .now() + .nanoseconds(Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)))
    }

    /// Sleeps until `until` unless stopped (new events do not shorten a backoff).
    private func pause(_ delay: Duration) {
        let until = ContinuousClock.now + delay
        while !stopping.load(ordering: .relaxed) {
            let left = until - ContinuousClock.now
            guard left > .zero else { return }
            let (seconds, attoseconds) = left.components
            _ = signal.wait(
                timeout: .now() + .nanoseconds(Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)))
        }
    }

    private func run() {
        // This thread's own: one kept-alive connection per lane.
        let client = HTTP1Post.Client(target: endpoint.target, caFile: endpoint.caFile)
        defer { client.close() }
        var failingSince: ContinuousClock.Instant?
        while !stopping.load(ordering: .relaxed) {
            let delivery: WebhookDelivery?
            do {
                delivery = try outbox.next(endpoint: endpoint.key, lane: lane)
            } catch {
                if stopping.load(ordering: .relaxed) { return }
                logger.warning("webhook \(endpoint.path): cannot read the outbox: \(error)")
                pause(.seconds(1))
                continue
            }
            guard let delivery else {
                // Woken by `wake()`, or every second anyway (events recorded by a previous process).
                _ = signal.wait(timeout: .now() + .seconds(1))
                continue
            }
            if delivery.attempts > 0, failingSince == nil {
                // Resumed after a restart mid-backoff: keep backing off from where the attempts are.
                pause(backoff(attempts: delivery.attempts))
                failingSince = .now
                if stopping.load(ordering: .relaxed) { return }
            }
            let started = ContinuousClock.now
            let outcome = send(delivery, on: client)
            metrics.duration.observe(ContinuousClock.now - started)
            if let failure = outcome {
                metrics.failures.labels(label, failure.kind).increment()
                try? outbox.failed(endpoint: endpoint.key, sequence: delivery.sequence)
                if failingSince == nil {
                    failingSince = .now
                    logger.warning(
                        "webhook \(endpoint.path) (\(endpoint.target.origin)): \(failure.message); "
                            + "retrying with backoff",
                        fields: ["event": delivery.eventID])
                }
                pause(backoff(attempts: delivery.attempts + 1))
                continue
            }
            do {
                try outbox.delivered(endpoint: endpoint.key, sequence: delivery.sequence)
            } catch {
                // Delivered, not yet marked: sent again later (the receiver deduplicates by id).
                if stopping.load(ordering: .relaxed) { return }
                logger.warning("webhook \(endpoint.path): cannot mark \(delivery.eventID) delivered: \(error)")
                pause(.seconds(1))
                continue
            }
            metrics.deliveries.labels(label).increment()
            metrics.backlog.labels(label).decrement()
            checkpoint()
            if failingSince != nil {
                logger.info("webhook \(endpoint.path) (\(endpoint.target.origin)) delivers again")
                failingSince = nil
            }
        }
    }

    private func backoff(attempts: Int) -> Duration {
        let factor = 1 << min(max(attempts - 1, 0), 20)
        return min(endpoint.retryDelay * factor, endpoint.maxRetryDelay)
    }

    /// POSTs the delivery, signed; nil on a 2xx.
    private func send(_ delivery: WebhookDelivery, on client: HTTP1Post.Client) -> (kind: String, message: String)? {
        let timestamp = String(Int64(Date().timeIntervalSince1970))
        let signature = WebhookSignature.sign(secret: secret, timestamp: timestamp, body: delivery.body)
        let headers = [
            ("Content-Type", "application/json"), ("User-Agent", "fanout-webhooks/1"),
            ("Fanout-Event-Id", delivery.eventID), ("Fanout-Event-Type", delivery.type),
            ("Fanout-Signature", signature),
        ]
        do {
            let status = try client.post(headers: headers, body: delivery.body, timeout: endpoint.timeout)
            if (200..<300).contains(status) { return nil }
            return ("status", "answered \(status)")
        } catch {
            return (error.kind.rawValue, error.description)
        }
    }
}

/// The `Fanout-Signature` header (docs/WEBHOOKS.md): `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
enum WebhookSignature {
    static func sign(secret: [UInt8], timestamp: String, body: [UInt8]) -> String {
        "t=\(timestamp),v1=" + HMACSHA256.hex(key: secret, message: Array((timestamp + ".").utf8) + body)
    }
}

/// The webhook metrics at `/metrics`, labelled `endpoint="<workspace>/<index in its webhooks list>"` (never the URL,
/// which may carry a receiver's own token).
final class WebhookMetrics: Sendable {
    let deliveries: MetricFamily<MetricCounter>
    let failures: MetricFamily<MetricCounter>
    let backlog: MetricFamily<MetricGauge>
    let duration: MetricHistogram

    init(registry: MetricsRegistry) {
        deliveries = registry.counter(
            "fanout_webhook_deliveries_total", help: "Webhook events delivered (answered 2xx).",
            labelNames: ["endpoint"])
        failures = registry.counter(
            "fanout_webhook_failures_total",
            help: "Webhook delivery attempts that failed and will be retried, by cause (status, timeout, connect, tls, "
                + "protocol).",
            labelNames: ["endpoint", "reason"])
        backlog = registry.gauge(
            "fanout_webhook_backlog", help: "Webhook events recorded and not yet delivered.", labelNames: ["endpoint"])
        duration = registry.histogram(
            "fanout_webhook_delivery_seconds", help: "Time of one webhook delivery attempt.",
            buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30])
    }
}
