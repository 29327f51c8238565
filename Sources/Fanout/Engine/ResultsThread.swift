import CFanoutShims
import FanoutCore
import Foundation

/// A notification its loop has decided, as the loop hands it to its results thread: the record (still holding the
/// job, token, `apns-id`, position and attempts) and what only the loop knew. The results thread makes the
/// `NotificationResult` from it, so the loop copies no strings and takes no lock per notification.
struct FinishedNotification {
    let pending: PendingNotification
    let outcome: NotificationOutcome
    let status: Int?
    let reason: String?
    /// The response's `apns-id`, when it had one; nil means the record's (none for a broadcast).
    let apnsID: APNsIdentifier?
    let apnsUniqueID: APNsIdentifier?
    let timestamp: Int64?
    let latencyNanoseconds: Int64
}

/// One loop's results thread: the loop hands it the notifications it finished, once per loop turn, and this thread
/// delivers them (`deliver`: the results, the counts, the permits, the records back to the loop), off the loop.
///
/// The hand-off is one lock per turn around an array swap: three arrays (the loop's, the queue's, this thread's)
/// take turns, keep their capacity, and so allocate nothing once warm. The thread sleeps on a semaphore when there is
/// nothing to deliver, and the loop signals it only when it is asleep (one wake-up per idle-to-busy transition, as
/// `LoopThread.execute` wakes its loop).
///
/// Memory stays bounded without a limit of its own: a notification keeps its in-flight permit until `deliver` has
/// taken it, so the queue never holds more than the engine's in-flight limit.
final class ResultsThread: Sendable {
    private struct Queue {
        var finished: [FinishedNotification] = []
        var sleeping = false
        var closing = false
    }
    private let queue = FanoutMutex(Queue())
    private let wake = DispatchSemaphore(value: 0)
    private let exited = DispatchSemaphore(value: 0)
    private let deliver: @Sendable (inout [FinishedNotification]) -> Void

    /// Starts the thread. `deliver` runs on it, one batch at a time; it may empty the array or leave it.
    init(name: String, deliver: @escaping @Sendable (inout [FinishedNotification]) -> Void) {
        self.deliver = deliver
        let thread = Thread { [self] in run(name: name) }
        thread.stackSize = 1 << 20
        thread.start()
    }

    /// Queues `batch` for delivery and leaves it empty, keeping its capacity. Any one thread at a time (the loop).
    func handOver(_ batch: inout [FinishedNotification]) {
        guard !batch.isEmpty else { return }
        let mustWake = queue.withLock { queue -> Bool in
            precondition(!queue.closing, "results handed over after close")
            if queue.finished.isEmpty {
                swap(&queue.finished, &batch)
            } else {
                queue.finished.append(contentsOf: batch)
            }
            defer { queue.sleeping = false }
            return queue.sleeping
        }
        batch.removeAll(keepingCapacity: true)
        if mustWake { wake.signal() }
    }

    /// Delivers what is queued, then ends the thread, and returns once it has ended. Nothing may be handed over
    /// after this.
    func close() {
        let mustWake = queue.withLock { queue -> Bool in
            queue.closing = true
            defer { queue.sleeping = false }
            return queue.sleeping
        }
        if mustWake { wake.signal() }
        exited.wait()
        exited.signal()  // a second close returns too
    }

    private func run(name: String) {
        // The kernel's name for the thread (top -H, perf): at most 15 bytes.
        _ = CFanoutShims_set_current_thread_name(String(decoding: name.utf8.prefix(15), as: UTF8.self))
        var batch: [FinishedNotification] = []
        while true {
            let step = queue.withLock { queue -> Bool? in
                if queue.finished.isEmpty {
                    if queue.closing { return nil }
                    queue.sleeping = true
                    return false
                }
                swap(&queue.finished, &batch)
                return true
            }
            switch step {
            case nil:
                exited.signal()
                return
            case false?:
                wake.wait()
            case true?:
                deliver(&batch)
                batch.removeAll(keepingCapacity: true)
            }
        }
    }
}
