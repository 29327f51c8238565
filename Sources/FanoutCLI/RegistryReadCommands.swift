import Fanout
import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Rows per page for the paged reads.
private let pageSize = 10_000

/// Runs a store call, mapping its errors to the command's.
private func registry<R>(_ body: () async throws(RegistryError) -> R) async throws(RegistryCommandError) -> R {
    do {
        return try await body()
    } catch {
        throw RegistryCommandError(error)
    }
}

/// The flags of a subcommand that takes none but `--db` (stats, prune).
private func parseNoFlags(_ arguments: inout RegistryArguments, usage: String) throws(RegistryCommandError)
    -> RegistryLocation?
{
    arguments.usage = usage
    while let flag = try arguments.nextFlag() {
        switch flag {
        case "--help", "-h": return nil
        default: throw arguments.unknown(flag)
        }
    }
    return try arguments.requireDatabase()
}

/// `fanout registry list`: an activity's live update tokens, or a user's or device's registrations, as import lines.
enum ListCommand {
    static let usage = """
        fanout registry list: print registrations as JSON lines.

        usage: fanout registry (--db FILE | --redis URL) list --app BUNDLE (--activity ID | --user ID | --device ID)

          --activity ID   the activity's live update tokens
          --user ID       the devices recorded with this user, the push-to-start tokens registered with
                          it (what a push_to_start send to the user reaches), and the devices' live
                          update tokens
          --device ID     the device, its push-to-start tokens and its live update tokens
          --db FILE       the registry (must exist)
          --redis URL     or the registry on Redis

        Lines are in the import format (fanout registry import --help), so a list can be imported into
        another registry; registered_at is Unix seconds (with milliseconds):
          {"app":"com.acme.app","activity_id":"match-7","token":"<hex>","device":"d1","registered_at":1764460800.123}
          {"app":"com.acme.app","push_to_start_token":"<hex>","attributes_type":"MatchAttributes","device":"d1",
           "user":"u1","registered_at":…}
          {"app":"com.acme.app","device":"d1","user":"u1","push_token":"<hex>","registered_at":…}
        An expired token, or one of an activity past its dismissal date, is never listed.
        """

    enum Target {
        case activity(String)
        case user(String)
        case device(String)
    }

    static func parse(_ arguments: inout RegistryArguments) throws(RegistryCommandError)
        -> RegistryCommand.RegistryAction?
    {
        arguments.usage = usage
        var app: String?
        var targets: [(flag: String, target: Target)] = []
        while let flag = try arguments.nextFlag() {
            switch flag {
            case "--help", "-h": return nil
            case "--app": app = try arguments.string()
            case "--activity": targets.append((flag, .activity(try arguments.string())))
            case "--user": targets.append((flag, .user(try arguments.string())))
            case "--device": targets.append((flag, .device(try arguments.string())))
            default: throw arguments.unknown(flag)
            }
        }
        let path = try arguments.requireDatabase()
        guard let app else { throw RegistryCommandError("--app BUNDLE is required") }
        guard targets.count == 1, let target = targets.first?.target else {
            throw RegistryCommandError(
                targets.isEmpty
                    ? "one of --activity ID, --user ID or --device ID is required"
                    : "\(targets[1].flag) cannot be combined with \(targets[0].flag): give one of --activity, --user "
                        + "or --device")
        }
        try RegistryFiles.identifier(app, field: "app")
        switch target {
        case .activity(let id): try RegistryFiles.identifier(id, field: "activity_id")
        case .user(let id): try RegistryFiles.identifier(id, field: "user")
        case .device(let id): try RegistryFiles.identifier(id, field: "device")
        }
        return { () async throws(RegistryCommandError) -> Int32 in
            let store = try await RegistryFiles.open(path, create: false)
            defer { RegistryFiles.close(store) }
            var output = RegistryOutput()
            let now = store.clock.now()
            switch target {
            case .activity(let activityID):
                var cursor: RegistryCursor?
                repeat {
                    let page = try await registry { () async throws(RegistryError) in
                        try await store.liveUpdateTokens(
                            app: app, activityID: activityID, after: cursor, limit: pageSize, now: now)
                    }
                    for record in page.items { try output.line(line(record, app: app)) }
                    cursor = page.next
                } while cursor != nil
            case .user(let userID):
                try await list(store, app: app, selection: .users([userID]), now: now, to: &output)
            case .device(let deviceID):
                try await list(store, app: app, selection: .devices([deviceID]), now: now, to: &output)
            }
            try output.flush()
            return 0
        }
    }

