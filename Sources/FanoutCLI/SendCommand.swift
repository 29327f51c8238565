import CommandLineSupport
import Fanout
import FanoutCore
import FanoutFleet
import FanoutJobFile
import FanoutObservability
import FanoutPolicy
import FanoutRedisRegistry
import Foundation

/// `fanout send`: every job of a job file, with results, summary, progress and crash-safe resume.
enum SendCommand {
    static let usage = """
        fanout send: send every job of a JSON Lines job file and record one result per notification.

        usage: fanout send --jobs FILE [--results FILE] [--summary FILE] [--config FILE]
                           [--endpoint HOST:PORT | --sandbox | --production] [--ca-file PEM]
                           [--key P8 --key-id ID --team-id ID | --cert P12 (--cert-password-env VAR |
                           --cert-password-file FILE) | --cert PEM [--cert-key PEM]]
                           [--request-timeout SECONDS] [--proxy URL|none]
                           [--connections N] [--loops N] [--resume] [--follow [--follow-linger MS]]
                           [--progress auto|always|never] [--invalid-tokens FILE] [--concurrent-jobs N]
                           [--registry FILE|URL] [--metrics-listen HOST:PORT] [--log-format text|json]

          --jobs FILE           the job file (JSON Lines, one job per line; see docs/SEND.md); - reads
                                standard input. A pipe or FIFO is read until its writer closes it
          --results FILE        one JSON line per (job, token); default: standard output
          --summary FILE        also write the final summary line there
          --config FILE         JSON: endpoint, ca_file, key_path, key_id, team_id, cert_path,
                                cert_key_path, cert_password_env, cert_password_file, loops, connections,
                                max_attempts, request_timeout_seconds, rate_limits, proxy (see docs/SEND.md);
                                flags override it
          --cert FILE           authenticate with the app's push certificate (.p12 or PEM) instead of a
                                signing key; --cert-password-env VAR or --cert-password-file FILE give a
                                .p12 file's password, --cert-key PEM a PEM certificate's key. Jobs for a
                                topic the certificate does not cover are refused
          --request-timeout SECONDS
                                how long one request may wait for APNs's answer (default 30); past it
                                the stream is reset and retried, and after the last attempt it ends
                                failed with reason Timeout
          --proxy URL|none      reach Apple through this HTTP proxy (CONNECT; http://[user:password@]host:port);
                                default HTTPS_PROXY unless NO_PROXY names the host; none: directly
          --resume              continue the run recorded in --results FILE's journal after a crash:
                                finished notifications are not sent again
          --follow              treat the job file as a queue: send each job as soon as its line is
                                complete, wait for more at the end, and stop at SIGINT or SIGTERM
                                (finishing the jobs started, then the summary). A rotated or
                                truncated file is read again from its start, as tail -F does. With
                                --results, --resume after a kill goes on after the last finished job
          --follow-linger MS    with --follow: a line appended within MS milliseconds of the last
                                wake-up waits until they have passed, so that a burst of jobs is read
                                and started together (default 5; 0 reads each line at once). A line
                                appended after a quiet spell is read at once
          --invalid-tokens FILE tokens APNs invalidated, as JSON lines (token, reason, timestamp, job)
          --registry FILE|URL   the token registry (fanout registry) that jobs naming activity_id,
                                push_to_start, users or devices are resolved from; tokens APNs
                                invalidates are removed from it as their results arrive. A
                                redis://host:port[/db] URL names the registry on Redis (fanout serve
                                --redis's)
          --metrics-listen HOST:PORT
                                serve Prometheus metrics at http://HOST:PORT/metrics while running
          --log-format FORMAT   text (default) or json: structured logs on stderr
          --progress MODE       auto (default: a progress line on a terminal, plain lines otherwise),
                                always, never

        Credentials may also come from APNS_KEY_PATH, APNS_KEY_ID and APNS_TEAM_ID.
        Exit status: 0 when every notification was delivered; 1 when some were not, or the run was cut
        short after sending by a job file, tokens file or registry that failed mid-read, or results that
        could not be written (a line on stderr says why, the summary has "cut_short": true; what was
        recorded stays, and --resume sends the rest); 2 for bad arguments, unreadable files or
        configuration errors (nothing sent).
        """

    struct Options {
        var send: SendOptions?
        var configPath: String?
        var connection = ConnectionFlags()
        var loops: Int?
        var connections: Int?
        var metricsListen: String?
        var logFormat = FanoutLogger.Format.text
        var registryPath: String?
    }

