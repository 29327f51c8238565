import FanoutCore
import FanoutRedis
import Foundation

/// A RedisClient used from the bench's synchronous code: each call blocks until its reply. The scenarios that start
/// a redis-server (fleet, serve) read its counters with it: commands by name and CPU seconds.
final class BenchRedis: Sendable {
    private let client: RedisClient

    init(url: String) throws {
        client = try RedisClient(url: url)
    }

    func run(_ arguments: [RedisArgument]) throws -> RedisValue {
        let client = self.client
        return try blocking { try await client.command(arguments, timeout: .seconds(30)) }
    }

    func pipeline(_ batch: [[RedisArgument]]) throws -> [RedisValue] {
        let client = self.client
        return try blocking { try await client.commands(batch, timeout: .seconds(30)) }
    }

    func close() {
        let client = self.client
        _ = try? blocking { await client.shutdown() }
    }

    /// `INFO commandstats` since the last `CONFIG RESETSTAT`: calls by command (lowercase, subcommands as
    /// `config|resetstat`; commands run inside scripts count too), those named in `excluded` left out (the bench's
    /// own).
    func commandCalls(excluding excluded: Set<String>) throws -> [String: Int] {
        try commandStats(excluding: excluded).mapValues(\.calls)
    }

    /// `commandCalls`, with each command's microseconds in Redis (`usec`: a script's include the commands it runs).
    func commandStats(excluding excluded: Set<String>) throws -> [String: (calls: Int, microseconds: Int)] {
        guard let text = try run(["INFO", "commandstats"]).string else { return [:] }
        var stats: [String: (calls: Int, microseconds: Int)] = [:]
        for line in text.split(whereSeparator: \.isNewline) where line.hasPrefix("cmdstat_") {
            // cmdstat_hsetnx:calls=1,usec=20,...
            guard let colon = line.firstIndex(of: ":") else { continue }
            let name = String(line[line.index(line.startIndex, offsetBy: 8)..<colon])
            let fields = line[line.index(after: colon)...].split(separator: ",")
            guard !excluded.contains(name), fields.count >= 2,
                let calls = Int(fields[0].split(separator: "=").last ?? ""),
                let microseconds = Int(fields[1].split(separator: "=").last ?? "")
            else { continue }
            stats[name] = (calls, microseconds)
        }
        return stats
    }

    /// Redis's CPU seconds so far (`INFO cpu`: used_cpu_user + used_cpu_sys).
    func cpuSeconds() throws -> Double {
        guard let text = try run(["INFO", "cpu"]).string else { return 0 }
        var total = 0.0
        for line in text.split(whereSeparator: \.isNewline)
        where line.hasPrefix("used_cpu_user:") || line.hasPrefix("used_cpu_sys:") {
            total += Double(line.split(separator: ":").last ?? "") ?? 0
        }
        return total
    }

    /// `SLOWLOG GET` (up to `limit` entries, newest first): each logged command's duration in microseconds and its
    /// first arguments (Redis keeps 32 of them, each cut at 128 bytes), those in `excluded` left out.
    func slowCommands(limit: Int = 1024, excluding excluded: Set<String>) throws -> [(
        microseconds: Int, arguments: [String]
    )] {
        var commands: [(microseconds: Int, arguments: [String])] = []
        for entry in try run(["SLOWLOG", "GET", RedisArgument(limit)]).array ?? [] {
            guard let fields = entry.array, fields.count >= 4, let duration = fields[2].integer,
                let arguments = fields[3].array?.compactMap(\.string),
                !excluded.contains(arguments.first?.lowercased() ?? "")
            else { continue }
            commands.append((Int(duration), arguments))
        }
        return commands
    }

    /// `LATENCY LATEST` (the latency monitor, on past `latency-monitor-threshold`): each event's (`command`,
    /// `aof-fsync-always`, `aof-write`, `fork`, ...) largest latency in milliseconds since the last `LATENCY RESET`,
    /// and the seconds in which it went past the threshold (`LATENCY HISTORY` keeps one sample per second).
    func latencyEvents() throws -> [String: (maxMilliseconds: Int, seconds: Int)] {
        var events: [String: (maxMilliseconds: Int, seconds: Int)] = [:]
        for entry in try run(["LATENCY", "LATEST"]).array ?? [] {
            guard let fields = entry.array, fields.count >= 4, let name = fields[0].string,
                let highest = fields[3].integer
            else { continue }
            let history = try run(["LATENCY", "HISTORY", RedisArgument(name)]).array ?? []
            events[name] = (Int(highest), history.count)
        }
        return events
    }

    /// One `INFO` field as a number (`total_forks`, `aof_delayed_fsync`, ...); 0 when absent.
    func infoNumber(_ section: String, _ field: String) throws -> Double {
        guard let text = try run(["INFO", RedisArgument(section)]).string else { return 0 }
        for line in text.split(whereSeparator: \.isNewline) where line.hasPrefix(field + ":") {
            return Double(line.split(separator: ":").last ?? "") ?? 0
        }
        return 0
    }
}

/// The top commands over several runs (each run's `[name: calls]` under `key`, its notifications under
/// `notifications`), as `NAME calls/1,000 notifications`, the six most called first.
func topRedisCommands(_ runs: [[String: Any]], key: String) -> String {
    var totals: [String: Double] = [:]
    for run in runs {
        for (name, value) in run[key] as? [String: Int] ?? [:] {
            totals[name, default: 0] += Double(value)
        }
    }
    let notifications = runs.reduce(0.0) { $0 + number($1["notifications"]) }
    return totals.sorted { $0.value > $1.value }.prefix(6).map {
        String(format: "%@ %.1f", $0.key, $0.value / max(notifications, 1) * 1000)
    }.joined(separator: ", ")
}

/// Runs `body` on the concurrency pool and waits for it on this (non-pool) thread.
func blocking<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
    let result = FanoutMutex<Result<T, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    Task {
        let value: Result<T, any Error>
        do { value = .success(try await body()) } catch { value = .failure(error) }
        result.withLock { $0 = value }
        done.signal()
    }
    done.wait()
    return try result.withLock { $0! }.get()
}
