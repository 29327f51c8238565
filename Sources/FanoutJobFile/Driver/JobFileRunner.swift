import CommandLineSupport
package import Fanout
import FanoutCore
package import FanoutJobLines
import Foundation

/// What `fanout send` was asked to do.
package struct SendOptions: Sendable {
    package var jobsPath: String
    /// Results file; nil writes results to standard output (then the summary goes to stderr).
    package var resultsPath: String?
    package var summaryPath: String?
    package var invalidTokensPath: String?
    /// Continue the run recorded in the results file's journal.
    package var resume = false
    /// Jobs sent at the same time (each is spread over all loops and connections anyway).
    package var concurrentJobs = 16
    package var progress: ProgressReporter.Mode = .auto
    /// The longest job line read (`JobFileReader`'s limit): a longer one stops the run. Tests lower it.
    package var maximumJobLineLength = JobFileReader.defaultMaximumLineLength
    /// Keep reading the job file as producers append to it, until `JobFileRunner.stopFollowing()`
    /// (`FollowedJobFile`).
    package var follow = false
    /// With `follow`: appends wake the reader at most once per this interval, so that the jobs of a burst are read,
    /// started and recorded together (`FollowedJobFile`); a job appended after a quiet spell is read at once.
    package var followLinger = SendOptions.defaultFollowLinger
    /// 5 ms: at 1,000 jobs a second, about five jobs a wake-up, which halves a followed job's CPU (docs/BENCHMARKS.md,
    /// "Following a job file"), for at most 5 ms more latency.
    package static let defaultFollowLinger = Duration.milliseconds(5)
    /// Told what the run notices about its job file (a rotation, a truncation), for the log.
    package var notice: (@Sendable (String) -> Void)?
    /// With `follow`: told every 200 ms how far producers are ahead (`FollowedQueueLag`): the bytes and complete job
    /// lines written and not read yet, and how long the oldest has waited (`fanout send` puts them in /metrics).
    package var queueLag: (@Sendable (_ bytes: Int, _ jobs: Int, _ oldestAge: Duration?) -> Void)?

    package init(jobsPath: String) {
        self.jobsPath = jobsPath
    }
}

