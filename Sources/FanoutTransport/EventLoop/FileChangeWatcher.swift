import CLibUV
import FanoutCore
import Foundation
import Synchronization

/// Wakes a reader that follows a growing file (`fanout send --follow`): a libuv fs-event watch (inotify on Linux) on
/// the file's directory, filtered to the file's name, so that an append, a truncation, a rename away (a rotation) and
/// a new file of that name each wake it. A repeating recheck timer ends any wait at least every `recheckInterval`,
/// so a change the watch did not report (a file system without inotify, a network mount) is still seen: the reader
/// then checks the file itself. A wait costs no call to the watch's thread.
///
/// With a `coalescing` interval, changes are reported at most once per interval: a change within the interval after
/// the last one reported is held until the interval has passed, so that appends in a burst wake the reader once for
/// all of them (one read, one wake-up of everything downstream). A change after a quiet spell is reported at once.
///
/// The watch runs on a loop thread of its own. `waitForChange()` may be called from any task, one at a time.
package final class FileChangeWatcher: Sendable {
    private struct State {
        /// A change seen since the last wait returned.
        var pending = false
        var waiter: CheckedContinuation<Bool, Never>?
        var closed = false
        /// The pending change waits for the hold timer (it came within `coalescing` of the last one reported).
        var held = false
        /// When a change was last reported (`monotonicNanoseconds`).
        var lastReported: UInt64 = 0
    }

    /// Nanoseconds; changes are reported at most once per this many (0: each at once).
    private let coalescing: UInt64

    private let thread: LoopThread
    private let state = FanoutMutex(State())
    /// Loop-thread objects, created in init and closed in `close()`.
    private let handles: UncheckedSendableBox<Handles>

    /// The fs-event handle and the deadline timer. The event handle holds an unretained pointer to the watcher
    /// (`data`), valid until `close()`, which closes the handle (and frees it in its close callback) on the loop.
    private final class Handles {
        /// Owned: allocated in init on the loop, freed in its close callback after `close()` closes it.
        var event: UnsafeMutablePointer<uv_fs_event_t>?
        var timer: LoopTimer?
        /// Ends a hold (`coalescing`): reports the held change.
        var holdTimer: LoopTimer?
        /// The watch is stopped for a hold: the hold reports a change anyway, so the appends during it need not wake
        /// the watch's thread each.
        var paused = false
        let name: String
        let directory: String
        init(name: String, directory: String) {
            self.name = name
            self.directory = directory
        }
    }

    private let watching = Atomic<Bool>(false)

    /// Whether the watch is in place; false when the directory could not be watched, and the deadlines alone wake
    /// the reader.
    package var isWatching: Bool { watching.load(ordering: .acquiring) }

    /// Watches `path`'s directory for changes to `path`'s name; waits end at least every `recheckInterval`, and
    /// changes are reported at most once per `coalescing`.
    package init(path: String, recheckInterval: Duration = .seconds(1), coalescing: Duration = .zero) {
        self.coalescing = coalescing.wholeNanoseconds
        let interval = max(1, recheckInterval.wholeMilliseconds)
        let url = URL(fileURLWithPath: path)
        let directory = url.deletingLastPathComponent().path
        thread = LoopThread(name: "fanout-watch")
        handles = UncheckedSendableBox(Handles(name: url.lastPathComponent, directory: directory))
        let handles = self.handles.value
        let thread = self.thread
        // Unretained: the timer's closure and the fs-event handle's `data` point at this watcher, which closes both
        // (in `close()`, called by `deinit` at the latest) before it goes, so they never outlive it.
        let owner = UncheckedSendableBox(Unmanaged.passUnretained(self).toOpaque())
        let started = thread.runAndWait { () -> Bool in
            let timer = LoopTimer(loop: thread)
            timer.schedule(milliseconds: interval, repeatMilliseconds: interval) {
                let watcher = Unmanaged<FileChangeWatcher>.fromOpaque(owner.value).takeUnretainedValue()
                watcher.wake(changed: false)
            }
            handles.timer = timer
            let hold = LoopTimer(loop: thread)
            hold.schedule(milliseconds: 1) {
                let watcher = Unmanaged<FileChangeWatcher>.fromOpaque(owner.value).takeUnretainedValue()
                watcher.holdEnded()
            }
            hold.stop()
            handles.holdTimer = hold
            let event = UnsafeMutablePointer<uv_fs_event_t>.allocate(capacity: 1)
            guard uv_fs_event_init(thread.loop, event) == 0 else {
                event.deallocate()
                return false
            }
            event.pointee.data = owner.value
            guard uv_fs_event_start(event, fileChangeCallback, directory, 0) == 0 else {
                uv_close(UnsafeMutableRawPointer(event).assumingMemoryBound(to: uv_handle_t.self)) { $0?.deallocate() }
                return false
            }
            handles.event = event
            return true
        }
        watching.store(started, ordering: .releasing)
    }

    /// Waits until a change of the file is seen (true), or the recheck timer ticks (false). A change seen since the
    /// last wait returned ends this one at once. After `close()`, returns at once.
    package func waitForChange() async -> Bool {
        await withCheckedContinuation { continuation in
            let immediate = state.withLock { state -> Bool? in
                if state.closed { return false }
                if state.pending && !state.held {
                    state.pending = false
                    state.lastReported = Self.monotonicNanoseconds()
                    return true
                }
                precondition(state.waiter == nil, "one waitForChange at a time")
                state.waiter = continuation
                return nil
            }
            if let immediate { continuation.resume(returning: immediate) }
        }
    }

    deinit {
        close()
    }

    /// Ends the watch and any wait (which returns false); the watcher's thread exits. Idempotent.
    package func close() {
        let (first, waiter) = state.withLock { state -> (Bool, CheckedContinuation<Bool, Never>?) in
            guard !state.closed else { return (false, nil) }
            state.closed = true
            defer { state.waiter = nil }
            return (true, state.waiter)
        }
        guard first else { return }
        waiter?.resume(returning: false)
        let handles = self.handles
        try? thread.execute {
            handles.value.timer?.close()
            handles.value.timer = nil
            handles.value.holdTimer?.close()
            handles.value.holdTimer = nil
            if let event = handles.value.event {
                uv_fs_event_stop(event)
                uv_close(UnsafeMutableRawPointer(event).assumingMemoryBound(to: uv_handle_t.self)) { $0?.deallocate() }
                handles.value.event = nil
            }
        }
        thread.shutdown()
    }

    /// On the loop: an event for `name` (or one that names no file) is a change.
    fileprivate func eventSeen(name: String?) {
        guard name == nil || name == handles.value.name else { return }
        wake(changed: true)
    }

    /// On the loop: a change ends the current wait, or is remembered for the next; one within `coalescing` of the last
    /// change reported is held until the interval has passed (`holdEnded`). A recheck tick ends the current wait
    /// (false) and is not remembered.
    fileprivate func wake(changed: Bool) {
        var hold: UInt64?
        let waiter = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            guard !state.closed else { return nil }
            let now = changed ? Self.monotonicNanoseconds() : 0
            if changed {
                state.pending = true
                if state.held { return nil }
                if coalescing > 0 && now < state.lastReported &+ coalescing {
                    state.held = true
                    hold = state.lastReported &+ coalescing - now
                    return nil
                }
            }
            guard let waiter = state.waiter else { return nil }
            state.waiter = nil
            if changed {
                state.pending = false
                state.lastReported = now
            }
            return waiter
        }
        if let hold {
            let handles = handles.value
            // libuv's timers count whole milliseconds: the hold ends at the first tick at or after the interval.
            handles.holdTimer?.restart(milliseconds: max(1, (hold + 999_999) / 1_000_000))
            if let event = handles.event, !handles.paused {
                uv_fs_event_stop(event)
                handles.paused = true
            }
        }
        waiter?.resume(returning: changed)
    }

    /// On the loop: the hold is over; the watch starts again (before the reader reads, so that no append after its
    /// read goes unseen), and the held change ends the current wait, or the next one at once.
    fileprivate func holdEnded() {
        let handles = handles.value
        if handles.paused, let event = handles.event, !state.withLock({ $0.closed }) {
            handles.paused = false
            if uv_fs_event_start(event, fileChangeCallback, handles.directory, 0) != 0 {
                // The recheck timer alone wakes the reader from now on.
                watching.store(false, ordering: .releasing)
            }
        }
        let waiter = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            state.held = false
            guard state.pending, let waiter = state.waiter else { return nil }
            state.waiter = nil
            state.pending = false
            state.lastReported = Self.monotonicNanoseconds()
            return waiter
        }
        waiter?.resume(returning: true)
    }

    private static func monotonicNanoseconds() -> UInt64 { DispatchTime.now().uptimeNanoseconds }
}

private func fileChangeCallback(
    _ handle: UnsafeMutablePointer<uv_fs_event_t>?, _ filename: UnsafePointer<CChar>?, _ events: Int32,
    _ status: Int32
) {
    guard let handle, let data = handle.pointee.data else { return }
    let watcher = Unmanaged<FileChangeWatcher>.fromOpaque(data).takeUnretainedValue()
    watcher.eventSeen(name: filename.map { String(cString: $0) })
}
