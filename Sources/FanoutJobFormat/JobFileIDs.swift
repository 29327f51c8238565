import FanoutCore

/// The ids of a job file's jobs, each taken by the first line that names it.
///
/// Results lines are keyed by (job, token), and `fanout send --resume` finds a job's lines, and whether its own
/// `invalid` line ends it, by its id: two lines with one id would share their lines, so a line of one could count as
/// done for the other (a token of the second not sent) or end it. So a line whose id an earlier line took is refused,
/// as `invalid`, and its result is keyed `line-N` like a line that gives no id (taken too, so that a later line
/// naming that id is refused in turn). Every line's key is taken, in file order, including those a resumed run skips
/// as finished, so that a resumed run refuses the same lines as the first.
///
/// A followed queue (`fanout send --follow`) has no end, so there the ids are remembered for the last `window`
/// lines only (`followWindow`): memory stays bounded however long the sender runs, and an id is refused when one of
/// those lines took it. A resume needs no more: what it looks up by id is the journal's short tail of unfinished jobs.
package struct JobFileIDs {
    /// The line that took each key.
    private var lines: [String: Int] = [:]
    /// With a window: the keys in the order they were taken, the oldest at `oldest`.
    private var order: [String] = []
    private var oldest = 0
    private let window: Int?

    /// How many lines' ids a followed queue remembers: about 10 MB of ids of 30 characters.
    package static let followWindow = 100_000

    /// Remembers the id of every line (a job file that ends).
    package init() { window = nil }

    /// Remembers the ids of the last `window` lines only (a followed queue).
    package init(window: Int) {
        precondition(window > 0, "the window holds at least one line")
        self.window = window
    }

    /// How many keys are remembered.
    package var count: Int { lines.count }

    /// What the job on `line` is called in the results file, and why it is refused when another line has its id.
    package struct Claim: Sendable, Equatable {
        /// The `job` of its results lines: its `id`, or `line-N` when it has none or is a duplicate.
        package var key: String
        /// Set when an earlier line took the id: the line's `invalid` reason.
        package var duplicate: JobLineError?

        package init(key: String, duplicate: JobLineError? = nil) {
            self.key = key
            self.duplicate = duplicate
        }
    }

    /// Takes `id` (nil: the line gives none) for the job on `line`.
    package mutating func claim(_ id: String?, line: Int) -> Claim {
        let fallback = "line-\(line)"
        guard let id else {
            take(fallback, line: line)
            return Claim(key: fallback)
        }
        if let first = lines[id] {
            take(fallback, line: line)
            let shown = id.count > 200 ? String(id.prefix(200)) + "…" : id
            return Claim(
                key: fallback,
                duplicate: JobLineError(
                    lineNumber: line, jobID: nil, field: "id",
                    message:
                        "id \(JSONValue.string(shown).description) is already the id of line \(first) "
                        + "(job ids must be unique in a job file)"))
        }
        take(id, line: line)
        return Claim(key: id)
    }

    private mutating func take(_ key: String, line: Int) {
        guard lines[key] == nil else { return }
        lines[key] = line
        guard let window else { return }
        order.append(key)
        if order.count - oldest > window {
            lines[order[oldest]] = nil
            oldest += 1
            // Drop the forgotten keys' slots once they are half the array, so it stays within twice the window.
            if oldest > window {
                order.removeFirst(oldest)
                oldest = 0
            }
        }
    }
}

extension Result<ParsedJobLine, JobLineError> {
    /// The line's id, whether it parsed or not (what `JobLineParser.jobID(of:)` reads): for `JobFileIDs.claim`.
    package var jobID: String? {
        switch self {
        case .success(let parsed): parsed.job.id
        case .failure(let error): error.jobID
        }
    }
}
