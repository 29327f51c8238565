import CommandLineSupport
import Fanout
import FanoutFleet
import FanoutJobFile
import FanoutObservability
import FanoutRedis
import FanoutRedisRegistry
import Foundation

/// The fleet's commands (work shared through Redis Streams): `enqueue`, `worker`, `results`, `status`. Each opens its
/// Redis connection first and answers a PING, so an unreachable server (or a `rediss://` URL) is a one-line error and
/// exit status 2 before anything else happens.
enum FleetCommands {
    static let redisHelp = """
          --redis URL           redis://[user:password@]host:port[/db], a Redis Cluster
                                redis+cluster://host:port[,host:port...], or a primary behind Sentinel
                                redis+sentinel://host:26379[,host:port...]/MASTER[/db] (rediss:// is not
                                supported: Debian's hiredis 0.14 has no TLS)
        """

    /// `fanout enqueue --redis URL --jobs FILE [--shard-size N] [--partitions N]`.
    static func enqueue(_ arguments: [String]) async -> Int32 {
        let usage = """
            fanout enqueue: split each job of a job file into shards on Redis, for fanout worker to send.

            usage: fanout enqueue --redis URL --jobs FILE [--shard-size N] [--partitions N]

            \(redisHelp)
              --jobs FILE           the job file (the same JSON Lines as fanout send)
              --shard-size N        tokens per shard (default 5000)
              --partitions N        spread the shards over N streams (default 1): on a Redis Cluster, streams
                                    on several primaries; every worker reads them all

            Jobs that address the registry (activity_id, push_to_start, users, devices, with "app") are read
            from the registry on the same Redis (fanout serve --redis's) now: their audience is the tokens live
            at enqueue time; an activity bound to a broadcast channel also gets its broadcast.

            Prints one JSON line per job enqueued: {"job": ID, "shards": N}. Refused, with a line on stderr:
            a line that does not parse, a job id already enqueued (ids are unique in Redis), an app not in the
            registry, an activity update not newer than the activity's last, and broadcast jobs (channel_id) and
            push_to_start jobs that name their activity_id (not in the fleet yet; use fanout send).
            Exit status: 0 every job enqueued; 1 some refused; 2 bad arguments, unreadable file, Redis unreachable.
            """
        var redis: String?
        var jobs: String?
        var shardSize = 5000
        var partitions = 1
        do throws(UsageError) {
            var cursor = ArgumentCursor(arguments)
            while let flag = try cursor.nextFlag() {
                switch flag {
                case "--help", "-h":
                    print(usage)
                    return 0
                case "--redis": redis = try cursor.string()
                case "--jobs": jobs = try cursor.string()
                case "--shard-size": shardSize = try cursor.int(in: 1...1_000_000)
                case "--partitions": partitions = try cursor.int(in: 1...1_024)
                default: throw UsageError("unknown option \(flag) (see fanout enqueue --help)")
                }
            }
            guard redis != nil else { throw UsageError("--redis URL is required") }
            guard jobs != nil else { throw UsageError("--jobs FILE is required") }
        } catch {
            return fail("enqueue", error.message)
        }
        guard let redis, let jobs, FileManager.default.isReadableFile(atPath: jobs) else {
            return fail("enqueue", "job file \(jobs ?? "") cannot be read")
        }
        let client: RedisClient
        do {
            client = try await FleetConnection.connect(redis)
        } catch {
            return fail("enqueue", error.message)
        }
        var refused = 0
        do {
            // The registry that `fanout serve --redis` keeps on the same Redis (default key prefix).
            let enqueuer = FleetEnqueuer(
                client: client, shardSize: shardSize, partitions: partitions,
                registry: RedisRegistryStore(client: client),
                log: { StandardStream.error.write("fanout enqueue: \($0)\n") })
            try await enqueuer.enqueue(jobsPath: jobs) { report in
                switch report {
                case .enqueued(let job, let shards, _):
                    var line: [UInt8] = Array("{\"job\": ".utf8)
                    JSONStringEscaping.appendString(job, to: &line)
                    line += Array(", \"shards\": \(shards)}\n".utf8)
                    StandardStream.output.write(line)
                case .refused(_, _, let reason):
                    refused += 1
                    StandardStream.error.write("fanout enqueue: \(reason) (not enqueued)\n")
                }
            }
        } catch {
            return fail("enqueue", error.message)
        }
        return refused == 0 ? 0 : 1
    }