    static func parse(_ arguments: [String]) throws(UsageError) -> Options? {
        var options = Options()
        var jobs: String?
        var results: String?
        var summary: String?
        var invalidTokens: String?
        var resume = false
        var follow = false
        var followLinger = SendOptions.defaultFollowLinger
        var progress = ProgressReporter.Mode.auto
        var concurrentJobs = 16
        var cursor = ArgumentCursor(arguments)
        while let flag = try cursor.nextFlag() {
            switch flag {
            case "--help", "-h": return nil
            case "--jobs": jobs = try cursor.string()
            case "--results": results = try cursor.string()
            case "--summary": summary = try cursor.string()
            case "--config": options.configPath = try cursor.string()
            case "--loops": options.loops = try cursor.int(in: 1...256)
            case "--connections": options.connections = try cursor.int(in: 1...256)
            case "--concurrent-jobs": concurrentJobs = try cursor.int(in: 1...10_000)
            case "--resume": resume = true
            case "--follow": follow = true
            case "--follow-linger": followLinger = .milliseconds(try cursor.int(in: 0...1_000))
            case "--metrics-listen":
                let text = try cursor.string()
                guard MetricsEndpoint.parseListenAddress(text) != nil else {
                    throw UsageError("--metrics-listen takes HOST:PORT, not '\(text)'")
                }
                options.metricsListen = text
            case "--log-format":
                let text = try cursor.string()
                guard let format = FanoutLogger.Format(text) else {
                    throw UsageError("--log-format takes text or json, not '\(text)'")
                }
                options.logFormat = format
            case "--invalid-tokens": invalidTokens = try cursor.string()
            case "--registry": options.registryPath = try cursor.string()
            case "--progress":
                let text = try cursor.string()
                guard let mode = ProgressReporter.Mode(rawValue: text) else {
                    throw UsageError("--progress takes auto, always or never, not '\(text)'")
                }
                progress = mode
            default:
                guard try options.connection.take(flag, from: &cursor) else {
                    throw UsageError("unknown option \(flag) (see fanout send --help)")
                }
            }
        }
        guard let jobs else { throw UsageError("--jobs FILE is required (see fanout send --help)") }
        var send = SendOptions(jobsPath: jobs)
        send.resultsPath = results
        send.summaryPath = summary
        send.invalidTokensPath = invalidTokens
        send.resume = resume
        send.follow = follow
        send.followLinger = followLinger
        send.progress = progress
        send.concurrentJobs = concurrentJobs
        options.send = send
        return options
    }

    /// Flags over the config file over the environment over defaults.
    static func engineConfiguration(_ options: Options, environment: [String: String]) throws(UsageError)
        -> FanoutEngineConfiguration
    {
        let config = try SendConfigFile.load(options.configPath)
        var connection = options.connection
        connection.fill(from: config.connection, environment: environment)
        var configuration = FanoutEngineConfiguration(
            endpoint: connection.endpoint ?? .production, credentials: try connection.credentials(configFile: true),
            caFile: connection.caFile)
        configuration.proxy = try connection.proxy(for: configuration.endpoint.host, environment: environment)
        if let loops = options.loops ?? config.loops { configuration.loops = loops }
        if let connections = options.connections ?? config.connections {
            configuration.connectionsPerLoop = connections
        }
        if let attempts = config.maxAttempts { configuration.maxAttempts = attempts }
        if let timeout = connection.requestTimeout { configuration.requestTimeout = timeout }
        // The job-file driver waits for budget rather than refusing (RateBudget.jobFileDefault).
        configuration.rateLimits = try config.rateLimits()
        // A resent notification keeps its apns-id in the results file (and a resumed run's), as the job-file
        // contract says.
        configuration.apnsIDs = .fanout
        return configuration
    }

