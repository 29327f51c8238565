public import FanoutRegistry

extension BroadcastChannelClient {
    /// Creates a channel for an activity and binds it in the registry: a job by that activity id then sends one
    /// broadcast to it besides the pushes to the activity's update tokens, and a start job by that id subscribes
    /// the started activity to it (`input-push-channel`).
    ///
    /// An activity keeps its channel: one already bound is refused (`reason` `AlreadyBound`, the channel in the
    /// message), since binding another would cut off every activity subscribed to the first and lose its id while
    /// it counts against the app's 10,000. Two creations at once: the binding is made only if the activity has no
    /// channel yet, so the first to bind wins and the other, reading the binding back, deletes its own channel and
    /// returns the bound one.
    public func createChannel(
        forActivity activityID: String, app: String, storagePolicy: ChannelStoragePolicy, registry: any RegistryStore
    ) async throws(BroadcastChannelError) -> String {
        if let bound = try await boundChannel(activityID: activityID, app: app, registry: registry) {
            throw BroadcastChannelError(
                status: nil, reason: Self.alreadyBound,
                message: "activity \(activityID) already has channel \(bound); delete it first")
        }
        let channel = try await create(app: app, storagePolicy: storagePolicy)
        do {
            _ = try await registry.apply([
                .channel(
                    app: app, activityID: activityID, channelID: channel, storagePolicy: storagePolicy.rawValue,
                    onlyIfUnbound: true, environment: environment)
            ])
        } catch {
            // Not bound: delete it again so it does not count against the app's 10,000 unseen.
            try? await delete(app: app, channelID: channel)
            throw BroadcastChannelError(status: nil, reason: nil, message: "registry: \(error.description)")
        }
        if let bound = try? await boundChannel(activityID: activityID, app: app, registry: registry),
            bound != channel
        {
            try? await delete(app: app, channelID: channel)
            return bound
        }
        return channel
    }

    /// The `reason` of a creation refused because the activity already has a channel.
    public static let alreadyBound = "AlreadyBound"

    private func boundChannel(activityID: String, app: String, registry: any RegistryStore)
        async throws(BroadcastChannelError) -> String?
    {
        do {
            return try await registry.activity(app: app, activityID: activityID)?.channelID
        } catch {
            throw BroadcastChannelError(status: nil, reason: nil, message: "registry: \(error.description)")
        }
    }

    /// Deletes an activity's channel at APNs and unbinds it: what comes before giving the activity another (it keeps
    /// its channel until then). A channel APNs does not know counts as deleted, since the caller named it; but one
    /// created in another environment than this client's is left as it is (deleting it here would only be told it
    /// does not exist) and refused with `reason` `OtherEnvironment`, naming where it was created.
    /// - Returns: the channel deleted.
    public func deleteChannel(forActivity activityID: String, app: String, registry: any RegistryStore)
        async throws(BroadcastChannelError) -> String
    {
        let record: ActivityRecord?
        do {
            record = try await registry.activity(app: app, activityID: activityID)
        } catch {
            throw BroadcastChannelError(status: nil, reason: nil, message: "registry: \(error.description)")
        }
        guard let channel = record?.channelID else {
            throw BroadcastChannelError(
                status: nil, reason: nil, message: "activity \(activityID) of \(app) has no channel")
        }
        if let created = record?.channelEnvironment, created != environment {
            throw BroadcastChannelError(
                status: nil, reason: Self.otherEnvironment,
                message: "channel \(channel) of activity \(activityID) was created in \(created), not \(environment); "
                    + "delete it there")
        }
        do {
            try await delete(app: app, channelID: channel)
        } catch  where error.reason == "ChannelNotRegistered" {
            // Already gone at APNs: unbind it all the same.
        }
        do {
            _ = try await registry.apply([.channel(app: app, activityID: activityID, channelID: nil)])
        } catch {
            throw BroadcastChannelError(status: nil, reason: nil, message: "registry: \(error.description)")
        }
        return channel
    }

    /// The `reason` of a deletion refused because the channel was created in another environment than the client's.
    public static let otherEnvironment = "OtherEnvironment"

