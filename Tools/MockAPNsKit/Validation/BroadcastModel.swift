package import FanoutCore

// The pieces the broadcast-send and channel-management validators share: the reasons of Apple's broadcast error page
// (docs/reference/broadcast-channels.md, "Error reasons") that FanoutCore's device-push table lacks, channel ids,
// storage policies, the `apns-request-id` form and the bundle id in a path. All 400, so `APNsRejection(_:)` gives
// them the right status.

extension APNsReason {
    package static let missingChannelId = APNsReason("MissingChannelId")
    package static let badChannelId = APNsReason("BadChannelId")
    package static let channelNotRegistered = APNsReason("ChannelNotRegistered")
    package static let badRequestParams = APNsReason("BadRequestParams")
    package static let badRequestPayload = APNsReason("BadRequestPayload")
    package static let missingPushType = APNsReason("MissingPushType")
    package static let cannotCreateChannelConfig = APNsReason("CannotCreateChannelConfig")
}

/// A channel's `message-storage-policy`, fixed when it is created.
package enum ChannelStoragePolicy: Int, Sendable, Hashable, CaseIterable {
    /// Nothing stored; a broadcast's `apns-expiration` must be 0.
    case noMessageStored = 0
    /// The latest message is kept for offline devices (up to 8 hours).
    case mostRecentMessageStored = 1
}

/// Channel ids: base64 strings APNs picks at random ("don't make assumptions on the channel ID size").
package enum ChannelID {
    /// The longest id the mock accepts. Apple gives no maximum; the mock issues 24-character ids.
    package static let maximumLength = 128

    /// Whether `text` is standard base64 (RFC 4648 section 4 alphabet, `=` padding only at the end, length a multiple
    /// of 4) of at most `maximumLength` characters and at least one byte. Anything else is `BadChannelId`.
    package static func isWellFormed(_ text: some StringProtocol) -> Bool {
        let bytes = text.utf8
        let count = bytes.count
        guard count >= 4, count <= maximumLength, count % 4 == 0 else { return false }
        var padding = 0
        for byte in bytes {
            if byte == UInt8(ascii: "=") {
                padding += 1
                continue
            }
            guard padding == 0, isBase64Digit(byte) else { return false }
        }
        return padding <= 2
    }

    private static func isBase64Digit(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "+"), UInt8(ascii: "/"):
            return true
        default:
            return false
        }
    }
}

/// The rules both broadcast validators share.
package enum BroadcastRules {
    /// The only push type of channels and broadcasts, compared without regard to case (Apple's pages spell it
    /// `LiveActivity`, `Liveactivity` and `liveactivity`).
    static let pushType = "liveactivity"

    /// Whether `value` names the Live Activity push type, in any case.
    static func isLiveActivity(_ value: some StringProtocol) -> Bool {
        ASCIIBytes.equalsIgnoringCase(value.utf8, pushType.utf8)
    }

    /// Whether `text` is an `apns-request-id`: a canonical UUID in lowercase (8-4-4-4-12).
    package static func isValidRequestID(_ text: some StringProtocol) -> Bool {
        APNsID.isValid(text) && !text.utf8.contains { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "F") }
    }

    /// The `apns-request-id` to answer with: the request's own when it is valid, else nil (the server generates one).
    /// Used on every answer, errors included.
    package static func echoedRequestID(in headers: [(name: String, value: String)]) -> String? {
        for header in headers where header.name == "apns-request-id" {
            return isValidRequestID(header.value) ? header.value : nil
        }
        return nil
    }

    /// The bundle id in a path segment: BadPath when empty or holding a `/`, TopicDisallowed when it carries a
    /// push-type suffix (`com.example.app.push-type.liveactivity`): broadcast and channel paths take the plain id.
    static func bundleID(_ segment: Substring) -> Result<String, APNsRejection> {
        guard !segment.isEmpty, !segment.contains("/") else { return .failure(APNsRejection(.badPath)) }
        if segment.contains(".push-type.") { return .failure(APNsRejection(.topicDisallowed)) }
        return .success(String(segment))
    }
}

/// The request headers the broadcast and channel APIs read, picked out in one pass; a second copy of one is
/// `DuplicateHeaders`, as for device pushes.
struct BroadcastHeaders {
    var channelID: String?
    var pushType: String?
    var priority: String?
    var expiration: String?
    var topic: String?
    var requestID: String?
    var apnsID: String?

    static func collect(_ headers: [(name: String, value: String)]) -> Result<BroadcastHeaders, APNsRejection> {
        var collected = BroadcastHeaders()
        var seen: UInt8 = 0
        for header in headers {
            let bit: UInt8
            switch header.name {
            case "apns-channel-id": bit = 1 << 0
            case APNsHeaderName.pushType: bit = 1 << 1
            case APNsHeaderName.priority: bit = 1 << 2
            case APNsHeaderName.expiration: bit = 1 << 3
            case APNsHeaderName.topic: bit = 1 << 4
            case "apns-request-id": bit = 1 << 5
            case APNsHeaderName.apnsID: bit = 1 << 6
            default: continue
            }
            guard seen & bit == 0 else { return .failure(APNsRejection(.duplicateHeaders)) }
            seen |= bit
            switch bit {
            case 1 << 0: collected.channelID = header.value
            case 1 << 1: collected.pushType = header.value
            case 1 << 2: collected.priority = header.value
            case 1 << 3: collected.expiration = header.value
            case 1 << 4: collected.topic = header.value
            case 1 << 5: collected.requestID = header.value
            default: collected.apnsID = header.value
            }
        }
        return .success(collected)
    }

    /// `apns-request-id` must be a lowercase UUID and `apns-id` a UUID; either one malformed is `BadMessageId`.
    func checkIDs() -> APNsRejection? {
        if let requestID, !BroadcastRules.isValidRequestID(requestID) { return APNsRejection(.badMessageId) }
        if let apnsID, !APNsID.isValid(apnsID) { return APNsRejection(.badMessageId) }
        return nil
    }

    /// The channel id of a request that needs one: MissingChannelId when absent or empty, BadChannelId when not
    /// base64.
    func requiredChannelID() -> Result<String, APNsRejection> {
        guard let channelID, !channelID.isEmpty else { return .failure(APNsRejection(.missingChannelId)) }
        guard ChannelID.isWellFormed(channelID) else { return .failure(APNsRejection(.badChannelId)) }
        return .success(channelID)
    }
}
