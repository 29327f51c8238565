/// What `deliverFinished` delivers: a batch's results in order, and the runs they belong to as runs of consecutive
/// results (one entry per run of a job's results, not one per result). Used by one thread at a time, and kept for
/// its capacity.
///
/// The results live in storage of its own, so that delivering moves each one out: read through an array (or a buffer
/// pointer's subscript) to be handed on, a result would be copied, a reference-counting call for each of its Strings
/// and ids (scripts/count-arc.sh counts them).
final class DeliveryScratch {
    /// Owned: allocated by `append` when full (the old storage's results moved over), freed in deinit; `count`
    /// results from the start are initialized.
    private var storage: UnsafeMutablePointer<NotificationResult>?
    private var capacity = 0
    private(set) var count = 0
    private var runs: [(run: FanoutRun, count: Int)] = []
    /// Set while a `deliverFinished` fills and drains it.
    var inUse = false

    deinit {
        storage?.deinitialize(count: count)
        storage?.deallocate()
    }

    func append(_ result: consuming NotificationResult, of run: FanoutRun) {
        if count == capacity {
            capacity = max(64, capacity * 2)
            let grown = UnsafeMutablePointer<NotificationResult>.allocate(capacity: capacity)
            if let storage {
                grown.moveInitialize(from: storage, count: count)
                storage.deallocate()
            }
            storage = grown
        }
        (storage! + count).initialize(to: result)
        count += 1
        // `runs.count - 1`, not `runs.indices.last`: that allocates once per result in a debug build.
        if !runs.isEmpty && runs[runs.count - 1].run === run {
            runs[runs.count - 1].count += 1
        } else {
            runs.append((run, 1))
        }
    }

    /// Hands each result, moved out in order, to `body` with its run, and each run once after its last result;
    /// leaves the scratch empty.
    func drain(
        _ body: (FanoutRun, consuming NotificationResult) -> Void, endOfRun: (FanoutRun, _ results: Int) -> Void
    ) {
        var next = 0
        // By index: a debug build's array iterator allocates on every step (see `EngineLoop.pump`).
        for index in runs.indices {
            let (run, results) = runs[index]
            for _ in 0..<results {
                body(run, (storage! + next).move())
                next += 1
            }
            endOfRun(run, results)
        }
        count = 0
        runs.removeAll(keepingCapacity: true)
    }
}
