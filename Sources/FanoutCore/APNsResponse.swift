/// One APNs reply to a device push: status, the ids APNs echoes, and the reason and timestamp of an error body.
///
/// Parsing never fails: APNs's answer is recorded whatever shape its body has, and a body that is not the documented
/// `{"reason": "...", "timestamp": <ms>}` simply yields no reason, so the status alone decides what happens next.
public struct APNsResponse: Hashable, Sendable {
    /// The HTTP `:status`.
    public var status: Int
    /// The `apns-id` response header: the id the request carried, or the one APNs generated.
    public var apnsID: String?
    /// The `apns-unique-id` response header (sandbox only), for the Push Notifications Console.
    public var apnsUniqueID: String?
    /// The error body's `reason`; nil on success and when the body is missing or malformed.
    public var reason: APNsReason?
    /// The error body's `timestamp`, in milliseconds since the epoch (only 410 carries it): when APNs last knew the
    /// token was valid. Kept in milliseconds, unlike sideshow/apns2 which misreads it as seconds.
    public var timestamp: Int64?

    public init(
        status: Int, apnsID: String? = nil, apnsUniqueID: String? = nil, reason: APNsReason? = nil,
        timestamp: Int64? = nil
    ) {
        self.status = status
        self.apnsID = apnsID
        self.apnsUniqueID = apnsUniqueID
        self.reason = reason
        self.timestamp = timestamp
    }

    /// Whether APNs accepted the notification.
    public var isSuccess: Bool { status == 200 }

    /// What to do about a failure; nil on success. Unknown reasons are classified by status.
    public var reasonClass: ReasonClass? {
        isSuccess ? nil : ReasonClass(status: status, reason: reason)
    }

    /// Whether the device token must be dropped: any 410, or a reason that invalidates the token.
    public var invalidatesToken: Bool {
        status == 410 || (reason?.invalidatesToken ?? false)
    }

    /// Builds a response from the parts the HTTP/2 layer collected.
    public static func parse(
        status: Int, apnsID: String?, apnsUniqueID: String?, body: some Collection<UInt8>
    ) -> APNsResponse {
        let (reason, timestamp) = body.isEmpty ? (nil, nil) : parseErrorBody(body)
        return APNsResponse(
            status: status, apnsID: apnsID, apnsUniqueID: apnsUniqueID, reason: reason, timestamp: timestamp)
    }

    /// Builds a response from the response headers as received (names compared case-insensitively; the first
    /// `apns-id` and `apns-unique-id` win).
    public static func parse(
        status: Int, headers: [(name: String, value: String)], body: some Collection<UInt8>
    ) -> APNsResponse {
        var apnsID: String?
        var apnsUniqueID: String?
        for header in headers {
            let name = header.name.utf8
            if apnsID == nil, ASCIIBytes.equalsIgnoringCase(name, APNsHeaderName.apnsID.utf8) {
                apnsID = header.value
            } else if apnsUniqueID == nil, ASCIIBytes.equalsIgnoringCase(name, APNsHeaderName.apnsUniqueID.utf8) {
                apnsUniqueID = header.value
            }
        }
        return parse(status: status, apnsID: apnsID, apnsUniqueID: apnsUniqueID, body: body)
    }

    /// Reads `reason` and `timestamp` from an APNs error body, or from GOAWAY debug data, which uses the same shape.
    /// Both are nil unless the body is a well-formed JSON object; each is nil unless it has the right type (a string;
    /// an integer). Other members are ignored.
    public static func parseErrorBody(_ body: some Collection<UInt8>) -> (reason: APNsReason?, timestamp: Int64?) {
        do {
            return try JSONParser.withParser(over: body, rules: .rfc8259) { parser throws(JSONParseError) in
                var reason: APNsReason?
                var timestamp: Int64?
                try parser.readObject { key, parser throws(JSONParseError) in
                    if parser.string(key, equals: "reason"), try parser.peekKind() == .string {
                        reason = APNsReason(try parser.readStringValue())
                    } else if parser.string(key, equals: "timestamp"), try parser.peekKind() == .number {
                        timestamp = try parser.readInteger()
                    } else {
                        try parser.skipValue()
                    }
                }
                try parser.finish()
                return (reason, timestamp)
            }
        } catch {
            return (nil, nil)
        }
    }

    /// Encodes an error body as APNs sends it: `{"reason":"…"}`, plus `"timestamp":<ms>` when given (410 only).
    /// Used by mock-apns.
    public static func errorBody(reason: APNsReason, timestamp: Int64? = nil) -> [UInt8] {
        var body = [UInt8]()
        body.reserveCapacity(reason.rawValue.utf8.count + 40)
        body.append(contentsOf: #"{"reason":"#.utf8)
        JSONStringEscaping.appendString(reason.rawValue, to: &body)
        if let timestamp {
            body.append(contentsOf: #","timestamp":"#.utf8)
            body.append(contentsOf: String(timestamp).utf8)
        }
        body.append(UInt8(ascii: "}"))
        return body
    }
}
