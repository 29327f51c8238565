import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// One primary, one replica and three sentinels watching them under `masterName`, each `redis-server` on a free
/// loopback port, for tests of `redis+sentinel://` URLs: `killPrimary()` is a machine lost, and the sentinels
/// promote the replica once the primary has not answered for `downAfterMilliseconds` (small, so a test is quick).
/// Call `discard()` when done.
package final class RedisSentinelSetup {
    package static let masterName = "fanout"

    package let primary: RedisServerProcess
    package let replica: RedisServerProcess
    private var sentinels: [(port: Int, directory: String, process: Process)] = []

    package init(downAfterMilliseconds: Int = 1_000) throws {
        // No 5-second wait before the replica's first sync (Redis's default, to gather replicas into one transfer).
        primary = try RedisServerProcess(appendOnly: true, extra: ["--repl-diskless-sync-delay", "0"])
        do {
            // Its data is the primary's, replicated (no AOF of its own).
            replica = try RedisServerProcess(extra: ["--replicaof", "127.0.0.1", String(primary.port)])
        } catch {
            primary.discard()
            throw error
        }
        do {
            for _ in 0..<3 {
                sentinels.append(try Self.startSentinel(primaryPort: primary.port, downAfterMilliseconds))
            }
            // A sentinel learns of the replica from the primary's INFO (every 10 s at first) and of the other
            // sentinels through the primary: until each knows both, and the replica has its first copy of the
            // primary's data, a failover cannot happen, or promotes an empty replica.
            let deadline = Date().addingTimeInterval(30)
            while !sentinels.allSatisfy({ Self.knowsSetup($0.port, replicaPort: replica.port) })
                || !(RedisServerProcess.inline("INFO replication", port: replica.port, whole: true) ?? "").contains(
                    "master_link_status:up")
            {
                guard Date() < deadline else {
                    throw RedisServerError(
                        "the replica did not sync, or the sentinels did not learn of it and of each other, in 30 s")
                }
                usleep(100_000)
            }
        } catch {
            discard()
            throw error
        }
    }

    /// Whether the sentinel on `port` knows the replica and the two other sentinels.
    private static func knowsSetup(_ port: Int, replicaPort: Int) -> Bool {
        guard let replicas = RedisServerProcess.inline("SENTINEL REPLICAS \(masterName)", port: port, whole: true),
            replicas.contains(String(replicaPort)),
            let master = RedisServerProcess.inline("SENTINEL MASTER \(masterName)", port: port, whole: true)
        else { return false }
        // The reply lists field, value pairs: "num-other-sentinels" then its value.
        let lines = master.components(separatedBy: "\r\n")
        guard let index = lines.firstIndex(of: "num-other-sentinels"), index + 2 < lines.count else { return false }
        return lines[index + 2] == "2"
    }

    /// `redis+sentinel://` naming the three sentinels and the primary's name.
    package var url: String {
        "redis+sentinel://" + sentinels.map { "127.0.0.1:\($0.port)" }.joined(separator: ",") + "/\(Self.masterName)"
    }

    /// The sentinels' ports.
    package var sentinelPorts: [Int] { sentinels.map(\.port) }

    /// SIGKILL of the primary (its replica is promoted by the sentinels after `downAfterMilliseconds`).
    package func killPrimary() { primary.kill() }

    /// Stops every server and removes their directories.
    package func discard() {
        for sentinel in sentinels {
            if sentinel.process.isRunning { Glibc.kill(sentinel.process.processIdentifier, SIGKILL) }
            sentinel.process.waitUntilExit()
            try? FileManager.default.removeItem(atPath: sentinel.directory)
        }
        sentinels = []
        replica.discard()
        primary.discard()
    }

    /// The sentinels' logs, for failure messages.
    package var sentinelLogs: String {
        sentinels.map { (try? String(contentsOfFile: $0.directory + "/sentinel.log", encoding: .utf8)) ?? "" }
            .joined(separator: "\n---\n")
    }

    private static func startSentinel(primaryPort: Int, _ downAfterMilliseconds: Int) throws -> (
        port: Int, directory: String, process: Process
    ) {
        let directory = (NSTemporaryDirectory() as NSString).appendingPathComponent(
            "fanout-sentinel-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var lastError: Error = RedisServerError("no attempt")
        for _ in 0..<4 {
            let port = try RedisServerProcess.freeLoopbackPort()
            // Sentinel rewrites its config file as the setup changes: one of its own in its directory.
            let config = """
                port \(port)
                bind 127.0.0.1
                dir \(directory)
                logfile sentinel.log
                sentinel monitor \(masterName) 127.0.0.1 \(primaryPort) 2
                sentinel down-after-milliseconds \(masterName) \(downAfterMilliseconds)
                sentinel failover-timeout \(masterName) \(max(3_000, 3 * downAfterMilliseconds))
                sentinel parallel-syncs \(masterName) 1

                """
            let path = directory + "/sentinel.conf"
            try config.write(toFile: path, atomically: true, encoding: .utf8)
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/redis-server")
            process.arguments = [path, "--sentinel"]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            do {
                try process.run()
            } catch {
                lastError = error
                continue
            }
            let deadline = Date().addingTimeInterval(5)
            while Date() < deadline, process.isRunning {
                if RedisServerProcess.ping(port: port) != nil { return (port, directory, process) }
                usleep(10_000)
            }
            if process.isRunning { Glibc.kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
            lastError = RedisServerError("redis-server --sentinel on port \(port) did not answer PING within 5 s")
        }
        throw lastError
    }
}
