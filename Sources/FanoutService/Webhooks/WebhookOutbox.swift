import FanoutCore
import FanoutSQLite
import Foundation

/// One event as the outbox keeps it and a receiver gets it: `body` is the JSON POSTed (`id`, `type`, `workspace`,
/// `created`, `data`).
struct WebhookEvent: Sendable, Equatable {
    /// Unique and stable: the same happening always gets the same id, so a receiver deduplicates by it.
    var id: String
    var type: WebhookEventType
    var workspace: String
    /// Unix milliseconds.
    var created: Int64
    var data: JSONObject
    /// What must stay in order (the activity, else the dispatch, else the token): an endpoint's events with the
    /// same key go through the same delivery lane, one at a time. Not part of the body.
    var orderKey: String

    init(id: String, type: WebhookEventType, workspace: String, created: Int64, data: JSONObject, orderKey: String) {
        self.id = id
        self.type = type
        self.workspace = workspace
        self.created = created
        self.data = data
        self.orderKey = orderKey
    }

    /// The lane of `orderKey` among `lanes` (FNV-1a: the same on every run, since lanes are kept on disk).
    func lane(of lanes: Int) -> Int {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in orderKey.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return Int(hash % UInt64(max(1, lanes)))
    }

    /// The JSON body.
    var body: [UInt8] {
        JSONValue.object([
            "id": .string(id), "type": .string(type.rawValue), "workspace": .string(workspace),
            "created": .integer(created), "data": .object(data),
        ]).encoded()
    }
}

/// A pending delivery: one event for one endpoint.
struct WebhookDelivery: Sendable {
    var sequence: Int64
    var eventID: String
    var type: String
    var body: [UInt8]
    var attempts: Int
}

/// The webhook outbox: tables of its own in the instance's SQLite file (`--db`), on a connection of its own.
///
/// - `webhook_events`: every event recorded (`seq` orders them; `id` is unique, so recording the same happening twice
///   is a no-op). Kept `retention` after they were made, for deduplication of a re-recorded event.
/// - `webhook_pending`: (endpoint, lane, event) for each delivery not yet answered 2xx, keyed so a lane's are read
///   in event order. A row is deleted only after its 2xx (at least once).
/// - `webhook_meta`: the registry change feed's cursor (token removals) and where it started.
///
/// The file's writers are several (registry, dispatch store, this): each write is one short `BEGIN IMMEDIATE`
/// transaction that waits for the others' locks up to the busy timeout.
final class WebhookOutbox: Sendable {
    private let database: FanoutMutex<OutboxConnection>
    let path: String
    /// How long a recorded event is kept once delivered everywhere (its id still deduplicates for that long).
    static let retention: Int64 = 3 * 86_400_000

    static let schema = """
        CREATE TABLE IF NOT EXISTS webhook_events (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            workspace TEXT NOT NULL,
            type TEXT NOT NULL,
            created INTEGER NOT NULL,
            body BLOB NOT NULL
        ) STRICT;
        CREATE INDEX IF NOT EXISTS webhook_events_by_workspace ON webhook_events (workspace, seq);
        CREATE TABLE IF NOT EXISTS webhook_pending (
            endpoint TEXT NOT NULL,
            lane INTEGER NOT NULL,
            event INTEGER NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (endpoint, lane, event)
        ) STRICT, WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS webhook_pending_by_event ON webhook_pending (event);
        CREATE TABLE IF NOT EXISTS webhook_meta (
            name TEXT PRIMARY KEY,
            value TEXT NOT NULL
        ) STRICT, WITHOUT ROWID;
        """

    /// Opens the outbox in the file the dispatch store already opened (and so checked is Fanout's).
    init(path: String) throws(SQLiteError) {
        self.path = path
        let database = try SQLiteDatabase(path: path, mode: .readWrite, busyTimeoutMilliseconds: 5_000)
        _ = try database.useWriteAheadLog()
        // No checkpoint inside a commit (one can take tens of milliseconds, and an accept's event is recorded on the
        // request's path): the deliverers call the dispatch store's passive `checkpointIfDue` instead.
        try database.execute("PRAGMA wal_autocheckpoint = 0")
        try database.transaction(.immediate) { () throws(SQLiteError) in try database.execute(Self.schema) }
        self.database = FanoutMutex(OutboxConnection(database: database))
    }

    func close() {
        database.withLock { $0.database.close() }
    }

    private func write<R: Sendable>(_ body: (SQLiteDatabase) throws(SQLiteError) -> R) throws(SQLiteError) -> R {
        try database.withLock { connection throws(SQLiteError) -> R in
            let database = connection.database
            guard database.isOpen else { throw SQLiteError(code: 21, message: "the outbox is closed") }
            return try database.transaction(.immediate) { () throws(SQLiteError) in try body(database) }
        }
    }

