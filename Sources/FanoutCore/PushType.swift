/// The value of the `apns-push-type` request header, with the rules APNs ties to each type.
///
/// A struct over an internal enum rather than a public enum, so that a push type Apple adds later can be added here
/// without breaking callers that switch over the known ones.
public struct PushType: Hashable, Sendable, CustomStringConvertible {
    enum Kind: String, CaseIterable, Sendable {
        case alert, background, location, voip, complication, fileprovider, mdm, liveactivity, pushtotalk, widgets
    }

    let kind: Kind

    init(_ kind: Kind) {
        self.kind = kind
    }

    /// Parses a header value. Known values only; ASCII case is ignored because Apple's own documents spell some of
    /// them with capitals (`LiveActivity`), and the result is always the canonical lowercase form.
    public init?(rawValue: String) {
        if let kind = Kind(rawValue: rawValue) {
            self.kind = kind
            return
        }
        guard rawValue.utf8.count <= 16 else { return nil }
        let lowercased = String(decoding: rawValue.utf8.map(ASCIIBytes.lowercased), as: UTF8.self)
        guard let kind = Kind(rawValue: lowercased) else { return nil }
        self.kind = kind
    }

    /// Parses a header value's bytes as `init?(rawValue:)` parses text, with no String: mock-apns reads one per
    /// request, and the String switch behind `Kind(rawValue:)` would be 1% of its CPU.
    package init?(utf8 bytes: UnsafeBufferPointer<UInt8>) {
        for (kind, spelling) in Self.spellings where spelling.count == bytes.count {
            var index = 0
            while index < bytes.count, ASCIIBytes.lowercased(bytes[index]) == spelling[index] { index += 1 }
            if index == bytes.count {
                self.kind = kind
                return
            }
        }
        return nil
    }

    /// Each kind with its header value's bytes, for `init?(utf8:)`.
    private static let spellings: [(Kind, [UInt8])] = Kind.allCases.map { ($0, Array($0.rawValue.utf8)) }

    /// The canonical header value, for example `liveactivity`.
    public var rawValue: String { kind.rawValue }

    public var description: String { kind.rawValue }

    public static let alert = PushType(.alert)
    public static let background = PushType(.background)
    public static let location = PushType(.location)
    public static let voip = PushType(.voip)
    public static let complication = PushType(.complication)
    public static let fileprovider = PushType(.fileprovider)
    public static let mdm = PushType(.mdm)
    public static let liveactivity = PushType(.liveactivity)
    public static let pushtotalk = PushType(.pushtotalk)
    public static let widgets = PushType(.widgets)

    /// Every push type this version knows, in the order of docs/reference/apns.md, "Push types and topics".
    public static let allKnown: [PushType] = Kind.allCases.map(PushType.init)

    /// The suffix `apns-topic` must carry after the bundle ID: `""` when the topic is the bare bundle ID, `nil` when
    /// APNs imposes no shape (`mdm` topics are the UID from the MDM certificate's subject).
    public var requiredTopicSuffix: String? {
        switch kind {
        case .alert, .background: return ""
        case .location: return ".location-query"
        case .voip: return ".voip"
        case .complication: return ".complication"
        case .fileprovider: return ".pushkit.fileprovider"
        case .mdm: return nil
        case .liveactivity: return ".push-type.liveactivity"
        case .pushtotalk: return ".voip-ptt"
        case .widgets: return ".push-type.widgets"
        }
    }

    /// The `apns-topic` for a notification of this type to the app `bundleID`: the bundle ID with the suffix this type
    /// requires (`com.acme.app.push-type.liveactivity` for Live Activities). An `mdm` topic has no suffix: it is the
    /// UID itself.
    public func topic(forBundleID bundleID: String) -> String {
        bundleID + (requiredTopicSuffix ?? "")
    }

    /// The largest payload APNs accepts for this type, in bytes (docs/reference/apns.md, "Payload size limits").
    /// Live Activities sent to a device token share the regular 4 KB limit; only VoIP gets 5 KB.
    public var payloadSizeLimit: Int {
        kind == .voip ? 5120 : 4096
    }

    /// The `apns-priority` to use when the caller gives none. Background pushes must use 5: APNs calls 10 an error.
    public var defaultPriority: Int {
        kind == .background ? 5 : 10
    }

    /// Whether `priority` is one APNs accepts for this type: 1, 5 or 10, except that background pushes may not use 10.
    public func allowsPriority(_ priority: Int) -> Bool {
        switch priority {
        case 1, 5: return true
        case 10: return kind != .background
        default: return false
        }
    }

    /// Whether `topic` has the shape this push type needs: a non-empty bundle ID followed by `requiredTopicSuffix`.
    ///
    /// Only the shape can be checked here; whether the bundle ID is the right app is something only APNs knows.
    public func acceptsTopic(_ topic: some StringProtocol) -> Bool {
        guard let suffix = requiredTopicSuffix else { return !topic.isEmpty }
        let topicBytes = topic.utf8
        let suffixBytes = suffix.utf8
        guard topicBytes.count > suffixBytes.count else { return false }
        return topicBytes.reversed().starts(with: suffixBytes.reversed())
    }

    /// Whether APNs-style validation expects the payload to hold an `aps` dictionary.
    ///
    /// The types delivered through PushKit or system services (VoIP, complication, file provider, location, push to
    /// talk, MDM) carry app-defined JSON, so only the user-facing types insist on `aps`.
    package var requiresAPSDictionary: Bool {
        switch kind {
        case .alert, .background, .liveactivity, .widgets: return true
        case .location, .voip, .complication, .fileprovider, .mdm, .pushtotalk: return false
        }
    }
}
