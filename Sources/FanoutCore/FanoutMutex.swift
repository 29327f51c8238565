#if FANOUT_TSAN
    import Glibc
#else
    package import Synchronization
#endif

// The package's lock around a value. Every lock in the package is a `FanoutMutex` (scripts/check-locks.sh, run by
// `make lint`, fails on a `Mutex` used directly), so that a ThreadSanitizer build can swap what is underneath.
//
// A normal build: `FanoutMutex` is `Synchronization.Mutex`, a type alias, so the code is exactly `Mutex`'s.
//
// A build with the `FANOUT_TSAN` condition (`scripts/sanitize.sh` sets it with `-Xswiftc -DFANOUT_TSAN` next to
// `--sanitize=thread`): `FanoutMutex` is a `pthread_mutex_t` with the same `init` and `withLock`. ThreadSanitizer
// cannot see `Mutex` on Linux: its uncontended paths are atomics it does see, but a contended lock is handed over by
// the futex syscall (`FUTEX_LOCK_PI`/`FUTEX_UNLOCK_PI`, in the uninstrumented libswiftSynchronization.so), which it
// does not intercept, so it misses the happens-before edge from one holder's unlock to the next one's lock and
// reports what the lock protects as raced. It intercepts `pthread_mutex_lock`/`unlock`, and with them sees every
// hand-off a lock makes (and checks lock order, for potential deadlocks). A ThreadSanitizer build without the
// condition would report those false races again: `FanoutMutexTests` fails in one.

#if FANOUT_TSAN
    /// The package's lock, in a ThreadSanitizer build: a pthread mutex, which ThreadSanitizer sees, with
    /// `Synchronization.Mutex`'s `init` and `withLock`.
    package struct FanoutMutex<Value: ~Copyable>: ~Copyable, @unchecked Sendable {
        // @unchecked Sendable: the value is only reached inside `withLock`, under the lock, as with `Mutex`.

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

        /// Runs `body` with the value, holding the lock.
        package borrowing func withLock<Result: ~Copyable, E: Error>(
            _ body: (inout sending Value) throws(E) -> sending Result
        ) throws(E) -> sending Result {
            pthread_mutex_lock(lock)
            defer { pthread_mutex_unlock(lock) }
            return try body(&value.pointee)
        }
    }

    /// Whether this build's `FanoutMutex` is the pthread mutex ThreadSanitizer sees (`FANOUT_TSAN`).
    package let fanoutMutexIsPthreadMutex = true
#else
    /// The package's lock: `Synchronization.Mutex` itself (a ThreadSanitizer build swaps in a pthread mutex).
    package typealias FanoutMutex<Value: ~Copyable> = Mutex<Value>

    /// Whether this build's `FanoutMutex` is the pthread mutex ThreadSanitizer sees (`FANOUT_TSAN`).
    package let fanoutMutexIsPthreadMutex = false
#endif
