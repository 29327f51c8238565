import CFanoutShims
package import CLibUV
import COpenSSL
import FanoutCore
import Foundation
import Synchronization

/// One thread running one libuv loop. Every libuv, OpenSSL and nghttp2 call of the objects pinned
/// to this loop happens on this thread; other threads hand work in with `execute(_:)`.
///
/// Cross-thread hand-off: a wake-up is sent only when the queue goes from empty to non-empty (as
/// swift-nio's `SelectableEventLoop` does), and the loop drains the whole queue when it wakes.
///
/// The wake-up is one byte written to a pipe the loop watches with a `uv_poll_t`, not libuv's
/// `uv_async_send`: in libuv 1.44 the loop, woken by `uv_async_send`'s eventfd write, then spins
/// (`uv__async_spin`: 997 `pause`s, then `sched_yield`) until the sending thread has come back from
/// that write and marked the handle done. With one send at a time every wake-up paid that spin:
/// 4.6% of single-send's CPU (about 10 µs per send) in `perf record`.
///
/// Work the loop queues for itself (a task on its `LoopTaskExecutor` handing notifications in, a continuation it
/// resumes) sends no wake-up: it is run by the prepare callback, before the loop next blocks. Writing a byte to its
/// own pipe cost a write, a turn of `epoll_wait` and a read each time, twice per `send` on the loop.
///
/// Writes are flushed once per loop turn: objects call `scheduleFlush(_:)` when they have output,
/// and a `uv_prepare_t` (run just before the loop blocks for I/O) flushes every one of them.
package final class LoopThread: @unchecked Sendable {
    // @unchecked Sendable: the C handles below are touched only on the loop thread; other threads
    // touch only `queue` (behind a lock) and write to `wakeWriteFD`.

    /// Owned: allocated in init, closed with `uv_loop_close` and freed when the thread exits. `package` so that
    /// FanoutRedis can watch hiredis's socket with a `uv_poll_t` on it (on this loop's thread only).
    package let loop: UnsafeMutablePointer<uv_loop_t>
    /// The wake-up pipe: other threads write a byte to `wakeWriteFD`, the loop watches `wakeReadFD` with
    /// `wakeHandle`. Both descriptors are owned and closed when the thread exits, once no thread is still
    /// between deciding to wake the loop and writing (`wakesInFlight`), so that none writes to a closed
    /// (or reused) descriptor.
    private let wakeReadFD: Int32
    private let wakeWriteFD: Int32
    /// Threads that decided to write a wake-up (under the queue's lock, before `stopping` was set) and
    /// may not have written yet.
    private let wakesInFlight = Atomic<Int>(0)
    /// Owned: freed in its close callback (libuv may touch it until then).
    private let wakeHandle: UnsafeMutablePointer<uv_poll_t>
    /// Owned: freed in its close callback.
    private let prepareHandle: UnsafeMutablePointer<uv_prepare_t>
    /// Owned: freed in its close callback. Active only while tasks the loop queued for itself are still waiting after
    /// the prepare callback (queued by the tasks it ran, or by the flush): an active idle handle makes the next poll
    /// return at once instead of blocking.
    private let idleHandle: UnsafeMutablePointer<uv_idle_t>
    /// Loop thread only: tasks queued from the loop's own thread since the prepare callback last ran the queue. No
    /// wake-up was sent for them.
    private var queuedFromLoop = 0
    /// How many times the prepare callback runs the queue for tasks queued from the loop before it lets the loop poll.
    private static let drainsBeforeBlocking = 8
    /// Loop thread only: set once the handles are closed (the prepare callback must not start the idle handle then).
    private var handlesClosed = false
    /// Loop thread only: the high-resolution clock as `readClock()` last read it (`clockNanoseconds`).
    var lastClockNanoseconds: UInt64 = 0

    private struct Queue {
        var tasks: [@Sendable () -> Void] = []
        var stopping = false
    }
    private let queue = FanoutMutex(Queue())
    /// Loop thread only: an empty array, with the capacity of an earlier drain, that the next drain swaps in for the
    /// queue's, so that a drain allocates nothing. (Copying the tasks out and `removeAll(keepingCapacity:)` on the
    /// queue's array would allocate a new buffer every time, since the copy would still share the old one.)
    private var spareTasks: [@Sendable () -> Void] = []
    private var flushList: [LoopFlushable] = []
    /// Loop thread only: the flush list's other buffer, swapped in as `spareTasks` is (one allocation a turn less).
    private var spareFlushList: [LoopFlushable] = []
    /// What must be closed when the loop stops, in registration order (loop thread only). Each entry
    /// holds its object strongly, so an open connection or handle lives until it closes.
    private var stopActions: [Int: () -> Void] = [:]
    private var nextStopActionID = 0
    private var thread: Thread?
    private let exited = DispatchSemaphore(value: 0)
    private var threadID: pthread_t?
    package let name: String

    /// Creates the loop and starts its thread.
    package init(name: String = "fanout-loop") {
        _ = Self.ignoreSIGPIPE
        // (Handles opened on this loop register a stop action, so `shutdown()` can close them all.)
        self.name = name
        loop = .allocate(capacity: 1)
        precondition(uv_loop_init(loop) == 0, "uv_loop_init failed")
        var fds: [Int32] = [-1, -1]
        precondition(pipe(&fds) == 0, "pipe for the loop's wake-ups failed: errno \(errno)")
        wakeReadFD = fds[0]
        wakeWriteFD = fds[1]
        for fd in fds {
            // Non-blocking both ways: a full pipe already means a wake-up is pending, and the loop reads
            // until it is empty. Close-on-exec, as libuv's own descriptors are.
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        wakeHandle = .allocate(capacity: 1)
        prepareHandle = .allocate(capacity: 1)
        idleHandle = .allocate(capacity: 1)
        let selfPointer = Unmanaged.passUnretained(self).toOpaque()
        // The handles hold an unretained pointer to self: the thread retains self until it exits,
        // and the handles are closed before it does.
        precondition(uv_poll_init(loop, wakeHandle, wakeReadFD) == 0, "uv_poll_init on the wake-up pipe failed")
        wakeHandle.pointee.data = selfPointer
        uv_poll_start(wakeHandle, Int32(UV_READABLE.rawValue), loopWakeCallback)
        uv_prepare_init(loop, prepareHandle)
        prepareHandle.pointee.data = selfPointer
        uv_prepare_start(prepareHandle, loopPrepareCallback)
        // Keep the prepare handle from holding the loop open on its own.
        uv_unref(UnsafeMutableRawPointer(prepareHandle).assumingMemoryBound(to: uv_handle_t.self))
        uv_idle_init(loop, idleHandle)
        uv_unref(UnsafeMutableRawPointer(idleHandle).assumingMemoryBound(to: uv_handle_t.self))

        let thread = Thread { [self] in self.run() }
        thread.name = name
        thread.stackSize = 1 << 20
        self.thread = thread
        thread.start()
        // Wait until the thread has recorded its id: `inLoop` reads it from any thread, and the
        // semaphore orders that write before every such read (no data race).
        started.wait()
    }

    private let started = DispatchSemaphore(value: 0)

    /// libuv writes to sockets with write(2), which raises SIGPIPE when the peer has gone, and
    /// SIGPIPE's default action ends the process: a library must not let a dropped connection kill
    /// its host. Ignored once, process-wide, before the first loop exists (node does the same);
    /// the write then fails with EPIPE, which the socket reports as a lost connection.
    private static let ignoreSIGPIPE: Void = {
        signal(SIGPIPE, SIG_IGN)
    }()

    private func run() {
        threadID = pthread_self()
        // The kernel's name for the thread (top -H, /proc/self/task/*/comm): at most 15 bytes.
        _ = CFanoutShims_set_current_thread_name(String(decoding: name.utf8.prefix(15), as: UTF8.self))
        started.signal()
        uv_run(loop, UV_RUN_DEFAULT)
        // Every handle is closed by now; release the loop.
        let rc = uv_loop_close(loop)
        assert(rc == 0, "uv_loop_close: handles still open")
        loop.deallocate()
        // `stopping` is set, so no thread decides to wake the loop any more (reading it under the lock
        // orders this after every such decision); wait out those that decided before, then close the pipe.
        _ = queue.withLock { $0.stopping }
        while wakesInFlight.load(ordering: .acquiring) != 0 { sched_yield() }
        close(wakeReadFD)
        close(wakeWriteFD)
        // This thread's OpenSSL state (TLS, signing) goes now rather than in the thread's exit destructors. OpenSSL
        // has no exit-time cleanup in this process (CFanoutShims initialises it with OPENSSL_INIT_NO_ATEXIT), so
        // neither this nor those destructors can meet state an `exit` freed.
        OPENSSL_thread_stop()
        hasExitedFlag.store(true, ordering: .releasing)
        exited.signal()
    }

    private let hasExitedFlag = Atomic<Bool>(false)

    /// Whether the thread has finished (its loop closed and freed).
    package var hasExited: Bool { hasExitedFlag.load(ordering: .acquiring) }

    /// True when called on this loop's thread.
    package var inLoop: Bool {
        guard let threadID else { return false }
        return pthread_equal(threadID, pthread_self()) != 0
    }

    /// Debug-build check that the caller is on the loop thread.
    @inline(__always)
    package func assertInLoop(file: StaticString = #fileID, line: UInt = #line) {
        assert(inLoop, "must be called on loop thread \(name)", file: file, line: line)
    }

    /// Runs `task` on the loop thread, soon. Thread-safe. Tasks run in submission order.
    ///
    /// - Throws: `TransportError(.loopStopped)` once `shutdown()` has begun; `task` is dropped, so a
    ///   caller waiting on it must complete its work another way.
    package func execute(_ task: @escaping @Sendable () -> Void) throws(TransportError) {
        // The loop's own thread needs no wake-up: the prepare callback runs the task before the loop blocks.
        let fromLoop = inLoop
        let mustWake = queue.withLock { queue -> Bool? in
            guard !queue.stopping else { return nil }
            queue.tasks.append(task)
            guard !fromLoop, queue.tasks.count == 1 else { return false }
            wakesInFlight.add(1, ordering: .relaxed)
            return true
        }
        guard let mustWake else { throw TransportError(.loopStopped, "event loop \(name) has stopped") }
        if fromLoop { queuedFromLoop += 1 }
        if mustWake { wake() }
    }

    /// Makes the loop's wake-up pipe readable (any thread), for a caller that counted itself in
    /// `wakesInFlight` under the queue's lock. A full pipe (EAGAIN) is already readable.
    private func wake() {
        var byte: UInt8 = 1
        while write(wakeWriteFD, &byte, 1) < 0 && errno == EINTR {}
        wakeUpsWritten.add(1, ordering: .relaxed)
        wakesInFlight.subtract(1, ordering: .releasing)
    }

    private let wakeUpsWritten = Atomic<Int>(0)

    /// How many wake-ups other threads have written to the loop's pipe so far (for tests: work the loop queues for
    /// itself must write none).
    package var wakeUpsSent: Int { wakeUpsWritten.load(ordering: .relaxed) }

    /// Whether `shutdown()` has begun: `execute` refuses work from then on.
    package var isStopping: Bool { queue.withLock { $0.stopping } }

    /// Same as `execute`, for closures that are not Sendable but are known to touch only
    /// loop-confined state (the caller vouches for it).
    func executeUnchecked(_ task: @escaping () -> Void) throws(TransportError) {
        let box = UncheckedSendableBox(task)
        try execute { box.value() }
    }

    /// Asks the loop to stop without waiting for it (from any thread, the loop's own included): the
    /// tasks queued so far run, stop actions close what is open, and the thread exits.
    package func requestStop() {
        let alreadyStopping = queue.withLock { queue -> Bool in
            let was = queue.stopping
            queue.stopping = true
            if !was { wakesInFlight.add(1, ordering: .relaxed) }
            return was
        }
        if !alreadyStopping { wake() }
    }

    /// The wake-up pipe is readable: empties it, then runs what was queued. Emptying first means that a
    /// wake-up sent after it is never lost (at worst the next callback finds the queue empty).
    fileprivate func wakeUp() {
        var buffer: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0, 0, 0, 0)
        let size = MemoryLayout.size(ofValue: buffer)
        while true {
            let count = withUnsafeMutableBytes(of: &buffer) { read(wakeReadFD, $0.baseAddress, size) }
            if count == size || (count < 0 && errno == EINTR) { continue }
            break
        }
        drainQueue()
    }

    fileprivate func drainQueue() {
        // `tasks` holds the only reference to its buffer (the spare is emptied first, which also keeps a drain that
        // a task starts from reusing a buffer still being run), so clearing it after the run keeps the buffer.
        var tasks = spareTasks
        spareTasks = []
        let stopping = queue.withLock { queue -> Bool in
            swap(&queue.tasks, &tasks)
            return queue.stopping
        }
        for task in tasks { task() }
        tasks.removeAll(keepingCapacity: true)
        spareTasks = tasks
        if stopping && !handlesClosed { closeLoopHandles() }
    }

    /// The prepare callback, just before the loop blocks: runs the tasks the loop queued for itself and flushes, and
    /// again for what that queued (the engine's flush delivers a `send`'s result and resumes its task; the resumed
    /// task's jobs follow one another). After `Self.drainsBeforeBlocking` rounds the rest wait for the next turn, which
    /// the idle handle keeps from blocking, so a task that keeps queuing another cannot starve the loop's I/O.
    fileprivate func beforeBlocking() {
        var rounds = 0
        repeat {
            if queuedFromLoop > 0 {
                queuedFromLoop = 0
                drainQueue()
            }
            flushAll()
            rounds += 1
        } while queuedFromLoop > 0 && rounds < Self.drainsBeforeBlocking && !handlesClosed
        guard !handlesClosed else { return }
        if queuedFromLoop > 0 {
            uv_idle_start(idleHandle) { _ in }
        } else {
            uv_idle_stop(idleHandle)
        }
    }

    /// Asks an object to be flushed at the end of this loop turn (before the loop blocks).
    func scheduleFlush(_ flushable: LoopFlushable) {
        assertInLoop()
        if flushable.flushScheduled { return }
        flushable.flushScheduled = true
        flushList.append(flushable)
    }

    /// Runs what is scheduled for the end of this turn now (`SecureChannel` after a full read buffer: the
    /// engine's deferred sends, then the connections' output, go out while libuv reads on).
    package func flushScheduledNow() {
        assertInLoop()
        flushAll()
    }

    fileprivate func flushAll() {
        // Flushing may schedule more flushes (e.g. a write completing synchronously): loop until quiet.
        while !flushList.isEmpty {
            // The two buffers trade places, as in `drainQueue`: what is scheduled meanwhile goes into the other one.
            var list = spareFlushList
            spareFlushList = []
            swap(&list, &flushList)
            for item in list {
                item.flushScheduled = false
                item.flushNow()
            }
            list.removeAll(keepingCapacity: true)
            spareFlushList = list
        }
    }

    /// Stops the loop after the tasks queued so far have run, and waits for its thread to exit.
    /// Objects pinned to the loop must have closed their handles (or close them in a task queued
    /// before this call); the loop ends when no handle is left.
    package func shutdown() {
        precondition(!inLoop, "shutdown() from the loop thread would deadlock")
        requestStop()
        exited.wait()
        exited.signal()  // let a second shutdown() return too
    }

    /// Registers `action` to run when the loop stops (to close a handle or a connection that is still
    /// open). Returns an id for `removeStopAction` once the object has closed by itself.
    package func addStopAction(_ action: @escaping () -> Void) -> Int {
        assertInLoop()
        nextStopActionID += 1
        stopActions[nextStopActionID] = action
        return nextStopActionID
    }

    package func removeStopAction(_ id: Int) {
        stopActions[id] = nil
    }

    private func closeLoopHandles() {
        handlesClosed = true
        // Close what is still open, oldest first: connections before the sockets they made later.
        for id in stopActions.keys.sorted() {
            if let action = stopActions.removeValue(forKey: id) { action() }
        }
        flushAll()
        uv_poll_stop(wakeHandle)
        uv_close(UnsafeMutableRawPointer(wakeHandle).assumingMemoryBound(to: uv_handle_t.self)) { handle in
            handle?.deallocate()
        }
        uv_close(UnsafeMutableRawPointer(prepareHandle).assumingMemoryBound(to: uv_handle_t.self)) { handle in
            handle?.deallocate()
        }
        uv_close(UnsafeMutableRawPointer(idleHandle).assumingMemoryBound(to: uv_handle_t.self)) { handle in
            handle?.deallocate()
        }
    }
}