    /// Reads in one deferred transaction (no write lock taken).
    private func read<R: Sendable>(_ body: (SQLiteDatabase) throws(SQLiteError) -> R) throws(SQLiteError) -> R {
        try database.withLock { connection throws(SQLiteError) -> R in
            let database = connection.database
            guard database.isOpen else { throw SQLiteError(code: 21, message: "the outbox is closed") }
            return try database.transaction(.deferred) { () throws(SQLiteError) in try body(database) }
        }
    }

    /// Records `events` in order, each with a pending delivery for every endpoint in `endpoints(event)`, in one
    /// transaction; an event whose id is already recorded is skipped (with no new deliveries). `meta` is written in
    /// the same transaction (the registry feed's cursor with the events it read). Returns how many were new.
    @discardableResult
    func record(
        _ events: [WebhookEvent], endpoints: (WebhookEvent) -> [(endpoint: String, lane: Int)],
        meta: [(String, String)] = []
    ) throws(SQLiteError) -> Int {
        try write { database throws(SQLiteError) -> Int in
            var added = 0
            for event in events {
                let inserted = try database.withStatement(
                    """
                    INSERT INTO webhook_events (id, workspace, type, created, body) VALUES (?1, ?2, ?3, ?4, ?5)
                    ON CONFLICT (id) DO NOTHING
                    """
                ) { statement throws(SQLiteError) -> Bool in
                    try statement.bind(event.id, at: 1)
                    try statement.bind(event.workspace, at: 2)
                    try statement.bind(event.type.rawValue, at: 3)
                    try statement.bind(event.created, at: 4)
                    try statement.bind(event.body, at: 5)
                    try statement.run()
                    return database.changes == 1
                }
                guard inserted else { continue }
                added += 1
                let sequence = database.lastInsertRowID
                for (endpoint, lane) in endpoints(event) {
                    try database.withStatement(
                        "INSERT INTO webhook_pending (endpoint, lane, event) VALUES (?1, ?2, ?3)"
                    ) { statement throws(SQLiteError) in
                        try statement.bind(endpoint, at: 1)
                        try statement.bind(Int64(lane), at: 2)
                        try statement.bind(sequence, at: 3)
                        try statement.run()
                    }
                }
            }
            for (name, value) in meta {
                try database.withStatement(
                    "INSERT INTO webhook_meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = ?2"
                ) { statement throws(SQLiteError) in
                    try statement.bind(name, at: 1)
                    try statement.bind(value, at: 2)
                    try statement.run()
                }
            }
            return added
        }
    }

    /// Whether an event with this id is recorded.
    func contains(eventID: String) throws(SQLiteError) -> Bool {
        try read { database throws(SQLiteError) -> Bool in
            try database.withStatement("SELECT 1 FROM webhook_events WHERE id = ?1") { statement throws(SQLiteError) in
                try statement.bind(eventID, at: 1)
                return try statement.step()
            }
        }
    }

    func meta(_ name: String) throws(SQLiteError) -> String? {
        try read { database throws(SQLiteError) -> String? in
            try database.withStatement("SELECT value FROM webhook_meta WHERE name = ?1") {
                statement throws(SQLiteError) in
                try statement.bind(name, at: 1)
                return try statement.step() ? statement.string(at: 0) : nil
            }
        }
    }

    /// The oldest pending delivery of the endpoint's lane.
    func next(endpoint: String, lane: Int) throws(SQLiteError) -> WebhookDelivery? {
        try read { database throws(SQLiteError) -> WebhookDelivery? in
            try database.withStatement(
                """
                SELECT p.event, e.id, e.type, e.body, p.attempts FROM webhook_pending p
                JOIN webhook_events e ON e.seq = p.event
                WHERE p.endpoint = ?1 AND p.lane = ?2 ORDER BY p.event LIMIT 1
                """
            ) { statement throws(SQLiteError) -> WebhookDelivery? in
                try statement.bind(endpoint, at: 1)
                try statement.bind(Int64(lane), at: 2)
                guard try statement.step() else { return nil }
                return WebhookDelivery(
                    sequence: statement.int64(at: 0), eventID: statement.string(at: 1), type: statement.string(at: 2),
                    body: statement.data(at: 3).map { [UInt8]($0) } ?? [], attempts: Int(statement.int64(at: 4)))
            }
        }
    }

