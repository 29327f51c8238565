import Fanout
import FanoutCore

/// The audience of a registry-addressed job at enqueue time: which query to page, at which one `now`, and what
/// `fanout send --registry` decides for a job by activity id besides its tokens (the content timestamp, the
/// broadcast, the end).
///
/// The engine does these while it sends (`applyActivityRules`, `sendChannelBroadcast`, `recordActivityEnded`,
/// internal to `Fanout`; the paging is the engine's `RegistryPager`); the fleet does them once per job, here, because its workers
/// send shards of tokens, not the registry address. The rules are the same: a job whose content timestamp is not
/// newer than the activity's last recorded one is superseded (refused here, nothing is sent), otherwise its timestamp
/// becomes the activity's last; an activity bound to a channel gets one broadcast besides its tokens; an `end` marks
/// the activity ended (its tokens kept until the dismissal date) after its tokens are read.
struct RegistryAudience: Sendable {
    /// Why a job is refused, as its report line says.
    struct Refusal: Error {
        var message: String
    }

    private typealias Query = RegistryPager.Query

    private let registry: any RegistryStore
    private let query: Query
    /// The registry's moment for the whole job (Unix ms), so every page agrees on what has expired.
    private let now: Int64
    /// For a job by activity id with Live Activity content (`update`, `end`): what to record.
    private let content: (app: String, id: String, content: LiveActivityContent)?
    /// The activity's broadcast channel, when it has one: the job's last recipient.
    let channel: String?
    /// The channel's storage policy as the registry bound it (nil: unknown), for the broadcast's expiration.
    let channelStoragePolicy: Int?

    /// Checks the job against the registry (it names a known app; by activity id, its content is newer than the
    /// activity's last) and fixes the job's `now`.
    static func resolve(_ job: FanoutJob, registry: (any RegistryStore)?, line: Int) async -> Result<Self, Refusal> {
        let prefix = "line \(line): "
        guard let registry else {
            return .failure(
                Refusal(message: prefix + "jobs that address the registry need the registry on Redis"))
        }
        let query: Query
        switch job.recipients {
        case .activity(let app, let id):
            query = .activity(app: app, id: id)
        case .pushToStart(let app, let attributesType, let selection, let activityID):
            guard activityID == nil else {
                return .failure(
                    Refusal(
                        message: prefix
                            + "push_to_start jobs that name their activity_id cannot be enqueued yet (the start "
                            + "payload's attributes and the channel binding are the engine's); send them with fanout "
                            + "send --registry"))
            }
            query = .pushToStart(app: app, attributesType: attributesType, selection: selection)
        case .devices(let app, let selection):
            query = .devices(app: app, selection: selection)
        case .tokens, .file, .sequence, .channel:
            preconditionFailure("only registry-addressed jobs have an audience")
        }
        let app = query.app
        do throws(RegistryError) {
            guard try await registry.apps().contains(where: { $0.bundleID == app }) else {
                return .failure(Refusal(message: prefix + "app: \"\(app)\" is not in the registry"))
            }
            var content: (app: String, id: String, content: LiveActivityContent)?
            var channel: String?
            var channelStoragePolicy: Int?
            if case .activity(let app, let id) = query {
                let record = try await registry.activity(app: app, activityID: id)
                channel = record?.channelID
                channelStoragePolicy = record?.channelStoragePolicy
                if case .liveActivity(let live) = job.payload, live.event == .update || live.event == .end {
                    if let last = record?.lastContentTimestamp, last >= live.timestamp {
                        return .failure(
                            Refusal(
                                message: prefix
                                    + "superseded: its content timestamp \(live.timestamp) is not newer than the "
                                    + "activity's last (\(last)); nothing enqueued"))
                    }
                    content = (app, id, live)
                }
            }
            return .success(
                RegistryAudience(
                    registry: registry, query: query, now: registry.clock.now(), content: content, channel: channel,
                    channelStoragePolicy: channelStoragePolicy))
        } catch {
            return .failure(Refusal(message: prefix + "registry: \(error.description)"))
        }
    }

    private init(
        registry: any RegistryStore, query: Query, now: Int64,
        content: (app: String, id: String, content: LiveActivityContent)?, channel: String?,
        channelStoragePolicy: Int?
    ) {
        self.channelStoragePolicy = channelStoragePolicy
        self.registry = registry
        self.query = query
        self.now = now
        self.content = content
        self.channel = channel
    }

    /// Records the job's content timestamp as the activity's last, before any of its shards is on the stream.
    func recordContent() async throws(RegistryError) {
        guard let content else { return }
        _ = try await registry.apply([
            .contentSent(app: content.app, activityID: content.id, timestamp: content.content.timestamp)
        ])
    }

    /// After every token is read: an `end` marks the activity ended (a failure is only logged by `fanout send`
    /// too: the tokens then expire on their own).
    func recordEnded() async {
        guard let content, content.content.event == .end else { return }
        _ = try? await registry.apply([
            .endActivity(
                app: content.app, activityID: content.id, dismissalDate: content.content.dismissalDateMilliseconds
            )
        ])
    }

    /// The job's recipients, page by page in the registry's order, all as of the job's one `now`.
    func pager() -> RegistryPager {
        RegistryPager(store: registry, query: query, now: now)
    }
}
