#if FANOUT_TSAN
    import Glibc
#else
    // Package: `withLock` is inlined into its callers, so they see `Mutex`.
    package import Synchronization
#endif

/// The package's lock around a value: `Synchronization.Mutex`'s `withLock`, which every lock in the package goes
/// through so that a ThreadSanitizer build can swap what is underneath.
///
/// A normal build is a `Mutex<Value>` and nothing else: the same layout, and `withLock` inlines to `Mutex.withLock`,
/// so it costs nothing over using `Mutex` directly.
///
/// A build with the `FANOUT_TSAN` condition (`scripts/sanitize.sh` sets it with `-Xswiftc -DFANOUT_TSAN` next to
/// `--sanitize=thread`) uses a `pthread_mutex_t` instead. ThreadSanitizer cannot see `Mutex` on Linux: its
/// uncontended paths are atomics it does see, but a contended lock is handed over by the futex syscall
/// (`FUTEX_LOCK_PI`/`FUTEX_UNLOCK_PI`, in the uninstrumented libswiftSynchronization.so), which it does not intercept,
/// so it misses the happens-before edge from one holder's unlock to the next one's lock and reports what the lock
/// protects as raced. It intercepts `pthread_mutex_lock`/`unlock`, and with them sees every hand-off a lock makes,
/// which also lets it check lock order (potential deadlocks). A TSan build without the condition would report the
/// false races again; `FanoutMutexTests` fails in such a build.
package struct FanoutMutex<Value: ~Copyable>: ~Copyable, @unchecked Sendable {
    // @unchecked Sendable: the value is only reached inside `withLock`, under the lock, as with `Mutex`.

    #if FANOUT_TSAN
        /// Owned: allocated and initialised in `init`, destroyed and freed in `deinit`. On the heap, so that its
        /// address does not change when the struct moves (a pthread mutex must not move).
        private let lock: UnsafeMutablePointer<pthread_mutex_t>
        /// Owned, like `lock`: the value, reached only while `lock` is held.
        private let value: UnsafeMutablePointer<Value>

        package init(_ initialValue: consuming sending Value) {
            lock = .allocate(capacity: 1)
            lock.initialize(to: pthread_mutex_t())
            let status = pthread_mutex_init(lock, nil)
            precondition(status == 0, "pthread_mutex_init failed (\(status))")
            value = .allocate(capacity: 1)
            value.initialize(to: initialValue)
        }

        deinit {
            pthread_mutex_destroy(lock)
            lock.deallocate()
            value.deinitialize(count: 1)
            value.deallocate()
        }

        /// Runs `body` with the value, holding the lock. Not inlined: this build is for checking, not speed.
        package borrowing func withLock<Result: ~Copyable, E: Error>(
            _ body: (inout sending Value) throws(E) -> sending Result
        ) throws(E) -> sending Result {
            pthread_mutex_lock(lock)
            defer { pthread_mutex_unlock(lock) }
            return try body(&value.pointee)
        }

        /// Whether this build's lock is one ThreadSanitizer sees (`FANOUT_TSAN`).
        package static var isVisibleToThreadSanitizer: Bool { true }
    #else
        @usableFromInline let mutex: Mutex<Value>

        package init(_ initialValue: consuming sending Value) {
            mutex = Mutex(initialValue)
        }

        /// Runs `body` with the value, holding the lock.
        @inlinable @inline(__always)
        package borrowing func withLock<Result: ~Copyable, E: Error>(
            _ body: (inout sending Value) throws(E) -> sending Result
        ) throws(E) -> sending Result {
            try mutex.withLock(body)
        }

        /// Whether this build's lock is one ThreadSanitizer sees (`FANOUT_TSAN`).
        package static var isVisibleToThreadSanitizer: Bool { false }
    #endif
}
