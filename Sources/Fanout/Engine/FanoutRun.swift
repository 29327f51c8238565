import FanoutCore
import Foundation
import Synchronization

/// What a finished job came to.
public struct JobSummary: Sendable {
    public var jobID: String
    /// Results (one per token, plus one per broadcast).
    public var notifications: Int
    public var counts: OutcomeCounts
    /// Payload encodings done for this job: 1 with batch encoding, whatever the token count.
    public var payloadEncodings: Int
    /// Notifications sent at priority 5 instead of 10 by the activity priority-10 guard.
    public var demoted = 0
    public var seconds: Double
    /// Broadcast requests among the results (one per channel the job reached; their results carry `channel`).
    public var broadcasts = 0
}

/// One job in progress: results arrive from the loops' results threads (and from the feeding task, for results decided
/// before a loop: bad tokens, rate-limited, stopped), counts accumulate, and whoever
/// awaits `summary()` is resumed when the last notification has its outcome.
///
/// `cancel()` (or cancelling the task that iterates `results`) ends the job early: what was not sent
/// yet ends `cancelled`, open streams are reset and end `cancelled` unless their answer came first,
/// and the summary still counts every notification once.
public final class FanoutRun: Sendable {
    public let jobID: String
    /// Every notification's result, in completion order. Consume it, or start the job with
    /// `FanoutEngine.run(_:onResult:)` instead: results not consumed stay buffered here.
    public let results: AsyncStream<NotificationResult>
    private let continuation: AsyncStream<NotificationResult>.Continuation?
    private let onResult: (@Sendable (NotificationResult) -> Void)?
    /// The loop that finishes a notification of this run delivers its result itself, at the end of its turn,
    /// instead of handing it to its results thread. Only for runs whose `onResult` is the engine's own and costs
    /// next to nothing (`FanoutEngine.send` keeps the result for its caller): the results thread exists so that a
    /// caller's slow handler cannot stall a loop, and for a lone send its wake-up would be a third of the loop's CPU.
    let deliversOnLoop: Bool
    /// A run made for one `FanoutEngine.send` (`init(sendOf:metricsListener:cancelOnLoops:)`): its one result resumes
    /// the calling task (`waitForResult`) straight from whoever delivers it, with no handler, counts or summary.
    let isSend: Bool
    /// The task of a `send` run, resumed once with the result by `deliver`. Written once, by the calling task before
    /// it hands the notification to its loop (`LoopThread.execute`, whose lock orders the write before the loop's
    /// read), and taken once by the delivery: the notification has exactly one result, delivered after that hand-off
    /// (or by the calling task itself when the hand-off failed).
    private nonisolated(unsafe) var sendWaiter: UnsafeContinuation<NotificationResult, Never>?
    /// Told of the outcomes `record` gives (those of notifications that never reached a loop; a loop's results thread
    /// tells it of the others).
    private let metricsListener: (any FanoutMetricsListener)?
    private let started = DispatchTime.now()
    private let cancelledFlag = Atomic<Bool>(false)
    private let supersededFlag = Atomic<Bool>(false)
    /// The run was stopped by its deadline (`expire()`), not by a caller's cancel: what it stops ends `failed`,
    /// reason `DeadlineExceeded`. Set before `cancelledFlag`.
    private let deadlineFlag = Atomic<Bool>(false)
    /// Ends the wait the run's feeding is in (for room in flight), when the run is stopped while it waits.
    private let waitCanceller = FanoutMutex<(@Sendable () -> Void)?>(nil)
    /// Tells the engine's loops to drop this run's queued notifications and reset its open streams.
    private let cancelOnLoops: @Sendable (FanoutRun) -> Void
    /// The task feeding a `submit`ted job, cancelled with the run.
    private let feeder = FanoutMutex<Task<Void, Never>?>(nil)

