public import FanoutRegistry

extension BroadcastChannelClient {
    /// Creates a channel for an activity and binds it in the registry: a job by that activity id then sends one
    /// broadcast to it besides the pushes to the activity's update tokens, and a start job by that id subscribes
    /// the started activity to it (`input-push-channel`).
    public func createChannel(
        forActivity activityID: String, app: String, storagePolicy: ChannelStoragePolicy, registry: any RegistryStore
    ) async throws(BroadcastChannelError) -> String {
        let channel = try await create(app: app, storagePolicy: storagePolicy)
        do {
            _ = try await registry.apply([
                .channel(app: app, activityID: activityID, channelID: channel, storagePolicy: storagePolicy.rawValue)
            ])
        } catch {
            // Not bound: delete it again so it does not count against the app's 10,000 unseen.
            try? await delete(app: app, channelID: channel)
            throw BroadcastChannelError(status: nil, reason: nil, message: "registry: \(error.description)")
        }
        return channel
    }

    /// Deletes the channels of activities that have ended and whose dismissal date has passed, and unbinds them
    /// (a channel APNs no longer knows counts as deleted). Returns the channels deleted; stops at the first other
    /// refusal, leaving the rest bound for the next call.
    /// - Parameter apps: only these apps' channels (the apps of this client's team); nil: every app.
    public func deleteEndedChannels(registry: any RegistryStore, apps: Set<String>? = nil)
        async throws(BroadcastChannelError) -> [EndedChannel]
    {
        var deleted: [EndedChannel] = []
        while true {
            let ended: [EndedChannel]
            do {
                ended = try await registry.endedChannels(now: registry.clock.now(), limit: 100)
            } catch {
                throw BroadcastChannelError(status: nil, reason: nil, message: "registry: \(error.description)")
            }
            let mine = ended.filter { apps?.contains($0.app) ?? true }
            if mine.isEmpty { return deleted }
            for channel in mine {
                do {
                    try await delete(app: channel.app, channelID: channel.channelID)
                } catch  where error.reason == "ChannelNotRegistered" {
                    // Already gone at APNs.
                }
                do {
                    _ = try await registry.apply([
                        .channel(app: channel.app, activityID: channel.activityID, channelID: nil)
                    ])
                } catch {
                    throw BroadcastChannelError(status: nil, reason: nil, message: "registry: \(error.description)")
                }
                deleted.append(channel)
            }
        }
    }
}