    /// `fanout worker --redis URL [--config FILE] [--name NAME] ...`.
    static func worker(_ arguments: [String]) async -> Int32 {
        let usage = """
            fanout worker: send the shards enqueued on Redis, with the other workers of the fleet.

            usage: fanout worker --redis URL [--config FILE] [--name NAME] [--claim-idle SECONDS]
                                 [--concurrent-shards N] [--endpoint HOST:PORT | --sandbox | --production]
                                 [--ca-file PEM] [--key P8 --key-id ID --team-id ID | --cert FILE ...]
                                 [--request-timeout SECONDS]
                                 [--connections N] [--loops N] [--proxy URL|none] [--log-format text|json]
                   fanout worker --redis URL --serve-config FILE [--db FILE] [--log-format text|json]

            \(redisHelp)
              --serve-config FILE   fanout serve's config: also send the dispatches that fanout serve --redis
                                    instances accept, with the config's teams, apps and limits (fanout serve
                                    without HTTP); the fleet's shards are sent with the config's teams too, and
                                    the send options below do not apply
              --db FILE             with --serve-config: this worker's own SQLite file for the dispatches it runs
                                    (overrides the config's "db"; one file per worker)
              --config FILE         fanout send's config file (endpoint, credentials, loops, connections, ...);
                                    flags override it
              --cert FILE           the app's push certificate instead of a signing key, as fanout send takes it
                                    (--cert-password-env VAR, --cert-password-file FILE, --cert-key PEM)
              --name NAME           this worker's consumer name (default HOST-PID), one live worker each: a second
                                    is refused (exit 2); a worker restarted under its old name takes its pending
                                    shards back at once (after a crash, once --claim-idle has passed)
              --claim-idle SECONDS  claim a shard pending this long without a heartbeat (its worker died; default 30,
                                    at least \(seconds(FleetWorkerOptions.minimumClaimIdle)))
              --concurrent-shards N shards sent at once (default 4)

            Runs until SIGTERM or SIGINT: then it reads no more shards, lets those it sends finish (10 s), leaves
            the rest pending for other workers, and exits 0. Exit status 2: bad arguments, configuration errors,
            Redis unreachable at start, another live worker with the same --name.
            """
        var redis: String?
        var options = SendCommand.Options()
        var name = FleetWorkerOptions.defaultName
        var claimIdle = Duration.seconds(30)
        var concurrentShards = 4
        var serveConfig: String?
        var database: String?
        /// The flags that configure a send of its own, which a worker on fanout serve's config does not take.
        var sendFlags: [String] = []
        do throws(UsageError) {
            var cursor = ArgumentCursor(arguments)
            while let flag = try cursor.nextFlag() {
                if !["--help", "-h", "--redis", "--serve-config", "--db", "--log-format"].contains(flag) {
                    sendFlags.append(flag)
                }
                switch flag {
                case "--help", "-h":
                    print(usage)
                    return 0
                case "--redis": redis = try cursor.string()
                case "--serve-config": serveConfig = try cursor.string()
                case "--db": database = try cursor.string()
                case "--config": options.configPath = try cursor.string()
                case "--name": name = try cursor.string()
                case "--claim-idle": claimIdle = try cursor.seconds()
                case "--concurrent-shards": concurrentShards = try cursor.int(in: 1...1000)
                case "--loops": options.loops = try cursor.int(in: 1...256)
                case "--connections": options.connections = try cursor.int(in: 1...256)
                case "--log-format":
                    let text = try cursor.string()
                    guard let format = FanoutLogger.Format(text) else {
                        throw UsageError("--log-format takes text or json, not '\(text)'")
                    }
                    options.logFormat = format
                default:
                    guard try options.connection.take(flag, from: &cursor) else {
                        throw UsageError("unknown option \(flag) (see fanout worker --help)")
                    }
                }
            }
            guard redis != nil else { throw UsageError("--redis URL is required") }
            if serveConfig != nil, let flag = sendFlags.first {
                throw UsageError(
                    "\(flag) does not go with --serve-config: fanout serve's config names the teams, apps and limits")
            }
            guard database == nil || serveConfig != nil else { throw UsageError("--db goes with --serve-config") }
            guard !name.isEmpty else { throw UsageError("--name must not be empty") }
            // The heartbeat runs at most every 100 ms: a shorter claim-idle hands live workers' shards to others.
            let minimum = FleetWorkerOptions.minimumClaimIdle
            guard claimIdle >= minimum else {
                throw UsageError(
                    "--claim-idle must be at least \(seconds(minimum)) s (\(FleetWorkerOptions.heartbeatsPerClaimIdle) "
                        + "heartbeats, which run at most every \(seconds(FleetWorkerOptions.shortestHeartbeatInterval)) s), "
                        + "not \(seconds(claimIdle))")
            }
        } catch {
            return fail("worker", error.message)
        }
        if let serveConfig {
            return await ServeCommand.runWithoutHTTP(
                configPath: serveConfig, redis: redis!, database: database, logFormat: options.logFormat)
        }
        var configuration: FanoutEngineConfiguration
        do {
            configuration = try SendCommand.engineConfiguration(
                options, environment: ProcessInfo.processInfo.environment)
        } catch {
            return fail("worker", error.message)
        }
        var workerOptions = FleetWorkerOptions(name: name)
        workerOptions.claimIdle = claimIdle
        workerOptions.concurrentShards = concurrentShards
        let signals = ServeSignals()
        let writer: RedisClient
        let reader: RedisClient
        do {
            writer = try await FleetConnection.connect(redis!)
            reader = try await FleetConnection.connect(redis!, commandTimeout: workerOptions.block + .seconds(10))
        } catch {
            return fail("worker", error.message)
        }
        // The name first: a second live worker under it (the default host-PID is the same for containers on host
        // networking) would send this one's pending shards, so it stops here, before it mints or leases anything.
        let nameHold: FleetWorkerName
        do {
            nameHold = try await FleetWorkerName.claim(name, expiry: claimIdle, client: writer)
        } catch {
            return fail("worker", error.message)
        }
        let logger = FanoutLogger(format: options.logFormat)
        do {
            try CertificateCheck.checkAndLog(configuration.credentials, logger: logger, metrics: nil)
        } catch {
            await nameHold.release(client: writer, timeout: .seconds(1))
            return fail("worker", error.message)
        }
        // One provider token per team for the whole fleet, kept in Redis, instead of one per worker. A certificate
        // makes none: each connection authenticates in its handshake.
        var fleetToken: FleetProviderToken?
        if let credentials = configuration.credentials, !credentials.usesCertificate {
            do {
                var tokenOptions = FleetProviderToken.Options()
                tokenOptions.refreshAfter = configuration.tokenRefresh.components.seconds
                tokenOptions.minimumInterval = configuration.tokenMinimumInterval.components.seconds
                let workerName = name
                let source = FleetProviderToken(
                    client: writer, signer: try credentials.makeSigner(), options: tokenOptions,
                    log: { logger.info($0, fields: ["worker": workerName]) })
                try await source.start()
                fleetToken = source
                configuration.tokenSource = source
            } catch {
                await nameHold.release(client: writer, timeout: .seconds(1))
                return fail("worker", (error as? FanoutError)?.message ?? (error as? FleetError)?.message ?? "\(error)")
            }
        }
        defer { fleetToken?.stop() }
        // One budget per workspace for the whole fleet: the buckets in Redis, leased to this worker in chunks.
        var fleetBudget: FleetRateBudget?
        if let limits = configuration.rateLimits {
            let workerName = name
            let budget = FleetRateBudget(
                client: writer, limits: limits,
                options: FleetRateBudget.Options(leaseID: "\(name)-\(UInt32.random(in: 0...UInt32.max))"),
                log: { logger.info($0, fields: ["worker": workerName]) })
            fleetBudget = budget
            configuration.sharedRateLimits = budget
        }
        // The registry on this Redis (`fanout serve --redis`'s, default key prefix): the engine removes the tokens
        // APNs invalidates (410 Unregistered after their registration, BadDeviceToken, DeviceTokenNotForTopic) from
        // it, as `fanout send --registry` does.
        configuration.registry = RedisRegistryStore(client: writer)
        let warningWorker = name
        configuration.warningHandler = { message, fields in
            logger.warning(message, fields: fields.merging(["worker": warningWorker]) { value, _ in value })
        }
        let engine: FanoutEngine
        do {
            engine = try FanoutEngine(configuration: configuration)
        } catch {
            await nameHold.release(client: writer, timeout: .seconds(1))
            return fail("worker", error.message)
        }
        if let warning = configuration.credentials?.permissionWarning() { logger.warning(warning) }
        let workerName = name
        let worker = FleetWorker(
            engine: engine, reader: reader, writer: writer, options: workerOptions, name: nameHold,
            log: { logger.info($0, fields: ["worker": workerName]) })
        logger.info(
            "worker started",
            fields: [
                "worker": name, "endpoint": configuration.endpoint.description,
                "loops": String(configuration.loops), "connections_per_loop": String(configuration.connectionsPerLoop),
            ])
        let stopper = Task {
            await signals.wait()
            logger.info("stopping: no new shards", fields: ["worker": workerName])
            worker.stop()
        }
        defer { stopper.cancel() }
        let stats: FleetWorkerStats
        do {
            stats = try await worker.run()
        } catch {
            await engine.shutdown(gracePeriod: .zero)
            await fleetBudget?.returnLeases(timeout: .seconds(1))
            await worker.releaseName(timeout: .seconds(1))
            return fail("worker", error.message)
        }
        await engine.shutdown(gracePeriod: .seconds(1))
        // The leases and the name share one second (with Redis hung, both expire instead).
        let teardownEnd = ContinuousClock.now + .seconds(1)
        await fleetBudget?.returnLeases(timeout: .seconds(1))
        await worker.releaseName(timeout: teardownEnd - ContinuousClock.now)
        logger.info(
            "worker stopped",
            fields: [
                "worker": name, "shards_completed": String(stats.shardsCompleted),
                "shards_claimed": String(stats.shardsClaimed), "results_written": String(stats.resultsWritten),
            ])
        if stats.nameTaken {
            return fail(
                "worker",
                "another worker named \(name) took this worker's name on this Redis; give each worker its own --name")
        }
        return 0
    }

