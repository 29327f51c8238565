import Fanout
import FanoutSQLite

/// The dispatch queue's tables, version 2, in the registry's file (whose header's `application_id` and
/// `user_version` belong to the registry, so the dispatch tables keep their own version in `dispatch_meta`).
///
/// - `dispatches`: one row per accepted API call. `seq` (the rowid) orders them; `id` is the unguessable public id.
///   The outcome counts and `done_prefix` (every position below it has a result) are updated in the same
///   transaction as the results they count, so they always agree with `dispatch_results`.
/// - `dispatch_results`: one row per recipient, WITHOUT ROWID and keyed (dispatch seq, position), so a dispatch's
///   results are one contiguous range read in position order, appends land at the end of the tree, and a result
///   for a position already recorded is refused by the key. Job-level results (position -1 in the engine) get keys
///   from `jobLevelKeyBase` up, far below every position, one new key each.
///   `job` is NULL when the result's job id is the dispatch's `job_id` (set from its first result), so a million rows
///   do not repeat it. Outcomes are stored as their index in `NotificationOutcome.all`. A broadcast's result has
///   `channel` (and no `token`); `dispatches.broadcasts` counts them.
///
/// Version 2 added `dispatches.request_digest`: the SHA-256 of the request that took the row's idempotency key, so
/// that the same key sent with another request is refused. A version 1 file is upgraded when opened (its rows have
/// none, and a retry with their keys gets the dispatch as before).
enum DispatchSchema {
    static let version: Int64 = 2

    /// Upgrades version 1 tables to this version.
    static let upgradeFrom1 = """
        ALTER TABLE dispatches ADD COLUMN request_digest TEXT;
        UPDATE dispatch_meta SET value = 2 WHERE name = 'version';
        """

    /// The first key of a dispatch's job-level results; the next ones follow it (`jobLevelKeyBase + 1`, ...).
    static let jobLevelKeyBase = Int64.min + 1
    /// Keys at or below this are job-level results.
    static let jobLevelKeyLimit = Int64.min / 2

    static let create = """
        CREATE TABLE dispatch_meta (
            name TEXT PRIMARY KEY,
            value INTEGER NOT NULL
        ) STRICT, WITHOUT ROWID;
        INSERT INTO dispatch_meta (name, value) VALUES ('version', \(version));

        CREATE TABLE dispatches (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            workspace TEXT NOT NULL,
            app TEXT NOT NULL,
            kind TEXT NOT NULL,
            job_line BLOB NOT NULL,
            state INTEGER NOT NULL DEFAULT 0 CHECK (state IN (0, 1, 2)),
            created_at INTEGER NOT NULL,
            started_at INTEGER,
            finished_at INTEGER,
            idempotency_key TEXT,
            request_digest TEXT,
            payload_encodings INTEGER NOT NULL DEFAULT 0,
            demoted INTEGER NOT NULL DEFAULT 0,
            job_id TEXT,
            done_prefix INTEGER NOT NULL DEFAULT 0,
            delivered INTEGER NOT NULL DEFAULT 0,
            rejected INTEGER NOT NULL DEFAULT 0,
            unregistered INTEGER NOT NULL DEFAULT 0,
            failed INTEGER NOT NULL DEFAULT 0,
            expired INTEGER NOT NULL DEFAULT 0,
            rate_limited INTEGER NOT NULL DEFAULT 0,
            invalid INTEGER NOT NULL DEFAULT 0,
            cancelled INTEGER NOT NULL DEFAULT 0,
            superseded INTEGER NOT NULL DEFAULT 0,
            retries INTEGER NOT NULL DEFAULT 0,
            broadcasts INTEGER NOT NULL DEFAULT 0,
            runs INTEGER NOT NULL DEFAULT 0
        ) STRICT;
        CREATE UNIQUE INDEX dispatches_by_idempotency_key ON dispatches (workspace, idempotency_key)
            WHERE idempotency_key IS NOT NULL;
        CREATE INDEX dispatches_unfinished ON dispatches (seq) WHERE state < 2;
        CREATE INDEX dispatches_by_workspace ON dispatches (workspace, seq);

        CREATE TABLE dispatch_results (
            dispatch INTEGER NOT NULL,
            position INTEGER NOT NULL,
            token TEXT,
            outcome INTEGER NOT NULL,
            status INTEGER,
            reason TEXT,
            apns_id TEXT,
            apns_unique_id TEXT,
            attempts INTEGER NOT NULL,
            latency_ms REAL NOT NULL,
            timestamp INTEGER,
            retry_after_s REAL,
            job TEXT,
            channel TEXT,
            PRIMARY KEY (dispatch, position)
        ) STRICT, WITHOUT ROWID;
        """

    /// The columns `DispatchRecord(row:)` reads, in its order.
    static let recordColumns = """
        id, workspace, app, kind, job_line, state, created_at, started_at, finished_at, idempotency_key,
        payload_encodings, demoted, delivered, rejected, unregistered, failed, expired, rate_limited, invalid,
        cancelled, superseded, retries, broadcasts
        """
    /// How many `recordColumns` there are: a column selected after them is at this index.
    static let recordColumnCount: Int32 = 23

    static let insertResult = SQLiteSQL(
        """
        INSERT INTO dispatch_results (dispatch, position, token, outcome, status, reason, apns_id, apns_unique_id,
            attempts, latency_ms, timestamp, retry_after_s, job, channel)
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
        ON CONFLICT DO NOTHING
        """)
}

extension DispatchState {
    var code: Int64 {
        switch self {
        case .queued: return 0
        case .running: return 1
        case .done: return 2
        }
    }

    init(code: Int64) {
        switch code {
        case 0: self = .queued
        case 1: self = .running
        default: self = .done
        }
    }
}

extension NotificationOutcome {
    /// The integer `dispatch_results.outcome` stores: the index in `NotificationOutcome.all`.
    var code: Int64 {
        Int64(NotificationOutcome.all.firstIndex(of: self) ?? NotificationOutcome.all.firstIndex(of: .invalid)!)
    }

    init(code: Int64) {
        let all = NotificationOutcome.all
        self = code >= 0 && code < all.count ? all[Int(code)] : .invalid
    }
}
