import FanoutRedis
package import FanoutRegistry

/// A change after validation (`RegistryValidation.validate`); its app is the bundle id.
typealias RedisChange = ValidatedChange<String>

/// What a write script's events are about: filled into each `RegistryEvent`, and where its gone tokens were.
struct ScriptContext {
    var app: String
    var activityID: String?
    var kind: RegistryEvent.TokenKind
    var location: TokenLocation?
}

/// A write script's reply (see `RedisRegistryScripts`).
struct ScriptOutcome {
    var unchanged = 0
    var expiredSwept = 0
    var removed = 0
    var events: [(change: RegistryEvent.Change, reason: RegistryEvent.Reason?, token: String, deviceID: String?)] = []
    var goneTokens: [String] = []
    var goneDevices: [String] = []
    var extra: [Int64] = []

    init(_ reply: RedisValue) throws(RegistryError) {
        if case .error(let message) = reply { throw RegistryError(.storage, "Redis: \(message)") }
        guard let values = reply.array, values.count >= 6 else {
            throw RegistryError(.storage, "Redis: unexpected script reply \(reply)")
        }
        unchanged = Int(values[0].integer ?? 0)
        expiredSwept = Int(values[1].integer ?? 0)
        removed = Int(values[2].integer ?? 0)
        let flat = values[3].array ?? []
        for index in stride(from: 0, to: flat.count - 3, by: 4) {
            let change = RegistryEvent.Change(rawValue: flat[index].string ?? "") ?? .removed
            let reason = RegistryEvent.Reason(rawValue: flat[index + 1].string ?? "")
            let device = flat[index + 3].string ?? ""
            events.append((change, reason, flat[index + 2].string ?? "", device.isEmpty ? nil : device))
        }
        goneTokens = (values[4].array ?? []).compactMap(\.string)
        goneDevices = (values[5].array ?? []).compactMap(\.string)
        extra = values.dropFirst(6).map { $0.integer ?? 0 }
    }
}

/// What the second round trip of a write writes: the events (to number and log), the counter, the clean-ups.
struct WriteEffects {
    var result = RegistryApplyResult()
    var pendingEvents: [RegistryEvent] = []
    var expiredSwept = 0
    /// Index entries of tokens gone from where they were: (token, encoded location).
    var gone: [(token: String, location: String)] = []
    /// Activities to visit at the next sweep: a registration into one already dismissed, a change that took the last
    /// token of one (it may be idle already).
    var visitNow: Set<ActivityReference> = []
    /// Index entries this write added: one it also found gone stays (the token may be back by a later change of the
    /// batch; a stale entry is harmless, a missing one is not).
    var added: Set<String> = []
    /// (device, activity) pairs whose token went, by app.
    var untracked: [String: [(deviceID: String, activityID: String)]] = [:]
    /// (app, device, activity) the write recorded in the device-activities index: not untracked (as `added`).
    var tracked: Set<String> = []

    mutating func record(_ outcome: ScriptOutcome, context: ScriptContext, at now: Int64, keys: RedisRegistryKeys) {
        expiredSwept += outcome.expiredSwept
        for event in outcome.events {
            pendingEvents.append(
                RegistryEvent(
                    sequence: 0, at: now, app: context.app, activityID: context.activityID, deviceID: event.deviceID,
                    token: event.token, kind: context.kind, change: event.change, reason: event.reason))
        }
        if let location = context.location {
            for token in outcome.goneTokens {
                gone.append((token, location.encoded))
            }
        }
        if let activityID = context.activityID {
            for device in outcome.goneDevices {
                untracked[context.app, default: []].append((device, activityID))
            }
        }
    }
}

extension RedisRegistryStore {
    // MARK: Validation

    /// Checks one change as SQLiteRegistryStore does (the same rules, fields and messages) and that its app is
    /// defined.
    func validate(_ change: RegistryChange) async throws(RegistryError) -> RedisChange {
        let valid = try RegistryValidation.validate(change)
        if let app = valid.app { try await requireApp(app) }
        return valid
    }