    /// `fanout results --redis URL --job ID [--out FILE]`.
    static func results(_ arguments: [String]) async -> Int32 {
        let usage = """
            fanout results: a job's results from Redis, one line per (job, token) in job order, then the summary.

            usage: fanout results --redis URL --job ID [--out FILE]

            \(redisHelp)
              --job ID              the job's id
              --out FILE            write the results lines there (default: standard output); the summary line
                                    is the last line of standard output either way

            Exit status: 0 the job is done and every notification delivered; 1 it is not done yet, or some
            notifications were not delivered (the lines so far are written); 2 bad arguments, unknown job,
            Redis unreachable, or the results could not be written (a full disk: one line on stderr says so).
            """
        var redis: String?
        var job: String?
        var out: String?
        do throws(UsageError) {
            var cursor = ArgumentCursor(arguments)
            while let flag = try cursor.nextFlag() {
                switch flag {
                case "--help", "-h":
                    print(usage)
                    return 0
                case "--redis": redis = try cursor.string()
                case "--job": job = try cursor.string()
                case "--out": out = try cursor.string()
                default: throw UsageError("unknown option \(flag) (see fanout results --help)")
                }
            }
            guard redis != nil else { throw UsageError("--redis URL is required") }
            guard job != nil else { throw UsageError("--job ID is required") }
        } catch {
            return fail("results", error.message)
        }
        let client: RedisClient
        do {
            client = try await FleetConnection.connect(redis!)
        } catch {
            return fail("results", error.message)
        }
        // Nil: stdout, through StandardStream (a reader that has gone, `| head`, drops the rest, and the command
        // still ends with its summary and status; a full disk behind `>` is an error, as with `--out`).
        let file: OutputFile?
        do throws(OutputFile.Failure) {
            file = try out.map { path throws(OutputFile.Failure) in try OutputFile(path: path) }
        } catch {
            return fail("results", error.message)
        }
        var readerGone = false
        do {
            let (status, lines) = try await FleetReader(client: client).writeResults(job: job!) { bytes in
                if let file {
                    try file.write(copy bytes)
                } else if !readerGone {
                    do throws(StandardStream.WriteFailure) {
                        try StandardStream.output.writeAll(copy bytes)
                    } catch .readerGone {
                        readerGone = true
                    } catch .failed(let reason) {
                        throw OutputFile.Failure(message: "cannot write the results to standard output: \(reason)")
                    }
                }
            }
            try file?.close()
            let summary = FleetReader.summary(status)
            // The last line of stdout either way, as `fanout send`'s: after the lines, or alone with `--out`.
            StandardStream.output.write(summary.jsonLine + "\n")
            if !status.isDone {
                StandardStream.error.write(
                    "fanout results: job \(job!) is not done: \(status.shardsDone) of \(status.shards) shards, \(lines) of \(status.notifications) results\n"
                )
                return 1
            }
            return summary.allDelivered ? 0 : 1
        } catch let error as FleetError {
            return fail("results", error.message)
        } catch let error as OutputFile.Failure {
            return fail("results", error.message)
        } catch {
            return fail("results", "\(error)")
        }
    }

