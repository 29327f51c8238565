import CommandLineSupport
import Fanout
import FanoutCore
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// What `register`, `stop` and `end` print: `{"added":…,"rotated":…,"removed":…,"unchanged":…}`.
private func applyResultLine(_ result: RegistryApplyResult) -> String {
    var line = JSONLine()
    line.add("added", result.added)
    line.add("rotated", result.rotated)
    line.add("removed", result.removed)
    line.add("unchanged", result.unchanged)
    return line.text
}

/// Applies `changes`, mapping the store's errors to the command's.
private func apply(_ changes: [RegistryChange], to store: any RegistryStore) async throws(RegistryCommandError)
    -> RegistryApplyResult
{
    do {
        // The file's store applies on this thread; Redis's through its client.
        if let file = store as? SQLiteRegistryStore { return try file.applyNow(changes) }
        return try await store.apply(changes)
    } catch {
        throw RegistryCommandError(error)
    }
}

/// `fanout registry register`: one registration of any of the three kinds.
enum RegisterCommand {
    static let usage = """
        fanout registry register: record one registration.

        usage: fanout registry (--db FILE | --redis URL) register --app BUNDLE --activity ID --token HEX
                   [--device ID] [--user ID] [--workspace NAME]
               fanout registry (--db FILE | --redis URL) register --app BUNDLE --push-to-start HEX --device ID
                   [--user ID] [--attributes-type T] [--workspace NAME]
               fanout registry (--db FILE | --redis URL) register --app BUNDLE --device ID [--push-token HEX]
                   [--user ID] [--workspace NAME]

          --app BUNDLE          the app's bundle id; defined in the registry when missing
          --activity ID         a Live Activity update token for this activity id (at most 256 bytes)...
          --token HEX           ...and the token (64 to 200 hex digits). Registering again for the same
                                activity and device replaces the token (rotation); an empty token stops it.
          --push-to-start HEX   a push-to-start token of the device (one per device and attributes type)
          --attributes-type T   the ActivityAttributes type it starts (none: offered for every type)
          --push-token HEX      the device's regular push token (alerts, background pushes)
          --device ID           the device (Pushwoosh hwid); required for push-to-start and push tokens
          --user ID             the device's user
          --workspace NAME      the workspace of an app this defines (default "default"); an app already
                                defined keeps its own
          --db FILE             the registry, created when missing
          --redis URL           or the registry on Redis

        Prints {"added":N,"rotated":N,"removed":N,"unchanged":N}. Bad input (a token that is not hex of
        the right length, an id over 256 bytes) exits 2 naming the field; nothing is written.
        """

