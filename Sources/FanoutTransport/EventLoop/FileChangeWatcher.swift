import CLibUV
import Foundation
import Synchronization

/// Wakes a reader that follows a growing file (`fanout send --follow`): a libuv fs-event watch (inotify on Linux) on
/// the file's directory, filtered to the file's name, so that an append, a truncation, a rename away (a rotation) and
/// a new file of that name each wake it. Each wait has a deadline, so a change the watch did not report (a file
/// system without inotify, a network mount) is still seen within it: the reader then checks the file itself.
///
/// The watch runs on a loop thread of its own. `waitForChange(timeout:)` may be called from any task, one at a time.
package final class FileChangeWatcher: Sendable {
    private struct State {
        /// A change seen since the last wait returned.
        var pending = false
        var waiter: CheckedContinuation<Bool, Never>?
        /// Bumped by each wait, so that a wait's deadline does not end a later one.
        var generation = 0
        var closed = false
    }

    private let thread: LoopThread
    private let state = Mutex(State())
    /// Loop-thread objects, created in init and closed in `close()`.
    private let handles: UncheckedSendableBox<Handles>

    /// The fs-event handle and the deadline timer. The event handle holds an unretained pointer to the watcher
    /// (`data`), valid until `close()`, which closes the handle (and frees it in its close callback) on the loop.
    private final class Handles {
        var event: UnsafeMutablePointer<uv_fs_event_t>?
        var timer: LoopTimer?
        let name: String
        init(name: String) { self.name = name }
    }

    private let watching = Atomic<Bool>(false)

    /// Whether the watch is in place; false when the directory could not be watched, and the deadlines alone wake
    /// the reader.
    package var isWatching: Bool { watching.load(ordering: .acquiring) }

    /// Watches `path`'s directory for changes to `path`'s name.
    package init(path: String) {
        let url = URL(fileURLWithPath: path)
        let directory = url.deletingLastPathComponent().path
        thread = LoopThread(name: "fanout-watch")
        handles = UncheckedSendableBox(Handles(name: url.lastPathComponent))
        let handles = self.handles.value
        let thread = self.thread
        let owner = UncheckedSendableBox(Unmanaged.passUnretained(self).toOpaque())
        let started = thread.runAndWait { () -> Bool in
            handles.timer = LoopTimer(loop: thread)
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

    /// Waits until a change of the file is seen (true), or `timeout` passes (false). A change seen since the last
    /// wait returned ends this one at once. After `close()`, returns at once.
    package func waitForChange(timeout: Duration) async -> Bool {
        let milliseconds =
            UInt64(max(0, timeout.components.seconds)) * 1000
            + UInt64(max(0, timeout.components.attoseconds) / 1_000_000_000_000_000)
        return await withCheckedContinuation { continuation in
            let generation = state.withLock { state -> Int? in
                if state.pending || state.closed {
                    let changed = state.pending
                    state.pending = false
                    continuation.resume(returning: changed)
                    return nil
                }
                precondition(state.waiter == nil, "one waitForChange at a time")
                state.waiter = continuation
                state.generation += 1
                return state.generation
            }
            guard let generation else { return }
            let handles = self.handles
            do {
                try thread.execute { [self] in
                    handles.value.timer?.schedule(milliseconds: milliseconds) { [self] in
                        wake(changed: false, generation: generation)
                    }
                }
            } catch {
                wake(changed: false, generation: generation)
            }
        }
    }

    /// Ends the watch and any wait (which returns false); the watcher's thread exits.
    package func close() {
        let waiter = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            guard !state.closed else { return nil }
            state.closed = true
            defer { state.waiter = nil }
            return state.waiter
        }
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
        handles.value.timer?.stop()
        wake(changed: true, generation: nil)
    }

    /// Ends the current wait with `changed`; with no wait, remembers a change for the next. A deadline
    /// (`generation` given) ends only the wait it was set for.
    private func wake(changed: Bool, generation: Int?) {
        let waiter = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            if let generation, generation != state.generation { return nil }
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
