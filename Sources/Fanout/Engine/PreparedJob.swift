import FanoutCore
import FanoutTransport
import Foundation

/// A job made ready to send, shared read-only by every loop: the payload encoded once into a
/// `SharedBody`, and the constant header block built once per provider token (the token changes
/// every 50 minutes; only `:path` and `apns-id` change per notification).
final class PreparedJob: Sendable {
    let id: String
    let run: FanoutRun
    let body: SharedBody
    let headers: NotificationHeaders
    /// Unix seconds after which the notification is `expired` instead of sent; nil for none (0).
    let expiresAt: Int64?
    /// A broadcast job's `:path` (`/4/broadcasts/apps/{bundle}`): its one "recipient" is the channel id. Nil for
    /// device pushes, whose path is `/3/device/<token>`.
    let broadcastPath: String?
    /// The constant request headers and their encoded block; shared by the jobs of an engine whose
    /// headers are equal (`HeaderCache`).
    private let constant: ConstantHeaders
    private var fieldsWithoutToken: [HeaderField] { constant.fieldsWithoutToken }

    /// - Parameter payload: the job's payload, already encoded (once).
    /// - Parameter headerCache: the engine's cache of constant headers, so that jobs with the same headers (a
    ///   gateway's one-token jobs, mostly) check and encode them once, not once per job.
    /// - Throws: the header rule a job breaks (topic, priority, collapse id, ...).
    convenience init(
        job: FanoutJob, payload: [UInt8], run: FanoutRun, authority: String, headerCache: HeaderCache? = nil
    ) throws(NotificationHeaderError) {
        try self.init(
            id: job.id, headers: job.headers, payload: payload, run: run, authority: authority, headerCache: headerCache
        )
    }

    /// A job of `id` with these headers (a `send`'s, which makes no `FanoutJob`).
    init(
        id: String, headers jobHeaders: NotificationHeaders, payload: [UInt8], run: FanoutRun, authority: String,
        headerCache: HeaderCache? = nil
    ) throws(NotificationHeaderError) {
        self.id = id
        self.run = run
        body = SharedBody(payload)
        var headers = jobHeaders
        headers.apnsID = nil
        headers.bearerToken = nil
        self.headers = headers
        expiresAt = (jobHeaders.expiration ?? 0) > 0 ? jobHeaders.expiration : nil
        if let cached = headerCache?.lookup(headers) {
            constant = cached
        } else {
            constant = ConstantHeaders(try Self.constantFields(of: headers, authority: authority))
            headerCache?.store(constant, for: headers)
        }
        broadcastPath = nil
    }

    /// A broadcast to `channelID` of the app `bundleID`, with the same payload bytes: its headers are
    /// `apns-channel-id`, `apns-push-type: liveactivity`, `apns-priority` and `apns-expiration`, and no
    /// `apns-topic`. A job that gives no expiration is sent with 0 to a channel that stores nothing (or whose policy
    /// is unknown: 0 is what any channel accepts) and with `storedBroadcastLifetime` from now to one that keeps the
    /// latest message, so that APNs keeps it for devices that are offline (0 there is a single attempt).
    init(
        broadcastOf job: FanoutJob, payload: SharedBody, bundleID: String, channelID: String,
        storagePolicy: ChannelStoragePolicy?, run: FanoutRun, authority: String,
        nowSeconds: Int64 = Int64(Date().timeIntervalSince1970)
    ) throws(NotificationHeaderError) {
        id = job.id
        self.run = run
        body = payload
        var headers = job.headers
        headers.apnsID = nil
        headers.bearerToken = nil
        headers.collapseID = nil
        self.headers = headers
        let expiration =
            job.headers.expiration
            ?? (storagePolicy == .mostRecentMessageStored ? nowSeconds + Self.storedBroadcastLifetime : 0)
        expiresAt = expiration > 0 ? expiration : nil
        constant = ConstantHeaders(
            try BroadcastRequest.headerFields(
                bundleID: bundleID, channelID: channelID, priority: headers.effectivePriority, expiration: expiration,
                authority: authority))
        broadcastPath = BroadcastRequest.path(bundleID: bundleID)
    }

    /// How long a broadcast to a channel that stores the latest message is kept when its job gives no expiration:
    /// a minute inside the 8 hours APNs keeps one (whether APNs clamps or refuses a later one is not documented).
    static let storedBroadcastLifetime: Int64 = 8 * 3600 - 60