/// Drives the engine from a job file: one job line at a time (several in flight), one results line
/// per (job, token), a journal for `--resume`, the invalid-tokens file and progress.
package final class JobFileRunner: Sendable {
    private let engine: FanoutEngine
    private let options: SendOptions
    /// The followed job file once open, for `stopFollowing()`; and whether a stop came first.
    private let following = FanoutMutex<(file: FollowedJobFile?, stopped: Bool)>((nil, false))

    package init(engine: FanoutEngine, options: SendOptions) {
        self.engine = engine
        self.options = options
    }

    /// With `follow`: stops reading the job file. The jobs already started run to the end and are recorded, and
    /// `run()` returns its summary. Any thread, at any time.
    package func stopFollowing() {
        let file = following.withLock { state -> FollowedJobFile? in
            state.stopped = true
            return state.file
        }
        file?.stop()
    }

    /// Runs every job of the file. Throws `SendError` (nothing sent) when the job file or results
    /// file cannot be used, or the journal does not match. A run cut short after sending, once everything sent is
    /// recorded and the journal written, returns its summary with `cutShort` saying why: the job file could not be
    /// read to its end (the jobs before the failure still run to theirs), or a job's recipients could not all be
    /// read (that job is left unfinished for `--resume`, the others run to the end).
    package func run() async throws -> SendSummary {
        let started = DispatchTime.now()
        var reader: JobFileReader?
        if !options.follow {
            do {
                reader = try JobFileReader(path: options.jobsPath, maximumLineLength: options.maximumJobLineLength)
            } catch {
                throw SendError(error.description)
            }
        }
        guard let jobFile = ReadableFile.kind(of: options.jobsPath) else {
            throw SendError("job file \(options.jobsPath) cannot be read")
        }
        // A pipe, FIFO or standard input can be read once only: nothing else reads it (no count for the progress
        // line), and a journal of it could not be resumed, since its lines cannot be read again.
        if options.resume && !jobFile.isRegular {
            throw SendError(
                "--resume: job file \(options.jobsPath) is a pipe or other stream, which cannot be read again; "
                    + "resume needs a regular file")
        }
        if options.follow && !jobFile.isRegular {
            throw SendError(
                "--follow: job file \(options.jobsPath) is a pipe or other stream; it is read until its writer "
                    + "closes it without --follow")
        }
        let jobsSize = jobFile.size
        let resume = try SendResume.load(options: options, jobsSize: jobsSize)
        let followed = try options.follow ? openFollowedJobFile(resume: resume) : nil
        defer { followed?.stop() }
        let directory = followed?.directory ?? reader?.directory ?? "."
        let invalidTokensFile = try openInvalidTokensFile(resuming: resume.isResuming)
        let writer = try ResultsWriter(
            path: options.resultsPath, journal: options.resultsPath != nil, jobsFile: options.jobsPath,
            jobsFileSize: jobsSize, resumeFrom: resume.journal, fileLength: resume.fileLength)
        if let followed { writer.follow(followed.openFile) }
        let countsAtStart = writer.counts.notifications
        // With --follow, how far producers are ahead: on the progress line and to `queueLag`.
        let queueLag = options.queueLag
        let flusher = DispatchSource.makeTimerSource(queue: .global())
        flusher.schedule(deadline: .now() + .milliseconds(200), repeating: .milliseconds(200))
        // A failed flush is kept by the writer; the final flush below throws it and ends the run.
        flusher.setEventHandler {
            _ = Result { try writer.flush() }
            guard let followed else { return }
            let lag = followed.queueLag.measure()
            queueLag?(lag.bytes, lag.jobs, lag.oldestAge)
        }
        flusher.resume()
        let invalidTokens = invalidTokensFile.map(startInvalidTokensWriter)
        let progress = ProgressReporter(mode: options.progress) { writer.counts }
        if let followed { progress.showQueueLag { followed.queueLag.latest } }
        progress.start()
        defer { progress.stop() }
        let counting = Task.detached { [options] in
            guard jobFile.isRegular, !options.follow else { return }
            if let total = Self.countNotifications(jobsPath: options.jobsPath) { progress.setTotal(total) }
        }
        defer { counting.cancel() }

        var timestamps = JobFileTimestamps()
        var ids = options.follow ? JobFileIDs(window: JobFileIDs.followWindow) : JobFileIDs()
        // Why the job file was not read to its end, if it was not: the jobs already started still run to the end
        // and are recorded (cancelled, their notifications in flight would have ended `cancelled`, a result that
        // `--resume` does not send again, and their answered results would have stayed in the writer's buffer).
        var stoppedReading: SendError?
        let unfinished = UnfinishedJobs()
        await withTaskGroup(of: Void.self) { group in
            var running = 0
            reading: while true {
                let next: JobFileReader.Line?
                do {
                    if let followed {
                        switch try await followed.next() {
                        case .line(let line): next = line
                        case .stopped: next = nil
                        case .replaced(let why):
                            options.notice?(why)
                            // The old file's jobs finish first, so that the journal can name the new file as the
                            // one to resume from (its lines after the old one's, all finished).
                            await group.waitForAll()
                            running = 0
                            guard try await followed.openNewFile() else { break reading }
                            writer.follow(followed.openFile)
                            continue reading
                        }
                    } else {
                        next = try reader?.nextLine()
                    }
                } catch {
                    stoppedReading = SendError("\(error)")
                    break reading
                }
                guard let line = next else { break }
                // Results that cannot be written (a full disk, stdout's reader gone): no new job is started.
                if let failure = writer.failure {
                    stoppedReading = failure
                    break reading
                }
                if resume.isFinished(line: line.number) {
                    // Its id stays taken: a later line that repeats it is refused, as it was in the earlier run.
                    _ = ids.claim(JobLineParser.jobID(of: line.bytes), line: line.number)
                    continue
                }
                // A slot first, then the parse: a job's default timestamp is the moment it starts sending
                // (docs/SEND.md), not the moment its line was read, which behind long jobs can be minutes earlier.
                if running >= options.concurrentJobs {
                    await group.next()
                    running -= 1
                }
                let registry = engine.configuration.registry
                var parsed = await timestamps.parse(
                    line: line.bytes, lineNumber: line.number, jobFileDirectory: directory,
                    now: Int64(Date().timeIntervalSince1970),
                    lastSent: { app, activityID in
                        try? await registry?.activity(app: app, activityID: activityID)?.lastContentTimestamp
                    }
                ).result
                let claim = ids.claim(parsed.jobID, line: line.number)
                if let duplicate = claim.duplicate { parsed = .failure(duplicate) }
                switch parsed {
                case .failure(let error):
                    let id = claim.key
                    // Its `invalid` line is in the tail (and counted): recorded as finished, not written again.
                    if resume.ended(jobID: id) {
                        writer.finishJob(line: line.number, payloadEncodings: 0, demoted: 0)
                        continue
                    }
                    writer.record(
                        NotificationResult(jobID: id, token: nil, outcome: .invalid, reason: error.description),
                        line: line.number)
                    writer.finishJob(line: line.number, payloadEncodings: 0, demoted: 0)
                case .success(let parsed):
                    var job = FanoutJob(parsed.job)
                    let number = line.number
                    let id = job.id
                    if resume.ended(jobID: id) {
                        writer.finishJob(line: number, payloadEncodings: 0, demoted: 0)
                        continue
                    }
                    do {
                        job.alreadyDone = try resume.resumePoint(for: job, line: number) {
                            writer.markDone(positions: [$0], line: number, job: id)
                        }
                    } catch {
                        stoppedReading = error as? SendError ?? SendError("\(error)")
                        break reading
                    }
                    running += 1
                    if SendResume.isRegistryAddressed(job.recipients) {
                        writer.beginRegistryJob(
                            line: number, job: id, linesFrom: resume.registryLinesStart(line: number),
                            broadcastDone: job.alreadyDone?.beyondPrefix.contains(
                                FanoutEngine.activityBroadcastPosition) == true)
                    }
                    let engine = self.engine
                    group.addTask {
                        await Self.send(job, line: number, engine: engine, writer: writer, unfinished: unfinished)
                        // Following a queue, a job's results go out when it ends, not at the next 200 ms flush:
                        // a producer waiting for them sees them in milliseconds. (The journal keeps its cadence.)
                        if followed != nil { _ = try? writer.flush(syncAndJournal: false) }
                    }
                }
            }
            await group.waitForAll()
        }
        flusher.cancel()
        // After sending, a results write that fails cuts the run short (exit 1), as a failed read does.
        var flushFailure: SendError?
        do { try writer.flush() } catch { flushFailure = error as? SendError ?? SendError("\(error)") }
        await engine.shutdown()
        await invalidTokens?.value
        // Everything sent has its line and the journal covers it: a later `--resume` takes over from here.
        let cutShort =
            flushFailure.map { "\($0.description); the results after the last written line are lost" }
            ?? stoppedReading.map {
                "\($0.description); the jobs before it ran to the end and are recorded"
                    + (options.resultsPath == nil ? "" : " (fanout send --resume goes on from there)")
            } ?? unfinished.message(resumable: options.resultsPath != nil)
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - started.uptimeNanoseconds) / 1e9
        let counts = writer.counts
        return SendSummary(
            counts: counts, seconds: seconds, rate: Double(counts.notifications - countsAtStart) / max(seconds, 1e-9),
            cutShort: cutShort, notificationsThisRun: counts.notifications - countsAtStart)
    }

    /// The followed job file, from where an earlier run's journal stopped: the same file (by device and inode) goes
    /// on with its line numbers; another file at the path (rotated while no sender ran) is read from its start, its
    /// lines numbered after every line the journal knows, and the log says so.
    private func openFollowedJobFile(resume: SendResume) throws -> FollowedJobFile {
        guard let status = ReadableFile.kind(of: options.jobsPath), status.isRegular else {
            throw SendError("job file \(options.jobsPath) cannot be read")
        }
        var base = 0
        if let followed = resume.journal?.followed {
            if FollowedJobFile.identity(ofPath: options.jobsPath) == followed.file {
                base = followed.lineNumberBase
            } else {
                base = resume.journal?.highestLine ?? 0
                options.notice?(
                    "job file \(options.jobsPath) is not the file the journal followed (rotated while stopped); "
                        + "reading it from its start, after line \(base)")
            }
        }
        let file: FollowedJobFile
        do {
            file = try FollowedJobFile(
                path: options.jobsPath, maximumLineLength: options.maximumJobLineLength, lineNumberBase: base,
                linger: options.followLinger)
        } catch {
            throw SendError(error.description)
        }
        let stopped = following.withLock { state -> Bool in
            state.file = file
            return state.stopped
        }
        if stopped { file.stop() }
        return file
    }

    /// Runs one job, its results into `writer`. A job that fails validation gets its one `invalid` line and is
    /// finished. One whose recipients could not all be read (a tokens file or the registry failing mid-read, or the
    /// registry unreachable when the job starts) is not: what was sent has its lines, the rest has none, and the job
    /// stays unfinished in the journal, so that `--resume` sends the rest; it goes into `unfinished` for the run's
    /// error. (The engine reports that failure as a job-level `invalid` result too, from a run that returns: as a
    /// line it would end the job for `--resume`, and the rest would never be sent.)
    private static func send(
        _ job: FanoutJob, line: Int, engine: FanoutEngine, writer: ResultsWriter, unfinished: UnfinishedJobs
    ) async {
        let jobLevel = FanoutMutex<NotificationResult?>(nil)
        do {
            let summary = try await engine.run(job) { result in
                if result.tokenValue == nil && result.channel == nil {
                    jobLevel.withLock { $0 = result }
                } else {
                    writer.record(result, line: line)
                }
            }
            if let failure = jobLevel.withLock({ $0 }) {
                unfinished.add(job: job.id, line: line, reason: failure.reason ?? "its recipients could not be read")
                return
            }
            writer.finishJob(line: line, payloadEncodings: summary.payloadEncodings, demoted: summary.demoted)
        } catch {
            guard error.kind == .invalidNotification else {
                // Not a verdict on the job (the registry could not be asked, the engine shut down): left to resume.
                return unfinished.add(job: job.id, line: line, reason: error.message)
            }
            if var invalid = jobLevel.withLock({ $0 }) {
                // Every `invalid` line names its line, the parser's and the engine's refusals alike.
                invalid.reason = "line \(line): " + (invalid.reason ?? error.message)
                writer.record(invalid, line: line)
            }
            writer.finishJob(line: line, payloadEncodings: 0, demoted: 0)
        }
    }

    /// How many notifications the job file names (inline tokens, lines of token files, one per
    /// invalid line), counted in the background for the progress line's total and ETA; nil when a
    /// file cannot be read to the end, or a job addresses the registry (the progress line then shows
    /// no total).
    static func countNotifications(jobsPath: String) -> Int? {
        do {
            let reader = try JobFileReader(path: jobsPath)
            let parser = JobLineParser()
            var ids = JobFileIDs()
            var total = 0
            while let line = try reader.nextLine() {
                if Task.isCancelled { return nil }
                var parsed = parser.parse(
                    line: line.bytes, lineNumber: line.number, jobFileDirectory: reader.directory, now: 0)
                if let duplicate = ids.claim(parsed.jobID, line: line.number).duplicate { parsed = .failure(duplicate) }
                switch parsed {
                case .failure: total += 1
                case .success(let parsed):
                    switch parsed.job.recipients {
                    case .tokens(let tokens): total += tokens.count
                    case .file(let path): total += try countLines(path)
                    case .channel: total += 1
                    case .activity, .pushToStart, .devices: return nil  // known only once read from the registry
                    }
                }
            }
            return total
        } catch {
            return nil
        }
    }

    /// The non-blank lines of a tokens file (what the engine will read from it).
    private static func countLines(_ path: String) throws(FileReadError) -> Int {
        let reader = try ChunkedLineReader(path: path)
        var count = 0
        while try reader.nextLine({ _ in () }) != nil { count += 1 }
        return count
    }

    /// The `--invalid-tokens` file, opened before anything is sent: emptied for a new run, appended to by a
    /// `--resume` (the tokens the interrupted run invalidated are still to be dropped). One that cannot be opened
    /// ends the run before it starts.
    private func openInvalidTokensFile(resuming: Bool) throws -> UncheckedOutputFile? {
        guard let path = options.invalidTokensPath else { return nil }
        do throws(OutputFile.Failure) {
            // Written through (a device or a link stays what it is), appended to on a resume.
            return UncheckedOutputFile(file: try OutputFile(path: path, append: resuming))
        } catch {
            throw SendError("--invalid-tokens: \(error.message)")
        }
    }

    private func startInvalidTokensWriter(_ output: UncheckedOutputFile) -> Task<Void, Never> {
        let stream = engine.invalidTokens
        return Task.detached {
            let handle = output.file
            defer { try? handle.close() }
            for await token in stream {
                var line: [UInt8] = Array("{\"token\":".utf8)
                JSONStringEscaping.appendString(token.token, to: &line)
                line += Array(",\"reason\":".utf8)
                JSONStringEscaping.appendString(token.reason, to: &line)
                line += Array(",\"timestamp\":\(token.timestamp.map(String.init) ?? "null"),\"job\":".utf8)
                JSONStringEscaping.appendString(token.jobID, to: &line)
                line += Array("}\n".utf8)
                // On a full disk or a reader gone, later lines are dropped.
                guard (try? handle.write(line)) != nil else {
                    StandardStream.error.write(
                        "fanout send: cannot write the invalid-tokens file; its later lines are lost\n")
                    for await _ in stream {}
                    return
                }
            }
        }
    }
}

