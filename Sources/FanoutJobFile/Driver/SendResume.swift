import Fanout
import FanoutCore
import Foundation

/// What an earlier, killed run left for `fanout send --resume`: its journal, with the results written after the
/// journal's checkpoint (the results file's tail) counted in, and for each job what that run finished: by position
/// (the journal's prefix and out-of-order positions), and by token for the tail.
struct SendResume {
    /// Nil when not resuming.
    private(set) var journal: SendJournal?
    /// Where the results file is cut (after the last complete line of the tail) and appended to.
    private(set) var fileLength = 0
    /// The tail's lines, per job id.
    private var tail: [String: JobLines] = [:]

    /// A job's results lines: its recipients' tokens (counted: a token may appear twice in a job), and whether a
    /// line without a token is among them.
    private struct JobLines {
        var tokens: [String: Int] = [:]
        var ended = false

        mutating func add(_ line: ResultLine.Parsed) {
            if let token = line.token {
                tokens[token, default: 0] += 1
            } else {
                ended = true
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
        guard journal.jobsFile == options.jobsPath, journal.jobsFileSize == jobsSize else {
            throw SendError(
                "--resume: the journal belongs to \(journal.jobsFile) (\(journal.jobsFileSize) bytes), not this job file"
            )
        }
        var resume = SendResume()
        // The file is cut after the last line that parses: a line half written at the kill goes.
        resume.fileLength = try ResultsFileLines.forEach(inFile: results, from: journal.resultsOffset) { bytes in
            guard let line = ResultLine.parse(bytes) else { return false }
            journal.counts.outcomes.add(NotificationOutcome(named: line.outcome))
            resume.tail[line.job, default: JobLines()].add(line)
            return true
        }
        resume.journal = journal
        return resume
    }

    var isResuming: Bool { journal != nil }

    /// Whether the journal records the job on `line` as finished.
    func isFinished(line: Int) -> Bool { journal?.isFinished(line: line) == true }

    /// Whether a line of the job without a token is in the tail.
    func ended(jobID: String) -> Bool { tail[jobID]?.ended == true }

    /// What the earlier run finished of `job` (the one on `line`); nil when not resuming.
    /// - Parameter skippedByToken: told the position of each recipient skipped because its token has a line.
    func resumePoint(for job: FanoutJob, line: Int, skippedByToken: @escaping @Sendable (Int) -> Void)
        -> ResumePoint?
    {
        guard let journal else { return nil }
        let partial = journal.partial[String(line)]
        return ResumePoint(
            prefix: partial?.prefix ?? 0, beyondPrefix: Set(partial?.beyond ?? []),
            tokensDone: tail[job.id]?.tokens ?? [:], skippedByToken: skippedByToken)
    }
}