    /// The selected devices, then their push-to-start tokens, then their live update tokens.
    private static func list(
        _ store: any RegistryStore, app: String, selection: RecipientSelection, now: Int64,
        to output: inout RegistryOutput
    ) async throws(RegistryCommandError) {
        var deviceIDs: [String] = []
        var cursor: RegistryCursor?
        repeat {
            let page = try await registry { () async throws(RegistryError) in
                try await store.devices(app: app, selection: selection, after: cursor, limit: pageSize)
            }
            for device in page.items {
                deviceIDs.append(device.deviceID)
                var line = JSONLine()
                line.add("app", app)
                line.add("device", device.deviceID)
                line.add("user", device.userID)
                line.add("push_token", device.pushToken)
                line.addSeconds("registered_at", milliseconds: device.pushTokenRegisteredAt)
                try output.line(line.text)
            }
            cursor = page.next
        } while cursor != nil
        repeat {
            let page = try await registry { () async throws(RegistryError) in
                try await store.pushToStartTokens(
                    app: app, attributesType: nil, selection: selection, after: cursor, limit: pageSize)
            }
            for record in page.items {
                var line = JSONLine()
                line.add("app", app)
                line.add("push_to_start_token", record.token)
                line.add("attributes_type", record.attributesType)
                line.add("device", record.deviceID)
                line.add("user", record.userID)
                line.addSeconds("registered_at", milliseconds: record.updatedAt)
                try output.line(line.text)
            }
            cursor = page.next
        } while cursor != nil
        for deviceID in deviceIDs {
            repeat {
                let page = try await registry { () async throws(RegistryError) in
                    try await store.updateTokens(app: app, deviceID: deviceID, after: cursor, limit: pageSize, now: now)
                }
                for record in page.items { try output.line(line(record, app: app)) }
                cursor = page.next
            } while cursor != nil
        }
    }

    private static func line(_ record: UpdateTokenRecord, app: String) -> String {
        var line = JSONLine()
        line.add("app", app)
        line.add("activity_id", record.activityID)
        line.add("token", record.token)
        line.add("device", record.deviceID)
        line.addSeconds("registered_at", milliseconds: record.registeredAt)
        return line.text
    }
}

/// `fanout registry stats`: the registry's counts as one JSON object (docs/REGISTRY.md).
enum StatsCommand {
    static let usage = """
        fanout registry stats: print the registry's counts as one JSON object.

        usage: fanout registry (--db FILE | --redis URL) stats

        {"apps":N,"devices":N,"activities":N,"live_activities":N,"update_tokens":N,"push_to_start_tokens":N,
         "expired_swept":N}
        update_tokens counts live tokens only: an expired token is never counted, swept or not.
        expired_swept counts the expired tokens sweeps (prune) have removed since the registry was created.
        """

    static func parse(_ arguments: inout RegistryArguments) throws(RegistryCommandError)
        -> RegistryCommand.RegistryAction?
    {
        guard let path = try parseNoFlags(&arguments, usage: usage) else { return nil }
        return { () async throws(RegistryCommandError) -> Int32 in
            let store = try await RegistryFiles.open(path, create: false)
            defer { RegistryFiles.close(store) }
            let stats = try await registry { () async throws(RegistryError) in try await store.stats() }
            try RegistryOutput.printLine(stats.jsonLine)
            return 0
        }
    }
}

/// `fanout registry prune`: one sweep, now.
enum PruneCommand {
    static let usage = """
        fanout registry prune: remove what has expired, now.

        usage: fanout registry (--db FILE | --redis URL) prune

        Removes update tokens past their lifetime (8 hours after registration; reason "expired"), the tokens
        of ended activities past their dismissal date (reason "ended"), activities left with nothing, and
        events older than 24 hours. Prints
        {"expired":N,"ended":N,"activities_removed":N,"events_pruned":N}.
        """

