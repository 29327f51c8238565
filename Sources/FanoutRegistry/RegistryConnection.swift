import FanoutSQLite

/// One SQLite connection to a registry file, with the app ids it has seen. Confined to one thread at a time: the store
/// holds each connection behind its own mutex.
final class RegistryConnection {
    let database: SQLiteDatabase
    let configuration: RegistryConfiguration
    /// Bundle id to app row id, and back. Apps are only ever added or moved between workspaces, so an entry never goes
    /// stale; a miss reloads the table, because another process may have defined the app since.
    private var appIDs: [String: Int64] = [:]
    private var bundleIDs: [Int64: String] = [:]

    init(database: SQLiteDatabase, configuration: RegistryConfiguration) {
        self.database = database
        self.configuration = configuration
    }

    var path: String { database.path }

    // MARK: Apps

    func loadApps() throws(SQLiteError) -> [RegistryApp] {
        var apps: [RegistryApp] = []
        appIDs.removeAll()
        bundleIDs.removeAll()
        try database.withStatement("SELECT id, bundle_id, workspace FROM apps ORDER BY bundle_id") {
            statement throws(SQLiteError) in
            while try statement.step() {
                let id = statement.int64(at: 0)
                let bundleID = statement.string(at: 1)
                appIDs[bundleID] = id
                bundleIDs[id] = bundleID
                apps.append(RegistryApp(bundleID: bundleID, workspace: statement.string(at: 2)))
            }
        }
        return apps
    }

    /// The row id of `bundleID`, or nil when no such app is defined.
    func appID(_ bundleID: String) throws(SQLiteError) -> Int64? {
        if let id = appIDs[bundleID] { return id }
        _ = try loadApps()
        return appIDs[bundleID]
    }

    /// The row id of `bundleID`; `invalidInput` naming `field` when the app is not defined.
    func requireApp(_ bundleID: String, field: String = "app") throws(RegistryError) -> AppRef {
        let id: Int64?
        do {
            id = try appID(bundleID)
        } catch {
            throw RegistryConnection.map(error, path: path)
        }
        guard let id else {
            throw .invalid(
                field, "unknown app \(RegistryValidation.excerpt(bundleID)) (define it in the registry's apps first)")
        }
        return AppRef(id: id, bundleID: bundleID)
    }

    func bundleID(_ appID: Int64) throws(SQLiteError) -> String {
        if let bundleID = bundleIDs[appID] { return bundleID }
        _ = try loadApps()
        return bundleIDs[appID] ?? "app-\(appID)"
    }

    func defineApps(_ apps: [RegistryApp]) throws(SQLiteError) {
        try database.transaction { () throws(SQLiteError) in
            for app in apps {
                try database.withStatement(
                    """
                    INSERT INTO apps (bundle_id, workspace) VALUES (?1, ?2)
                    ON CONFLICT (bundle_id) DO UPDATE SET workspace = excluded.workspace
                    """
                ) { statement throws(SQLiteError) in
                    try statement.bind(app.bundleID, at: 1)
                    try statement.bind(app.workspace, at: 2)
                    try statement.run()
                }
            }
        }
        _ = try loadApps()
    }

    // MARK: Errors

    /// A storage failure as the registry reports it: busy, corrupt, not a registry, unavailable, or storage.
    static func map(_ error: SQLiteError, path: String) -> RegistryError {
        if error.isBusy {
            return RegistryError(.busy, "\(path) is locked by another process (gave up waiting): \(error.message)")
        }
        if error.isNotADatabase {
            return RegistryError(.notARegistry, "\(path) is not a Fanout registry (not an SQLite database)")
        }
        if error.isCorrupt {
            return RegistryError(.corrupt, "\(path) is corrupt: \(error.message)")
        }
        if error.isCannotOpen || error.isReadOnly {
            return RegistryError(.unavailable, "cannot open \(path) for writing: \(error.message)")
        }
        return RegistryError(.storage, "\(path): \(error)")
    }
}

/// An app as the writes need it: its row id and its bundle id (for events).
struct AppRef: Hashable {
    var id: Int64
    var bundleID: String
}
