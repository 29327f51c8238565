/// The SQLite registry's schema: version 4 (version 3 had no `activities.channel_environment`, version 2 no
/// `update_tokens_in_order` either, version 1 no `activities.channel_storage_policy`). docs/REGISTRY.md describes each table and why each index exists.
///
/// All times are Unix milliseconds except `last_content_timestamp` (the `aps` timestamp, Unix seconds). Tables are
/// STRICT, so a value of the wrong type is refused instead of silently stored. Apps and activities are interned as
/// integer ids, so a million-token activity does not repeat its id string a million times. Tokens are found by their
/// `token_key` (a 64-bit hash of the token, see `RegistrySchema.tokenKey`): an index of 8-byte integers instead
/// of 64-character strings is five times smaller, and since tokens are random, a commit of a batch of new tokens
/// dirties (and writes to the WAL) as many of its pages as fit, so its size is what bulk import speed depends on.
enum RegistrySchema {
    /// `PRAGMA application_id`: "FnRg". A file with another id is not a Fanout registry and is never written to.
    static let applicationID: Int32 = 0x466E_5267
    /// `PRAGMA user_version`: the schema version this code reads and writes.
    static let version: Int32 = 4

    /// What brings a registry of version 1 up to version 2: version 1 had no channel storage policy (its bound
    /// channels read as policy unknown).
    static let upgradeFromVersion1 =
        "ALTER TABLE activities ADD COLUMN channel_storage_policy INTEGER CHECK (channel_storage_policy IN (0, 1))"

    /// What brings a registry of version 2 up to version 3: the index an activity's tokens are paged in. Version 2
    /// paged by (expiry, row id), so a token registered again (a later expiry) moved behind a send's cursor and was
    /// read twice. Building it reads the table once, at the first open by this version.
    static let upgradeFromVersion2 = "CREATE INDEX update_tokens_in_order ON update_tokens (activity, id)"

    /// What brings a registry of version 3 up to version 4: where each bound channel was created. Version 3's
    /// bindings read as environment unknown, so a prune deletes them where it runs but never takes a "not found"
    /// there for the channel being gone (it may live in the other environment).
    static let upgradeFromVersion3 = "ALTER TABLE activities ADD COLUMN channel_environment TEXT"

    /// 16 KiB pages instead of SQLite's 4 KiB. Tokens are random, so a batch of new ones lands all over the token
    /// index and each commit writes most of its pages to the WAL; measured on a million-row import (10,000 rows per
    /// transaction), 16 KiB pages took 40% less time than 4 KiB ones (shallower trees, a quarter of the frames).
    static let pageSize = 16_384