    private struct State {
        var counts = OutcomeCounts()
        var submitted = 0
        var completed = 0
        var allSubmitted = false
        var summary: JobSummary?
        /// Who awaits `summary()`: nearly always one caller (`run`, `send`), kept inline so that a job allocates no
        /// array for it. Each is resumed exactly once, under this lock's rules (taken out when the summary is set,
        /// never added after), so the unchecked continuation's canary allocation is not needed.
        var firstWaiter: UnsafeContinuation<JobSummary, Never>?
        var otherWaiters: [UnsafeContinuation<JobSummary, Never>] = []
        var payloadEncodings = 0
        var demoted = 0
        var broadcasts = 0
    }
    private let state = FanoutMutex(State())

    /// The `results` of a run whose results go to its handler: one stream, finished, shared by every such run (its
    /// `next()` returns nil at once, so any number of tasks may iterate it), instead of a stream made per job.
    private static let finishedResults: AsyncStream<NotificationResult> = {
        let (stream, continuation) = AsyncStream<NotificationResult>.makeStream()
        continuation.finish()
        return stream
    }()

    init(
        jobID: String, onResult: (@Sendable (NotificationResult) -> Void)?, deliversOnLoop: Bool,
        metricsListener: (any FanoutMetricsListener)? = nil, isSend: Bool = false,
        cancelOnLoops: @escaping @Sendable (FanoutRun) -> Void
    ) {
        self.jobID = jobID
        self.metricsListener = metricsListener
        self.onResult = onResult
        self.deliversOnLoop = deliversOnLoop
        self.isSend = isSend
        self.cancelOnLoops = cancelOnLoops
        if onResult == nil && !isSend {
            let (stream, continuation) = AsyncStream<NotificationResult>.makeStream(bufferingPolicy: .unbounded)
            results = stream
            self.continuation = continuation
        } else {
            results = Self.finishedResults
            continuation = nil
        }
        // The consumer's task was cancelled while iterating: nobody wants the rest of this job.
        continuation?.onTermination = { [weak self] termination in
            if case .cancelled = termination { self?.cancel() }
        }
    }

    /// The run of one `send`: delivered on its loop (`deliversOnLoop`), its result resuming the task that called
    /// `waitForResult`.
    convenience init(
        sendOf jobID: String, metricsListener: (any FanoutMetricsListener)?,
        cancelOnLoops: @escaping @Sendable (FanoutRun) -> Void
    ) {
        self.init(
            jobID: jobID, onResult: nil, deliversOnLoop: true, metricsListener: metricsListener, isSend: true,
            cancelOnLoops: cancelOnLoops)
    }

    /// A `send` run: `continuation` is resumed with the notification's result. Call once, before the notification is
    /// handed to a loop.
    func waitForResult(_ continuation: UnsafeContinuation<NotificationResult, Never>) {
        precondition(isSend && sendWaiter == nil, "one waiter, for a send's run")
        sendWaiter = continuation
    }

    /// Cancels the job: feeding stops at once, notifications not sent yet end `cancelled`, open streams
    /// are reset (CANCEL) and end `cancelled` unless their answer arrives first. Idempotent.
    public func cancel() {
        guard cancelledFlag.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
        else { return }
        feeder.withLock { $0 }?.cancel()
        waitCanceller.withLock { $0 }?()
        cancelOnLoops(self)
    }

    /// Whether `cancel()` was called (or the run's deadline passed).
    public var isCancelled: Bool { cancelledFlag.load(ordering: .acquiring) }

    /// Stops the run because its call's deadline passed: as `cancel()`, but what it stops ends `failed` with
    /// reason `DeadlineExceeded`.
    func expire() {
        deadlineFlag.store(true, ordering: .releasing)
        cancel()
    }

    /// Whether the run was stopped by its deadline.
    var deadlinePassed: Bool { deadlineFlag.load(ordering: .acquiring) }

    /// The outcome of a notification the run's stop ended: `cancelled`, or `failed` once its deadline passed.
    var stopOutcome: NotificationOutcome { deadlinePassed ? .failed : .cancelled }
    /// Its reason: `Cancelled` or `DeadlineExceeded`.
    var stopReason: String { deadlinePassed ? "DeadlineExceeded" : "Cancelled" }