    /// A 2xx: the delivery is done.
    func delivered(endpoint: String, sequence: Int64) throws(SQLiteError) {
        try write { database throws(SQLiteError) in
            try database.withStatement("DELETE FROM webhook_pending WHERE endpoint = ?1 AND event = ?2") {
                statement throws(SQLiteError) in
                try statement.bind(endpoint, at: 1)
                try statement.bind(sequence, at: 2)
                try statement.run()
            }
        }
    }

    /// A failed attempt: counted, so the backoff survives a restart.
    func failed(endpoint: String, sequence: Int64) throws(SQLiteError) {
        try write { database throws(SQLiteError) in
            try database.withStatement(
                "UPDATE webhook_pending SET attempts = attempts + 1 WHERE endpoint = ?1 AND event = ?2"
            ) { statement throws(SQLiteError) in
                try statement.bind(endpoint, at: 1)
                try statement.bind(sequence, at: 2)
                try statement.run()
            }
        }
    }

    /// Pending deliveries per endpoint.
    func backlog() throws(SQLiteError) -> [String: Int] {
        try read { database throws(SQLiteError) -> [String: Int] in
            try database.withStatement("SELECT endpoint, count(*) FROM webhook_pending GROUP BY endpoint") {
                statement throws(SQLiteError) in
                var counts: [String: Int] = [:]
                while try statement.step() { counts[statement.string(at: 0)] = Int(statement.int64(at: 1)) }
                return counts
            }
        }
    }

    /// Moves the endpoint's deliveries in lanes at or past `lanes` (its `concurrency` was lowered) into the lanes
    /// it has now.
    func fold(endpoint: String, lanes: Int) throws(SQLiteError) {
        try write { database throws(SQLiteError) in
            try database.withStatement(
                "UPDATE webhook_pending SET lane = lane % ?2 WHERE endpoint = ?1 AND lane >= ?2"
            ) { statement throws(SQLiteError) in
                try statement.bind(endpoint, at: 1)
                try statement.bind(Int64(lanes), at: 2)
                try statement.run()
            }
        }
    }

    /// Drops the pending deliveries of endpoints no longer configured; returns how many.
    func dropEndpoints(except keep: Set<String>) throws(SQLiteError) -> Int {
        try write { database throws(SQLiteError) -> Int in
            let endpoints = try database.withStatement("SELECT DISTINCT endpoint FROM webhook_pending") {
                statement throws(SQLiteError) in
                var names: [String] = []
                while try statement.step() { names.append(statement.string(at: 0)) }
                return names
            }
            var dropped = 0
            for endpoint in endpoints where !keep.contains(endpoint) {
                try database.withStatement("DELETE FROM webhook_pending WHERE endpoint = ?1") {
                    statement throws(SQLiteError) in
                    try statement.bind(endpoint, at: 1)
                    try statement.run()
                }
                dropped += database.changes
            }
            return dropped
        }
    }

    /// Deletes events older than `retention` that no endpoint still waits for.
    func prune(now: Int64) throws(SQLiteError) {
        try write { database throws(SQLiteError) in
            try database.withStatement(
                """
                DELETE FROM webhook_events WHERE created < ?1
                AND NOT EXISTS (SELECT 1 FROM webhook_pending p WHERE p.event = webhook_events.seq)
                """
            ) { statement throws(SQLiteError) in
                try statement.bind(now - Self.retention, at: 1)
                try statement.run()
            }
        }
    }

    /// A workspace's events after `sequence`, oldest first (for a stream that resumes): sequence, type, body.
    func events(workspace: String, after sequence: Int64, limit: Int) throws(SQLiteError) -> [(
        Int64, String, [UInt8]
    )] {
        try read { database throws(SQLiteError) -> [(Int64, String, [UInt8])] in
            try database.withStatement(
                "SELECT seq, type, body FROM webhook_events WHERE workspace = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
            ) { statement throws(SQLiteError) in
                try statement.bind(workspace, at: 1)
                try statement.bind(sequence, at: 2)
                try statement.bind(Int64(limit), at: 3)
                var rows: [(Int64, String, [UInt8])] = []
                while try statement.step() {
                    rows.append(
                        (
                            statement.int64(at: 0), statement.string(at: 1),
                            statement.data(at: 2).map { [UInt8]($0) } ?? []
                        ))
                }
                return rows
            }
        }
    }

    /// The newest event's sequence (0 when there is none).
    func lastSequence() throws(SQLiteError) -> Int64 {
        try read { database throws(SQLiteError) -> Int64 in
            try database.scalarInt64("SELECT coalesce(max(seq), 0) FROM webhook_events") ?? 0
        }
    }
}

/// The outbox's connection, confined by its mutex (see `DispatchConnection`).
private final class OutboxConnection: @unchecked Sendable {
    let database: SQLiteDatabase
    init(database: SQLiteDatabase) { self.database = database }
}
