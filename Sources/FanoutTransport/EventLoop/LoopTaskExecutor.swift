/// A task executor on a loop thread (SE-0417): a task started with `Task(executorPreference:)` on it runs each of its
/// jobs on the loop's thread, between the loop's callbacks, in the order they were enqueued.
///
/// Why: a task on Swift's cooperative pool that hands work to a loop and waits for the answer crosses threads twice
/// (the pool wakes the loop, the loop wakes the pool), and on a virtual machine a wake-up across cores costs more
/// than the work. A task whose jobs run on the loop makes neither crossing: what it hands to the loop is queued on
/// the loop's own thread, and the continuation the loop resumes is run by the loop.
///
/// Jobs must not block: they hold up every connection of the loop while they run.
package final class LoopTaskExecutor: TaskExecutor {
    private let loop: LoopThread

    package init(loop: LoopThread) {
        self.loop = loop
    }

    package func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        do throws(TransportError) {
            try loop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
        } catch {
            // The loop has stopped (the engine shut down): the task goes on on the cooperative pool, so it can
            // still finish (its send ends `failed`, or `shutdown` is thrown) instead of never running again.
            globalConcurrentExecutor.enqueue(ExecutorJob(job))
        }
    }
}
