import FanoutCore
import Foundation
import Synchronization

/// What mock-apns has seen, shared by all its loops. Written as JSON to `--stats` at least once a
/// second and on exit, in the shape docs/MOCK-APNS.md gives.
package final class MockStats: Sendable {
    private struct Tallies {
        var requests = 0
        var accepted = 0
        /// Counts by HTTP status, indexed by the status (an array: no hashing per request).
        var byStatus = [Int](repeating: 0, count: 600)
        var byReason: [String: Int] = [:]
        /// 64-bit digests of the accepted tokens and apns-ids: integers hash and compare far
        /// faster than strings, and a collision among a few million 64-bit values is vanishingly rare.
        var tokens = DigestSet()
        var apnsIDs = DigestSet()
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
        /// Of those, the ones APNs would keep for devices that are offline (policy 1, an expiration ahead).
        var broadcastsStored = 0
        /// Accepted broadcasts by `apns-priority` (1 to 10).
        var broadcastsByPriority = [Int](repeating: 0, count: 11)
        /// Channels that exist now (set by `MockChannels`).
        var channels = 0
    }

    private let tallies = FanoutMutex(Tallies())
    /// Every loop's own counts (see `LoopStats`), folded into `tallies` whenever the stats are read.
    private let loops = FanoutMutex<[LoopStats]>([])

    package init() {}

    /// The per-request counts of one loop: only that loop writes them, so its lock is never contended except by a
    /// reader folding them in. Devices' answers are counted here; the rarer events go straight to `MockStats`.
    final class LoopStats: Sendable {
        fileprivate struct Counts {
            var requests = 0
            var accepted = 0
            var byStatus = [Int](repeating: 0, count: 600)
            var byReason: [String: Int] = [:]
            var acceptedByPriority = [Int](repeating: 0, count: 11)
            /// Digests of the accepted tokens and apns-ids since the last fold, in order (the sets are the
            /// reader's: duplicates are found across loops, as with one set).
            var tokens: [UInt64] = []
            var apnsIDs: [UInt64] = []
        }

        fileprivate let counts = FanoutMutex(Counts())
        private unowned let stats: MockStats
        /// Digests kept before the loop asks for a fold (`foldSoon`), so that memory stays bounded with no reader.
        /// Small, so each fold is short: a fold inserts into sets of millions (a cache miss each) on a thread that
        /// shares the machine with the loops, and at 65,536 it took 4 ms (12 ms the longest), a stall in every
        /// latency measured against the mock. At 8,192 the same work comes in eighths: `load` at 60,000/s, 11
        /// alternated runs with a fresh mock each, p99 1.93 ms median against 2.67, p99.9 5.18 against 6.11.
        private static let foldThreshold = 1 << 13

        fileprivate init(stats: MockStats) { self.stats = stats }

        /// Counts a request answered with `status` (and `reason` when it is an error); `token` and `apnsID` are
        /// `MockStats.digest`s.
        func recordAnswer(status: Int, reason: String?, token: UInt64?, apnsID: UInt64?, priority: Int? = nil) {
            let pending = counts.withLock { counts in
                counts.requests += 1
                counts.byStatus[min(max(status, 0), 599)] += 1
                if let reason { counts.byReason[reason, default: 0] += 1 }
                guard status == 200 else { return 0 }
                counts.accepted += 1
                if let priority, (0...10).contains(priority) { counts.acceptedByPriority[priority] += 1 }
                if let token { counts.tokens.append(token) }
                if let apnsID { counts.apnsIDs.append(apnsID) }
                return counts.apnsIDs.count + counts.tokens.count
            }
            if pending >= Self.foldThreshold { stats.foldSoon() }
        }
    }

    /// The counts of a new loop, which that loop alone writes.
    func makeLoopStats() -> LoopStats {
        let loop = LoopStats(stats: self)
        loops.withLock { $0.append(loop) }
        return loop
    }

    /// Folds every loop's counts into `tallies` (emptying them), then runs `body` on the totals.
    private func merged<R>(_ body: (inout Tallies) -> R) -> R {
        tallies.withLock { tallies in
            loops.withLock { loops in
                for loop in loops {
                    // The digests are taken out under the loop's lock and put in the sets after it: inserting tens of
                    // thousands of them (and growing a set of millions) takes milliseconds, which the loop would
                    // otherwise wait out in its next `recordAnswer`, holding up every answer behind it.
                    var tokens: [UInt64] = []
                    var apnsIDs: [UInt64] = []
                    loop.counts.withLock { counts in
                        tallies.requests += counts.requests
                        tallies.accepted += counts.accepted
                        counts.requests = 0
                        counts.accepted = 0
                        for status in counts.byStatus.indices where counts.byStatus[status] != 0 {
                            tallies.byStatus[status] += counts.byStatus[status]
                            counts.byStatus[status] = 0
                        }
                        for (reason, count) in counts.byReason { tallies.byReason[reason, default: 0] += count }
                        counts.byReason.removeAll(keepingCapacity: true)
                        for priority in counts.acceptedByPriority.indices {
                            tallies.acceptedByPriority[priority] += counts.acceptedByPriority[priority]
                            counts.acceptedByPriority[priority] = 0
                        }
                        swap(&tokens, &counts.tokens)
                        swap(&apnsIDs, &counts.apnsIDs)
                    }
                    for token in tokens { _ = tallies.tokens.insert(token) }
                    for apnsID in apnsIDs where !tallies.apnsIDs.insert(apnsID) {
                        tallies.duplicateApnsIDs += 1
                    }
                }
            }
            return body(&tallies)
        }
    }

    /// Set while a background fold (`foldSoon`) is queued or running.
    private let folding = Atomic<Bool>(false)

    /// Folds the loops' counts in soon, on another thread (a loop whose digests piled up): folding on the loop would
    /// hold up its answers for the milliseconds the sets take, a periodic stall in every latency measured against the
    /// mock (tens of milliseconds when a set of millions grows). One fold at a time.
    fileprivate func foldSoon() {
        guard folding.compareExchange(expected: false, desired: true, ordering: .acquiring).exchanged else { return }
        DispatchQueue.global().async { [self] in
            merged { _ in }
            folding.store(false, ordering: .releasing)
        }
    }

    /// Counts a broadcast send answered with `status`: in `requests`, `by_status` and `by_reason` like a device push,
    /// and, when accepted, in `broadcasts` and `broadcasts_by_channel` (not in `accepted`, which counts device pushes),
    /// and in `broadcasts_stored` when APNs would keep it for offline devices (`stored`).
    func recordBroadcast(status: Int, reason: String?, channel: String?, stored: Bool = false, priority: Int? = nil) {
        tallies.withLock { tallies in
            tallies.requests += 1
            tallies.byStatus[min(max(status, 0), 599)] += 1
            if let reason { tallies.byReason[reason, default: 0] += 1 }
            guard status == 200, let channel else { return }
            tallies.broadcasts += 1
            tallies.broadcastsByChannel[channel, default: 0] += 1
            if stored { tallies.broadcastsStored += 1 }
            if let priority, (0...10).contains(priority) { tallies.broadcastsByPriority[priority] += 1 }
        }
    }

    /// Counts a provider token that verified (called when a connection's token changes, not per request).
    func recordProviderToken(_ token: String) {
        tallies.withLock { _ = $0.providerTokens.insert(MockStats.digest(token)) }
    }

    /// How many distinct valid provider tokens were seen.
    package var distinctProviderTokens: Int { merged { $0.providerTokens.count } }

    /// How many distinct `apns-id`s requests carried (a request without one, answered with an id of the mock's own,
    /// adds none).
    package var distinctRequestAPNsIDs: Int { merged { $0.apnsIDs.count } }

    func recordChannelCount(_ count: Int) { tallies.withLock { $0.channels = count } }

    func recordRefused() { tallies.withLock { $0.streamsRefused += 1 } }
    func recordBlackholed() { tallies.withLock { $0.streamsBlackholed += 1 } }
    func recordPayload(_ payload: [UInt8], token: String) {
        tallies.withLock { $0.payloadsByToken[token, default: []].append(payload) }
    }

    /// The payloads accepted for each token, in the order they were accepted (with `capturePayloads`).
    package var payloadsByToken: [String: [[UInt8]]] { merged { $0.payloadsByToken } }
    func recordConnection() { tallies.withLock { $0.connections += 1 } }
    func recordViolation() { tallies.withLock { $0.streamLimitViolations += 1 } }
    func recordGoaway() { tallies.withLock { $0.goawaysSent += 1 } }
    func recordDrop() { tallies.withLock { $0.connectionsDropped += 1 } }

    /// A snapshot as a JSON object.
    package func snapshot() -> [String: Any] {
        merged { tallies in
            [
                "requests": tallies.requests,
                "accepted": tallies.accepted,
                "by_status": Self.nonZero(tallies.byStatus),
                "by_reason": tallies.byReason,
                "distinct_tokens": tallies.tokens.count,
                "duplicate_apns_ids": tallies.duplicateApnsIDs,
                "connections": tallies.connections,
                "stream_limit_violations": tallies.streamLimitViolations,
                "goaways_sent": tallies.goawaysSent,
                "connections_dropped": tallies.connectionsDropped,
                "streams_refused": tallies.streamsRefused,
                "streams_blackholed": tallies.streamsBlackholed,
                "accepted_by_priority": Self.nonZero(tallies.acceptedByPriority),
                "broadcasts": tallies.broadcasts,
                "broadcasts_by_channel": tallies.broadcastsByChannel, "broadcasts_stored": tallies.broadcastsStored,
                "broadcasts_by_priority": Self.nonZero(tallies.broadcastsByPriority),
                "channels": tallies.channels,
            ]
        }
    }

    /// Counts indexed by a number (a status, a priority) as JSON: the non-zero ones, keyed by the number's text.
    private static func nonZero(_ counts: [Int]) -> [String: Int] {
        Dictionary(
            uniqueKeysWithValues: counts.enumerated().filter { $0.element > 0 }.map { (String($0.offset), $0.element) })
    }

    package var accepted: Int { merged { $0.accepted } }
    package var requests: Int { merged { $0.requests } }
    package var streamLimitViolations: Int { merged { $0.streamLimitViolations } }
    package var duplicateApnsIDs: Int { merged { $0.duplicateApnsIDs } }
    package func count(status: Int) -> Int {
        merged { (0..<600).contains(status) ? $0.byStatus[status] : 0 }
    }
    package func count(reason: String) -> Int { merged { $0.byReason[reason] ?? 0 } }
    /// Broadcast sends accepted, over all channels.
    package var broadcasts: Int { merged { $0.broadcasts } }
    /// Broadcast sends accepted on channel `channel`.
    package func broadcasts(channel: String) -> Int { merged { $0.broadcastsByChannel[channel] ?? 0 } }
    /// Accepted broadcasts APNs would keep for devices that are offline.
    package var broadcastsStored: Int { merged { $0.broadcastsStored } }
    /// Broadcast sends accepted, by channel id.
    package var broadcastsByChannel: [String: Int] { merged { $0.broadcastsByChannel } }
    /// Channels that exist now, over all apps.
    package var channelCount: Int { merged { $0.channels } }

    /// Writes the snapshot to `path` atomically (write a temporary file, then rename).
    package func write(to path: String) {
        guard let data = try? JSONSerialization.data(withJSONObject: snapshot(), options: [.sortedKeys]) else { return }
        let temporary = path + ".tmp"
        if FileManager.default.createFile(atPath: temporary, contents: data + Data("\n".utf8)) {
            _ = rename(temporary, path)
        }
    }
}

