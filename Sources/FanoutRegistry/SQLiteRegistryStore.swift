import FanoutCore
import FanoutSQLite

/// The registry in one SQLite file (WAL mode): the store `fanout registry`, `fanout send --registry` and
/// `fanout serve --db` open.
///
/// Two connections: one writer and one reader, each behind its own mutex. Writes (batches, sweeps) go through the
/// writer in `BEGIN IMMEDIATE` transactions; paged reads go through the reader and never wait for a write, because
/// WAL readers see the last committed state. Other processes may open the same file; a write waits up to
/// `busyTimeoutMilliseconds` for their locks, then fails `busy`.
///
/// The SQLite calls block the calling thread (briefly: one batch or one page).
public final class SQLiteRegistryStore: RegistryStore {
    public let path: String
    public let configuration: RegistryConfiguration
    public var clock: RegistryClock { configuration.clock }

    private let writer: FanoutMutex<RegistryConnection>
    private let reader: FanoutMutex<RegistryConnection>
    /// Single-row lookups (an activity, devices by their tokens), which API requests make before they answer: a
    /// connection of their own, so that a request never waits behind a page of a large send's tokens, which holds
    /// `reader` for milliseconds.
    private let lookupReader: FanoutMutex<RegistryConnection>
    private let hub: RegistryEventHub

    /// Opens the registry at `path`, creating it when the file is missing or empty. Throws `notARegistry` for any
    /// other SQLite database or a file that is not SQLite (leaving it untouched), `corrupt` for a damaged registry,
    /// `unsupportedVersion` for one made by a newer Fanout, `busy` when another process holds it locked past the busy
    /// timeout, and `unavailable` when the file cannot be opened.
    public init(path: String, configuration: RegistryConfiguration = RegistryConfiguration()) throws(RegistryError) {
        self.path = path
        self.configuration = configuration
        do {
            let writerDatabase = try SQLiteDatabase(
                path: path, mode: .readWriteCreate, busyTimeoutMilliseconds: configuration.busyTimeoutMilliseconds)
            try SQLiteRegistryStore.prepare(writerDatabase, path: path)
            // A checkpoint every 16,000 WAL pages (256 MB) instead of SQLite's 1,000: a bulk import's commits each
            // rewrite most of the token index, and a larger WAL copies each of its pages to the file fewer times.
            // After a checkpoint the WAL file is cut back to 64 MB. The writer maps up to 1 GiB of the file.
            try writerDatabase.execute(
                """
                PRAGMA cache_size = -\(configuration.cacheKiB); PRAGMA temp_store = MEMORY;
                PRAGMA wal_autocheckpoint = 16000; PRAGMA journal_size_limit = 67108864;
                PRAGMA mmap_size = 1073741824
                """)
            let readerDatabase = try SQLiteDatabase(
                path: path, mode: .readWrite, busyTimeoutMilliseconds: configuration.busyTimeoutMilliseconds)
            // The reader never writes; query_only makes SQLite refuse it if a bug ever tried. It pages through ranges
            // of an index in order, so a small cache serves it, and it maps nothing: every mapped page a million-token
            // send touched would count in the sender's resident memory (+290 MB measured), where an 8 MB cache keeps
            // it flat.
            try readerDatabase.execute("PRAGMA cache_size = -8192; PRAGMA mmap_size = 0; PRAGMA query_only = 1")
            let lookupDatabase = try SQLiteDatabase(
                path: path, mode: .readWrite, busyTimeoutMilliseconds: configuration.busyTimeoutMilliseconds)
            try lookupDatabase.execute("PRAGMA cache_size = -2048; PRAGMA mmap_size = 0; PRAGMA query_only = 1")
            let writerConnection = RegistryConnection(database: writerDatabase, configuration: configuration)
            let readerConnection = RegistryConnection(database: readerDatabase, configuration: configuration)
            _ = try writerConnection.loadApps()
            writer = FanoutMutex(writerConnection)
            reader = FanoutMutex(readerConnection)
            lookupReader = FanoutMutex(RegistryConnection(database: lookupDatabase, configuration: configuration))
        } catch let error as RegistryError {
            throw error
        } catch let error as SQLiteError {
            throw RegistryConnection.map(error, path: path)
        } catch {
            throw RegistryError(.storage, "\(path): \(error)")
        }
        hub = RegistryEventHub(bufferLimit: configuration.subscriberBufferLimit)
    }

