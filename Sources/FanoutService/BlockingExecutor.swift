import Foundation
import Synchronization

/// A task executor over a fixed pool of threads of its own, for tasks that make blocking calls (SQLite: the
/// registry, the dispatch store). Swift's cooperative pool has one thread per core; a task that blocks in SQLite
/// (waiting for the write lock behind a results transaction, or reading a page of a million-token audience) holds
/// one of them, and on a two-core machine two such tasks stall every other task of the process, API requests
/// included. Tasks started with `Task(executorPreference: executor)` run here instead (SE-0417), so their blocking
/// only ever holds these threads. The dispatches use it (they page through whole audiences); API requests stay on
/// the cooperative pool, whose short SQLite calls cost less there than a hop to another pool.
///
/// Jobs run in the order they were enqueued; `threads` of them at once.
package final class BlockingExecutor: TaskExecutor, @unchecked Sendable {
    /// Dispatches' tasks (the engine feeding a job, which pages through the registry), and the sweeps.
    package static let dispatches = BlockingExecutor(name: "fanout-dispatch", threads: 4)

    // @unchecked Sendable: `queue` is behind `lock`; the threads are only started.
    private let lock = NSCondition()
    private var queue: [UnownedJob] = []
    private var head = 0

    /// - Parameter name: the threads' name (`fanout-api-3`), for debuggers and `top -H`.
    private init(name: String, threads: Int) {
        precondition(threads > 0)
        for index in 0..<threads {
            let thread = Thread { [self] in work() }
            thread.name = "\(name)-\(index)"
            thread.start()
        }
    }

    package func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        lock.lock()
        queue.append(job)
        lock.signal()
        lock.unlock()
    }

    /// One thread: take the oldest job, run it, again. The executors are process-wide (`api`, `dispatches`), so
    /// the threads never end.
    private func work() {
        let executor = asUnownedTaskExecutor()
        while true {
            lock.lock()
            while head == queue.count { lock.wait() }
            let job = queue[head]
            head += 1
            if head > 1024 && head * 2 > queue.count {
                queue.removeFirst(head)
                head = 0
            }
            lock.unlock()
            job.runSynchronously(on: executor)
        }
    }
}
