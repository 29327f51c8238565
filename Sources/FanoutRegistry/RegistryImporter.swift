import FanoutCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// What an import did.
package struct RegistryImportSummary: Sendable, Hashable {
    /// Lines read (blank lines and the CSV header included).
    package var lines = 0
    /// Registrations parsed and handed to the store.
    package var registrations = 0
    /// Registrations in batches committed so far (all of them once the import returns; in `onBatch`, what a crash
    /// at that moment would keep).
    package var committed = 0
    package var added = 0
    package var rotated = 0
    package var removed = 0
    /// Registrations the store already held (what a second import of the same file reports for every line).
    package var unchanged = 0
    /// Registrations whose back-filled `registered_at` was already more than a token lifetime ago.
    package var alreadyExpired = 0
    /// Lines refused (each reported to `onInvalidLine`).
    package var invalid = 0
    /// Transactions committed.
    package var batches = 0

    package init() {}

    /// `{"lines":…,"registrations":…,"added":…,"rotated":…,"removed":…,"unchanged":…,"already_expired":…,
    /// "invalid":…}`.
    package var jsonLine: String {
        "{\"lines\":\(lines),\"registrations\":\(registrations),\"added\":\(added),\"rotated\":\(rotated),"
            + "\"removed\":\(removed),\"unchanged\":\(unchanged),\"already_expired\":\(alreadyExpired),"
            + "\"invalid\":\(invalid)}"
    }
}

/// Bulk import of registrations from a JSON-lines or CSV file (`fanout registry import`).
///
/// Lines are parsed and validated one by one; a bad line (or one naming an app the registry does not define) is
/// reported with its line number and field and skipped, and the others go on. Valid registrations are applied in
/// batches of `batchSize`, one transaction each, so a crash or kill -9 leaves the registry holding exactly a prefix of
/// the file's batches, and importing the file again completes it: the rows already there are unchanged and produce
/// no events.
package struct RegistryImporter: Sendable {
    /// Registrations per transaction.
    package var batchSize = 50_000
    /// The file's format; nil to detect it from the first non-blank line.
    package var format: RegistryImportFormat?
    /// Parse and validate only; write nothing.
    package var dryRun = false

    package init(batchSize: Int = 50_000, format: RegistryImportFormat? = nil, dryRun: Bool = false) {
        precondition(batchSize > 0, "batchSize must be positive")
        self.batchSize = batchSize
        self.format = format
        self.dryRun = dryRun
    }

    /// Imports `path` into `store`.
    ///
    /// - Parameters:
    ///   - onInvalidLine: called for each refused line, in order.
    ///   - onBatch: called after each committed batch with the totals so far (for progress).
    /// - returns: the totals. Throws `unreadableInput` when the file cannot be read, and the store's errors (busy,
    ///   corrupt, ...), after which the batches already committed stay.
    package func run(
        path: String, into store: some RegistryStore,
        onInvalidLine: (RegistryImportError) -> Void = { _ in },
        onBatch: (RegistryImportSummary) -> Void = { _ in }
    ) async throws(RegistryError) -> RegistryImportSummary {
        var reader = try LineFileReader(path: path)
        let apps = Set(try await store.apps().map(\.bundleID))
        var parser: RegistryImportParser?
        var summary = RegistryImportSummary()
        var batch: [RegistryChange] = []
        batch.reserveCapacity(batchSize)
        // The batch being written while the next one is parsed: parsing and SQLite each take one core. Batches are
        // still committed one at a time and in file order, so a kill leaves a prefix of them.
        var writing: (task: Task<RegistryApplyResult, any Error>, count: Int)?

        func finishWriting() async throws(RegistryError) {
            guard let (task, count) = writing else { return }
            writing = nil
            let result: RegistryApplyResult
            do {
                result = try await task.value
            } catch let error as RegistryError {
                throw error
            } catch {
                throw RegistryError(.storage, "\(error)")
            }
            for event in result.events {
                switch event.change {
                case .added: summary.added += 1
                case .rotated: summary.rotated += 1
                case .removed: summary.removed += 1
                }
            }
            summary.unchanged += result.unchanged
            summary.alreadyExpired += result.alreadyExpired
            summary.batches += 1
            summary.committed += count
            onBatch(summary)
        }

        func startWriting() async throws(RegistryError) {
            try await finishWriting()
            guard !batch.isEmpty else { return }
            defer { batch.removeAll(keepingCapacity: true) }
            guard !dryRun else { return }
            let changes = batch
            if let store = store as? SQLiteRegistryStore {
                // The parser validated every registration with the store's own rules; only apps are resolved again.
                writing = (Task.detached { try store.applyNow(changes, validated: true) }, changes.count)
            } else {
                writing = (Task.detached { try await store.apply(changes) }, changes.count)
            }
        }

        do throws(RegistryError) {
            while let line = try reader.nextLine() {
                summary.lines += 1
                let lineNumber = summary.lines
                if parser == nil {
                    guard line.contains(where: { !RegistryImportParser.isBlank($0) }) else { continue }
                    parser = RegistryImportParser(format: format ?? .detect(firstLine: line))
                }
                let registration: Registration?
                do {
                    registration = try parser!.parse(line: line, lineNumber: lineNumber)
                } catch {
                    summary.invalid += 1
                    onInvalidLine(error)
                    continue
                }
                guard let registration else { continue }
                guard apps.contains(registration.app) else {
                    summary.invalid += 1
                    onInvalidLine(
                        RegistryImportError(
                            lineNumber: lineNumber, field: "app",
                            message: "unknown app \(RegistryValidation.excerpt(registration.app)) (define it first)"))
                    continue
                }
                summary.registrations += 1
                batch.append(registration.change)
                if batch.count >= batchSize { try await startWriting() }
            }
            try await startWriting()
            try await finishWriting()
        } catch {
            // Let the batch in flight end (committed or not) before reporting, so nothing writes after we return.
            _ = try? await writing?.task.value
            throw error
        }
        return summary
    }
}