    // MARK: Applying

    @discardableResult
    package func apply(_ changes: [RegistryChange]) async throws(RegistryError) -> RegistryApplyResult {
        guard !changes.isEmpty else { return RegistryApplyResult() }
        let now = clock.now()
        var valid: [RedisChange] = []
        valid.reserveCapacity(changes.count)
        for (index, change) in changes.enumerated() {
            do throws(RegistryError) {
                valid.append(try await validate(change))
            } catch {
                guard error.kind == .invalidInput, changes.count > 1 else { throw error }
                throw RegistryError(.invalidInput, field: error.field, "change \(index): \(error.message)")
            }
        }

        var effects = WriteEffects()
        var planner = Planner(keys: keys, now: now)
        var pipeline: [[RedisArgument]] = []
        // The scripts of the pipeline: their index in it, their context, and the removal change they serve (if any).
        var scripts: [(index: Int, context: ScriptContext, removal: Int?)] = []
        var removedByChange: [Int: Int] = [:]

        func flush() async throws(RegistryError) {
            // The chunk's activity-set and schedule additions, coalesced, go first: indexes only ever lead the data.
            let prefix = planner.takeScheduleCommands()
            let replies = try await send(prefix + pipeline)
            for script in scripts {
                let outcome = try ScriptOutcome(replies[prefix.count + script.index])
                effects.result.unchanged += script.removal == nil ? outcome.unchanged : 0
                if let removal = script.removal { removedByChange[removal, default: 0] += outcome.removed }
                effects.record(outcome, context: script.context, at: now, keys: keys)
                if script.context.kind == .update, outcome.extra.first == 1, let activityID = script.context.activityID
                {
                    effects.visitNow.insert(ActivityReference(app: script.context.app, activityID: activityID))
                }
            }
            for reply in replies {
                if case .error(let message) = reply { throw RegistryError(.storage, "Redis: \(message)") }
            }
            pipeline.removeAll(keepingCapacity: true)
            scripts.removeAll(keepingCapacity: true)
        }

        for (changeIndex, change) in valid.enumerated() {
            if case .removeToken(let token, let before, let scope) = change {
                // The places it is registered come from the token index: read them first (after the changes
                // before this one are applied, so that a batch registering then removing a token finds it).
                if !pipeline.isEmpty { try await flush() }
                let members = try await send(["SMEMBERS", keys.token(token)]).array ?? []
                removedByChange[changeIndex] = 0
                for member in members {
                    guard case .bytes(let bytes) = member, let location = TokenLocation(encoded: bytes),
                        scope.map(location.isReached(by:)) ?? true
                    else {
                        continue
                    }
                    let (command, context) = removal(of: token, before: before, at: location, now: now)
                    scripts.append((pipeline.count, context, changeIndex))
                    pipeline.append(command)
                }
                continue
            }
            let (commands, context) = plan(change, now: now, planner: &planner, result: &effects.result)
            guard !commands.isEmpty else { continue }
            pipeline += commands.dropLast()
            if let context {
                scripts.append((pipeline.count, context, nil))
            }
            pipeline.append(commands.last!)
            if pipeline.count >= Self.pipelineChunk { try await flush() }
        }
        if !pipeline.isEmpty { try await flush() }
        for (_, removed) in removedByChange where removed == 0 { effects.result.unchanged += 1 }
        effects.added = planner.added
        effects.tracked = planner.tracked
        return try await finish(effects, now: now)
    }