    static let create = """
        CREATE TABLE apps (
            id INTEGER PRIMARY KEY,
            bundle_id TEXT NOT NULL UNIQUE,
            workspace TEXT NOT NULL
        ) STRICT;

        CREATE TABLE devices (
            id INTEGER PRIMARY KEY,
            app INTEGER NOT NULL,
            device_id TEXT NOT NULL,
            user_id TEXT,
            push_token TEXT,
            push_token_key INTEGER,
            push_token_at INTEGER,
            updated_at INTEGER NOT NULL
        ) STRICT;
        CREATE UNIQUE INDEX devices_by_device ON devices (app, device_id);
        CREATE INDEX devices_by_app ON devices (app);
        CREATE INDEX devices_by_user ON devices (app, user_id) WHERE user_id IS NOT NULL;
        CREATE INDEX devices_by_push_token ON devices (push_token_key) WHERE push_token_key IS NOT NULL;

        CREATE TABLE activities (
            id INTEGER PRIMARY KEY,
            app INTEGER NOT NULL,
            activity_id TEXT NOT NULL,
            attributes_type TEXT,
            state INTEGER NOT NULL DEFAULT 0 CHECK (state IN (0, 1)),
            last_content_timestamp INTEGER,
            ended_at INTEGER,
            dismissal_at INTEGER,
            channel_id TEXT,
            channel_storage_policy INTEGER CHECK (channel_storage_policy IN (0, 1)),
            channel_environment TEXT,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL
        ) STRICT;
        CREATE UNIQUE INDEX activities_by_id ON activities (app, activity_id);
        CREATE INDEX activities_by_dismissal ON activities (dismissal_at) WHERE state = 1;

        CREATE TABLE update_tokens (
            id INTEGER PRIMARY KEY,
            activity INTEGER NOT NULL,
            device_id TEXT,
            token TEXT NOT NULL,
            token_key INTEGER NOT NULL,
            registered_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL
        ) STRICT;
        CREATE INDEX update_tokens_by_activity ON update_tokens (activity, expires_at);
        CREATE INDEX update_tokens_in_order ON update_tokens (activity, id);
        CREATE UNIQUE INDEX update_tokens_by_device ON update_tokens (activity, device_id) WHERE device_id IS NOT NULL;
        CREATE INDEX update_tokens_by_token ON update_tokens (token_key);

        CREATE TABLE push_to_start_tokens (
            id INTEGER PRIMARY KEY,
            app INTEGER NOT NULL,
            device_id TEXT NOT NULL,
            user_id TEXT,
            attributes_type TEXT NOT NULL,
            token TEXT NOT NULL,
            token_key INTEGER NOT NULL,
            updated_at INTEGER NOT NULL
        ) STRICT;
        CREATE UNIQUE INDEX push_to_start_by_device ON push_to_start_tokens (app, device_id, attributes_type);
        CREATE INDEX push_to_start_by_app ON push_to_start_tokens (app);
        CREATE INDEX push_to_start_by_user ON push_to_start_tokens (app, user_id) WHERE user_id IS NOT NULL;
        CREATE INDEX push_to_start_by_token ON push_to_start_tokens (token_key);

        CREATE TABLE events (
            seq INTEGER PRIMARY KEY,
            at INTEGER NOT NULL,
            app INTEGER NOT NULL,
            kind INTEGER NOT NULL,
            activity_id TEXT,
            device_id TEXT,
            token TEXT NOT NULL,
            change INTEGER NOT NULL,
            reason INTEGER
        ) STRICT;

        CREATE TABLE counters (
            name TEXT PRIMARY KEY,
            value INTEGER NOT NULL
        ) STRICT, WITHOUT ROWID;
        INSERT INTO counters (name, value) VALUES ('expired_swept', 0);
        """
}

extension RegistrySchema {
    /// A 64-bit hash of a lowercase hex token (FNV-1a): the key of the token indexes. Keys rarely collide,
    /// and every lookup compares the whole token too.
    static func tokenKey(_ token: String) -> Int64 {
        // FNV-1a over the whole token. A prefix of the token would do for random tokens, but tokens that share a
        // prefix (sequential test tokens, or a client registering crafted ones) would all land on one key and turn
        // every lookup into a scan of them.
        var key: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in token.utf8 {
            key = (key ^ UInt64(byte)) &* 0x0000_0100_0000_01b3
        }
        return Int64(bitPattern: key)
    }
}

/// The integer codes the events table stores for an event's kind, change and reason.
extension RegistryEvent.TokenKind {
    var code: Int64 {
        switch self {
        case .update: return 0
        case .pushToStart: return 1
        case .push: return 2
        }
    }

    init?(code: Int64) {
        switch code {
        case 0: self = .update
        case 1: self = .pushToStart
        case 2: self = .push
        default: return nil
        }
    }
}

extension RegistryEvent.Change {
    var code: Int64 {
        switch self {
        case .added: return 0
        case .rotated: return 1
        case .removed: return 2
        }
    }

    init?(code: Int64) {
        switch code {
        case 0: self = .added
        case 1: self = .rotated
        case 2: self = .removed
        default: return nil
        }
    }
}

extension RegistryEvent.Reason {
    var code: Int64 {
        switch self {
        case .stopped: return 0
        case .expired: return 1
        case .ended: return 2
        case .unregistered: return 3
        }
    }

    init?(code: Int64) {
        switch code {
        case 0: self = .stopped
        case 1: self = .expired
        case 2: self = .ended
        case 3: self = .unregistered
        default: return nil
        }
    }
}