    static func run(_ arguments: [String]) async -> Int32 {
        let options: Options
        var configuration: FanoutEngineConfiguration
        do {
            guard let parsed = try parse(arguments) else {
                print(usage)
                return 0
            }
            options = parsed
            configuration = try engineConfiguration(options, environment: ProcessInfo.processInfo.environment)
        } catch {
            return fail(error.message)
        }
        guard var send = options.send,
            send.jobsPath == JobFileReader.standardInput || FileManager.default.isReadableFile(atPath: send.jobsPath)
        else {
            return fail("job file \(options.send?.jobsPath ?? "") cannot be read")
        }
        if let url = options.registryPath, url.hasPrefix("redis://") || url.hasPrefix("rediss://") {
            do {
                configuration.registry = RedisRegistryStore(client: try await FleetConnection.connect(url))
            } catch {
                return fail("registry: \(error.message)")
            }
        } else if let path = options.registryPath {
            guard FileManager.default.fileExists(atPath: path) else {
                return fail("registry \(path) does not exist (create it with fanout registry --db \(path) import ...)")
            }
            do {
                configuration.registry = try SQLiteRegistryStore(path: path)
            } catch {
                return fail("registry \(path): \(error.description)")
            }
        }
        let logger = FanoutLogger(format: options.logFormat)
        configuration.warningHandler = { logger.warning($0, fields: $1) }
        var endpoint: MetricsEndpoint?
        if let listen = options.metricsListen {
            let metrics = FanoutMetrics()
            configuration.metricsListener = metrics
            do {
                endpoint = try MetricsEndpoint(registry: metrics.registry, listen: listen)
            } catch {
                return fail("--metrics-listen \(listen): \(error.message)")
            }
            if send.follow {
                // How far producers are ahead of the reading, in /metrics beside the progress line.
                let bytes = metrics.registry.gauge(
                    "fanout_send_queue_lag_bytes", help: "Bytes of the followed job file written and not read yet.")
                let jobs = metrics.registry.gauge(
                    "fanout_send_queue_lag_jobs", help: "Complete job lines of the followed job file not read yet.")
                let age = metrics.registry.gauge(
                    "fanout_send_queue_oldest_unread_seconds",
                    help: "How long the oldest unread job line has waited since the sender saw it (whole seconds).")
                send.queueLag = { lagBytes, lagJobs, oldestAge in
                    bytes.set(lagBytes)
                    jobs.set(lagJobs)
                    age.set(oldestAge.map { Int($0.components.seconds) } ?? 0)
                }
            }
        }
        defer { endpoint?.shutdown() }
        // A certificate is read and checked before the engine starts: unusable or expired is exit 2, nothing sent.
        do {
            try CertificateCheck.checkAndLog(
                configuration.credentials, logger: logger, metrics: configuration.metricsListener as? FanoutMetrics)
        } catch {
            return fail(error.message)
        }
        let engine: FanoutEngine
        do {
            engine = try FanoutEngine(configuration: configuration)
        } catch {
            return fail(error.message)
        }
        if let warning = configuration.credentials?.permissionWarning() { logger.warning(warning) }
        logger.info(
            "send started",
            fields: [
                "jobs": send.jobsPath, "endpoint": configuration.endpoint.description,
                "loops": String(configuration.loops), "connections_per_loop": String(configuration.connectionsPerLoop),
                "metrics": endpoint.map { "127.0.0.1:\($0.port)" } ?? "off",
            ])
        send.notice = { message in logger.info(message) }
        let runner = JobFileRunner(engine: engine, options: send)
        // With --follow, SIGINT and SIGTERM end the reading; the jobs started finish and the summary is written.
        let signals = send.follow ? StopSignals.install { runner.stopFollowing() } : []
        defer { signals.forEach { $0.cancel() } }
        do {
            let summary = try await runner.run()
            let line = summary.jsonLine
            logger.info(
                "send finished",
                fields: [
                    "notifications": String(summary.counts.notifications),
                    "delivered": String(summary.counts.outcomes.delivered),
                    "seconds": String(format: "%.2f", summary.seconds),
                ])
            if let path = send.summaryPath {
                do throws(OutputFile.Failure) {
                    let file = try OutputFile(path: path)
                    try file.write(line + "\n")
                    try file.close()
                } catch {
                    return fail("--summary: \(error.message)")
                }
            }
            if let cutShort = summary.cutShort {
                StandardStream.error.write("fanout send: \(cutShort)\n")
            }
            // The last line of stdout in every case (docs/SEND.md); without `--results` it follows the results lines.
            print(line)
            // Cut short before this run recorded anything: nothing was sent, which exit status 2 is for (docs/SEND.md).
            if summary.cutShort != nil && summary.notificationsThisRun == 0 { return 2 }
            return summary.allDelivered ? 0 : 1
        } catch {
            await engine.shutdown(gracePeriod: .zero)
            return fail("\(error)")
        }
    }

    static func fail(_ message: String) -> Int32 {
        StandardStream.error.write("fanout send: \(message)\n")
        return 2
    }
}

/// `fanout validate --jobs FILE`: checks every line, sends nothing.
enum ValidateCommand {
    static let usage = """
        fanout validate: check every line of a job file and print the errors; nothing is sent.

        usage: fanout validate --jobs FILE

        Exit status: 0 when every line is valid; 1 when some are not; 2 when the file cannot be read.
        """

    static func run(_ arguments: [String]) -> Int32 {
        var cursor = ArgumentCursor(arguments)
        var jobs: String?
        do {
            while let flag = try cursor.nextFlag() {
                switch flag {
                case "--help", "-h":
                    print(usage)
                    return 0
                case "--jobs": jobs = try cursor.string()
                default: throw UsageError("unknown option \(flag) (see fanout validate --help)")
                }
            }
            guard let jobs else { throw UsageError("--jobs FILE is required") }
            let reader = try JobFileReader(path: jobs)
            let parser = JobLineParser()
            let now = Int64(Date().timeIntervalSince1970)
            var ids = JobFileIDs()
            var valid = 0
            var invalid = 0
            while let line = try reader.nextLine() {
                var parsed = parser.parse(
                    line: line.bytes, lineNumber: line.number, jobFileDirectory: reader.directory, now: now)
                // fanout send refuses a line that repeats an earlier line's id (results are keyed by job id).
                if let duplicate = ids.claim(parsed.jobID, line: line.number).duplicate { parsed = .failure(duplicate) }
                switch parsed {
                case .success: valid += 1
                case .failure(let error):
                    invalid += 1
                    print(error.description)
                }
            }
            print("\(valid) valid, \(invalid) invalid")
            return invalid == 0 ? 0 : 1
        } catch let error as UsageError {
            StandardStream.error.write("fanout validate: \(error.message)\n")
            return 2
        } catch {
            StandardStream.error.write("fanout validate: \(error)\n")
            return 2
        }
    }
}
