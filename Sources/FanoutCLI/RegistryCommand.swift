import CommandLineSupport
import Fanout
import FanoutCore
import FanoutFleet
import FanoutRedis
import FanoutRedisRegistry
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// `fanout registry`: the token registry from the command line (register, stop, end, import, list, stats, prune,
/// events). The subcommands live in RegistryWriteCommands.swift and RegistryReadCommands.swift.
enum RegistryCommand {
    static let usage = """
        fanout registry: the token registry (Live Activity update tokens, push-to-start tokens, devices) in one
        SQLite file, or on Redis (the registry fanout serve --redis shares).

        usage: fanout registry (--db FILE | --redis URL) <subcommand> [options]

          register --app BUNDLE --activity ID --token HEX [--device ID] [--user ID] [--workspace NAME]
          register --app BUNDLE --push-to-start HEX --device ID [--user ID] [--attributes-type T] [--workspace NAME]
          register --app BUNDLE --device ID --push-token HEX [--user ID] [--workspace NAME]
          stop     --app BUNDLE --activity ID [--device ID]
          end      --app BUNDLE --activity ID [--dismissal-date UNIX]
          import   FILE [--format jsonl|csv] [--workspace NAME]
          list     --app BUNDLE (--activity ID | --user ID | --device ID)
          stats
          prune
          events   [--follow] [--after SEQ]

          --db FILE   the registry file. register and import create it when it is missing; the other
                      subcommands refuse a missing (or empty) file.
          --redis URL the registry on Redis (redis://[user:password@]host:port[/db]), as fanout serve --redis
                      and fanout enqueue use it.

        Apps: register and import define an app they name that the registry does not hold yet, in the
        workspace --workspace names (default "default"). An app already defined keeps its workspace.

        Output: JSON on stdout (one object, or one line per token or event); errors on stderr, one line.
        Exit status: 0 on success; 1 when an import skipped bad lines (the others were imported) or the
        storage failed midway; 2 for bad arguments, bad input (nothing written), a missing file, a file
        that is not a Fanout registry or is corrupt, or a registry locked by another process for longer
        than the busy timeout (5 s).

        fanout registry <subcommand> --help describes each subcommand.
        """

    /// Runs `fanout registry`; returns the exit status.
    static func run(_ arguments: [String]) async -> Int32 {
        var database: String?
        var redis: String?
        var rest = arguments[...]
        // Flags before the subcommand: --db, --redis and --help.
        while let first = rest.first, first.hasPrefix("-") {
            rest.removeFirst()
            switch first {
            case "--help", "-h":
                print(usage)
                return 0
            case "--db":
                guard let value = rest.popFirst() else { return fail(nil, "--db needs a value") }
                database = value
            case let flag where flag.hasPrefix("--db="):
                database = String(flag.dropFirst("--db=".count))
            case "--redis":
                guard let value = rest.popFirst() else { return fail(nil, "--redis needs a value") }
                redis = value
            default:
                return fail(nil, "unknown option \(first) before the subcommand (see fanout registry --help)")
            }
        }
        guard let name = rest.popFirst() else {
            return fail(
                nil,
                "a subcommand is required: register, stop, end, import, list, stats, prune or events "
                    + "(see fanout registry --help)")
        }
        guard let subcommand = parser(for: name) else {
            return fail(nil, "unknown subcommand '\(name)' (see fanout registry --help)")
        }
        var cursor = RegistryArguments(Array(rest), subcommand: name, database: database, redis: redis)
        do {
            guard let action = try subcommand(&cursor) else {
                print(cursor.usage)
                return 0
            }
            return try await action()
        } catch {
            // An empty message: standard output was closed (`| head`), nothing to say.
            guard !error.message.isEmpty else { return error.status }
            return fail(name, error.message, status: error.status)
        }
    }

