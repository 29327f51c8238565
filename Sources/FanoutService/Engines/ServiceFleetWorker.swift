import Fanout
import FanoutFleet
import FanoutObservability
import FanoutRedis
import Foundation

/// `fanout serve --redis` as a worker of the fleet: it takes shards from the fleet's stream (`fanout enqueue`'s jobs)
/// and sends each with the engine of its app's team, as `fanout worker` does with its one engine: the same consumer
/// group, heartbeat, claims and results (`FleetWorker`). Its provider tokens and send budgets are the engines'
/// (shared on Redis), so instances and workers count as one sender.
final class ServiceFleetWorker: Sendable {
    private let worker: FleetWorker
    private let run: Task<Void, Never>
    /// Owned: made by `start`, shut down by `stop`.
    private let reader: RedisClient
    private let writer: RedisClient

    /// Connects (a reading and a writing client, as `fanout worker`), takes the name `serve-HOST-PID-RANDOM`, and
    /// starts.
    static func start(url: String, engines: TeamEngines, claimIdle: Duration, logger: FanoutLogger)
        async throws(ServiceStartError) -> ServiceFleetWorker
    {
        // A name of its own each start: a restarted instance (same host name, and in a container the same PID)
        // must not wait for its dead predecessor's hold to expire; that one's shards are claimed like any dead
        // worker's.
        let suffix = String(UInt32.random(in: 0...UInt32.max), radix: 36)
        var options = FleetWorkerOptions(name: "serve-\(FleetWorkerOptions.defaultName)-\(suffix)")
        options.stopGrace = .seconds(5)
        options.claimIdle = max(claimIdle, FleetWorkerOptions.minimumClaimIdle)
        let writer: RedisClient
        let reader: RedisClient
        do {
            writer = try await FleetConnection.connect(url)
        } catch {
            throw ServiceStartError("\(error)")
        }
        do {
            reader = try await FleetConnection.connect(url, commandTimeout: options.block + .seconds(10))
        } catch {
            await writer.shutdown()
            throw ServiceStartError("\(error)")
        }
        let name: FleetWorkerName
        do {
            name = try await FleetWorkerName.claim(options.name, expiry: options.claimIdle, client: writer)
        } catch {
            await reader.shutdown()
            await writer.shutdown()
            throw ServiceStartError("the fleet worker: \(error.message)")
        }
        let workerName = options.name
        let worker = FleetWorker(
            engines: { job in engines.engine(forApp: FleetWorker.app(of: job)) }, reader: reader, writer: writer,
            options: options, name: name, log: { logger.info($0, fields: ["worker": workerName]) })
        let run = Task {
            do throws(FleetError) {
                _ = try await worker.run()
            } catch {
                logger.error("the fleet worker stopped", fields: ["worker": workerName, "error": error.message])
            }
        }
        logger.info("fleet worker started", fields: ["worker": workerName])
        return ServiceFleetWorker(worker: worker, run: run, reader: reader, writer: writer)
    }

    private init(worker: FleetWorker, run: Task<Void, Never>, reader: RedisClient, writer: RedisClient) {
        self.worker = worker
        self.run = run
        self.reader = reader
        self.writer = writer
    }

    /// Reads no more shards; those being sent get the worker's grace period from now.
    func requestStop() { worker.stop() }

    /// Stops (if not yet), waits for the shards being sent to finish or be left pending, frees the name, and closes
    /// the connections.
    func stop() async {
        worker.stop()
        await run.value
        await worker.releaseName(timeout: .seconds(1))
        await reader.shutdown()
        await writer.shutdown()
    }
}
