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
/// The watch runs on a loop thread of its own. `waitForChange()` may be called from any task, one at a time.
package final class FileChangeWatcher: Sendable {
    private struct State {
        /// A change seen since the last wait returned.
        var pending = false
        var waiter: CheckedContinuation<Bool, Never>?
        var closed = false
    }

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
        let name: String
        init(name: String) { self.name = name }
    }

    private let watching = Atomic<Bool>(false)

    /// Whether the watch is in place; false when the directory could not be watched, and the deadlines alone wake
    /// the reader.
    package var isWatching: Bool { watching.load(ordering: .acquiring) }

    /// Watches `path`'s directory for changes to `path`'s name; waits end at least every `recheckInterval`.
    package init(path: String, recheckInterval: Duration = .seconds(1)) {
        let interval = UInt64(
            max(
                1,
                recheckInterval.components.seconds * 1000
                    + recheckInterval.components.attoseconds / 1_000_000_000_000_000))
        let url = URL(fileURLWithPath: path)
        let directory = url.deletingLastPathComponent().path
        thread = LoopThread(name: "fanout-watch")
        handles = UncheckedSendableBox(Handles(name: url.lastPathComponent))
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
                if state.pending || state.closed {
                    let changed = state.pending
                    state.pending = false
                    return changed
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

    /// Ends the current wait with `changed`; with no wait, remembers a change for the next (a tick is not kept).
    fileprivate func wake(changed: Bool) {
        let waiter = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            guard let waiter = state.waiter else {
                if changed { state.pending = true }
                return nil
            }
            state.waiter = nil
            return waiter
        }
        waiter?.resume(returning: changed)
    }
}

private func fileChangeCallback(
    _ handle: UnsafeMutablePointer<uv_fs_event_t>?, _ filename: UnsafePointer<CChar>?, _ events: Int32,
    _ status: Int32
) {
    guard let handle, let data = handle.pointee.data else { return }
    let watcher = Unmanaged<FileChangeWatcher>.fromOpaque(data).takeUnretainedValue()
    watcher.eventSeen(name: filename.map { String(cString: $0) })
}