/// Reads a file line by line through one reusable buffer (no `String` per line, no whole-file load).
struct LineFileReader: ~Copyable {
    /// The longest line accepted.
    static let maximumLineLength = 1 << 20

    /// The file descriptor. Owned: opened in `init`, closed in `deinit`.
    private let descriptor: Int32
    private let path: String
    private var buffer: [UInt8]
    private var start = 0
    private var end = 0
    private var atEOF = false

    init(path: String) throws(RegistryError) {
        let descriptor = open(path, O_RDONLY)
        guard descriptor >= 0 else {
            throw RegistryError(.unreadableInput, "cannot open \(path): \(String(cString: strerror(errno)))")
        }
        self.descriptor = descriptor
        self.path = path
        buffer = [UInt8](repeating: 0, count: 1 << 20)
    }

    deinit {
        close(descriptor)
    }

    /// The next line without its `\n` (a `\r` before it stays; the parsers treat it as blank), or nil at the end.
    mutating func nextLine() throws(RegistryError) -> ArraySlice<UInt8>? {
        while true {
            if let newline = newlineIndex() {
                let line = buffer[start..<newline]
                start = newline + 1
                return line
            }
            if atEOF {
                guard start < end else { return nil }
                let line = buffer[start..<end]
                start = end
                return line
            }
            try fill()
        }
    }

    /// The index of the next `\n` in the unread bytes (memchr: this runs once per line of a million-line file).
    private func newlineIndex() -> Int? {
        guard start < end else { return nil }
        return buffer.withUnsafeBytes { bytes -> Int? in
            guard let found = memchr(bytes.baseAddress! + start, Int32(UInt8(ascii: "\n")), end - start) else {
                return nil
            }
            return UnsafeRawPointer(found) - bytes.baseAddress!
        }
    }

    /// Moves the unread bytes to the front and reads more after them.
    private mutating func fill() throws(RegistryError) {
        if start > 0 {
            let count = end - start
            if count > 0 {
                buffer.withUnsafeMutableBytes { bytes in
                    bytes.baseAddress!.copyMemory(from: bytes.baseAddress! + start, byteCount: count)
                }
            }
            start = 0
            end = count
        }
        if end == buffer.count {
            guard buffer.count < LineFileReader.maximumLineLength * 2 else {
                throw RegistryError(
                    .unreadableInput, "\(path): a line is longer than \(LineFileReader.maximumLineLength) bytes")
            }
            buffer.append(contentsOf: repeatElement(0, count: buffer.count))
        }
        let capacity = buffer.count - end
        let count = buffer.withUnsafeMutableBytes { bytes in read(descriptor, bytes.baseAddress! + end, capacity) }
        guard count >= 0 else {
            if errno == EINTR { return }
            throw RegistryError(.unreadableInput, "cannot read \(path): \(String(cString: strerror(errno)))")
        }
        if count == 0 { atEOF = true }
        end += count
    }
}