    static func parse(_ arguments: inout RegistryArguments) throws(RegistryCommandError)
        -> RegistryCommand.RegistryAction?
    {
        arguments.usage = usage
        var app: String?
        var activity: String?
        var token: String?
        var device: String?
        var user: String?
        var workspace: String?
        var pushToStart: String?
        var attributesType: String?
        var pushToken: String?
        while let flag = try arguments.nextFlag() {
            switch flag {
            case "--help", "-h": return nil
            case "--app": app = try arguments.string()
            case "--activity": activity = try arguments.string()
            case "--token": token = try arguments.string()
            case "--device": device = try arguments.string()
            case "--user": user = try arguments.string()
            case "--workspace": workspace = try arguments.string()
            case "--push-to-start": pushToStart = try arguments.string()
            case "--attributes-type": attributesType = try arguments.string()
            case "--push-token": pushToken = try arguments.string()
            default: throw arguments.unknown(flag)
            }
        }
        let path = try arguments.requireDatabase()
        guard let app else { throw RegistryCommandError("--app BUNDLE is required") }

        func forbid(_ value: String?, _ flag: String, with other: String) throws(RegistryCommandError) {
            if value != nil { throw RegistryCommandError("\(flag) cannot be combined with \(other)") }
        }
        let registration: Registration
        if let token {
            try forbid(pushToStart, "--push-to-start", with: "--token")
            try forbid(pushToken, "--push-token", with: "--token")
            try forbid(attributesType, "--attributes-type", with: "--token (it belongs to --push-to-start)")
            guard let activity else { throw RegistryCommandError("--token needs --activity ID") }
            registration = .updateToken(
                UpdateTokenRegistration(app: app, activityID: activity, deviceID: device, userID: user, token: token))
        } else if let pushToStart {
            try forbid(activity, "--activity", with: "--push-to-start")
            try forbid(pushToken, "--push-token", with: "--push-to-start")
            guard let device else { throw RegistryCommandError("--push-to-start needs --device ID") }
            registration = .pushToStart(
                PushToStartRegistration(
                    app: app, deviceID: device, userID: user, attributesType: attributesType, token: pushToStart))
        } else {
            if activity != nil {
                throw RegistryCommandError("--activity needs --token HEX (to stop a token: fanout registry stop)")
            }
            try forbid(attributesType, "--attributes-type", with: "a device registration (it needs --push-to-start)")
            guard let device else {
                throw RegistryCommandError(
                    "nothing to register: give --activity ID --token HEX, --push-to-start HEX --device ID, "
                        + "or --device ID [--push-token HEX]")
            }
            registration = .device(DeviceRegistration(app: app, deviceID: device, userID: user, pushToken: pushToken))
        }

        // The store's own rules, checked before the file is opened: bad input writes nothing, not even the app.
        try RegistryFiles.identifier(app, field: "app")
        if let activity { try RegistryFiles.identifier(activity, field: "activity_id") }
        if let device { try RegistryFiles.identifier(device, field: "device") }
        if let user { try RegistryFiles.identifier(user, field: "user") }
        if let attributesType { try RegistryFiles.identifier(attributesType, field: "attributes_type") }
        if let workspace { try RegistryFiles.identifier(workspace, field: "workspace") }
        if let token { try RegistryFiles.token(token, field: "token") }
        if let pushToStart { try RegistryFiles.token(pushToStart, field: "push_to_start_token") }
        if let pushToken { try RegistryFiles.token(pushToken, field: "push_token") }

        let workspaceName = workspace ?? "default"
        return { () async throws(RegistryCommandError) -> Int32 in
            let store = try await RegistryFiles.open(path, create: true)
            defer { RegistryFiles.close(store) }
            for defined in try await RegistryFiles.defineMissingApps([app], workspace: workspaceName, in: store) {
                RegistryCommand.note("register", "defined app \(defined) in workspace \(workspaceName)")
            }
            let result = try await apply([registration.change], to: store)
            try RegistryOutput.printLine(applyResultLine(result))
            return 0
        }
    }
}

/// `fanout registry stop`: stops an activity's update token on one device, or all of them.
enum StopCommand {
    static let usage = """
        fanout registry stop: remove Live Activity update tokens (reason "stopped").

        usage: fanout registry (--db FILE | --redis URL) stop --app BUNDLE --activity ID [--device ID]

          --app BUNDLE    the app's bundle id (must be in the registry)
          --activity ID   the activity
          --device ID     only this device's token; without it, every token of the activity
          --db FILE       the registry (must exist)
          --redis URL     or the registry on Redis

        Prints {"added":0,"rotated":0,"removed":N,"unchanged":0}.
        """

    static func parse(_ arguments: inout RegistryArguments) throws(RegistryCommandError)
        -> RegistryCommand.RegistryAction?
    {
        arguments.usage = usage
        var app: String?
        var activity: String?
        var device: String?
        while let flag = try arguments.nextFlag() {
            switch flag {
            case "--help", "-h": return nil
            case "--app": app = try arguments.string()
            case "--activity": activity = try arguments.string()
            case "--device": device = try arguments.string()
            default: throw arguments.unknown(flag)
            }
        }
        let path = try arguments.requireDatabase()
        guard let app else { throw RegistryCommandError("--app BUNDLE is required") }
        guard let activity else { throw RegistryCommandError("--activity ID is required") }
        try RegistryFiles.identifier(app, field: "app")
        try RegistryFiles.identifier(activity, field: "activity_id")
        if let device { try RegistryFiles.identifier(device, field: "device") }
        return { () async throws(RegistryCommandError) -> Int32 in
            let store = try await RegistryFiles.open(path, create: false)
            defer { RegistryFiles.close(store) }
            let result = try await apply(
                [.stopUpdateTokens(app: app, activityID: activity, deviceID: device)], to: store)
            try RegistryOutput.printLine(applyResultLine(result))
            return 0
        }
    }
}

/// `fanout registry end`: marks an activity ended; its tokens go at its dismissal date.
enum EndCommand {
    static let usage = """
        fanout registry end: mark an activity ended.

        usage: fanout registry (--db FILE | --redis URL) end --app BUNDLE --activity ID [--dismissal-date UNIX]

          --app BUNDLE            the app's bundle id (must be in the registry)
          --activity ID           the activity (must be in the registry)
          --dismissal-date UNIX   when its tokens are removed (Unix seconds); default 4 hours from now,
                                  Apple's default. A date already past removes them now (reason "ended").
          --db FILE               the registry (must exist)
          --redis URL             or the registry on Redis

        An ended activity keeps its update tokens (an end event may still be sent to them) until the
        dismissal date; from then on they are not returned, and prune or the next sweep removes them.
        Prints {"app":…,"activity_id":…,"state":"ended","dismissal_date":UNIX,"removed":N}.
        """

