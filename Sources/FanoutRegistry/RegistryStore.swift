import Foundation

/// Where the registry keeps its tokens: an embedded SQLite file today (`SQLiteRegistryStore`), Redis for the fleet.
///
/// The interface is what both do well: reads stream in pages behind an opaque cursor (a million-token activity never
/// sits in memory), writes come in batches applied atomically, and nothing asks the store to join tables. Every token
/// change a write or a sweep makes is returned, published to `subscribe()` and kept in the event log.
///
/// Times are Unix milliseconds. Reads take `now` so that a whole send sees one consistent set: a token whose lifetime
/// ended before `now`, or whose ended activity was dismissed before `now`, is never returned, swept or not.
public protocol RegistryStore: Sendable {
    /// The clock for writes that give no time, and for the convenience reads without `now`.
    var clock: RegistryClock { get }

    /// How many tokens a send asks for per page (default 4,096). A store whose page read holds a server that others
    /// wait on (Redis runs one script at a time) prefers smaller pages.
    var preferredPageSize: Int { get }

    // MARK: Apps

    /// Adds apps, or moves existing ones to another workspace. Registrations for an app not defined are refused.
    func defineApps(_ apps: [RegistryApp]) async throws(RegistryError)

    /// Every defined app, by bundle id.
    func apps() async throws(RegistryError) -> [RegistryApp]

    // MARK: Writes

    /// Validates every change, then applies them all in one transaction: all are written or none. Throws
    /// `invalidInput` naming the field (and the change's index in the message) before writing anything.
    @discardableResult
    func apply(_ changes: [RegistryChange]) async throws(RegistryError) -> RegistryApplyResult

    /// Removes what has expired by `now`, in batches of `batchSize` rows (one transaction each): tokens past their
    /// lifetime (reason `expired`, counted in `expired_swept`), tokens of ended activities past their dismissal date
    /// (reason `ended`), activities left with nothing, and events older than the retention.
    func sweep(now: Int64, batchSize: Int) async throws(RegistryError) -> RegistrySweepResult

    // MARK: Paged reads

    /// The live update tokens of one activity, oldest registration slot first. Pass the returned `next` as `after`
    /// until it is nil. Each token present for the whole paging is returned exactly once.
    func liveUpdateTokens(app: String, activityID: String, after: RegistryCursor?, limit: Int, now: Int64)
        async throws(RegistryError) -> RegistryPage<UpdateTokenRecord>

    /// Broadcast channels bound to activities that have ended and whose dismissal date has passed, oldest dismissal
    /// first, after the first `skipping` of them (those a caller leaves bound: another team's, or refused): delete
    /// each at APNs, then unbind it (`.channel(app:activityID:channelID: nil)`), and the next sweep removes the
    /// activity.
    func endedChannels(now: Int64, limit: Int, skipping: Int) async throws(RegistryError) -> [EndedChannel]

    /// How many update tokens of an activity are live at `now` (what `liveUpdateTokens` would return in all).
    func liveUpdateTokenCount(app: String, activityID: String, now: Int64) async throws(RegistryError) -> Int

    /// The live update tokens registered for one device, across the app's activities (for listing).
    func updateTokens(app: String, deviceID: String, after: RegistryCursor?, limit: Int, now: Int64)
        async throws(RegistryError) -> RegistryPage<UpdateTokenRecord>

    /// Push-to-start tokens of the selected devices, for `attributesType` (tokens registered without a type match
    /// every type; nil matches all).
    func pushToStartTokens(
        app: String, attributesType: String?, selection: RecipientSelection, after: RegistryCursor?, limit: Int
    ) async throws(RegistryError) -> RegistryPage<PushToStartRecord>

    /// The selected devices, with or without a push token.
    func devices(app: String, selection: RecipientSelection, after: RegistryCursor?, limit: Int)
        async throws(RegistryError) -> RegistryPage<DeviceRecord>