    /// `pruneEndedChannels(registry:apps:)`'s channels deleted.
    public func deleteEndedChannels(registry: any RegistryStore, apps: Set<String>? = nil)
        async throws(BroadcastChannelError) -> [EndedChannel]
    {
        try await pruneEndedChannels(registry: registry, apps: apps).deleted
    }

    /// Deletes the channels of activities that have ended and whose dismissal date has passed, and unbinds them.
    ///
    /// A channel lives in one APNs environment, and the registry records which (`ActivityRecord.channelEnvironment`):
    /// - one created in this client's environment is deleted, and one APNs no longer knows there counts as deleted;
    /// - one created in another is left bound, not asked about (`otherEnvironment` in the answer): APNs here would
    ///   say it does not exist, and taking that for its being gone dropped the binding of every channel of a prune
    ///   pointed at the wrong environment, losing their ids while they still counted against the app's 10,000;
    /// - one bound without its environment (before the registry recorded it, or by a start job sent to a host not
    ///   Apple's, whose management host the engine does not know) is taken to be this one's, as before the
    ///   environment was recorded: deleted, or counted as deleted when APNs does not know it. Kept bound instead, it
    ///   would stay so for ever (every prune refused, `fanout serve` warning each minute), and every start job to a
    ///   mock binds one.
    ///
    /// A channel APNs refuses to delete stays bound for the next call and the others are still deleted (one stuck
    /// channel first in line stopped every later one, for every team); the first refusal is then thrown, saying how
    /// many were deleted.
    /// - Parameters:
    ///   - registry: the registry whose ended channels are deleted and then unbound.
    ///   - apps: only these apps' channels (the apps of this client's team); nil: every app. Other apps'
    ///     channels are paged past, so a team's come up however many of another team's are ahead of them.
    public func pruneEndedChannels(registry: any RegistryStore, apps: Set<String>? = nil)
        async throws(BroadcastChannelError) -> EndedChannelsPrune
    {
        var prune = EndedChannelsPrune()
        var firstRefusal: (channel: EndedChannel, error: BroadcastChannelError)?
        var refused = 0
        // Ended channels left bound in this call (another team's, another environment's, or refused), which sort
        // first in every page.
        var leftBound = 0
        while true {
            let ended: [EndedChannel]
            do {
                ended = try await registry.endedChannels(now: registry.clock.now(), limit: 100, skipping: leftBound)
            } catch {
                throw BroadcastChannelError(status: nil, reason: nil, message: "registry: \(error.description)")
            }
            if ended.isEmpty { break }
            for channel in ended {
                guard apps?.contains(channel.app) ?? true else {
                    leftBound += 1
                    continue
                }
                if let created = channel.environment, created != environment {
                    prune.otherEnvironment.append(channel)
                    leftBound += 1
                    continue
                }
                do {
                    try await delete(app: channel.app, channelID: channel.channelID)
                } catch  where error.reason == "ChannelNotRegistered" {
                    // Already gone at APNs, in the environment it was created in (or, not recorded, taken to be).
                } catch {
                    if firstRefusal == nil { firstRefusal = (channel, error) }
                    refused += 1
                    leftBound += 1
                    continue
                }
                do {
                    _ = try await registry.apply([
                        .channel(app: channel.app, activityID: channel.activityID, channelID: nil)
                    ])
                } catch {
                    throw BroadcastChannelError(status: nil, reason: nil, message: "registry: \(error.description)")
                }
                prune.deleted.append(channel)
            }
        }
        if let (channel, error) = firstRefusal {
            throw BroadcastChannelError(
                status: error.status, reason: error.reason,
                message: "deleted \(prune.deleted.count) ended channels; \(refused) refused, left bound for the next "
                    + "prune, the first \(channel.channelID) of \(channel.app): \(error.message)")
        }
        return prune
    }
}

/// What `BroadcastChannelClient.pruneEndedChannels` did.
public struct EndedChannelsPrune: Sendable, Equatable {
    /// Deleted at APNs (or already gone there) and unbound.
    public var deleted: [EndedChannel] = []
    /// Created in another environment than the client's: left bound, for a prune there.
    public var otherEnvironment: [EndedChannel] = []

    public init(deleted: [EndedChannel] = [], otherEnvironment: [EndedChannel] = []) {
        self.deleted = deleted
        self.otherEnvironment = otherEnvironment
    }
}
