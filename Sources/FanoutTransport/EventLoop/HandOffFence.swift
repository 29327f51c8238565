import FanoutCore

/// Makes a value's hand-off through a continuation visible to ThreadSanitizer: the thread that makes the value calls
/// `release()` before `resume`, and the task calls `acquire()` after its `await`, before it reads the value.
///
/// The Swift runtime tells ThreadSanitizer of a resume that wakes a suspended task, but not of one that comes first:
/// when `resume` runs before the task reaches its `await`, the await finds the continuation resumed and goes on at
/// once, with no annotation (`swift_continuation_await`'s fast path in libswift_Concurrency), so ThreadSanitizer
/// reports the resuming thread's writes of the value (an HTTP/2 response made on a loop thread, say) and the task's
/// reads as a race. In a `FANOUT_TSAN` build the two calls take and drop one `FanoutMutex`, which orders them; in a
/// normal build they do nothing (the continuation's own synchronisation orders the accesses).
package struct HandOffFence: Sendable {
    #if FANOUT_TSAN
        private final class Lock: Sendable {
            let mutex = FanoutMutex(())
        }
        private let lock = Lock()
    #endif

    package init() {}

    /// On the thread that made the value, just before it resumes the continuation.
    package func release() {
        #if FANOUT_TSAN
            lock.mutex.withLock { _ in }
        #endif
    }

    /// In the task, after its `await` returned, before it reads what it was handed.
    package func acquire() {
        #if FANOUT_TSAN
            lock.mutex.withLock { _ in }
        #endif
    }
}
