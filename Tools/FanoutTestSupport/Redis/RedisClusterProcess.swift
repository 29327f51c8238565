// A real Redis Cluster for the tests: `primaries` redis-server processes with `--cluster-enabled yes` (each a
// `RedisServerProcess` on a free loopback port in its own temporary directory), optionally `replicasPerPrimary` more,
// joined by `redis-cli --cluster create ... --cluster-yes`, and waited for until every node reports
// `cluster_state:ok` and every replica is in sync. `discard()` stops them all and removes their directories.
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// One node as `CLUSTER NODES` describes it.
package struct RedisClusterNodeInfo: Sendable {
    package let id: String
    package let port: Int
    package let isPrimary: Bool
    /// The primary's id for a replica.
    package let primaryID: String?
    /// The slot ranges it serves (primaries), as `start...end`.
    package let slots: [ClosedRange<Int>]
    /// `fail` or `fail?` in its flags: the cluster has marked it down.
    package let isFailed: Bool
}

/// A cluster of redis-server children. Not thread-safe: a test drives it from its own task.
package final class RedisClusterProcess {
    /// Every node, primaries first (in the order `--cluster create` was given them), then replicas.
    package private(set) var servers: [RedisServerProcess] = []

    /// Starts the nodes and creates the cluster. `nodeTimeoutMilliseconds` is `cluster-node-timeout`: how long a node
    /// may not answer before it is marked failed and its replica promoted (small, so that a failover test is quick).
    package init(primaries: Int = 3, replicasPerPrimary: Int = 0, nodeTimeoutMilliseconds: Int = 1000) throws {
        guard FileManager.default.isExecutableFile(atPath: Self.redisCLI) else {
            throw RedisServerError("redis-cli is not installed (make deps-test installs it)")
        }
        do {
            for _ in 0..<(primaries * (1 + replicasPerPrimary)) {
                servers.append(
                    try RedisServerProcess(extra: [
                        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout",
                        String(nodeTimeoutMilliseconds),
                    ]))
            }
            let create = try Self.run(
                Self.redisCLI,
                ["--cluster", "create"] + servers.map { "127.0.0.1:\($0.port)" } + [
                    "--cluster-replicas", String(replicasPerPrimary), "--cluster-yes",
                ])
            guard create.status == 0 else {
                throw RedisServerError("redis-cli --cluster create failed:\n\(create.output.suffix(2000))")
            }
            try waitUntilReady(primaries: primaries, replicas: primaries * replicasPerPrimary)
        } catch {
            discard()
            throw error
        }
    }

    /// `redis+cluster://` with every node as a seed.
    package var url: String { "redis+cluster://" + servers.map { "127.0.0.1:\($0.port)" }.joined(separator: ",") }

    /// Stops every node and removes their directories.
    package func discard() {
        for server in servers { server.discard() }
    }

    /// The server listening on `port`.
    package func server(port: Int) -> RedisServerProcess? { servers.first { $0.port == port } }

    /// Runs `redis-cli -p port arguments...` (no cluster redirection) and returns its output, trimmed.
    @discardableResult
    package func cli(_ port: Int, _ arguments: [String]) throws -> String {
        let result = try Self.run(Self.redisCLI, ["-h", "127.0.0.1", "-p", String(port)] + arguments)
        guard result.status == 0 else {
            throw RedisServerError("redis-cli -p \(port) \(arguments.first ?? "") failed: \(result.output)")
        }
        return result.output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// The nodes as the node on `port` sees them (`CLUSTER NODES`).
    package func nodes(askingPort port: Int? = nil) throws -> [RedisClusterNodeInfo] {
        let text = try cli(port ?? servers.first { $0.isRunning }!.port, ["CLUSTER", "NODES"])
        return text.split(whereSeparator: \.isNewline).compactMap { line in
            let fields = line.split(separator: " ").map(String.init)
            // ip:port@cport[,hostname]
            guard fields.count >= 8 else { return nil }
            let address = fields[1].prefix { $0 != "@" }
            guard let colon = address.lastIndex(of: ":"), let port = Int(address[address.index(after: colon)...])
            else { return nil }
            let flags = fields[2].split(separator: ",")
            let slots: [ClosedRange<Int>] = fields.dropFirst(8).compactMap { field in
                guard !field.hasPrefix("[") else { return nil }  // a migration in progress: [slot->-id]
                let bounds = field.split(separator: "-").compactMap { Int($0) }
                if bounds.count == 2 { return bounds[0]...bounds[1] }
                return bounds.count == 1 ? bounds[0]...bounds[0] : nil
            }
            return RedisClusterNodeInfo(
                id: fields[0], port: port, isPrimary: flags.contains("master"),
                primaryID: fields[3] == "-" ? nil : fields[3], slots: slots,
                isFailed: flags.contains("fail") || flags.contains("fail?"))
        }
    }

    /// The primary serving `slot`, as the node on `port` (default: the first running node) sees it.
    package func primary(servingSlot slot: Int, askingPort port: Int? = nil) throws -> RedisClusterNodeInfo {
        guard
            let node = try nodes(askingPort: port).first(where: {
                $0.isPrimary && !$0.isFailed && $0.slots.contains { $0.contains(slot) }
            })
        else { throw RedisServerError("no primary serves slot \(slot)") }
        return node
    }

    /// Waits until every running node says `cluster_state:ok` and `primaries` primaries serve all 16384 slots, and
    /// every replica's link to its primary is up.
    package func waitUntilReady(primaries: Int, replicas: Int, seconds: Double = 20) throws {
        let deadline = Date().addingTimeInterval(seconds)
        var last = ""
        while Date() < deadline {
            do {
                if try isReady(primaries: primaries, replicas: replicas, why: &last) { return }
            } catch {
                last = "\(error)"
            }
            usleep(50_000)
        }
        throw RedisServerError("the cluster was not ready within \(seconds) s: \(last)")
    }

    private func isReady(primaries: Int, replicas: Int, why: inout String) throws -> Bool {
        for server in servers where server.isRunning {
            let info = try cli(server.port, ["CLUSTER", "INFO"])
            guard info.contains("cluster_state:ok") else {
                why = "node \(server.port): not cluster_state:ok"
                return false
            }
        }
        let nodes = try nodes()
        let serving = nodes.filter { $0.isPrimary && !$0.isFailed && !$0.slots.isEmpty }
        let covered = serving.reduce(0) { $0 + $1.slots.reduce(0) { $0 + $1.count } }
        guard serving.count == primaries, covered == 16384 else {
            why = "\(serving.count) primaries serving \(covered) slots"
            return false
        }
        let replicaNodes = nodes.filter { !$0.isPrimary && !$0.isFailed }
        guard replicaNodes.count >= replicas else {
            why = "\(replicaNodes.count) of \(replicas) replicas"
            return false
        }
        for replica in replicaNodes where server(port: replica.port)?.isRunning == true {
            let info = try cli(replica.port, ["INFO", "replication"])
            guard info.contains("master_link_status:up") else {
                why = "replica \(replica.port): link to its primary not up"
                return false
            }
        }
        return true
    }

    /// Moves `slot` from the primary serving it to the primary on `destinationPort` as Redis Cluster does it, step
    /// by step: IMPORTING on the destination, MIGRATING on the source, then `migrate(keys)` may move keys (`MIGRATE`),
    /// and `finishSlotMigration` assigns the slot. Returns the source's port.
    @discardableResult
    package func beginSlotMigration(_ slot: Int, to destinationPort: Int) throws -> Int {
        let all = try nodes()
        let source = try primary(servingSlot: slot)
        guard let destination = all.first(where: { $0.port == destinationPort }) else {
            throw RedisServerError("no node on port \(destinationPort)")
        }
        try expectOK(cli(destinationPort, ["CLUSTER", "SETSLOT", String(slot), "IMPORTING", source.id]))
        try expectOK(cli(source.port, ["CLUSTER", "SETSLOT", String(slot), "MIGRATING", destination.id]))
        return source.port
    }

    /// `MIGRATE` of `keys` (all in one slot) from the node on `sourcePort` to the one on `destinationPort`.
    package func migrate(keys: [String], from sourcePort: Int, to destinationPort: Int) throws {
        try expectOK(
            cli(sourcePort, ["MIGRATE", "127.0.0.1", String(destinationPort), "", "0", "5000", "KEYS"] + keys))
    }

    /// Assigns `slot` to the node on `destinationPort` on every primary (`CLUSTER SETSLOT slot NODE id`), destination
    /// first, as the specification orders it.
    package func finishSlotMigration(_ slot: Int, to destinationPort: Int, from sourcePort: Int) throws {
        let all = try nodes()
        guard let destination = all.first(where: { $0.port == destinationPort }) else {
            throw RedisServerError("no node on port \(destinationPort)")
        }
        let others = all.filter { $0.isPrimary && $0.port != destinationPort && $0.port != sourcePort }
        let order = [destinationPort, sourcePort] + others.map(\.port)
        for port in order {
            try expectOK(cli(port, ["CLUSTER", "SETSLOT", String(slot), "NODE", destination.id]))
        }
    }

    private func expectOK(_ output: String) throws {
        guard output == "OK" else { throw RedisServerError("expected OK, got: \(output)") }
    }

    private static let redisCLI: String =
        ["/usr/bin/redis-cli", "/usr/local/bin/redis-cli"].first { FileManager.default.isExecutableFile(atPath: $0) }
        ?? "/usr/bin/redis-cli"

    private static func run(_ executable: String, _ arguments: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}