    /// The devices of `app` whose regular push token is one of `pushTokens` (hex, any case), found through the
    /// token: each device once, in the order of `pushTokens`; a token no device of the app holds finds none. (An API
    /// that names devices by their push tokens, as Pushwoosh's `devices` does, reads them here.)
    func devices(app: String, pushTokens: [String]) async throws(RegistryError) -> [DeviceRecord]

    /// One activity, or nil when the registry holds none by that id (never created, or removed after dismissal).
    func activity(app: String, activityID: String) async throws(RegistryError) -> ActivityRecord?

    /// The event log from `after` (nil: from the oldest kept), in order.
    func events(after: RegistryCursor?, limit: Int) async throws(RegistryError) -> RegistryPage<RegistryEvent>

    /// Counts for `fanout registry stats`, live as of `now`.
    func stats(now: Int64) async throws(RegistryError) -> RegistryStats

    // MARK: Change feed

    /// A stream of every event this store object applies from now on (writes and sweeps through this object; another
    /// process's writes reach only the event log). Any number of subscribers; each gets every event in order, up to
    /// a buffer of the newest events when it falls behind. Ends when the store closes.
    func subscribe() -> AsyncStream<RegistryEvent>
}

/// The page size a send reads a store with, unless the store prefers another (`RegistryStore.preferredPageSize`).
package enum RegistryPaging {
    package static let defaultPageSize = 4096
}

extension RegistryStore {
    public var preferredPageSize: Int { RegistryPaging.defaultPageSize }

    /// `devices(app:pushTokens:)` for a store without a token index: pages through every device of the app (the
    /// stores of this package look the tokens up instead).
    public func devices(app: String, pushTokens: [String]) async throws(RegistryError) -> [DeviceRecord] {
        var wanted: [String: Int] = [:]
        for (index, token) in pushTokens.enumerated() {
            let hex = try RegistryValidation.token(token, field: "push_token", allowEmpty: false)
            if wanted[hex] == nil { wanted[hex] = index }
        }
        var found: [(index: Int, record: DeviceRecord)] = []
        var cursor: RegistryCursor?
        repeat {
            let page = try await devices(app: app, selection: .all, after: cursor, limit: 1_000)
            for record in page.items {
                if let token = record.pushToken, let index = wanted[token] { found.append((index, record)) }
            }
            cursor = page.next
        } while cursor != nil
        return found.sorted { $0.index < $1.index }.map(\.record)
    }

    /// `endedChannels(now:limit:skipping:)` from the first.
    public func endedChannels(now: Int64, limit: Int) async throws(RegistryError) -> [EndedChannel] {
        try await endedChannels(now: now, limit: limit, skipping: 0)
    }

    /// `liveUpdateTokens` as of the store's clock.
    public func liveUpdateTokens(app: String, activityID: String, after: RegistryCursor?, limit: Int)
        async throws(RegistryError) -> RegistryPage<UpdateTokenRecord>
    {
        try await liveUpdateTokens(app: app, activityID: activityID, after: after, limit: limit, now: clock.now())
    }

    /// `sweep` as of the store's clock, in batches of 10,000.
    public func sweep() async throws(RegistryError) -> RegistrySweepResult {
        try await sweep(now: clock.now(), batchSize: 10_000)
    }

    /// `stats` as of the store's clock.
    public func stats() async throws(RegistryError) -> RegistryStats {
        try await stats(now: clock.now())
    }

    /// Records one registration.
    @discardableResult
    public func register(_ registration: Registration) async throws(RegistryError) -> RegistryApplyResult {
        try await apply([registration.change])
    }

    /// Records a 410 for `token` sent with `topic` (see `RegistryChange.unregistered`).
    @discardableResult
    public func recordUnregistered(token: String, timestamp: Int64?, topic: String? = nil) async throws(RegistryError)
        -> RegistryApplyResult
    {
        try await apply([.unregistered(token: token, timestamp: timestamp, topic: topic)])
    }

    /// Records a `BadDeviceToken` or `DeviceTokenNotForTopic` for `token` sent with `topic`: removed at once from the
    /// registrations that topic reaches (nil: from every one; see `RegistryChange.invalidToken`).
    @discardableResult
    public func recordInvalid(token: String, topic: String? = nil) async throws(RegistryError) -> RegistryApplyResult {
        try await apply([.invalidToken(token: token, topic: topic)])
    }