    /// `fanout status --redis URL`.
    static func status(_ arguments: [String]) async -> Int32 {
        let usage = """
            fanout status: one JSON line per enqueued job, in enqueue order: its state (enqueuing, waiting,
            running, done), shards done and in all, notifications, results so far by outcome.

            usage: fanout status --redis URL

            \(redisHelp)
            """
        var redis: String?
        do throws(UsageError) {
            var cursor = ArgumentCursor(arguments)
            while let flag = try cursor.nextFlag() {
                switch flag {
                case "--help", "-h":
                    print(usage)
                    return 0
                case "--redis": redis = try cursor.string()
                default: throw UsageError("unknown option \(flag) (see fanout status --help)")
                }
            }
            guard redis != nil else { throw UsageError("--redis URL is required") }
        } catch {
            return fail("status", error.message)
        }
        let client: RedisClient
        do {
            client = try await FleetConnection.connect(redis!)
        } catch {
            return fail("status", error.message)
        }
        do {
            for status in try await FleetReader(client: client).statuses() {
                StandardStream.output.write(status.jsonLine + "\n")
            }
        } catch {
            return fail("status", error.message)
        }
        return 0
    }

    /// A duration in seconds, as short as it can be written: `0.3`, `30`.
    static func seconds(_ duration: Duration) -> String {
        let (whole, attoseconds) = duration.components
        let milliseconds = whole * 1000 + attoseconds / 1_000_000_000_000_000
        return milliseconds % 1000 == 0 ? String(milliseconds / 1000) : String(Double(milliseconds) / 1000)
    }

    static func fail(_ command: String, _ message: String) -> Int32 {
        StandardStream.error.write("fanout \(command): \(message)\n")
        return 2
    }
}
