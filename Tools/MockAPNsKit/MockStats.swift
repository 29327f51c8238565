import Foundation
import Synchronization

/// What mock-apns has seen, shared by all its loops. Written as JSON to `--stats` at least once a
/// second and on exit, in the shape product.md gives.
package final class MockStats: Sendable {
    private struct Tallies {
        var requests = 0
        var accepted = 0
        /// Counts by HTTP status, indexed by the status (an array: no hashing per request).
        var byStatus = [Int](repeating: 0, count: 600)
        var byReason: [String: Int] = [:]
        /// 64-bit digests of the accepted tokens and apns-ids: integers hash and compare far
        /// faster than strings, and a collision among a few million 64-bit values is vanishingly rare.
        var tokens = Set<UInt64>()
        var apnsIDs = Set<UInt64>()
        /// Digests of the valid provider tokens (JWTs) seen: a fleet sharing one token per team shows one.
        var providerTokens = Set<UInt64>()
        var duplicateApnsIDs = 0
        var connections = 0
        var streamLimitViolations = 0
        var goawaysSent = 0
        var connectionsDropped = 0
        var streamsRefused = 0
        var streamsBlackholed = 0
        /// Accepted requests by `apns-priority` (1 to 10).
        var acceptedByPriority = [Int](repeating: 0, count: 11)
        var payloadsByToken: [String: [[UInt8]]] = [:]
        /// Broadcast sends accepted, in all and by channel id.
        var broadcasts = 0
        var broadcastsByChannel: [String: Int] = [:]
        /// Channels that exist now (set by `MockChannels`).
        var channels = 0
    }

    private let tallies = Mutex(Tallies())

    package init() {}

    /// Counts a request answered with `status` (and `reason` when it is an error).
    func recordAnswer(status: Int, reason: String?, token: String?, apnsID: String?, priority: Int? = nil) {
        tallies.withLock { tallies in
            tallies.requests += 1
            tallies.byStatus[min(max(status, 0), 599)] += 1
            if let reason { tallies.byReason[reason, default: 0] += 1 }
            guard status == 200 else { return }
            tallies.accepted += 1
            if let priority, (0...10).contains(priority) { tallies.acceptedByPriority[priority] += 1 }
            if let token { tallies.tokens.insert(digest(token)) }
            if let apnsID, !tallies.apnsIDs.insert(digest(apnsID)).inserted { tallies.duplicateApnsIDs += 1 }
        }
    }

    /// Counts a broadcast send answered with `status`: in `requests`, `by_status` and `by_reason` like a device push,
    /// and, when accepted, in `broadcasts` and `broadcasts_by_channel` (not in `accepted`, which counts device pushes).
    func recordBroadcast(status: Int, reason: String?, channel: String?) {
        tallies.withLock { tallies in
            tallies.requests += 1
            tallies.byStatus[min(max(status, 0), 599)] += 1
            if let reason { tallies.byReason[reason, default: 0] += 1 }
            guard status == 200, let channel else { return }
            tallies.broadcasts += 1
            tallies.broadcastsByChannel[channel, default: 0] += 1
        }
    }

    /// Counts a provider token that verified (called when a connection's token changes, not per request).
    func recordProviderToken(_ token: String) { tallies.withLock { _ = $0.providerTokens.insert(digest(token)) } }

    /// How many distinct valid provider tokens were seen.
    package var distinctProviderTokens: Int { tallies.withLock { $0.providerTokens.count } }

    func recordChannelCount(_ count: Int) { tallies.withLock { $0.channels = count } }

    func recordRefused() { tallies.withLock { $0.streamsRefused += 1 } }
    func recordBlackholed() { tallies.withLock { $0.streamsBlackholed += 1 } }
    func recordPayload(_ payload: [UInt8], token: String) {
        tallies.withLock { $0.payloadsByToken[token, default: []].append(payload) }
    }

    /// The payloads accepted for each token, in the order they were accepted (with `capturePayloads`).
    package var payloadsByToken: [String: [[UInt8]]] { tallies.withLock { $0.payloadsByToken } }
    func recordConnection() { tallies.withLock { $0.connections += 1 } }
    func recordViolation() { tallies.withLock { $0.streamLimitViolations += 1 } }
    func recordGoaway() { tallies.withLock { $0.goawaysSent += 1 } }
    func recordDrop() { tallies.withLock { $0.connectionsDropped += 1 } }

    /// A snapshot as a JSON object.
    package func snapshot() -> [String: Any] {
        tallies.withLock { tallies in
            [
                "requests": tallies.requests,
                "accepted": tallies.accepted,
                "by_status": Dictionary(
                    uniqueKeysWithValues: tallies.byStatus.enumerated().filter { $0.element > 0 }.map {
                        (String($0.offset), $0.element)
                    }),
                "by_reason": tallies.byReason,
                "distinct_tokens": tallies.tokens.count,
                "duplicate_apns_ids": tallies.duplicateApnsIDs,
                "connections": tallies.connections,
                "stream_limit_violations": tallies.streamLimitViolations,
                "goaways_sent": tallies.goawaysSent,
                "connections_dropped": tallies.connectionsDropped,
                "streams_refused": tallies.streamsRefused,
                "streams_blackholed": tallies.streamsBlackholed,
                "accepted_by_priority": Dictionary(
                    uniqueKeysWithValues: tallies.acceptedByPriority.enumerated().filter { $0.element > 0 }.map {
                        (String($0.offset), $0.element)
                    }),
                "broadcasts": tallies.broadcasts,
                "broadcasts_by_channel": tallies.broadcastsByChannel,
                "channels": tallies.channels,
            ]
        }
    }

    package var accepted: Int { tallies.withLock { $0.accepted } }
    package var requests: Int { tallies.withLock { $0.requests } }
    package var streamLimitViolations: Int { tallies.withLock { $0.streamLimitViolations } }
    package var duplicateApnsIDs: Int { tallies.withLock { $0.duplicateApnsIDs } }
    package func count(status: Int) -> Int {
        tallies.withLock { (0..<600).contains(status) ? $0.byStatus[status] : 0 }
    }
    package func count(reason: String) -> Int { tallies.withLock { $0.byReason[reason] ?? 0 } }
    /// Broadcast sends accepted, over all channels.
    package var broadcasts: Int { tallies.withLock { $0.broadcasts } }
    /// Broadcast sends accepted on channel `channel`.
    package func broadcasts(channel: String) -> Int { tallies.withLock { $0.broadcastsByChannel[channel] ?? 0 } }
    /// Broadcast sends accepted, by channel id.
    package var broadcastsByChannel: [String: Int] { tallies.withLock { $0.broadcastsByChannel } }
    /// Channels that exist now, over all apps.
    package var channelCount: Int { tallies.withLock { $0.channels } }

    /// Writes the snapshot to `path` atomically (write a temporary file, then rename).
    package func write(to path: String) {
        guard let data = try? JSONSerialization.data(withJSONObject: snapshot(), options: [.sortedKeys]) else { return }
        let temporary = path + ".tmp"
        if FileManager.default.createFile(atPath: temporary, contents: data + Data("\n".utf8)) {
            _ = rename(temporary, path)
        }
    }
}

/// FNV-1a over the text's bytes, ASCII case folded (apns-ids and tokens are case-insensitive hex).
private func digest(_ text: String) -> UInt64 {
    var text = text
    return text.withUTF8 { bytes in
        var hash: UInt64 = 0xCBF2_9CE4_8422_2325
        for byte in bytes {
            let folded = byte >= 65 && byte <= 90 ? byte | 0x20 : byte
            hash = (hash ^ UInt64(folded)) &* 0x0000_0100_0000_01B3
        }
        return hash
    }
}