/// An object with buffered output, flushed by its loop once per turn.
package class LoopFlushable {
    fileprivate(set) var flushScheduled = false
    func flushNow() {}
}

/// Carries a value the caller knows is used on one thread only across a `@Sendable` boundary.
package struct UncheckedSendableBox<T>: @unchecked Sendable {
    package let value: T
    package init(_ value: T) { self.value = value }
}

private func loopWakeCallback(_ handle: UnsafeMutablePointer<uv_poll_t>?, _ status: Int32, _ events: Int32) {
    guard let handle, let data = handle.pointee.data else { preconditionFailure("wake-up handle without owner") }
    // A poll error on our own pipe cannot happen; drain anyway, so that queued work still runs.
    Unmanaged<LoopThread>.fromOpaque(data).takeUnretainedValue().wakeUp()
}

private func loopPrepareCallback(_ handle: UnsafeMutablePointer<uv_prepare_t>?) {
    guard let handle, let data = handle.pointee.data else { preconditionFailure("prepare handle without owner") }
    Unmanaged<LoopThread>.fromOpaque(data).takeUnretainedValue().beforeBlocking()
}

extension LoopThread {
    /// Runs `body` on the loop and waits for its result. Never call from the loop itself.
    package func runAndWait<T>(_ body: @escaping () -> T) -> T {
        precondition(!inLoop, "runAndWait from the loop thread would deadlock")
        let done = DispatchSemaphore(value: 0)
        let result = UncheckedSendableBox(ResultSlot<T>())
        do {
            try executeUnchecked {
                result.value.value = body()
                done.signal()
            }
        } catch {
            preconditionFailure("runAndWait on a stopped loop \(name)")
        }
        done.wait()
        return result.value.value!
    }
}

private final class ResultSlot<T> {
    var value: T?
}
