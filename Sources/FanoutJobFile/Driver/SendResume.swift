import Fanout
import FanoutCore
import FanoutJobLines
import Foundation

/// What an earlier, killed run left for `fanout send --resume`: its journal, with the results written after the
/// journal's checkpoint (the results file's tail) counted in, and for each job what that run finished.
///
/// A recipient is finished when it has a results line. A job whose recipients keep their positions between runs
/// (inline tokens, a tokens file, a channel) is told them by position (the journal's prefix and out-of-order
/// positions), and by token for the tail. A job addressed through the registry reads its recipients again from a
/// registry that changed meanwhile (the first run removed the tokens APNs invalidated; others expired, rotated or
/// were added), so its positions name other tokens: it is told them by token alone, from its lines in the results
/// file (from `SendJournal.PartialJob.tokensFrom` on).
struct SendResume {
    /// Nil when not resuming.
    private(set) var journal: SendJournal?
    /// Where the results file is cut (after the last complete line of the tail) and appended to.
    private(set) var fileLength = 0
    private var resultsPath = ""
    /// The tail's lines, per job id.
    private var tail: [String: JobLines] = [:]

    /// A job's results lines: its recipients' tokens (counted: a token may appear twice in a job), the channels of
    /// its broadcasts, and whether its own line is among them.
    private struct JobLines {
        var tokens: [String: Int] = [:]
        var channels: [String: Int] = [:]
        /// The job's own line (`ResultLine.Parsed.isJobLine`) ends it.
        var ended = false

        mutating func add(_ line: ResultLine.Parsed) {
            if line.isJobLine {
                ended = true
            } else if let token = line.token {
                tokens[token, default: 0] += 1
            } else if let channel = line.channel {
                channels[channel, default: 0] += 1
            }
        }
    }

    /// Nothing to resume: a new run (which removes any journal of an earlier one), or `--resume` refused with a
    /// `SendError` when there is no journal of this job file.
    static func load(options: SendOptions, jobsSize: Int) throws -> SendResume {
        guard options.resume else {
            if let results = options.resultsPath {
                try? FileManager.default.removeItem(atPath: SendJournal.path(forResults: results))
            }
            return SendResume()
        }
        guard let results = options.resultsPath else {
            throw SendError("--resume needs --results FILE (its journal holds the progress)")
        }
        guard var journal = try? SendJournal.load(from: SendJournal.path(forResults: results)) else {
            throw SendError(
                "--resume: no usable journal at \(SendJournal.path(forResults: results)); run without --resume to start over"
            )
        }
        guard journal.version == SendJournal.currentVersion else {
            throw SendError(
                "--resume: the journal is version \(journal.version), written by another fanout (this one reads "
                    + "version \(SendJournal.currentVersion)); resume with that one, or run without --resume to start over"
            )
        }
        // A followed job file grows (or is rotated) between runs: its journal names where reading goes on.
        guard journal.jobsFile == options.jobsPath,
            options.follow ? journal.followed != nil : journal.jobsFileSize == jobsSize
        else {
            throw SendError(
                "--resume: the journal belongs to \(journal.jobsFile) (\(journal.jobsFileSize) bytes), not this job file"
            )
        }
        var resume = SendResume()
        resume.resultsPath = results
        // The file is cut after the last line that parses: a line half written at the kill goes.
        resume.fileLength = try ResultsFileLines.forEach(inFile: results, from: journal.resultsOffset) { bytes in
            guard let line = ResultLine.parse(bytes) else { return false }
            // The counts of every result the file holds: the journal's, and the tail's as the writer counts them.
            journal.counts.outcomes.add(NotificationOutcome(named: line.outcome), retries: max(0, line.attempts - 1))
            if line.channel != nil { journal.counts.broadcasts += 1 }
            resume.tail[line.job, default: JobLines()].add(line)
            return true
        }
        resume.journal = journal
        return resume
    }

    var isResuming: Bool { journal != nil }

    /// Whether the journal records the job on `line` as finished.
    func isFinished(line: Int) -> Bool { journal?.isFinished(line: line) == true }

    /// Whether the job's own line (an `invalid` job) is in the tail: the job is over, though the journal does not
    /// say so yet.
    func ended(jobID: String) -> Bool { tail[jobID]?.ended == true }

    /// Whether the job reads its recipients from the registry (so they are not where they were in an earlier run).
    static func isRegistryAddressed(_ recipients: Recipients) -> Bool {
        switch recipients {
        case .activity, .pushToStart, .devices: return true
        case .tokens, .file, .sequence, .channel: return false
        }
    }

    /// Where in the results file an earlier run's lines of the registry-addressed job on `line` can start: its journal
    /// entry's `tokensFrom`; the start of the file for an entry without one (written before the field existed; such a
    /// journal is version 1, which `load` refuses); the tail for a job the journal does not know (begun after the
    /// checkpoint, or not at all). Nil when not resuming.
    func registryLinesStart(line: Int) -> Int? {
        guard let journal else { return nil }
        guard let partial = journal.partial[String(line)] else { return journal.resultsOffset }
        return partial.tokensFrom ?? 0
    }

    /// What the earlier run finished of `job` (the one on `line`); nil when not resuming.
    /// - Parameter skippedByToken: told the position of each recipient skipped because its token has a line.
    /// - Throws: `SendError` when the results file cannot be read.
    func resumePoint(for job: FanoutJob, line: Int, skippedByToken: @escaping @Sendable (Int) -> Void) throws
        -> ResumePoint?
    {
        guard let journal else { return nil }
        let partial = journal.partial[String(line)]
        var lines = tail[job.id] ?? JobLines()
        guard Self.isRegistryAddressed(job.recipients), let start = registryLinesStart(line: line) else {
            // A channel job's one recipient is its channel, and its line names it as `channel`.
            return ResumePoint(
                prefix: partial?.prefix ?? 0, beyondPrefix: Set(partial?.beyond ?? []),
                tokensDone: lines.tokens.merging(lines.channels, uniquingKeysWith: +), skippedByToken: skippedByToken)
        }
        if start < journal.resultsOffset {
            try readLines(of: job.id, from: start, to: journal.resultsOffset, into: &lines)
        }
        // An activity's broadcast, sent before its token pushes, is not sent again once it has a line.
        let broadcastDone =
            !lines.channels.isEmpty || partial?.beyond.contains(FanoutEngine.activityBroadcastPosition) == true
        return ResumePoint(
            prefix: 0, beyondPrefix: broadcastDone ? [FanoutEngine.activityBroadcastPosition] : [],
            tokensDone: lines.tokens, skippedByToken: skippedByToken)
    }

    /// Adds the job's lines between the two offsets to `lines`. Only lines that begin as `ResultLine.append` writes
    /// the job's are parsed, so the other jobs' lines in between cost a comparison, not a JSON parse.
    private func readLines(of jobID: String, from start: Int, to end: Int, into lines: inout JobLines) throws {
        var prefix = Array(#"{"job":"#.utf8)
        JSONStringEscaping.appendString(jobID, to: &prefix)
        prefix.append(UInt8(ascii: ","))
        do {
            _ = try ResultsFileLines.forEach(inFile: resultsPath, from: start, to: end) { bytes in
                if bytes.starts(with: prefix), let line = ResultLine.parse(bytes), line.job == jobID { lines.add(line) }
                return true
            }
        } catch {
            throw SendError("--resume: cannot read the results file \(resultsPath): \(error)")
        }
    }
}