    /// The commands of one change: plain index updates, then its script (last), and the script's context. The
    /// activity-set and schedule additions go to `planner`, which coalesces them per pipeline.
    private func plan(
        _ change: RedisChange, now: Int64, planner: inout Planner, result: inout RegistryApplyResult
    ) -> ([[RedisArgument]], ScriptContext?) {
        let lifetime = configuration.updateTokenLifetime
        func activity(_ app: String, _ activityID: String, _ arguments: [RedisArgument]) -> [RedisArgument] {
            Self.eval(
                RedisRegistryScripts.activity,
                keys: planner.activityKeys(ActivityReference(app: app, activityID: activityID)),
                arguments.first.map { [$0, planner.nowArgument] + arguments.dropFirst() } ?? [])
        }
        func app(_ app: String, _ arguments: [RedisArgument]) -> [RedisArgument] {
            Self.eval(
                RedisRegistryScripts.app, keys: planner.appKeys(app),
                arguments.first.map { [$0, planner.nowArgument] + arguments.dropFirst() } ?? [])
        }
        func member(_ app: String, _ activityID: String) -> RedisArgument {
            RedisArgument(ActivityReference(app: app, activityID: activityID).member)
        }
        func schedule(_ app: String, _ activityID: String, at time: Int64) -> [[RedisArgument]] {
            planner.schedule(ActivityReference(app: app, activityID: activityID), at: time, isCreated: true)
            return []
        }
        func updateContext(_ app: String, _ activityID: String) -> ScriptContext {
            ScriptContext(
                app: app, activityID: activityID, kind: .update,
                location: .update(app: app, activityID: activityID))
        }

        switch change {
        case .updateToken(let appID, let activityID, let deviceID, let userID, let token, let registeredAt):
            if token.isEmpty {
                return (
                    [activity(appID, activityID, ["stop", RedisArgument(deviceID ?? "")])],
                    updateContext(appID, activityID)
                )
            }
            let registered = registeredAt ?? now
            let expiresAt = registered &+ lifetime
            guard expiresAt > now else {
                result.alreadyExpired += 1
                return ([], nil)
            }
            var commands = [planner.index(token, at: .update(app: appID, activityID: activityID))]
            commands += schedule(appID, activityID, at: expiresAt)
            if let deviceID {
                commands.append(
                    app(
                        appID,
                        ["touch", RedisArgument(deviceID), RedisArgument(userID ?? ""), RedisArgument(activityID)]))
                planner.tracked.insert(appID + "\n" + deviceID + "\n" + activityID)
            }
            commands.append(
                activity(
                    appID, activityID,
                    [
                        "register", RedisArgument(deviceID ?? ""), RedisArgument(token),
                        RedisArgument(String(registered)),
                        RedisArgument(String(expiresAt)),
                    ]))
            return (commands, updateContext(appID, activityID))
        case .stopUpdateTokens(let appID, let activityID, let deviceID):
            return (
                [activity(appID, activityID, ["stop", RedisArgument(deviceID ?? "")])], updateContext(appID, activityID)
            )
        case .pushToStart(let appID, let deviceID, let userID, let type, let token, let updatedAt):
            let location = TokenLocation.pushToStart(app: appID, deviceID: deviceID, attributesType: type)
            var commands: [[RedisArgument]] = []
            if !token.isEmpty { commands.append(planner.index(token, at: location)) }
            commands.append(
                app(
                    appID,
                    [
                        "pts", RedisArgument(deviceID), RedisArgument(userID ?? ""), RedisArgument(type),
                        RedisArgument(token), RedisArgument(String(updatedAt ?? now)),
                    ]))
            return (commands, ScriptContext(app: appID, activityID: nil, kind: .pushToStart, location: location))
        case .device(let appID, let deviceID, let userID, let pushToken, let registeredAt):
            let location = TokenLocation.push(app: appID, deviceID: deviceID)
            var commands: [[RedisArgument]] = []
            if let pushToken, !pushToken.isEmpty {
                commands.append(planner.index(pushToken, at: location))
            }
            commands.append(
                app(
                    appID,
                    [
                        "device", RedisArgument(deviceID), RedisArgument(userID ?? ""),
                        RedisArgument(pushToken == nil ? "0" : "1"), RedisArgument(pushToken ?? ""),
                        RedisArgument(String(registeredAt ?? now)),
                    ]))
            return (commands, ScriptContext(app: appID, activityID: nil, kind: .push, location: location))
        case .startActivity(let appID, let activityID, let attributesType):
            return (
                schedule(appID, activityID, at: now &+ lifetime)
                    + [activity(appID, activityID, ["start", RedisArgument(attributesType ?? "")])],
                updateContext(appID, activityID)
            )
        case .endActivity(let appID, let activityID, let dismissalDate):
            let dismissal = dismissalDate ?? now &+ configuration.defaultDismissalDelay
            planner.schedule(ActivityReference(app: appID, activityID: activityID), at: dismissal, isCreated: false)
            return (
                [
                    ["ZADD", keys.ended, RedisArgument(String(dismissal)), member(appID, activityID)],
                    activity(appID, activityID, ["end", RedisArgument(String(dismissal))]),
                ], updateContext(appID, activityID)
            )
        case .contentSent(let appID, let activityID, let timestamp):
            return (
                schedule(appID, activityID, at: now &+ lifetime)
                    + [activity(appID, activityID, ["content", RedisArgument(String(timestamp))])],
                updateContext(appID, activityID)
            )
        case .channel(let appID, let activityID, let channelID, let storagePolicy, let onlyIfUnbound, let environment):
            // Unbinding lets the next sweep remove a dismissed activity: visit it then.
            return (
                schedule(appID, activityID, at: channelID == nil ? now : now &+ lifetime)
                    + [
                        activity(
                            appID, activityID,
                            [
                                "channel", RedisArgument(channelID ?? ""),
                                RedisArgument(storagePolicy.map(String.init) ?? ""),
                                RedisArgument(onlyIfUnbound ? "1" : ""), RedisArgument(environment ?? ""),
                            ])
                    ],
                updateContext(appID, activityID)
            )
        case .removeToken:
            preconditionFailure("removals are planned from the token index")
        }
    }

