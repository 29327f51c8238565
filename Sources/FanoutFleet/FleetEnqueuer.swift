import Fanout
import FanoutCore
import FanoutJobFile
import FanoutRedis
import Foundation

/// `fanout enqueue`: each job line of a job file becomes shards on the fleet's stream.
///
/// - A line is parsed and validated as `fanout send` would (`JobLineParser`), once, here: what a worker reads back is
///   known to parse.
/// - Its recipients (inline `tokens`, or a `tokens_file` read here, so workers need no shared disk) are cut into
///   shards of `shardSize` tokens in job order; shard N holds positions [N × shardSize, ...). Each shard's tokens go
///   to a key of their own, then its entry to the stream (one pipelined round trip per shard, in that order, so a
///   worker that reads the entry finds the tokens).
/// - The job line is stored once, with its recipients replaced by one placeholder token (a worker swaps in the
///   shard's), and with the parse time, so that every shard encodes the same default Live Activity `timestamp`.
/// - Job ids are unique in Redis: a job whose id was already enqueued is refused (HSETNX on the job's hash), never
///   merged, so a results line always belongs to one job line.
/// - Refused for now: jobs that address the registry (`activity_id`, `push_to_start`, `users`, `devices`: paging the
///   registry into shards needs the shared registry, issue 14 item 5) and broadcasts (`channel_id`). `fanout send`
///   sends them.
package final class FleetEnqueuer: Sendable {
    /// What happened to one job line.
    package enum Report: Sendable {
        case enqueued(job: String, shards: Int, notifications: Int)
        case refused(line: Int, job: String?, reason: String)
    }

    /// A valid device token that no device has: the recipient of the stored job line, replaced by each shard's.
    static let placeholderToken = String(repeating: "0", count: 64)

    private let client: RedisClient
    private let shardSize: Int

    package init(client: RedisClient, shardSize: Int) {
        precondition(shardSize > 0)
        self.client = client
        self.shardSize = shardSize
    }

    /// Enqueues every job of `jobsPath`, calling `report` once per job line, in file order.
    /// - Throws: `FleetError` when the job file cannot be read or Redis fails (jobs reported before stay enqueued;
    ///   the failing one may be partly enqueued, and its id is then taken).
    package func enqueue(jobsPath: String, report: (Report) -> Void) async throws(FleetError) {
        let reader: JobFileReader
        do {
            reader = try JobFileReader(path: jobsPath)
        } catch {
            throw FleetError(error.description)
        }
        do {
            try await FleetConnection.ensureGroup(client)
        } catch {
            throw FleetError("cannot create the consumer group: \(error.message)")
        }
        let parser = JobLineParser()
        let now = Int64(Date().timeIntervalSince1970)
        while true {
            let next: JobFileReader.Line?
            do {
                next = try reader.nextLine()
            } catch {
                throw FleetError("\(error)")
            }
            guard let line = next else { break }
            switch parser.parse(line: line.bytes, lineNumber: line.number, jobFileDirectory: reader.directory, now: now)
            {
            case .failure(let error):
                report(.refused(line: line.number, job: error.jobID, reason: error.description))
            case .success(let parsed):
                report(try await enqueue(parsed, bytes: line.bytes, now: now))
            }
        }
    }

    private func enqueue(_ parsed: ParsedJobLine, bytes: some Collection<UInt8>, now: Int64) async throws(FleetError)
        -> Report
    {
        let job = parsed.job
        let number = parsed.lineNumber
        var inline: [String]?
        var file: String?
        switch job.recipients {
        case .tokens(let tokens): inline = tokens
        case .file(let path): file = path
        case .activity, .pushToStart, .devices:
            return .refused(
                line: number, job: job.id,
                reason:
                    "line \(number): jobs that address the registry (activity_id, push_to_start, users, devices) cannot "
                    + "be enqueued yet (the fleet has no shared registry); send them with fanout send --registry")
        case .channel:
            return .refused(
                line: number, job: job.id,
                reason: "line \(number): broadcast jobs (channel_id) cannot be enqueued yet; send them with fanout send"
            )
        }
        guard let template = Self.template(bytes) else {
            return .refused(line: number, job: job.id, reason: "line \(number): not a JSON object")
        }
        let keys = FleetKeys(job: job.id)
        do {
            let claimed = try await client.command(["HSETNX", keys.meta, "line", RedisArgument(bytes: template)])
            guard claimed == .integer(1) else {
                return .refused(
                    line: number, job: job.id,
                    reason: "line \(number): job \(job.id) is already enqueued in Redis (job ids must be unique)")
            }
            let enqueuedAt = Int(Date().timeIntervalSince1970 * 1000)
            _ = try await client.commands([
                ["HSET", keys.meta, "now", RedisArgument(Int(now)), "enqueued_at", RedisArgument(enqueuedAt)],
                ["RPUSH", RedisArgument(FleetKeys.jobList), RedisArgument(job.id)],
            ])
            var shards = 0
            var total = 0
            var batch: [String] = []
            batch.reserveCapacity(shardSize)
            func flush() async throws(RedisError) {
                guard !batch.isEmpty else { return }
                let start = total - batch.count
                var data: [UInt8] = []
                data.reserveCapacity(batch.count * 65)
                for (index, token) in batch.enumerated() {
                    if index > 0 { data.append(10) }
                    data += token.utf8
                }
                let replies = try await client.commands([
                    ["SET", keys.tokens(shard: shards), RedisArgument(bytes: data)],
                    [
                        "XADD", RedisArgument(FleetKeys.stream), "*", "job", RedisArgument(job.id), "shard",
                        RedisArgument(shards), "start", RedisArgument(start), "count", RedisArgument(batch.count),
                    ],
                    [
                        "HSET", keys.meta, "shards", RedisArgument(shards + 1), "notifications", RedisArgument(total),
                    ],
                ])
                if let failed = replies.first(where: { if case .error = $0 { true } else { false } }),
                    case .error(let message) = failed
                {
                    throw RedisError.server(message)
                }
                shards += 1
                batch.removeAll(keepingCapacity: true)
            }
            if let inline {
                for token in inline {
                    batch.append(token)
                    total += 1
                    if batch.count == shardSize { try await flush() }
                }
            } else if let file {
                let reader: ChunkedLineReader
                do {
                    reader = try ChunkedLineReader(path: file)
                } catch {
                    throw FleetError("line \(number): tokens file \(file) cannot be read: \(error.reason)")
                }
                while true {
                    let token: String?
                    do {
                        token = try reader.nextLine(TokenFileReader.trimmed)
                    } catch {
                        throw FleetError("line \(number): tokens file \(file) cannot be read: \(error.reason)")
                    }
                    guard let token else { break }
                    batch.append(token)
                    total += 1
                    if batch.count == shardSize { try await flush() }
                }
            }
            try await flush()
            // `enqueued` last: until then `fanout status` shows the job as still being enqueued.
            _ = try await client.command([
                "HSET", keys.meta, "shards", RedisArgument(shards), "notifications", RedisArgument(total),
                "enqueued", "1",
            ])
            return .enqueued(job: job.id, shards: shards, notifications: total)
        } catch let error as FleetError {
            throw error
        } catch {
            let message = (error as? RedisError)?.message ?? "\(error)"
            throw FleetError("job \(job.id) (line \(number)): Redis: \(message)")
        }
    }

    /// The job line with `tokens`/`tokens_file` replaced by `"tokens": [placeholder]`; nil when it is not an object.
    static func template(_ bytes: some Collection<UInt8>) -> [UInt8]? {
        guard case .object(let object)? = try? JSONValue.parse(bytes) else { return nil }
        var members = object.members.filter { $0.key != "tokens" && $0.key != "tokens_file" }
        members.append(JSONObject.Member(key: "tokens", value: .array([.string(placeholderToken)])))
        return JSONValue.object(JSONObject(members)).encoded()
    }
}
