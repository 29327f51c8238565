import Dispatch
import FanoutCore

/// The deadlines of an engine's calls (`send(_:timeout:overBudget:)`, `run(_:timeout:onResult:)`): one timer for all of them,
/// armed for the earliest, that stops each run whose deadline passes (`FanoutRun.expire()`). A call that ends first
/// takes its run out, so the engine holds no finished run.
///
/// Registering costs a lock and a heap insertion; no task or timer per call.
final class CallDeadlines: Sendable {
    private struct Entry {
        let deadline: ContinuousClock.Instant
        let id: UInt64
    }

    private struct State {
        /// A binary min-heap on `deadline`.
        var heap: [Entry] = []
        /// The runs still waiting for their deadline, by entry id; an entry whose id is gone is skipped.
        var runs: [UInt64: FanoutRun] = [:]
        var nextID: UInt64 = 0
        /// What the timer is armed for; nil when it is idle.
        var armedFor: ContinuousClock.Instant?
    }

    private let state = FanoutMutex(State())
    private let queue = DispatchQueue(label: "fanout-call-deadlines")
    /// Touched on `queue` only (created, armed and cancelled there).
    private nonisolated(unsafe) var timer: DispatchSourceTimer?

    init() {}

    /// Stops `run` at `deadline` unless `remove(_:)` comes first; the returned id is `remove`'s.
    func add(_ run: FanoutRun, deadline: ContinuousClock.Instant) -> UInt64 {
        let (id, rearm) = state.withLock { state -> (UInt64, Bool) in
            state.nextID += 1
            let id = state.nextID
            state.runs[id] = run
            Self.push(Entry(deadline: deadline, id: id), into: &state.heap)
            let rearm = state.armedFor.map { deadline < $0 } ?? true
            if rearm { state.armedFor = deadline }
            return (id, rearm)
        }
        if rearm { queue.async { self.arm() } }
        return id
    }

    /// The call ended before its deadline.
    func remove(_ id: UInt64) {
        _ = state.withLock { $0.runs.removeValue(forKey: id) }
    }

    /// On `queue`: expires what is due and arms the timer for the earliest deadline left.
    private func arm() {
        let now = ContinuousClock.now
        var due: [FanoutRun] = []
        let next = state.withLock { state -> ContinuousClock.Instant? in
            while let first = state.heap.first {
                if state.runs[first.id] == nil {
                    Self.popFirst(&state.heap)
                    continue
                }
                guard first.deadline <= now else { break }
                Self.popFirst(&state.heap)
                if let run = state.runs.removeValue(forKey: first.id) { due.append(run) }
            }
            state.armedFor = state.heap.first?.deadline
            return state.armedFor
        }
        for run in due { run.expire() }
        guard let next else {
            timer?.cancel()
            timer = nil
            return
        }
        if timer == nil {
            let source = DispatchSource.makeTimerSource(queue: queue)
            source.setEventHandler { [weak self] in self?.arm() }
            source.resume()
            timer = source
        }
        let wait = max(Duration.zero, next - now)
        let nanoseconds = wait.components.seconds * 1_000_000_000 + wait.components.attoseconds / 1_000_000_000
        timer?.schedule(
            deadline: .now() + .nanoseconds(Int(min(nanoseconds, Int64(Int.max)))), leeway: .microseconds(500))
    }

    /// Stops the timer: no deadline is enforced after this (the engine is shutting down and ends every run).
    func close() {
        queue.sync {
            timer?.cancel()
            timer = nil
        }
        state.withLock { state in
            state.heap.removeAll()
            state.runs.removeAll()
            state.armedFor = nil
        }
    }

    private static func push(_ entry: Entry, into heap: inout [Entry]) {
        heap.append(entry)
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].deadline < heap[parent].deadline else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    private static func popFirst(_ heap: inout [Entry]) {
        heap.swapAt(0, heap.count - 1)
        heap.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < heap.count && heap[left].deadline < heap[smallest].deadline { smallest = left }
            if right < heap.count && heap[right].deadline < heap[smallest].deadline { smallest = right }
            guard smallest != parent else { return }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