    /// The script that removes `token` at one place it is registered.
    private func removal(of token: String, before: Int64?, at location: TokenLocation, now: Int64) -> (
        [RedisArgument], ScriptContext
    ) {
        let time = RedisArgument(before.map { String($0) } ?? "")
        switch location {
        case .update(let app, let activityID):
            return (
                Self.eval(
                    RedisRegistryScripts.activity,
                    keys: keys.activity(ActivityReference(app: app, activityID: activityID)),
                    ["remove", RedisArgument(String(now)), RedisArgument(token), time]),
                ScriptContext(app: app, activityID: activityID, kind: .update, location: location)
            )
        case .push(let app, let deviceID):
            return (
                Self.eval(
                    RedisRegistryScripts.app, keys: keys.app(app),
                    [
                        "remove", RedisArgument(String(now)), "push", RedisArgument(deviceID), "", RedisArgument(token),
                        time,
                    ]
                ), ScriptContext(app: app, activityID: nil, kind: .push, location: location)
            )
        case .pushToStart(let app, let deviceID, let type):
            return (
                Self.eval(
                    RedisRegistryScripts.app, keys: keys.app(app),
                    [
                        "remove", RedisArgument(String(now)), "push_to_start", RedisArgument(deviceID),
                        RedisArgument(type),
                        RedisArgument(token), time,
                    ]), ScriptContext(app: app, activityID: nil, kind: .pushToStart, location: location)
            )
        }
    }