    static func parse(_ arguments: inout RegistryArguments) throws(RegistryCommandError)
        -> RegistryCommand.RegistryAction?
    {
        guard let path = try parseNoFlags(&arguments, usage: usage) else { return nil }
        return { () async throws(RegistryCommandError) -> Int32 in
            let store = try await RegistryFiles.open(path, create: false)
            defer { RegistryFiles.close(store) }
            let result = try await registry { () async throws(RegistryError) in try await store.sweep() }
            var line = JSONLine()
            line.add("expired", result.expired)
            line.add("ended", result.ended)
            line.add("activities_removed", result.activitiesRemoved)
            line.add("events_pruned", result.eventsPruned)
            try RegistryOutput.printLine(line.text)
            return 0
        }
    }
}

/// `fanout registry events`: the change feed's log, and with `--follow` what other processes add to it.
enum EventsCommand {
    static let usage = """
        fanout registry events: print the change feed as JSON lines.

        usage: fanout registry (--db FILE | --redis URL) events [--follow] [--after SEQ]

          --follow      keep printing new events (polling every 200 ms) until SIGINT or SIGTERM; exit 0
          --after SEQ   start after this event (its "seq"); default: from the oldest kept (24 hours)
          --db FILE     the registry (must exist)
          --redis URL   or the registry on Redis

        One line per token change, oldest first:
          {"at":1764460800123,"app":"com.acme.app","activity_id":"match-7","token":"<hex>","change":"removed",
           "reason":"unregistered","kind":"update","seq":42}
        at: Unix milliseconds. change: added, rotated (token is the new one) or removed. reason: null, or for
        removed: stopped, expired, ended, unregistered. kind: update (activity_id set), push_to_start or push
        (a device's regular push token). seq: the event's position, for --after.
        """

    /// How often `--follow` reads the log.
    static let pollInterval = Duration.milliseconds(200)

    static func parse(_ arguments: inout RegistryArguments) throws(RegistryCommandError)
        -> RegistryCommand.RegistryAction?
    {
        arguments.usage = usage
        var follow = false
        var after: Int?
        while let flag = try arguments.nextFlag() {
            switch flag {
            case "--help", "-h": return nil
            case "--follow", "-f": follow = true
            case "--after": after = try arguments.int(in: 0...Int(Int64.max))
            default: throw arguments.unknown(flag)
            }
        }
        let path = try arguments.requireDatabase()
        return { () async throws(RegistryCommandError) -> Int32 in
            let store = try await RegistryFiles.open(path, create: false)
            defer { RegistryFiles.close(store) }
            let signals = follow ? StopSignals.install() : []
            defer { signals.forEach { $0.cancel() } }
            var cursor = after.map { RegistryCursor(rawValue: String($0)) }
            var output = RegistryOutput()
            while true {
                let page = try await registry { () async throws(RegistryError) in
                    try await store.events(after: cursor, limit: pageSize)
                }
                for event in page.items {
                    // The event line (docs/REGISTRY.md) and kind (RegistryEvent.jsonLine), then the sequence number.
                    var bytes: [UInt8] = []
                    event.appendJSONLine(to: &bytes)
                    bytes.removeLast()
                    bytes.append(contentsOf: ",\"seq\":\(event.sequence)}".utf8)
                    try output.line(bytes)
                }
                try output.flush()
                if let next = page.next { cursor = next }
                if page.items.count == pageSize { continue }
                guard follow else { return 0 }
                if await StopSignals.wait(for: pollInterval) { return 0 }
            }
        }
    }
}

/// SIGINT and SIGTERM, caught for `events --follow` so that it ends with status 0 after its last flush.
enum StopSignals {
    private static let flag = Atomic<Bool>(false)

    /// Catches both signals from now on, calling `onSignal` too; the sources must be kept (and are cancelled) by the
    /// caller.
    static func install(onSignal: @escaping @Sendable () -> Void = {}) -> [any DispatchSourceSignal] {
        [SIGINT, SIGTERM].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                StopSignals.flag.store(true, ordering: .relaxed)
                onSignal()
            }
            source.resume()
            return source
        }
    }

    static var received: Bool { flag.load(ordering: .relaxed) }

    /// Sleeps `interval`, waking early when a signal arrives; true when one has.
    static func wait(for interval: Duration) async -> Bool {
        let deadline = ContinuousClock.now + interval
        while ContinuousClock.now < deadline {
            if received { return true }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return received
    }
}
