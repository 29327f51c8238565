import FanoutCore
import Foundation
import Synchronization

/// How far producers are ahead of `fanout send --follow`: the bytes and complete job lines written to the followed
/// file and not read yet, and how long the oldest of those lines has waited since the sender first saw it.
///
/// The reading task publishes where it is (`readerAt`, per line); `measure()` runs on a timer thread with a
/// descriptor of its own, so the figures stay current while the reader is held back by the engine (no room in
/// flight), which is when they matter. Each measure reads only the bytes appended since the last one, once, and
/// remembers when it saw them (`sightings`), so the cost is one more read of what producers write and memory grows
/// only with the number of measures the reader is behind.
final class FollowedQueueLag: Sendable {
    struct Reading: Equatable {
        var bytes: Int
        var jobs: Int
        /// Since the sender first saw the oldest unread line; nil when nothing is unread.
        var oldestAge: Duration?
    }

    private struct ReaderPosition {
        var identity: String?
        var bytesRead = 0
    }

    /// Bytes appended between two measures: where, how many complete lines they end, and when they were first seen.
    private struct Sighting {
        var start: Int
        var end: Int
        var newlines: Int
        var at: ContinuousClock.Instant
    }

    private struct Scanner {
        /// Owned: opened on the reader's file, closed when the reader moves to another file or in `deinit`.
        var descriptor: Int32 = -1
        var identity: String?
        var scanned = 0
        var sightings: [Sighting] = []
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
    }

    private let path: String
    private let position = FanoutMutex(ReaderPosition())
    private let scanner = FanoutMutex(Scanner())
    private let latestReading = FanoutMutex(Reading(bytes: 0, jobs: 0, oldestAge: nil))

    /// What the last `measure()` found. Any thread.
    var latest: Reading { latestReading.withLock { $0 } }

    init(path: String) { self.path = path }

    deinit {
        scanner.withLock { if $0.descriptor >= 0 { close($0.descriptor) } }
    }

    /// The reader's file (`FollowedJobFile.identity`) and how much of it it has read. The reading task only.
    func readerAt(identity: String?, bytesRead: Int) {
        position.withLock {
            $0.identity = identity
            $0.bytesRead = bytesRead
        }
    }

    /// The lag now, kept as `latest`. Any thread (one at a time: the scanner is behind a lock).
    @discardableResult func measure(now: ContinuousClock.Instant = .now) -> Reading {
        let reader = position.withLock { $0 }
        let reading = scanner.withLock { scanner in
            guard let identity = reader.identity, Self.follow(identity, path: path, scanner: &scanner) else {
                return Reading(bytes: 0, jobs: 0, oldestAge: nil)
            }
            if scanner.scanned < reader.bytesRead { scanner.scanned = reader.bytesRead }
            var status = stat()
            guard fstat(scanner.descriptor, &status) == 0 else { return Reading(bytes: 0, jobs: 0, oldestAge: nil) }
            let size = Int(status.st_size)
            if size > scanner.scanned {
                let newlines = Self.countNewlines(in: scanner.scanned..<size, scanner: &scanner)
                scanner.sightings.append(Sighting(start: scanner.scanned, end: size, newlines: newlines, at: now))
                scanner.scanned = size
            }
            scanner.sightings.removeAll { $0.end <= reader.bytesRead }
            var jobs = 0
            for (index, sighting) in scanner.sightings.enumerated() {
                if index == 0 && sighting.start < reader.bytesRead {
                    jobs += Self.countNewlines(in: reader.bytesRead..<sighting.end, scanner: &scanner)
                } else {
                    jobs += sighting.newlines
                }
            }
            let oldest = jobs > 0 ? scanner.sightings.first.map { now - $0.at } : nil
            return Reading(bytes: max(0, size - reader.bytesRead), jobs: jobs, oldestAge: oldest)
        }
        latestReading.withLock { $0 = reading }
        return reading
    }

    /// Points the scanner at the reader's file: kept while the reader reads it; opened at `path` when the reader
    /// moves to the file there now (a rotation). False when that file cannot be opened as the reader's.
    private static func follow(_ identity: String, path: String, scanner: inout Scanner) -> Bool {
        if scanner.identity == identity && scanner.descriptor >= 0 { return true }
        if scanner.descriptor >= 0 { close(scanner.descriptor) }
        scanner = Scanner(buffer: scanner.buffer)
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return false }
        var status = stat()
        guard fstat(descriptor, &status) == 0,
            FollowedJobFile.identity(device: UInt64(status.st_dev), inode: UInt64(status.st_ino)) == identity
        else {
            close(descriptor)
            return false
        }
        scanner.descriptor = descriptor
        scanner.identity = identity
        return true
    }

    private static func countNewlines(in range: Range<Int>, scanner: inout Scanner) -> Int {
        var count = 0
        var offset = range.lowerBound
        let descriptor = scanner.descriptor
        while offset < range.upperBound {
            let wanted = min(scanner.buffer.count, range.upperBound - offset)
            let got = scanner.buffer.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, wanted, off_t(offset)) }
            guard got > 0 else { break }
            scanner.buffer.withUnsafeBytes { bytes in
                for index in 0..<got where bytes[index] == 10 { count += 1 }
            }
            offset += got
        }
        return count
    }
}