extension MockStats {
    /// FNV-1a over the text's bytes, ASCII case folded (apns-ids and tokens are case-insensitive hex).
    static func digest(_ text: String) -> UInt64 {
        var text = text
        return text.withUTF8 { digest($0) }
    }

    /// A digest of text already checked to be hex digits or a UUID (a device token, an apns-id): for these bytes
    /// (digits, `a-f`, `A-F`, `-`) setting bit 0x20 folds case as ASCII lowercasing does, so eight bytes are folded
    /// and mixed at a time instead of one multiply per byte. Used for the token and apns-id sets only, so that
    /// equal ids always get equal digests.
    package static func digest(hex bytes: UnsafeBufferPointer<UInt8>) -> UInt64 {
        let raw = UnsafeRawBufferPointer(bytes)
        var hash: UInt64 = 0xCBF2_9CE4_8422_2325 ^ UInt64(raw.count)
        var offset = 0
        while offset + 8 <= raw.count {
            let word = raw.loadUnaligned(fromByteOffset: offset, as: UInt64.self) | 0x2020_2020_2020_2020
            hash = (hash ^ word) &* 0x9E37_79B9_7F4A_7C15
            hash ^= hash >> 29
            offset += 8
        }
        while offset < raw.count {
            hash = (hash ^ UInt64(raw[offset] | 0x20)) &* 0x0000_0100_0000_01B3
            offset += 1
        }
        return hash ^ (hash >> 32)
    }

