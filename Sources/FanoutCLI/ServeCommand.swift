import CommandLineSupport
import FanoutCore
import FanoutObservability
import FanoutService
import Foundation

/// `fanout serve`: the HTTP service (README: "fanout serve").
enum ServeCommand {
    static let usage = """
        usage: fanout serve --config FILE [--listen HOST:PORT] [--db FILE] [--redis URL]
                            [--tls-cert PEM --tls-key PEM] [--log-format text|json]

        Runs the Live Activity service: the native API under /v1/, Pushwoosh's under /json/1.3/, Braze's under
        /messages/live_activity/, /healthz, /metrics, and the status page at /. HTTP/1.1 and HTTP/2 (h2 over TLS,
        prior knowledge without). Prints "listening on HOST:PORT" once it accepts connections.

          --config FILE      workspaces, apps, API key digests and limits (JSON; see docs/SERVE.md)
          --listen HOST:PORT where to listen (port 0: a free port); overrides the config's "listen"
          --db FILE          the SQLite file for the registry and the dispatch queue; overrides "db"
          --redis URL        keep the registry and the dispatch queue on Redis instead, shared by every fanout
                             serve given the same URL (redis://[user:password@]host:port[/db], redis+cluster://...
                             or redis+sentinel://host:26379[,...]/MASTER; overrides "redis"): a dispatch any
                             instance accepts is sent by whichever takes it; also shares one provider token per
                             team and orders content timestamps across them.
          --tls-cert PEM     serve HTTPS with this certificate chain (with --tls-key)
          --tls-key PEM      the certificate's private key
          --log-format F     text (default) or json, on stderr

        SIGTERM or SIGINT: stop accepting, let running dispatches finish within the grace period
        ("grace_seconds", default 10), leave the rest queued for the next start, exit 0.
        Exit status 2: bad arguments or configuration, or the port, database or Redis cannot be opened.
        """

    static func run(_ arguments: [String]) async -> Int32 {
        var configPath: String?
        var listen: (String, Int)?
        var database: String?
        var redis: String?
        var certificate: String?
        var key: String?
        var logFormat = FanoutLogger.Format.text
        do throws(UsageError) {
            var cursor = ArgumentCursor(arguments)
            while let flag = try cursor.nextFlag() {
                switch flag {
                case "--help", "-h":
                    print(usage)
                    return 0
                case "--config": configPath = try cursor.string()
                case "--listen": listen = try cursor.hostPort()
                case "--db": database = try cursor.string()
                case "--redis": redis = try cursor.string()
                case "--tls-cert": certificate = try cursor.string()
                case "--tls-key": key = try cursor.string()
                case "--log-format":
                    let text = try cursor.string()
                    guard let format = FanoutLogger.Format(text) else {
                        throw UsageError("--log-format takes text or json, not '\(text)'")
                    }
                    logFormat = format
                default: throw UsageError("unknown option \(flag) (see fanout serve --help)")
                }
            }
            guard configPath != nil else { throw UsageError("--config FILE is required (see fanout serve --help)") }
            guard (certificate == nil) == (key == nil) else {
                throw UsageError("--tls-cert and --tls-key go together")
            }
        } catch {
            return fail("\(error)")
        }
        var configuration: ServiceConfiguration
        do {
            configuration = try ServiceConfiguration.load(path: configPath!)
        } catch {
            return fail("\(error)")
        }
        if let (host, port) = listen { (configuration.listenHost, configuration.listenPort) = (host, port) }
        if let database { configuration.database = database }
        if let redis { configuration.redis = redis }
        if let certificate, let key { (configuration.tlsCertificate, configuration.tlsKey) = (certificate, key) }

        let logger = FanoutLogger(format: logFormat)
        let signals = ServeSignals()
        let service: ServiceInstance
        do {
            service = try await ServiceInstance.start(configuration: configuration, logger: logger)
        } catch {
            return fail("\(error)")
        }
        if service.resumedDispatches > 0 {
            logger.info("resuming unfinished dispatches", fields: ["count": String(service.resumedDispatches)])
        }
        let host = configuration.listenHost.contains(":") ? "[\(configuration.listenHost)]" : configuration.listenHost
        // Unbuffered, so a script waiting for this line sees it at once.
        StandardStream.output.write("listening on \(host):\(service.port)\n")
        await signals.wait()
        logger.info("stopping: no new connections; running dispatches get the grace period")
        await service.stop(gracePeriod: configuration.gracePeriod)
        return 0
    }

    /// `fanout worker --serve-config FILE`: the service without HTTP, sending the dispatches the instances on the
    /// same Redis accept (and the fleet's shards) until SIGTERM or SIGINT, then stopping as `fanout serve` does.
    static func runWithoutHTTP(
        configPath: String, redis: String, database: String?, logFormat: FanoutLogger.Format
    ) async -> Int32 {
        var configuration: ServiceConfiguration
        do {
            configuration = try ServiceConfiguration.load(path: configPath)
        } catch {
            return fail("\(error)", command: "worker")
        }
        configuration.redis = redis
        if let database { configuration.database = database }
        // A worker is there to send: the config's `fleet_worker: false` is for API-only instances.
        configuration.fleetWorker = true
        let logger = FanoutLogger(format: logFormat)
        let signals = ServeSignals()
        let service: ServiceInstance
        do {
            service = try await ServiceInstance.start(configuration: configuration, logger: logger, serving: false)
        } catch {
            return fail("\(error)", command: "worker")
        }
        logger.info("worker started: sending the shared dispatch queue and the fleet's shards")
        await signals.wait()
        logger.info("stopping: running dispatches get the grace period")
        await service.stop(gracePeriod: configuration.gracePeriod)
        return 0
    }

    private static func fail(_ message: String, command: String = "serve") -> Int32 {
        StandardStream.error.write("fanout \(command): \(message)\n")
        return 2
    }
}

/// SIGINT and SIGTERM, awaited without polling (`fanout serve`, `fanout worker`).
/// `@unchecked Sendable`: `sources` is written once in init and only kept alive; the latch is Sendable.
final class ServeSignals: @unchecked Sendable {
    private let latch = SignalLatch()
    private let sources: [any DispatchSourceSignal]

    init() {
        let latch = self.latch
        sources = [SIGINT, SIGTERM].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { latch.fire() }
            source.resume()
            return source
        }
    }

    /// Returns once either signal has arrived (at once if one already has).
    func wait() async { await latch.wait() }
}

/// Set once; wakes its waiter.
private final class SignalLatch: Sendable {
    private let state = FanoutMutex<(fired: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

    func fire() {
        let waiter = state.withLock { state in
            state.fired = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    func wait() async {
        await withCheckedContinuation { continuation in
            let fired = state.withLock { state in
                if state.fired { return true }
                state.waiter = continuation
                return false
            }
            if fired { continuation.resume() }
        }
    }
}