    /// Sweeps every `interval` seconds until the task is cancelled (for `fanout serve` and long sends).
    public func sweepPeriodically(every interval: Duration) async {
        while !Task.isCancelled {
            _ = try? await sweep()
            try? await Task.sleep(for: interval)
        }
    }
}

/// A position in a paged read. Opaque: only the store that returned it understands it.
public struct RegistryCursor: Sendable, Hashable, CustomStringConvertible {
    /// The store's encoding (for SQLite, row positions as decimal text).
    public let rawValue: String

    public init(rawValue: String) {
        self.rawValue = rawValue
    }

    public var description: String { rawValue }
}

/// One page of a read, and where the next one starts (nil when this was the last).
public struct RegistryPage<Element: Sendable>: Sendable {
    public var items: [Element]
    public var next: RegistryCursor?

    public init(items: [Element], next: RegistryCursor?) {
        self.items = items
        self.next = next
    }
}

extension RegistryPage: Equatable where Element: Equatable {}

/// What one `apply` did.
public struct RegistryApplyResult: Sendable, Hashable {
    /// The token changes, in order (also published and logged).
    public var events: [RegistryEvent] = []
    /// Registrations that changed nothing (the same token again, or an older registration than the one held).
    public var unchanged = 0
    /// Registrations refused because their lifetime had already ended when they arrived (a back-filled
    /// `registered_at` more than the token lifetime ago).
    public var alreadyExpired = 0

    public init() {}

    public var added: Int { events.count { $0.change == .added } }
    public var rotated: Int { events.count { $0.change == .rotated } }
    public var removed: Int { events.count { $0.change == .removed } }
}

/// What one `sweep` removed.
public struct RegistrySweepResult: Sendable, Hashable {
    /// Update tokens past their lifetime (reason `expired`).
    public var expired = 0
    /// Update tokens of activities past their dismissal date (reason `ended`).
    public var ended = 0
    /// Activity rows removed (dismissed, or with no tokens left long after their last change).
    public var activitiesRemoved = 0
    /// Events dropped from the log as older than the retention.
    public var eventsPruned = 0

    public init() {}
}

/// `fanout registry stats`, as docs/REGISTRY.md gives it.
public struct RegistryStats: Sendable, Hashable {
    public var apps = 0
    /// Devices recorded (with or without a push token).
    public var devices = 0
    /// Activities recorded (active, or ended and not yet dismissed).
    public var activities = 0
    /// Activities not ended with at least one live update token (or a broadcast channel).
    public var liveActivities = 0
    /// Live update tokens only: an expired token, or one of a dismissed activity, is never counted, swept or not.
    public var updateTokens = 0
    public var pushToStartTokens = 0
    /// Update tokens removed by sweeps as expired, since the registry was created.
    public var expiredSwept = 0

    public init() {}

    /// `{"apps":1,"devices":…,"activities":…,"live_activities":…,"update_tokens":…,"push_to_start_tokens":…,
    /// "expired_swept":…}`.
    package var jsonLine: String {
        "{\"apps\":\(apps),\"devices\":\(devices),\"activities\":\(activities),\"live_activities\":\(liveActivities),"
            + "\"update_tokens\":\(updateTokens),\"push_to_start_tokens\":\(pushToStartTokens),"
            + "\"expired_swept\":\(expiredSwept)}"
    }
}

/// A broadcast channel whose activity is over (`RegistryStore.endedChannels`).
public struct EndedChannel: Sendable, Hashable {
    public var app: String
    public var activityID: String
    public var channelID: String
    /// Where the channel was created (`ActivityRecord.channelEnvironment`); nil when unknown.
    public var environment: String?

    public init(app: String, activityID: String, channelID: String, environment: String? = nil) {
        self.app = app
        self.activityID = activityID
        self.channelID = channelID
        self.environment = environment
    }
}