    static func parse(_ arguments: inout RegistryArguments) throws(RegistryCommandError)
        -> RegistryCommand.RegistryAction?
    {
        arguments.usage = usage
        var app: String?
        var activity: String?
        var dismissalSeconds: Int?
        while let flag = try arguments.nextFlag() {
            switch flag {
            case "--help", "-h": return nil
            case "--app": app = try arguments.string()
            case "--activity": activity = try arguments.string()
            case "--dismissal-date": dismissalSeconds = try arguments.int(in: 0...9_000_000_000_000)
            default: throw arguments.unknown(flag)
            }
        }
        let path = try arguments.requireDatabase()
        guard let app else { throw RegistryCommandError("--app BUNDLE is required") }
        guard let activity else { throw RegistryCommandError("--activity ID is required") }
        try RegistryFiles.identifier(app, field: "app")
        try RegistryFiles.identifier(activity, field: "activity_id")
        let dismissalDate = dismissalSeconds.map { Int64($0) * 1000 }
        return { () async throws(RegistryCommandError) -> Int32 in
            let store = try await RegistryFiles.open(path, create: false)
            defer { RegistryFiles.close(store) }
            let found: ActivityRecord?
            do throws(RegistryError) {
                found = try await store.activity(app: app, activityID: activity)
            } catch {
                throw RegistryCommandError(error)
            }
            guard found != nil else {
                throw RegistryCommandError(
                    "activity_id: the registry holds no activity \(RegistryFiles.excerpt(activity)) for app "
                        + "\(RegistryFiles.excerpt(app)) (--activity)")
            }
            let result = try await apply(
                [.endActivity(app: app, activityID: activity, dismissalDate: dismissalDate)], to: store)
            // Read back for the default date; an activity already dismissed reads as nil (then the date was given).
            let ended = try? await store.activity(app: app, activityID: activity)
            var line = JSONLine()
            line.add("app", app)
            line.add("activity_id", activity)
            line.add("state", "ended")
            if let date = ended?.dismissalDate ?? dismissalDate { line.add("dismissal_date", Int(date / 1000)) }
            line.add("removed", result.removed)
            try RegistryOutput.printLine(line.text)
            return 0
        }
    }
}

/// `fanout registry import`: JSON lines or CSV, in batches, idempotent.
enum ImportCommand {
    static let usage = """
        fanout registry import: import registrations from a JSON-lines or CSV file (idempotent).

        usage: fanout registry (--db FILE | --redis URL) import FILE [--format jsonl|csv] [--workspace NAME]

          FILE               the registrations, one per line (see below)
          --format jsonl|csv default: JSON lines when the first non-blank character is {, else CSV
          --workspace NAME   the workspace of the apps this defines (default "default")
          --db FILE          the registry, created when missing
          --redis URL        or the registry on Redis

        Lines (JSON; null means absent, an unknown field is refused):
          {"app": "com.acme.app", "activity_id": "match-7", "token": "<hex>", "device": "d1", "user": "u1"}
          {"app": "com.acme.app", "push_to_start_token": "<hex>", "attributes_type": "MatchAttributes",
           "device": "d1", "user": "u1"}
          {"app": "com.acme.app", "device": "d1", "user": "u1", "push_token": "<hex>"}
        Any of them may carry "registered_at" (Unix seconds) for back-filling. CSV: a header row naming
        the same fields, then one registration per row; an empty cell is absent. The output of
        fanout registry list is in this format.

        Apps the file names that the registry does not hold are defined first. A bad line is reported on
        stderr (line number and field) and skipped. Registrations are committed in batches of 50,000, with a
        progress line on stderr after each; importing the same file again changes nothing. Prints
        {"lines":N,"registrations":N,"added":N,"rotated":N,"removed":N,"unchanged":N,"already_expired":N,
        "invalid":N}. Exit status 1 when lines were skipped.
        """

    /// Skipped lines reported one by one; past this, only counted.
    static let reportedInvalidLines = 20