    var isBroadcast: Bool { broadcastPath != nil }

    /// The same job at another priority (a `demote`d Live Activity update): same payload bytes.
    init(demoting job: PreparedJob, to priority: Int) {
        id = job.id
        run = job.run
        body = job.body
        var headers = job.headers
        headers.priority = priority
        self.headers = headers
        expiresAt = job.expiresAt
        broadcastPath = job.broadcastPath
        // apns-priority follows apns-topic; a job that left its priority implicit has none yet.
        var fields = job.fieldsWithoutToken.filter { $0.name != APNsHeaderName.priority }
        let afterTopic = (fields.firstIndex { $0.name == APNsHeaderName.topic } ?? fields.count - 1) + 1
        fields.insert(HeaderField(name: APNsHeaderName.priority, value: String(priority)), at: afterTopic)
        constant = ConstantHeaders(fields)
    }

    /// The constant headers with `authorization: bearer <token>` (nil: none). Built once per token (and, through
    /// the engine's `HeaderCache`, once for every job with the same headers).
    func headerBlock(bearer: String?) -> HeaderBlock { constant.block(bearer: bearer) }

    /// The token only fills `:path`, which `constantFields` leaves out; any valid token will do. Made once: building
    /// it per job (a 64-character string, then validated) showed in the profile of one-token jobs.
    private static let placeholderToken = DeviceToken(String(repeating: "0", count: 64))!

    /// The request's headers less `:path`, `apns-id` and `authorization`, which differ per stream or
    /// per provider token.
    private static func constantFields(of headers: NotificationHeaders, authority: String)
        throws(NotificationHeaderError) -> [HeaderField]
    {
        return try headers.headerFields(deviceToken: placeholderToken, authority: authority).filter { field in
            field.name != APNsHeaderName.path && field.name != APNsHeaderName.apnsID
        }
    }
}

/// A job's constant request headers without `authorization` (checked, in the order APNs sees them, so that building
/// a block later cannot fail) and the block last encoded from them, for one provider token.
final class ConstantHeaders: Sendable {
    let fieldsWithoutToken: [HeaderField]
    private let cachedBlock = FanoutMutex<(bearer: String?, block: HeaderBlock)?>(nil)

    init(_ fieldsWithoutToken: [HeaderField]) {
        self.fieldsWithoutToken = fieldsWithoutToken
    }

    func block(bearer: String?) -> HeaderBlock {
        if let cached = cachedBlock.withLock({ $0 }), cached.bearer == bearer { return cached.block }
        var fields: [(name: String, value: String, neverIndex: Bool)] = []
        fields.reserveCapacity(fieldsWithoutToken.count + 1)
        for field in fieldsWithoutToken {
            fields.append((field.name, field.value, field.neverIndex))
            // Not marked never-indexed here, but nghttp2's encoder never indexes `authorization` whatever the
            // flag says (and Apple asks for it as a literal): every stream carries the token, Huffman-coded. :path
            // and apns-id, which change per stream, stay out of the table too.
            if field.name == APNsHeaderName.authority, let bearer {
                fields.append((APNsHeaderName.authorization, "bearer " + bearer, false))
            }
        }
        let block = HeaderBlock(fields)
        cachedBlock.withLock { $0 = (bearer, block) }
        return block
    }
}

/// The constant headers of an engine's recent jobs, by their `NotificationHeaders` (without `apns-id` and bearer
/// token, which are not among them). A gateway calling `send` per request repeats a few header sets (topic, push
/// type, priority): each job then finds its headers checked and its block encoded, where building them takes about
/// 9 µs of a one-token job's CPU (`perf record` of single-send: `constantFields` 3 µs, `HeaderBlock.init` 4 µs and the
/// rest). Headers that vary per job (an `apns-expiration` per request) only fill it: at `capacity` entries it starts
/// over.
final class HeaderCache: Sendable {
    private let entries = FanoutMutex<[NotificationHeaders: ConstantHeaders]>([:])
    static let capacity = 64

    func lookup(_ headers: NotificationHeaders) -> ConstantHeaders? {
        entries.withLock { $0[headers] }
    }

    func store(_ constant: ConstantHeaders, for headers: NotificationHeaders) {
        entries.withLock { entries in
            if entries.count >= Self.capacity { entries.removeAll(keepingCapacity: true) }
            entries[headers] = constant
        }
    }
}
