import Fanout
import FanoutCore
import FanoutJobLines
import Foundation

/// Appends results lines (from any thread), keeps the counts and each running job's progress,
/// and at every flush writes the buffered lines, syncs them, then rewrites the journal that
/// describes them. Between flushes the lines go to the file (written, not synced) every
/// `writeThreshold` bytes, so a killed process leaves at most that much of them unwritten: a resumed
/// run finds written lines past the journal's offset in the file's tail, and sends again only what
/// has no line (what was in flight, and those few). Memory is bounded: the buffer holds less than
/// `writeThreshold`, and a job's progress is a prefix plus the few positions finished out of order.
final class ResultsWriter: Sendable {
    private struct Progress {
        var job: String
        var prefix = 0
        var beyond = Set<Int>()
        /// A registry-addressed job's `SendJournal.PartialJob.tokensFrom`.
        var tokensFrom: Int?

        mutating func done(_ position: Int) {
            guard position >= prefix else { return }
            if position == prefix {
                prefix += 1
                while beyond.remove(prefix) != nil { prefix += 1 }
            } else {
                beyond.insert(position)
            }
        }
    }

    private struct State {
        var buffer: [UInt8] = []
        /// The buffer the last flush wrote, emptied: the next flush swaps it in, so that a flush allocates nothing.
        var spare: [UInt8] = []
        var progress: [Int: Progress] = [:]
        var finished = LineRanges()
        var counts = SendCounts()
    }

    private let state: FanoutMutex<State>
    /// Serialises flushes (file writes happen outside the state lock).
    private let flushLock = FanoutMutex(())
    private let descriptor: Int32
    private let journalPath: String?
    private let jobsFile: String
    private let jobsFileSize: Int
    /// With `--follow`: the file being read, for the journal.
    private let followed = FanoutMutex<SendJournal.FollowedFile?>(nil)
    private let offset: FanoutMutex<Int>

    /// 64 KiB: about 200 lines, a write(2) every few hundred results, and at most about that many lines a SIGKILL can
    /// lose and a resumed run then sends again (1 MiB would be about 3,000).
    static let writeThreshold = 64 << 10

    /// Opens (appending) the results file at `path`, or standard output when nil.
    /// - Parameter resumeFrom: the journal state to continue (its counts and progress), already
    ///   reconciled with the results file's tail by the caller; the file is truncated to `fileLength`.
    init(
        path: String?, journal: Bool, jobsFile: String, jobsFileSize: Int, resumeFrom: SendJournal?, fileLength: Int
    ) throws {
        if let path {
            descriptor = open(path, O_WRONLY | O_CREAT, 0o644)
            guard descriptor >= 0 else { throw SendError("cannot open the results file \(path) for writing") }
            guard ftruncate(descriptor, off_t(fileLength)) == 0, lseek(descriptor, off_t(fileLength), SEEK_SET) >= 0
            else {
                throw SendError("cannot position the results file \(path)")
            }
            journalPath = journal ? SendJournal.path(forResults: path) : nil
        } else {
            descriptor = STDOUT_FILENO
            journalPath = nil
        }
        self.jobsFile = jobsFile
        self.jobsFileSize = jobsFileSize
        offset = FanoutMutex(fileLength)
        var initial = State()
        if let resumeFrom {
            initial.counts = resumeFrom.counts
            initial.finished = LineRanges(resumeFrom.finishedLines)
            for (line, partial) in resumeFrom.partial {
                guard let number = Int(line) else { continue }
                initial.progress[number] = Progress(
                    job: partial.job, prefix: partial.prefix, beyond: Set(partial.beyond),
                    tokensFrom: partial.tokensFrom)
            }
        }
        state = FanoutMutex(initial)
    }

    deinit {
        if descriptor != STDOUT_FILENO { close(descriptor) }
    }

    /// Records one result of the job on `line`.
    func record(_ result: NotificationResult, line: Int) {
        let mustWrite = state.withLock { state -> Bool in
            ResultLine.append(result, to: &state.buffer)
            state.counts.outcomes.add(result)
            if result.channel != nil { state.counts.broadcasts += 1 }
            if result.position >= 0 {
                state.progress[line, default: Progress(job: result.jobID)].done(result.position)
            }
            return state.buffer.count >= Self.writeThreshold
        }
        // A failure is kept by the writer and ends the run at its next flush.
        if mustWrite { _ = Result { try flush(syncAndJournal: false) } }
    }