    /// Checks what the file is and creates the schema in a new one. Writes nothing to a file that is not ours.
    private static func prepare(_ database: SQLiteDatabase, path: String) throws {
        switch try database.identify() {
        case .empty:
            // The page size first (WAL mode freezes it), then WAL (it cannot change inside a transaction), then the
            // schema in one transaction (re-checked under the write lock, in case another process created it
            // meanwhile).
            try database.execute("PRAGMA page_size = \(RegistrySchema.pageSize)")
            try database.useWriteAheadLog()
            try database.transaction { () throws(SQLiteError) in
                guard try database.identify() == .empty else { return }
                try database.execute(RegistrySchema.create)
                try database.setApplicationID(RegistrySchema.applicationID)
                try database.setUserVersion(RegistrySchema.version)
            }
            try check(try database.identify(), path: path)
        case let identity:
            try check(identity, path: path)
            try database.useWriteAheadLog()
            if case .database(_, let version) = identity, version < RegistrySchema.version {
                try upgrade(database, path: path)
            }
        }
    }

    /// Brings a registry of an older schema version up to this one, in one transaction under the write lock (the
    /// version re-read there, in case another process upgraded it meanwhile).
    private static func upgrade(_ database: SQLiteDatabase, path: String) throws {
        try database.transaction { () throws(SQLiteError) in
            guard case .database(_, let version) = try database.identify(), (1...3).contains(version) else {
                return
            }
            if version <= 1 { try database.execute(RegistrySchema.upgradeFromVersion1) }
            if version <= 2 { try database.execute(RegistrySchema.upgradeFromVersion2) }
            if version <= 3 { try database.execute(RegistrySchema.upgradeFromVersion3) }
            try database.setUserVersion(RegistrySchema.version)
        }
    }

    private static func check(_ identity: SQLiteDatabase.FileIdentity, path: String) throws(RegistryError) {
        guard case .database(let applicationID, let version) = identity else {
            throw RegistryError(.storage, "\(path): the registry schema was not created")
        }
        guard applicationID == RegistrySchema.applicationID else {
            throw RegistryError(
                .notARegistry, "\(path) is not a Fanout registry (an SQLite database of something else)")
        }
        guard version <= RegistrySchema.version else {
            throw RegistryError(
                .unsupportedVersion,
                "\(path) is a registry of schema version \(version); this Fanout reads version \(RegistrySchema.version)"
            )
        }
    }

    /// Closes the connections and ends every `subscribe()` stream (idempotent). Calls after it fail `unavailable`.
    public func close() {
        writer.withLock { $0.database.close() }
        reader.withLock { $0.database.close() }
        lookupReader.withLock { $0.database.close() }
        hub.finish()
    }

    deinit {
        close()
    }

    // MARK: Running on a connection

    private func write<R: Sendable>(_ body: (RegistryConnection) throws(RegistryError) -> R) throws(RegistryError) -> R
    {
        try writer.withLock { connection throws(RegistryError) -> R in
            guard connection.database.isOpen else { throw RegistryError(.unavailable, "\(path) is closed") }
            return try body(connection)
        }
    }

    /// Runs `body` on the reader, or for a single-row lookup (`lookup`) on the lookup reader.
    private func read<R: Sendable>(lookup: Bool = false, _ body: (RegistryConnection) throws(RegistryError) -> R)
        throws(RegistryError) -> R
    {
        if lookup {
            return try lookupReader.withLock { connection throws(RegistryError) -> R in
                guard connection.database.isOpen else { throw RegistryError(.unavailable, "\(path) is closed") }
                return try body(connection)
            }
        }
        return try reader.withLock { connection throws(RegistryError) -> R in
            guard connection.database.isOpen else { throw RegistryError(.unavailable, "\(path) is closed") }
            return try body(connection)
        }
    }

    private func storage<R>(_ body: () throws(SQLiteError) -> R) throws(RegistryError) -> R {
        do {
            return try body()
        } catch {
            throw RegistryConnection.map(error, path: path)
        }
    }

    // MARK: Apps

    public func defineApps(_ apps: [RegistryApp]) async throws(RegistryError) {
        for app in apps {
            _ = try RegistryValidation.identifier(app.bundleID, field: "app")
            _ = try RegistryValidation.identifier(app.workspace, field: "workspace")
        }
        try write { connection throws(RegistryError) in
            try storage { () throws(SQLiteError) in try connection.defineApps(apps) }
        }
    }