    static func parse(_ arguments: inout RegistryArguments) throws(RegistryCommandError)
        -> RegistryCommand.RegistryAction?
    {
        arguments.usage = usage
        var files: [String] = []
        var format: RegistryImportFormat?
        var workspace: String?
        while true {
            if let word = arguments.nextWord() {
                files.append(word)
                continue
            }
            guard let flag = try arguments.nextFlag() else { break }
            switch flag {
            case "--help", "-h": return nil
            case "--format":
                let text = try arguments.string()
                guard let value = RegistryImportFormat(rawValue: text) else {
                    throw RegistryCommandError("--format takes jsonl or csv, not '\(text)'")
                }
                format = value
            case "--workspace": workspace = try arguments.string()
            default: throw arguments.unknown(flag)
            }
        }
        let path = try arguments.requireDatabase()
        guard files.count == 1, let file = files.first else {
            throw RegistryCommandError(
                files.isEmpty ? "the FILE to import is required" : "one FILE to import, not \(files.count)")
        }
        if let workspace { try RegistryFiles.identifier(workspace, field: "workspace") }
        let workspaceName = workspace ?? "default"
        let importer = RegistryImporter(format: format)
        return { () async throws(RegistryCommandError) -> Int32 in
            // Before the registry is opened (or created): the apps the file names, and whether it can be read.
            let apps = try appsNamed(in: file, format: format)
            let store = try await RegistryFiles.open(path, create: true)
            defer { RegistryFiles.close(store) }
            for defined in try await RegistryFiles.defineMissingApps(apps, workspace: workspaceName, in: store) {
                RegistryCommand.note("import", "defined app \(defined) in workspace \(workspaceName)")
            }
            let started = ContinuousClock.now
            let interactive = isatty(STDERR_FILENO) == 1
            var reported = 0
            let summary: RegistryImportSummary
            do throws(RegistryError) {
                summary = try await importer.run(
                    path: file, into: store,
                    onInvalidLine: { error in
                        reported += 1
                        guard reported <= reportedInvalidLines else { return }
                        if interactive { StandardStream.error.write("\r\u{1B}[K") }
                        RegistryCommand.note("import", "skipped \(error)")
                    },
                    onBatch: { progress in
                        let elapsed = (ContinuousClock.now - started) / .milliseconds(1)
                        let rate = elapsed > 0 ? Int(Double(progress.committed) * 1000 / elapsed) : 0
                        RegistryCommand.note(
                            "import", "\(progress.committed) registrations committed (\(rate)/s)",
                            terminator: interactive ? "\r" : "\n")
                    })
            } catch {
                if interactive { StandardStream.error.write("\n") }
                throw RegistryCommandError(error)
            }
            if interactive { StandardStream.error.write("\n") }
            if summary.invalid > reportedInvalidLines {
                RegistryCommand.note(
                    "import", "skipped \(summary.invalid - reportedInvalidLines) more bad lines (not shown)")
            }
            try RegistryOutput.printLine(summary.jsonLine)
            return summary.invalid > 0 ? 1 : 0
        }
    }

    /// The apps the lines of `path` name (lines that do not parse are left to the import, which reports them).
    /// Throws when the file cannot be read.
    private static func appsNamed(in path: String, format: RegistryImportFormat?) throws(RegistryCommandError)
        -> Set<String>
    {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue {
            throw RegistryCommandError("cannot read \(path): it is a directory")
        }
        guard let file = fopen(path, "r") else {
            throw RegistryCommandError("cannot open \(path): \(String(cString: strerror(errno)))")
        }
        defer { fclose(file) }
        var apps: Set<String> = []
        var parser: RegistryImportParser? = format.map { RegistryImportParser(format: $0) }
        var line: UnsafeMutablePointer<CChar>?
        var capacity = 0
        defer { free(line) }
        var lineNumber = 0
        while true {
            let count = getline(&line, &capacity, file)
            guard count >= 0, let line else { break }
            lineNumber += 1
            var length = count
            if length > 0, line[length - 1] == 0x0A { length -= 1 }
            let bytes = UnsafeRawBufferPointer(start: line, count: length).bindMemory(to: UInt8.self)
            if parser == nil {
                guard bytes.contains(where: { !isBlank($0) }) else { continue }
                parser = RegistryImportParser(format: .detect(firstLine: bytes))
            }
            if let registration = try? parser!.parse(line: bytes, lineNumber: lineNumber) {
                apps.insert(registration.app)
            }
        }
        if ferror(file) != 0 {
            throw RegistryCommandError("cannot read \(path): \(String(cString: strerror(errno)))")
        }
        return apps
    }

    private static func isBlank(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") || byte == UInt8(ascii: "\r")
    }
}
