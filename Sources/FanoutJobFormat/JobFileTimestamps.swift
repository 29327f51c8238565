/// The default Live Activity `timestamp` of a job file's jobs: the moment each job is parsed, which `fanout send` does
/// once the job has a slot to send in (docs/SEND.md: the moment the job starts sending, one value for the whole job),
/// and, for a job by activity id, later than both the default the file gave that activity's previous job and the
/// content last sent to the activity (the registry's record, from any earlier run). Otherwise an update and the end
/// after it in one file, read in the same second, would share one timestamp, and the end would be refused as
/// `superseded` (its content no newer), leaving the activity on screen; and a later file's default could be behind the
/// seconds an earlier file's many updates ran ahead. A `timestamp` the line gives is used as it is.
package struct JobFileTimestamps {
    private let parser = JobLineParser()
    private var lastDefault: [String: Int64] = [:]

    package init() {}

    /// Parses `line` with `now` (seconds since 1970, read by the caller per line) as its default timestamp, moved
    /// later when the line's activity already had that one or a later one, from this file or as `lastSent(app,
    /// activityID)` says (nil: none known); returns the result and the default timestamp it was parsed with (what a
    /// worker that parses the line again must use).
    package mutating func parse(
        line: some Collection<UInt8>, lineNumber: Int, jobFileDirectory: String, now: Int64,
        lastSent: (_ app: String, _ activityID: String) async -> Int64? = { _, _ in nil }
    ) async -> (result: Result<ParsedJobLine, JobLineError>, now: Int64) {
        let first = parser.parse(line: line, lineNumber: lineNumber, jobFileDirectory: jobFileDirectory, now: now)
        guard let (app, activityID) = Self.activity(defaultedIn: first) else { return (first, now) }
        let key = app + "\u{0}" + activityID
        var ordered = now
        if let previous = lastDefault[key] { ordered = max(ordered, previous &+ 1) }
        if let sent = await lastSent(app, activityID) { ordered = max(ordered, sent &+ 1) }
        lastDefault[key] = ordered
        guard ordered != now else { return (first, now) }
        let again = parser.parse(line: line, lineNumber: lineNumber, jobFileDirectory: jobFileDirectory, now: ordered)
        return (again, ordered)
    }

    /// The activity of a parsed job by activity id whose line gave no timestamp; nil for any other line.
    private static func activity(defaultedIn result: Result<ParsedJobLine, JobLineError>) -> (String, String)? {
        switch result {
        case .failure: return nil
        case .success(let parsed):
            guard parsed.usesDefaultTimestamp, case .activity(let app, let id) = parsed.job.recipients else {
                return nil
            }
            return (app, id)
        }
    }
}