    public func apps() async throws(RegistryError) -> [RegistryApp] {
        try read { connection throws(RegistryError) in
            try storage { () throws(SQLiteError) in try connection.loadApps() }
        }
    }

    // MARK: Writes

    @discardableResult
    public func apply(_ changes: [RegistryChange]) async throws(RegistryError) -> RegistryApplyResult {
        try applyNow(changes)
    }

    /// `apply`, synchronously (for the importer and the command line, which have no reason to hop executors).
    /// `validated`: the changes already passed `RegistryValidation` (the import parser's registrations), so only
    /// their apps are resolved; tokens must then be lowercase already.
    @discardableResult
    package func applyNow(_ changes: [RegistryChange], validated: Bool = false) throws(RegistryError)
        -> RegistryApplyResult
    {
        guard !changes.isEmpty else { return RegistryApplyResult() }
        let now = clock.now()
        return try write { connection throws(RegistryError) in
            var valid: [ValidChange] = []
            valid.reserveCapacity(changes.count)
            for (index, change) in changes.enumerated() {
                do throws(RegistryError) {
                    valid.append(try connection.validate(change, trusted: validated))
                } catch {
                    guard error.kind == .invalidInput, changes.count > 1 else { throw error }
                    throw RegistryError(.invalidInput, field: error.field, "change \(index): \(error.message)")
                }
            }
            let result = try storage { () throws(SQLiteError) in try connection.apply(valid, now: now) }
            hub.publish(result.events)
            return result
        }
    }

    public func sweep(now: Int64, batchSize: Int) async throws(RegistryError) -> RegistrySweepResult {
        precondition(batchSize > 0, "batchSize must be positive")
        var total = RegistrySweepResult()
        while true {
            let (result, more) = try write { connection throws(RegistryError) in
                let (result, events, more) = try storage { () throws(SQLiteError) in
                    try connection.sweepBatch(now: now, batchSize: batchSize)
                }
                hub.publish(events)
                return (result, more)
            }
            total.expired += result.expired
            total.ended += result.ended
            total.activitiesRemoved += result.activitiesRemoved
            total.eventsPruned += result.eventsPruned
            guard more else { return total }
        }
    }

    // MARK: Reads

    public func liveUpdateTokens(app: String, activityID: String, after: RegistryCursor?, limit: Int, now: Int64)
        async throws(RegistryError) -> RegistryPage<UpdateTokenRecord>
    {
        guard let cursor = RegistryCursor.tokenRow(after) else {
            throw .invalid("cursor", "\(after?.rawValue ?? "") is not a cursor of this registry")
        }
        let limit = try SQLiteRegistryStore.limit(limit)
        let activityID = try RegistryValidation.identifier(activityID, field: "activity_id")
        return try read { connection throws(RegistryError) in
            let app = try connection.requireApp(app)
            return try storage { () throws(SQLiteError) in
                try connection.liveUpdateTokens(
                    app: app, activityID: activityID, after: cursor, limit: limit, now: now)
            }
        }
    }

    public func endedChannels(now: Int64, limit: Int, skipping: Int) async throws(RegistryError) -> [EndedChannel] {
        let limit = try SQLiteRegistryStore.limit(limit)
        let skipping = max(0, skipping)
        return try read { connection throws(RegistryError) in
            let rows = try storage { () throws(SQLiteError) in
                try connection.endedChannels(now: now, limit: limit, skipping: skipping)
            }
            var channels: [EndedChannel] = []
            for row in rows {
                let app = try storage { () throws(SQLiteError) in try connection.bundleID(row.app) }
                channels.append(
                    EndedChannel(
                        app: app, activityID: row.activityID, channelID: row.channelID, environment: row.environment))
            }
            return channels
        }
    }

    public func liveUpdateTokenCount(app: String, activityID: String, now: Int64) async throws(RegistryError) -> Int {
        let activityID = try RegistryValidation.identifier(activityID, field: "activity_id")
        return try read { connection throws(RegistryError) in
            let app = try connection.requireApp(app)
            return try storage { () throws(SQLiteError) in
                try connection.liveUpdateTokenCount(app: app, activityID: activityID, now: now)
            }
        }
    }