    /// The second round trip of a write: logs the events (which numbers them), adds to `expired_swept`, cleans the
    /// indexes, plus `extra` commands; then publishes the events and returns the result.
    func finish(_ effects: WriteEffects, now: Int64, extra: [[RedisArgument]] = []) async throws(RegistryError)
        -> RegistryApplyResult
    {
        var effects = effects
        var batch: [[RedisArgument]] = []
        if !effects.pendingEvents.isEmpty {
            var arguments: [RedisArgument] = [RedisArgument(String(now))]
            arguments.reserveCapacity(1 + effects.pendingEvents.count * 7)
            for event in effects.pendingEvents {
                arguments += [
                    RedisArgument(event.app), RedisArgument(event.activityID ?? ""),
                    RedisArgument(event.deviceID ?? ""),
                    RedisArgument(event.token), RedisArgument(event.kind.rawValue),
                    RedisArgument(event.change.rawValue),
                    RedisArgument(event.reason?.rawValue ?? ""),
                ]
            }
            batch.append(Self.eval(RedisRegistryScripts.eventLog, keys: [keys.events], arguments))
        }
        if effects.expiredSwept > 0 {
            batch.append(["HINCRBY", keys.counters, "expired_swept", RedisArgument(effects.expiredSwept)])
        }
        for (token, location) in effects.gone where !effects.added.contains(token + "\n" + location) {
            batch.append(["SREM", keys.token(token), RedisArgument(location)])
        }
        for (app, pairs) in effects.untracked {
            let pairs = pairs.filter { !effects.tracked.contains(app + "\n" + $0.deviceID + "\n" + $0.activityID) }
                .flatMap { [RedisArgument($0.deviceID), RedisArgument($0.activityID)] }
            guard !pairs.isEmpty else { continue }
            batch.append(
                Self.eval(
                    RedisRegistryScripts.app, keys: keys.app(app), ["untrack", RedisArgument(String(now))] + pairs))
        }
        if !effects.visitNow.isEmpty {
            batch.append(
                ["ZADD", keys.schedule, "LT"]
                    + effects.visitNow.flatMap { [RedisArgument(String(now)), RedisArgument($0.member)] })
        }
        batch += extra
        let replies = try await send(batch)
        for reply in replies {
            if case .error(let message) = reply { throw RegistryError(.storage, "Redis: \(message)") }
        }
        if !effects.pendingEvents.isEmpty {
            let numbers = replies[0].array ?? []
            for index in effects.pendingEvents.indices {
                effects.pendingEvents[index].sequence = index < numbers.count ? numbers[index].integer ?? 0 : 0
            }
            effects.result.events = effects.pendingEvents
            hub.publish(effects.pendingEvents)
        }
        return effects.result
    }

    // MARK: Sweeping

    package func sweep(now: Int64, batchSize: Int) async throws(RegistryError) -> RegistrySweepResult {
        precondition(batchSize > 0, "batchSize must be positive")
        var total = RegistrySweepResult()
        let visits = min(batchSize, 256)
        while true {
            let due =
                try await send([
                    "ZRANGEBYSCORE", keys.schedule, "-inf", RedisArgument(String(now)), "LIMIT", "0",
                    RedisArgument(visits),
                ]).array ?? []
            let references = due.compactMap { $0.string.flatMap(ActivityReference.init(member:)) }
            if due.isEmpty { break }
            let replies = try await send(
                references.map {
                    Self.eval(
                        RedisRegistryScripts.activity, keys: keys.activity($0),
                        [
                            "sweep", RedisArgument(String(now)), RedisArgument(batchSize),
                            RedisArgument(String(configuration.updateTokenLifetime)),
                        ])
                })
            var effects = WriteEffects()
            var schedule: [[RedisArgument]] = []
            for (reference, reply) in zip(references, replies) {
                let outcome = try ScriptOutcome(reply)
                let context = ScriptContext(
                    app: reference.app, activityID: reference.activityID, kind: .update,
                    location: .update(app: reference.app, activityID: reference.activityID))
                effects.record(outcome, context: context, at: now, keys: keys)
                guard outcome.extra.count == 4 else {
                    // Not a sweep reply (cannot happen with this script): unscheduled, so the loop ends.
                    schedule.append(["ZREM", keys.schedule, RedisArgument(reference.member)])
                    continue
                }
                total.expired += Int(outcome.extra[0])
                total.ended += Int(outcome.extra[1])
                total.activitiesRemoved += Int(outcome.extra[2])
                let member = RedisArgument(reference.member)
                switch outcome.extra[3] {
                case -2:
                    schedule += [
                        ["ZREM", keys.schedule, member], ["SREM", keys.activities, member],
                        ["ZREM", keys.ended, member],
                    ]
                case -1:
                    schedule.append(["ZREM", keys.schedule, member])
                case let next:
                    schedule.append(["ZADD", keys.schedule, RedisArgument(String(max(next, now))), member])
                }
            }
            // Members that are not activity references are dropped from the schedule.
            for value in due where value.string.flatMap(ActivityReference.init(member:)) == nil {
                if case .bytes(let bytes) = value {
                    schedule.append(["ZREM", keys.schedule, RedisArgument(bytes: bytes)])
                }
            }
            _ = try await finish(effects, now: now, extra: schedule)
        }
        let cutoff = now - configuration.eventRetention
        // At most 1,000 events a script: Redis runs one script at a time, and a prune of 10,000 held it 19 ms
        // (`fanout-bench --scenario serve`, after a million-token import) while a service's requests waited.
        let pruneBatch = min(batchSize, 1_000)
        while true {
            let pruned =
                try await send(
                    Self.eval(
                        RedisRegistryScripts.pruneEvents, keys: [keys.events],
                        [RedisArgument(String(cutoff)), RedisArgument(pruneBatch)])
                ).integer ?? 0
            total.eventsPruned += Int(pruned)
            if pruned < pruneBatch { break }
        }
        return total
    }
}