    /// Parses a subcommand's arguments into the work to do, or nil for `--help`.
    typealias Parser = (inout RegistryArguments) throws(RegistryCommandError) -> RegistryAction?
    typealias RegistryAction = () async throws(RegistryCommandError) -> Int32

    static func parser(for subcommand: String) -> Parser? {
        switch subcommand {
        case "register": return RegisterCommand.parse
        case "stop": return StopCommand.parse
        case "end": return EndCommand.parse
        case "import": return ImportCommand.parse
        case "list": return ListCommand.parse
        case "stats": return StatsCommand.parse
        case "prune": return PruneCommand.parse
        case "events": return EventsCommand.parse
        default: return nil
        }
    }

    /// Prints `fanout registry[ SUBCOMMAND]: MESSAGE` as one line on stderr; returns `status`.
    static func fail(_ subcommand: String?, _ message: String, status: Int32 = 2) -> Int32 {
        let prefix = subcommand.map { "fanout registry \($0)" } ?? "fanout registry"
        let oneLine = message.split(whereSeparator: \.isNewline).joined(separator: " ")
        StandardStream.error.write("\(prefix): \(oneLine)\n")
        return status
    }

    /// A note on stderr (progress, skipped import lines, apps defined).
    static func note(_ subcommand: String, _ message: String, terminator: String = "\n") {
        StandardStream.error.write("fanout registry \(subcommand): \(message)\(terminator)")
    }
}

/// Why a `fanout registry` subcommand stopped: its one-line message and exit status.
struct RegistryCommandError: Error {
    let message: String
    let status: Int32

    init(_ message: String, status: Int32 = 2) {
        self.message = message
        self.status = status
    }

    /// A registry error, with the flag that supplied the field when there is one (`token: … (--token)`).
    init(_ error: RegistryError, flags: [String: String] = RegistryArguments.flagsByField) {
        var message = error.description
        if error.kind == .invalidInput, let field = error.field, let flag = flags[field] {
            message += " (\(flag))"
        }
        self.init(message, status: error.kind == .storage ? 1 : 2)
    }

    /// Standard output was closed (`| head`): stop quietly.
    static let outputClosed = RegistryCommandError("", status: 0)
}

/// Where the registry is: a SQLite file (`--db`) or Redis (`--redis`).
enum RegistryLocation {
    case file(String)
    case redis(String)
}

/// A subcommand's command line: flags through `ArgumentCursor`, positional words, `--db` and `--redis` anywhere,
/// `--help`.
struct RegistryArguments {
    private var cursor: ArgumentCursor
    let subcommand: String
    /// `--db`, before the subcommand or among its flags.
    private(set) var database: String?
    /// `--redis`, likewise.
    private(set) var redis: String?
    /// The subcommand's usage, printed for `--help`.
    var usage = RegistryCommand.usage

    /// The import-line field each flag supplies, for messages that name both.
    static let flagsByField = [
        "app": "--app", "activity_id": "--activity", "token": "--token", "device": "--device", "user": "--user",
        "push_to_start_token": "--push-to-start", "attributes_type": "--attributes-type", "push_token": "--push-token",
        "workspace": "--workspace", "dismissal_date": "--dismissal-date",
    ]

    init(_ arguments: [String], subcommand: String, database: String?, redis: String?) {
        cursor = ArgumentCursor(arguments)
        self.subcommand = subcommand
        self.database = database
        self.redis = redis
    }

    /// The next flag, with `--db` and `--redis` taken here; nil at the end. Positional words are refused (see
    /// `nextWord`).
    mutating func nextFlag() throws(RegistryCommandError) -> String? {
        while true {
            let flag: String?
            do {
                flag = try cursor.nextFlag()
            } catch {
                throw RegistryCommandError(error.message)
            }
            switch flag {
            case "--db": database = try string()
            case "--redis": redis = try string()
            default: return flag
            }
        }
    }

    /// A positional word (not starting with `-`) if one comes next.
    mutating func nextWord() -> String? {
        cursor.nextWord()
    }

