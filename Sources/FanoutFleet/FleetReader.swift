import Fanout
package import FanoutJobLines
package import FanoutRedis
import Foundation

/// Reading the fleet's jobs back: `fanout results` and `fanout status`.
package struct FleetReader: Sendable {
    /// One job's state, from its hash, its done set and its counts.
    package struct JobStatus: Sendable {
        package var job: String
        package var enqueued: Bool
        package var shards: Int
        package var shardsDone: Int
        package var notifications: Int
        package var counts: SendCounts
        /// Unix ms.
        package var enqueuedAt: Int64?
        package var finishedAt: Int64?

        package var isDone: Bool { enqueued && shardsDone >= shards }

        /// `enqueuing` (enqueue has not finished), `waiting` (no result yet), `running`, `done`.
        package var state: String {
            if !enqueued { return "enqueuing" }
            if isDone { return "done" }
            return counts.notifications == 0 ? "waiting" : "running"
        }

        /// `{"job": ID, "state": ..., "shards_done": D, "shards": N, "notifications": T, "results": R, "delivered": ...}`,
        /// every outcome's count.
        package var jsonLine: String {
            var line: [UInt8] = Array("{\"job\": ".utf8)
            JSONStringEscaping.appendString(job, to: &line)
            let outcomes = counts.outcomes
            let fields: [(String, String)] = [
                ("state", "\"\(state)\""), ("shards_done", "\(shardsDone)"), ("shards", "\(shards)"),
                ("notifications", "\(notifications)"), ("results", "\(outcomes.total)"),
                ("delivered", "\(outcomes.delivered)"), ("rejected", "\(outcomes.rejected)"),
                ("unregistered", "\(outcomes.unregistered)"), ("failed", "\(outcomes.failed)"),
                ("expired", "\(outcomes.expired)"), ("rate_limited", "\(outcomes.rateLimited)"),
                ("invalid", "\(outcomes.invalid)"), ("cancelled", "\(outcomes.cancelled)"),
                ("superseded", "\(outcomes.superseded)"), ("retries", "\(outcomes.retries)"),
            ]
            for (key, value) in fields { line += Array(", \"\(key)\": \(value)".utf8) }
            line += Array("}".utf8)
            return String(decoding: line, as: UTF8.self)
        }
    }

    private let client: RedisClient

    package init(client: RedisClient) { self.client = client }

    /// The status of every enqueued job, in enqueue order.
    package func statuses() async throws(FleetError) -> [JobStatus] {
        let ids: [String]
        do {
            ids = (try await client.command(["LRANGE", RedisArgument(FleetKeys.jobList), "0", "-1"]).array ?? [])
                .compactMap(\.string)
        } catch {
            throw FleetError("Redis: \(error.message)")
        }
        var statuses: [JobStatus] = []
        var start = 0
        while start < ids.count {
            let chunk = ids[start..<min(ids.count, start + 500)]
            start += chunk.count
            let batch = chunk.flatMap(Self.statusCommands)
            let replies: [RedisValue]
            do {
                replies = try await client.commands(batch)
            } catch {
                throw FleetError("Redis: \(error.message)")
            }
            for (index, id) in chunk.enumerated() {
                if let status = Self.status(id, replies[(index * 3)..<(index * 3 + 3)]) { statuses.append(status) }
            }
        }
        return statuses
    }

    /// One job's status; nil when it was never enqueued.
    package func status(job: String) async throws(FleetError) -> JobStatus? {
        do {
            return Self.status(job, try await client.commands(Self.statusCommands(job))[...])
        } catch {
            throw FleetError("Redis: \(error.message)")
        }
    }

    private static func statusCommands(_ job: String) -> [[RedisArgument]] {
        let keys = FleetKeys(job: job)
        return [
            ["HMGET", keys.meta, "line", "shards", "notifications", "enqueued", "enqueued_at", "finished_at"],
            ["SCARD", keys.done],
            ["HGETALL", keys.counts],
        ]
    }

    private static func status(_ job: String, _ replies: ArraySlice<RedisValue>) -> JobStatus? {
        let base = replies.startIndex
        guard let meta = replies[base].array, meta.count == 6, meta[0] != .null else { return nil }
        var counts = SendCounts()
        counts.jobs = 1
        let pairs = replies[base + 2].array ?? []
        var index = 0
        while index + 1 < pairs.count {
            if let name = pairs[index].string, let value = pairs[index + 1].integer.map(Int.init) {
                switch name {
                case "retries": counts.outcomes.retries += value
                case "payload_encodings": counts.payloadEncodings = value
                case "demoted": counts.demoted = value
                case "broadcasts": counts.broadcasts = value
                case "delivered": counts.outcomes.delivered = value
                case "rejected": counts.outcomes.rejected = value
                case "unregistered": counts.outcomes.unregistered = value
                case "failed": counts.outcomes.failed = value
                case "expired": counts.outcomes.expired = value
                case "rate_limited": counts.outcomes.rateLimited = value
                case "cancelled": counts.outcomes.cancelled = value
                case "superseded": counts.outcomes.superseded = value
                default: counts.outcomes.invalid += value  // "invalid", and any name this version does not know
                }
            }
            index += 2
        }
        return JobStatus(
            job: job, enqueued: meta[3] != .null, shards: Int(meta[1].integer ?? 0),
            shardsDone: Int(replies[base + 1].integer ?? 0), notifications: Int(meta[2].integer ?? 0), counts: counts,
            enqueuedAt: meta[4].integer, finishedAt: meta[5].integer)
    }

    /// Writes the job's results lines in job order, exactly one per position that has a result (and the job-level
    /// `invalid` line, if any, first), to `output`, reading one shard's results at a time; returns the job's status (its counts are the summary's).
    /// - Throws: `FleetError` when the job was never enqueued or Redis fails.
    package func writeResults(job: String, to output: (borrowing [UInt8]) throws -> Void) async throws -> (
        status: JobStatus, lines: Int
    ) {
        guard let status = try await status(job: job) else {
            throw FleetError("job \(job) is not in Redis (see fanout status for the enqueued jobs)")
        }
        let keys = FleetKeys(job: job)
        var lines = 0
        var buffer: [UInt8] = []
        if case .bytes(let line) = try await client.command(["HGET", keys.results, RedisArgument(jobLevelField)]) {
            buffer += line
            lines += 1
        }
        // Each shard's records (`POSITION LINE`, in the order they were written), sorted by position: the job's
        // positions in order, since shard N holds the positions before shard N + 1's.
        for shard in 0..<status.shards {
            guard
                case .bytes(let records) = try await client.command(
                    ["GET", keys.results(shard: shard)], timeout: .seconds(30))
            else { continue }
            var entries: [(position: Int, line: Range<Int>)] = []
            var index = 0
            while index < records.count {
                var position = 0
                while index < records.count, records[index] != UInt8(ascii: " ") {
                    position = position * 10 + Int(records[index] &- UInt8(ascii: "0"))
                    index += 1
                }
                let lineStart = index + 1
                var end = lineStart
                while end < records.count, records[end] != 10 { end += 1 }
                end = min(end + 1, records.count)
                if lineStart < end { entries.append((position, lineStart..<end)) }
                index = end
            }
            // Stable: a position written twice (which the marks prevent) would keep its first line.
            entries.sort {
                $0.position < $1.position || ($0.position == $1.position && $0.line.lowerBound < $1.line.lowerBound)
            }
            var previous = -1
            for entry in entries where entry.position != previous {
                previous = entry.position
                buffer += records[entry.line]
                lines += 1
            }
            if buffer.count >= 1 << 20 {
                try output(buffer)
                buffer.removeAll(keepingCapacity: true)
            }
        }
        try output(buffer)
        return (status, lines)
    }

    /// The summary line of `fanout send` for one job: its counts, and the seconds from enqueue to its last shard (to
    /// now while it runs).
    package static func summary(_ status: JobStatus) -> SendSummary {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let start = status.enqueuedAt ?? now
        let end = status.isDone ? (status.finishedAt ?? now) : now
        let seconds = max(0, Double(end - start) / 1000)
        return SendSummary(
            counts: status.counts, seconds: seconds,
            rate: seconds > 0 ? Double(status.counts.notifications) / seconds : 0)
    }
}