/// Builds a batch's commands: key names made once per activity and app, the activity-set and schedule additions of a
/// pipeline coalesced into two commands (one `SADD`, one `ZADD LT` with each activity's earliest time).
struct Planner {
    let keys: RedisRegistryKeys
    let nowArgument: RedisArgument
    private var activities: [ActivityReference: [RedisArgument]] = [:]
    private var apps: [String: [RedisArgument]] = [:]
    private var created: [ActivityReference] = []
    private var times: [ActivityReference: Int64] = [:]
    private var order: [ActivityReference] = []
    /// The token index entries added (token, newline, encoded location).
    private(set) var added: Set<String> = []
    /// The device-activities entries added (app, device, activity, newline-separated).
    var tracked: Set<String> = []

    init(keys: RedisRegistryKeys, now: Int64) {
        self.keys = keys
        nowArgument = RedisArgument(String(now))
    }

    mutating func activityKeys(_ reference: ActivityReference) -> [RedisArgument] {
        if let cached = activities[reference] { return cached }
        let made = keys.activity(reference)
        activities[reference] = made
        return made
    }

    /// The command adding `location` to `token`'s index entries.
    mutating func index(_ token: String, at location: TokenLocation) -> [RedisArgument] {
        let encoded = location.encoded
        added.insert(token + "\n" + encoded)
        return ["SADD", keys.token(token), RedisArgument(encoded)]
    }

    mutating func appKeys(_ app: String) -> [RedisArgument] {
        if let cached = apps[app] { return cached }
        let made = keys.app(app)
        apps[app] = made
        return made
    }

    /// The sweep should visit `reference` at `time` at the latest; `isCreated`: the change creates the activity.
    mutating func schedule(_ reference: ActivityReference, at time: Int64, isCreated: Bool) {
        if let current = times[reference] {
            if time < current { times[reference] = time }
        } else {
            times[reference] = time
            order.append(reference)
        }
        if isCreated { created.append(reference) }
    }

    /// The coalesced additions since the last call, and forgets them.
    mutating func takeScheduleCommands() -> [[RedisArgument]] {
        defer {
            created.removeAll(keepingCapacity: true)
            times.removeAll(keepingCapacity: true)
            order.removeAll(keepingCapacity: true)
        }
        var commands: [[RedisArgument]] = []
        if !created.isEmpty {
            var seen = Set<ActivityReference>()
            commands.append(
                ["SADD", keys.activities] + created.filter { seen.insert($0).inserted }.map { RedisArgument($0.member) }
            )
        }
        if !order.isEmpty {
            var command: [RedisArgument] = ["ZADD", keys.schedule, "LT"]
            for reference in order {
                command += [RedisArgument(String(times[reference]!)), RedisArgument(reference.member)]
            }
            commands.append(command)
        }
        return commands
    }
}