    /// The current flag's value.
    mutating func string() throws(RegistryCommandError) -> String {
        do {
            return try cursor.string()
        } catch {
            throw RegistryCommandError(error.message)
        }
    }

    /// The current flag's value as a whole number in `range`.
    mutating func int(in range: ClosedRange<Int>) throws(RegistryCommandError) -> Int {
        do {
            return try cursor.int(in: range)
        } catch {
            throw RegistryCommandError(error.message)
        }
    }

    var currentFlag: String { cursor.currentFlag }

    /// The error for a flag this subcommand does not take.
    func unknown(_ flag: String) -> RegistryCommandError {
        RegistryCommandError("unknown option \(flag) (see fanout registry \(subcommand) --help)")
    }

    /// `--db` or `--redis` (exactly one), required once the flags are read.
    func requireDatabase() throws(RegistryCommandError) -> RegistryLocation {
        switch (database, redis) {
        case (let database?, nil) where !database.isEmpty: return .file(database)
        case (nil, let redis?) where !redis.isEmpty: return .redis(redis)
        case (.some, .some): throw RegistryCommandError("--db and --redis cannot be combined: give one")
        default: throw RegistryCommandError("--db FILE or --redis URL is required")
        }
    }
}

/// Opening the registry and checking input the way the store will, before anything is written.
enum RegistryFiles {
    /// Opens the registry. A file: with `create` false, a missing or empty file is an error instead of a new
    /// registry (reads, stop and end have nothing to work on in an empty one). Redis: connects and checks it answers
    /// (a registry on Redis always exists).
    static func open(_ location: RegistryLocation, create: Bool) async throws(RegistryCommandError)
        -> any RegistryStore
    {
        guard case .file(let path) = location else {
            guard case .redis(let url) = location else { preconditionFailure("a location is a file or Redis") }
            do {
                // The client is left to the process's exit: the command ends right after its one call.
                return RedisRegistryStore(client: try await FleetConnection.connect(url))
            } catch {
                throw RegistryCommandError(error.message)
            }
        }
        if !create {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
                throw RegistryCommandError("\(path) does not exist (register or import create a registry)")
            }
            if !isDirectory.boolValue,
                let size = (try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? NSNumber,
                size.intValue == 0
            {
                throw RegistryCommandError("\(path) is empty, not a registry yet (register or import create one)")
            }
        }
        do {
            return try SQLiteRegistryStore(path: path)
        } catch {
            throw RegistryCommandError(error)
        }
    }

    /// Closes what `open` opened (a file's connections; a Redis store's subscribers).
    static func close(_ store: any RegistryStore) {
        (store as? SQLiteRegistryStore)?.close()
        (store as? RedisRegistryStore)?.close()
    }

    /// Defines each of `bundleIDs` the registry does not hold yet, in `workspace`; returns the ones it defined.
    static func defineMissingApps(_ bundleIDs: Set<String>, workspace: String, in store: any RegistryStore)
        async throws(RegistryCommandError) -> [String]
    {
        do {
            let known = Set(try await store.apps().map(\.bundleID))
            let missing = bundleIDs.subtracting(known).sorted()
            guard !missing.isEmpty else { return [] }
            try await store.defineApps(missing.map { RegistryApp(bundleID: $0, workspace: workspace) })
            return missing
        } catch {
            throw RegistryCommandError(error)
        }
    }

    /// The store's identifier rule (not empty, at most 256 UTF-8 bytes), checked before the file is opened.
    static func identifier(_ value: String, field: String) throws(RegistryCommandError) {
        let flag = RegistryArguments.flagsByField[field] ?? field
        guard !value.isEmpty else { throw RegistryCommandError("\(field): must not be empty (\(flag))") }
        let count = value.utf8.count
        guard count <= 256 else {
            throw RegistryCommandError("\(field): is \(count) bytes long, over the 256-byte limit (\(flag))")
        }
    }

