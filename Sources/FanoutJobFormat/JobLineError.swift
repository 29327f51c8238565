/// Why one job line was refused: its line number, the job's id when the line gave one, and a message that names the
/// field at fault.
///
/// The run reports it as the job's `invalid` result and goes on with the other jobs.
package struct JobLineError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The 1-based line number in the job file.
    package let lineNumber: Int
    /// The line's `id`, when it had a non-empty string one.
    package let jobID: String?
    /// The job-file field at fault as the file spells it (`push_type`, `tokens[3]`, `live_activity.alert.title`);
    /// nil when the line as a whole is wrong (not JSON, not an object).
    package let field: String?
    /// What is wrong, starting with the field, for example `push_type "foo" is not an APNs push type`.
    package let message: String

    package init(lineNumber: Int, jobID: String?, field: String?, message: String) {
        self.lineNumber = lineNumber
        self.jobID = jobID
        self.field = field
        self.message = message
    }

    /// `line 7: push_type "foo" is not an APNs push type`.
    package var description: String { "line \(lineNumber): \(message)" }
}