    /// Runs `wait` (a wait for room in flight) so that stopping the run ends it: `cancel` is how to end it, and it
    /// is called at once when the run is stopped already.
    func stoppable<T>(_ wait: () async -> T, cancel: @escaping @Sendable () -> Void) async -> T {
        waitCanceller.withLock { $0 = cancel }
        if isCancelled { cancel() }
        defer { waitCanceller.withLock { $0 = nil } }
        return await wait()
    }

    /// A newer update for the same activity replaced this job: what is not on the wire yet ends
    /// `superseded`.
    func markSuperseded() { supersededFlag.store(true, ordering: .releasing) }

    var isSuperseded: Bool { supersededFlag.load(ordering: .acquiring) }

    func countDemoted(_ count: Int) {
        state.withLock { $0.demoted += count }
    }

    func setFeeder(_ task: Task<Void, Never>) {
        feeder.withLock { $0 = task }
        if isCancelled { task.cancel() }
    }

    /// Waits for the job to finish and returns its counts.
    public func summary() async -> JobSummary {
        await withUnsafeContinuation { continuation in
            let ready = state.withLock { state -> JobSummary? in
                if let summary = state.summary { return summary }
                if state.firstWaiter == nil {
                    state.firstWaiter = continuation
                } else {
                    state.otherWaiters.append(continuation)
                }
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }

    /// The counts so far (for progress).
    public var countsSoFar: OutcomeCounts { state.withLock { $0.counts } }

    func countEncoding() {
        state.withLock { $0.payloadEncodings += 1 }
    }

    func didSubmit(_ count: Int) {
        state.withLock { $0.submitted += count }
    }

    /// No more notifications will be submitted; finishes now if all are done.
    func didFinishSubmitting() {
        finishIfDone { $0.allSubmitted = true }
    }

    /// Records one notification's outcome: delivers and counts it. Called exactly once per notification that never
    /// reached a loop, on any thread (a loop's results go through `deliver` and `countDelivered`).
    func record(_ result: NotificationResult) {
        metricsListener?.notificationFinished(outcome: result.outcome, reason: result.reason, latency: nil)
        deliver(result)
        finishIfDone { state in
            state.counts.add(result)
            state.completed += 1
            if result.channel != nil { state.broadcasts += 1 }
        }
    }

    /// Hands one result to the caller (its `onResult`, or `results`; a `send` run's waiting task) without counting
    /// it: a loop's results thread delivers a batch this way, then counts the batch with one `countDelivered`. Every
    /// result delivered must be counted, after it is delivered, for the summary to come.
    func deliver(_ result: NotificationResult) {
        if isSend {
            guard let waiter = sendWaiter else { preconditionFailure("a send's result is delivered once") }
            sendWaiter = nil
            waiter.resume(returning: result)
            return
        }
        if let onResult { onResult(result) } else { continuation?.yield(result) }
    }

    /// Counts results already `deliver`ed, under one lock; finishes the run when they were its last.
    func countDelivered(_ counts: OutcomeCounts, results: Int, broadcasts: Int) {
        // A send's caller has its one result already and awaits no summary.
        guard !isSend else { return }
        finishIfDone { state in
            state.counts.add(counts)
            state.completed += results
            state.broadcasts += broadcasts
        }
    }

    private func finishIfDone(_ update: (inout State) -> Void) {
        typealias Waiter = UnsafeContinuation<JobSummary, Never>
        let (summary, first, others) = state.withLock { state -> (JobSummary?, Waiter?, [Waiter]) in
            update(&state)
            guard state.summary == nil, state.allSubmitted, state.completed == state.submitted else {
                return (nil, nil, [])
            }
            let seconds = Double(DispatchTime.now().uptimeNanoseconds - started.uptimeNanoseconds) / 1e9
            let summary = JobSummary(
                jobID: jobID, notifications: state.completed, counts: state.counts,
                payloadEncodings: state.payloadEncodings, demoted: state.demoted, seconds: seconds,
                broadcasts: state.broadcasts)
            state.summary = summary
            defer {
                state.firstWaiter = nil
                state.otherWaiters = []
            }
            return (summary, state.firstWaiter, state.otherWaiters)
        }
        guard let summary else { return }
        continuation?.finish()
        first?.resume(returning: summary)
        for waiter in others { waiter.resume(returning: summary) }
    }
}