    /// The store's token rule (64 to 200 hex digits, an even number; empty allowed: it stops or removes).
    static func token(_ value: String, field: String) throws(RegistryCommandError) {
        guard !value.isEmpty, DeviceToken(value) == nil else { return }
        let flag = RegistryArguments.flagsByField[field] ?? field
        throw RegistryCommandError(
            "\(field): \(excerpt(value)) is not a device token (\(DeviceToken.hexLengthRange.lowerBound) to "
                + "\(DeviceToken.hexLengthRange.upperBound) hex digits, an even number) (\(flag))")
    }

    /// The start of `text`, quoted, for messages.
    static func excerpt(_ text: String) -> String {
        if text.utf8.count <= 80 { return JSONStringEscaping.quoted(text, controls: .all) }
        return JSONStringEscaping.quoted(String(text.prefix(80)), controls: .all) + "…"
    }
}

/// Standard output through one buffer, written with write(2): lines reach a pipe when `flush` is called (so that
/// `events --follow` is seen at once), and a closed pipe ends the command quietly.
struct RegistryOutput {
    private var buffer: [UInt8] = []

    init() {
        buffer.reserveCapacity(1 << 16)
    }

    /// Prints one line and flushes: the whole output of a command that answers with one JSON object.
    static func printLine(_ text: String) throws(RegistryCommandError) {
        var output = RegistryOutput()
        try output.line(text)
        try output.flush()
    }

    mutating func line(_ text: String) throws(RegistryCommandError) {
        buffer.append(contentsOf: text.utf8)
        try endLine()
    }

    mutating func line(_ bytes: [UInt8]) throws(RegistryCommandError) {
        buffer.append(contentsOf: bytes)
        try endLine()
    }

    private mutating func endLine() throws(RegistryCommandError) {
        buffer.append(UInt8(ascii: "\n"))
        if buffer.count >= 1 << 16 { try flush() }
    }

    mutating func flush() throws(RegistryCommandError) {
        var offset = 0
        defer { buffer.removeAll(keepingCapacity: true) }
        while offset < buffer.count {
            let written = buffer.withUnsafeBytes { bytes in
                write(STDOUT_FILENO, bytes.baseAddress! + offset, bytes.count - offset)
            }
            if written < 0 {
                if errno == EINTR { continue }
                if errno == EPIPE { throw .outputClosed }
                throw RegistryCommandError("cannot write to standard output: \(String(cString: strerror(errno)))")
            }
            offset += written
        }
    }
}

/// A JSON object built field by field, in order, for the commands' output lines.
struct JSONLine {
    private(set) var bytes: [UInt8] = [UInt8(ascii: "{")]

    private mutating func key(_ name: String) {
        if bytes.count > 1 { bytes.append(UInt8(ascii: ",")) }
        JSONStringEscaping.appendString(name, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
    }

    /// A string field; omitted when nil.
    mutating func add(_ name: String, _ value: String?) {
        guard let value else { return }
        key(name)
        JSONStringEscaping.appendString(value, to: &bytes)
    }

    /// A number field.
    mutating func add(_ name: String, _ value: Int) {
        key(name)
        bytes.append(contentsOf: String(value).utf8)
    }

    /// Unix milliseconds as Unix seconds with three decimals (`1764460800.123`), the import lines' unit.
    mutating func addSeconds(_ name: String, milliseconds: Int64?) {
        guard let milliseconds else { return }
        key(name)
        let seconds = milliseconds / 1000
        let fraction = milliseconds % 1000
        bytes.append(contentsOf: String(seconds).utf8)
        if fraction != 0 {
            let digits = String(fraction)
            bytes.append(contentsOf: ("." + String(repeating: "0", count: 3 - digits.count) + digits).utf8)
        }
    }

    var text: String {
        String(decoding: bytes + [UInt8(ascii: "}")], as: UTF8.self)
    }
}