    public func updateTokens(app: String, deviceID: String, after: RegistryCursor?, limit: Int, now: Int64)
        async throws(RegistryError) -> RegistryPage<UpdateTokenRecord>
    {
        let row = try SQLiteRegistryStore.row(after)
        let limit = try SQLiteRegistryStore.limit(limit)
        let deviceID = try RegistryValidation.identifier(deviceID, field: "device")
        return try read { connection throws(RegistryError) in
            let app = try connection.requireApp(app)
            return try storage { () throws(SQLiteError) in
                try connection.updateTokens(app: app, deviceID: deviceID, after: row, limit: limit, now: now)
            }
        }
    }

    public func pushToStartTokens(
        app: String, attributesType: String?, selection: RecipientSelection, after: RegistryCursor?, limit: Int
    ) async throws(RegistryError) -> RegistryPage<PushToStartRecord> {
        let cursor = try SQLiteRegistryStore.listCursor(after)
        let limit = try SQLiteRegistryStore.limit(limit)
        let attributesType = try RegistryValidation.optionalIdentifier(attributesType, field: "attributes_type")
        return try read { connection throws(RegistryError) in
            let app = try connection.requireApp(app)
            return try storage { () throws(SQLiteError) in
                try connection.pushToStartTokens(
                    app: app, attributesType: attributesType, selection: selection, after: cursor, limit: limit)
            }
        }
    }

    public func devices(app: String, selection: RecipientSelection, after: RegistryCursor?, limit: Int)
        async throws(RegistryError) -> RegistryPage<DeviceRecord>
    {
        let cursor = try SQLiteRegistryStore.listCursor(after)
        let limit = try SQLiteRegistryStore.limit(limit)
        return try read { connection throws(RegistryError) in
            let app = try connection.requireApp(app)
            return try storage { () throws(SQLiteError) in
                try connection.devices(app: app, selection: selection, after: cursor, limit: limit)
            }
        }
    }

    public func devices(app: String, pushTokens: [String]) async throws(RegistryError) -> [DeviceRecord] {
        var tokens: [String] = []
        for token in pushTokens {
            tokens.append(try RegistryValidation.token(token, field: "push_token", allowEmpty: false))
        }
        return try read(lookup: true) { connection throws(RegistryError) in
            let app = try connection.requireApp(app)
            return try storage { () throws(SQLiteError) in try connection.devices(app: app, pushTokens: tokens) }
        }
    }

    public func activity(app: String, activityID: String) async throws(RegistryError) -> ActivityRecord? {
        let activityID = try RegistryValidation.identifier(activityID, field: "activity_id")
        return try read(lookup: true) { connection throws(RegistryError) in
            let app = try connection.requireApp(app)
            return try storage { () throws(SQLiteError) in try connection.activity(app: app, activityID: activityID) }
        }
    }

    public func events(after: RegistryCursor?, limit: Int) async throws(RegistryError) -> RegistryPage<RegistryEvent> {
        let row = try SQLiteRegistryStore.row(after)
        let limit = try SQLiteRegistryStore.limit(limit)
        return try read { connection throws(RegistryError) in
            try storage { () throws(SQLiteError) in try connection.events(after: row, limit: limit) }
        }
    }

    public func stats(now: Int64) async throws(RegistryError) -> RegistryStats {
        try read { connection throws(RegistryError) in
            try storage { () throws(SQLiteError) in try connection.stats(now: now) }
        }
    }

    public func subscribe() -> AsyncStream<RegistryEvent> {
        hub.subscribe()
    }

    // MARK: Arguments

    private static func row(_ cursor: RegistryCursor?) throws(RegistryError) -> Int64 {
        guard let cursor else { return 0 }
        guard let row = cursor.row else { throw .invalid("cursor", "\(cursor) is not a cursor of this registry") }
        return row
    }

    private static func listCursor(_ cursor: RegistryCursor?) throws(RegistryError) -> ListCursor {
        guard let list = ListCursor(cursor) else {
            throw .invalid("cursor", "\(cursor?.rawValue ?? "") is not a cursor of this registry")
        }
        return list
    }

    private static func limit(_ limit: Int) throws(RegistryError) -> Int {
        guard limit > 0 else { throw .invalid("limit", "must be at least 1, not \(limit)") }
        return limit
    }
}