/// The jobs of a run that stopped before their last recipient (see `JobFileRunner.send`), for the run's error.
private final class UnfinishedJobs: Sendable {
    private let jobs = FanoutMutex<[(job: String, line: Int, reason: String)]>([])

    func add(job: String, line: Int, reason: String) {
        jobs.withLock { $0.append((job, line, reason)) }
    }

    /// `job "v" (line 3) stopped before its last recipient: …`, naming the first by line and counting the others;
    /// nil when every job ran to the end.
    /// - Parameter resumable: the run has a results file (and so a journal) for `--resume`.
    func message(resumable: Bool) -> String? {
        let stopped = jobs.withLock { $0 }.sorted { $0.line < $1.line }
        guard let first = stopped.first else { return nil }
        var message =
            "job \(JSONValue.string(first.job).description) (line \(first.line)) stopped before its last recipient: "
            + first.reason
        if stopped.count > 1 { message += " (and \(stopped.count - 1) more job(s) stopped the same way)" }
        message +=
            resumable
            ? ". What was sent is recorded; fanout send --resume sends the rest"
            : ". What was sent has its results lines"
        return message
    }
}

/// The invalid-tokens file, handed to the one task that writes it (and nothing else touches).
struct UncheckedOutputFile: @unchecked Sendable {
    let file: OutputFile
}