    /// `digest` of UTF-8 bytes.
    static func digest(_ bytes: UnsafeBufferPointer<UInt8>) -> UInt64 {
        var hash: UInt64 = 0xCBF2_9CE4_8422_2325
        for byte in bytes {
            let folded = byte >= 65 && byte <= 90 ? byte | 0x20 : byte
            hash = (hash ^ UInt64(folded)) &* 0x0000_0100_0000_01B3
        }
        return hash
    }
}

/// A set of 64-bit digests: open addressing with linear probing, the digest (already a hash) mixed once as the slot.
/// `Set<UInt64>` hashes every value again with SipHash, which showed in mock-apns's profile when a loop's digests are
/// folded in. Zero marks an empty slot, so the digest 0 is kept aside.
package struct DigestSet {
    private var slots = [UInt64](repeating: 0, count: 1024)
    private var hasZero = false
    package private(set) var count = 0

    package init() {}

    /// Inserts `digest`; false when it was already there.
    package mutating func insert(_ digest: UInt64) -> Bool {
        if digest == 0 {
            defer { hasZero = true }
            if hasZero { return false }
            count += 1
            return true
        }
        if (count + 1) * 4 > slots.count * 3 { grow() }
        let mask = slots.count - 1
        var index = Self.slot(digest, mask: mask)
        while slots[index] != 0 {
            if slots[index] == digest { return false }
            index = (index + 1) & mask
        }
        slots[index] = digest
        count += 1
        return true
    }

    private static func slot(_ digest: UInt64, mask: Int) -> Int {
        Int(truncatingIfNeeded: (digest &* 0x9E37_79B9_7F4A_7C15) >> 32) & mask
    }

    private mutating func grow() {
        let old = slots
        slots = [UInt64](repeating: 0, count: old.count * 2)
        let mask = slots.count - 1
        for digest in old where digest != 0 {
            var index = Self.slot(digest, mask: mask)
            while slots[index] != 0 { index = (index + 1) & mask }
            slots[index] = digest
        }
    }
}