    /// Marks recipients that an earlier run finished (found in the results file's tail) as done.
    func markDone(positions: [Int], line: Int, job: String) {
        state.withLock { state in
            for position in positions { state.progress[line, default: Progress(job: job)].done(position) }
        }
    }

    /// The job on `line` is about to send to recipients read from the registry: its journal entry records where
    /// its lines start (`SendJournal.PartialJob.tokensFrom`), since a resumed run finds what it finished by token,
    /// not by position. Any positions an earlier run recorded are dropped (they no longer name its recipients); the
    /// activity broadcast's stays when `broadcastDone`.
    /// - Parameter linesFrom: where an earlier run's lines of the job can start; nil for a job not begun before,
    ///   whose lines start after what this writer has taken so far.
    func beginRegistryJob(line: Int, job: String, linesFrom: Int?, broadcastDone: Bool) {
        state.withLock { state in
            // Lines taken by a flush that has not counted them in `offset` yet make this an earlier offset than
            // the job's first line: still a place to start reading from.
            let from = linesFrom ?? (offset.withLock { $0 } + state.buffer.count)
            state.progress[line] = Progress(
                job: job, beyond: broadcastDone ? [FanoutEngine.activityBroadcastPosition] : [], tokensFrom: from)
        }
    }

    /// The job on `line` has all its results.
    func finishJob(line: Int, payloadEncodings: Int, demoted: Int) {
        state.withLock { state in
            state.progress[line] = nil
            state.finished.insert(line)
            state.counts.jobs += 1
            state.counts.payloadEncodings += payloadEncodings
            state.counts.demoted += demoted
        }
    }

    var counts: SendCounts { state.withLock { $0.counts } }

    /// The first write that failed: results taken from the buffer for it are lost, so every later
    /// flush fails with it too, and the run ends with this error instead of a results file with a hole.
    private let writeFailure = FanoutMutex<SendError?>(nil)

    /// Writes what is buffered, syncs it, then records the journal describing it (or, with `syncAndJournal`
    /// false, only writes it).
    /// The first failure to write the results or the journal, if one happened (the run stops reading new jobs).
    var failure: SendError? { writeFailure.withLock { $0 } }

    /// With `--follow`: the file now read (its identity, and the line number its first line follows), recorded in
    /// every later journal.
    func follow(_ file: (identity: String, lineNumberBase: Int)?) {
        followed.withLock {
            $0 = file.map { SendJournal.FollowedFile(file: $0.identity, lineNumberBase: $0.lineNumberBase) }
        }
    }

    /// - Throws: the first failure to write the results or the journal, now and on every later call.
    func flush(syncAndJournal: Bool = true) throws {
        if let failure = writeFailure.withLock({ $0 }) { throw failure }
        do {
            try flushOnce(syncAndJournal: syncAndJournal)
        } catch {
            let failure = error as? SendError ?? SendError("cannot write the results journal: \(error)")
            writeFailure.withLock { $0 = $0 ?? failure }
            throw failure
        }
    }

    private func flushOnce(syncAndJournal: Bool) throws {
        try flushLock.withLock { _ in
            var bytes: [UInt8] = []
            let journal = state.withLock { state -> SendJournal? in
                swap(&bytes, &state.spare)
                swap(&bytes, &state.buffer)
                guard syncAndJournal, journalPath != nil else { return nil }
                let end = offset.withLock { $0 } + bytes.count
                var partial: [String: SendJournal.PartialJob] = [:]
                for (line, progress) in state.progress {
                    partial[String(line)] = SendJournal.PartialJob(
                        job: progress.job, prefix: progress.prefix, beyond: progress.beyond.sorted(),
                        tokensFrom: progress.tokensFrom)
                }
                let journal = SendJournal(
                    jobsFile: jobsFile, jobsFileSize: jobsFileSize, resultsOffset: end,
                    finishedLines: state.finished.ranges, partial: partial, counts: state.counts,
                    followed: followed.withLock { $0 })
                return journal
            }
            var written = 0
            while written < bytes.count {
                let count = bytes.withUnsafeBytes {
                    Foundation.write(descriptor, $0.baseAddress! + written, bytes.count - written)
                }
                guard count > 0 else {
                    throw SendError("cannot write the results file: \(String(cString: strerror(errno)))")
                }
                written += count
            }
            offset.withLock { $0 += bytes.count }
            bytes.removeAll(keepingCapacity: true)
            state.withLock { swap(&$0.spare, &bytes) }
            guard let journal, let journalPath else { return }
            fsync(descriptor)
            try journal.write(to: journalPath)
        }
    }
}
