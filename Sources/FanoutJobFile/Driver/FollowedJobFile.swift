import FanoutCore
import FanoutJobFormat
import FanoutTransport
import Foundation
import Synchronization

/// `fanout send --follow`'s job file: a queue that producers append to while it is read. A job line is read once its
/// `\n` is written (a producer that died mid-line leaves no half job); at the end of what is written, the reader
/// waits for the file to change (`FileChangeWatcher`, with a deadline per wait) until `stop()`.
///
/// As `tail -F` does, it sees the file at its path replaced (renamed away by a rotation, and a new one created) or
/// truncated: `next()` then says so once the old file is read to its end, and `openNewFile()` reads the new one from
/// its start, its line numbers continuing the old one's, so that line numbers stay unique in the run's results and
/// journal.
///
/// One task reads (`next`, `openNewFile`); `stop()` may come from any thread.
final class FollowedJobFile: @unchecked Sendable {
    // @unchecked Sendable: `reader` is used by the reading task only; `stopped` and the watcher are thread-safe.

    enum Next {
        case line(JobFileReader.Line)
        /// The file at the path is another one now, or the open one was truncated: what was written to the open
        /// one is read. Says which, for the log.
        case replaced(String)
        /// `stop()` was called.
        case stopped
    }

    /// What identifies a file across runs: its device and inode, as `dev:ino`.
    static func identity(device: UInt64, inode: UInt64) -> String { "\(device):\(inode)" }

    /// The identity of the file `path` names now; nil when it names none.
    static func identity(ofPath path: String) -> String? {
        var status = stat()
        guard stat(path, &status) == 0 else { return nil }
        return identity(device: UInt64(status.st_dev), inode: UInt64(status.st_ino))
    }

    let path: String
    private let maximumLineLength: Int
    private var reader: JobFileReader
    private let watcher: FileChangeWatcher
    private let stopped = Atomic<Bool>(false)
    /// The longest wait for a change the watch did not report.
    private static let recheckInterval = Duration.seconds(1)

    /// Opens `path`; its line numbers start after `lineNumberBase` (the lines of the files read before it). Appends
    /// wake the reader at most once per `linger` (`FileChangeWatcher`'s coalescing): a burst is read together.
    init(path: String, maximumLineLength: Int, lineNumberBase: Int, linger: Duration = .zero) throws(JobFileError) {
        self.path = path
        self.maximumLineLength = maximumLineLength
        self.lineNumberBase = lineNumberBase
        reader = try JobFileReader(
            path: path, maximumLineLength: maximumLineLength, followsAppends: true, lineNumberBase: lineNumberBase)
        watcher = FileChangeWatcher(path: path, recheckInterval: Self.recheckInterval, coalescing: linger)
        queueLag = FollowedQueueLag(path: path)
        openIdentity = openFile?.identity
        publishPosition()
    }

    /// The open file's identity (`identity(device:inode:)`), and the line number its first line follows.
    var openFile: (identity: String, lineNumberBase: Int)? {
        guard let status = reader.openFileStatus() else { return nil }
        return (Self.identity(device: status.device, inode: status.inode), lineNumberBase)
    }

    private(set) var lineNumberBase = 0

    /// The directory that `tokens_file` paths in the job lines are resolved against.
    var directory: String { reader.directory }

    /// How far producers are ahead (measured by the caller's timer). The reading task tells it where it is.
    let queueLag: FollowedQueueLag
    /// The open file's identity, for `queueLag`.
    private var openIdentity: String?

    private func publishPosition() {
        queueLag.readerAt(identity: openIdentity, bytesRead: reader.bytesConsumed)
    }

    /// The next complete line; waits for one to be written.
    func next() async throws(JobFileError) -> Next {
        while true {
            if stopped.load(ordering: .acquiring) { return .stopped }
            if let line = try reader.nextLine() {
                publishPosition()
                return .line(line)
            }
            if let why = replacement() { return .replaced(why) }
            _ = await watcher.waitForChange()
        }
    }

    /// After `.replaced`: opens the file now at the path from its start (waiting for one to exist), its line numbers
    /// following the last line read. False when stopped first.
    func openNewFile() async throws(JobFileError) -> Bool {
        let base = reader.lineNumber
        while !stopped.load(ordering: .acquiring) {
            if ReadableFile.kind(of: path) != nil {
                reader = try JobFileReader(
                    path: path, maximumLineLength: maximumLineLength, followsAppends: true, lineNumberBase: base)
                lineNumberBase = base
                openIdentity = openFile?.identity
                publishPosition()
                return true
            }
            _ = await watcher.waitForChange()
        }
        return false
    }

    /// Ends the reading: a wait in progress returns, and `next()` says `.stopped`.
    func stop() {
        stopped.store(true, ordering: .releasing)
        watcher.close()
    }

    /// Why the open file is no longer the queue: another file at the path, or this one shorter than what was read.
    /// Nil while the path names the open file (or names nothing yet: a rotation that has not created the new file).
    private func replacement() -> String? {
        guard let open = reader.openFileStatus() else { return nil }
        if open.size < reader.bytesRead {
            return "job file \(path) was truncated; reading it again from its start"
        }
        var status = stat()
        guard stat(path, &status) == 0 else { return nil }
        if UInt64(status.st_dev) != open.device || UInt64(status.st_ino) != open.inode {
            return "job file \(path) was replaced (rotated); reading the new file from its start"
        }
        return nil
    }
}
