/// The check a payload given as raw bytes (`JobPayload.raw`, `PushNotification.payload`) needs before it is sent:
/// APNs refuses anything but one JSON object (`BadPayload`, 400), so a payload that is not one is refused before a
/// token is sent to, with the problem named.
package enum RawPayload {
    /// Throws unless `bytes` is one well-formed JSON object (RFC 8259: a repeated key is not refused, as APNs does not
    /// document refusing it, and mock-apns does not). A byte walk that allocates nothing, run once per job (a `send`
    /// is a job of one), never per token.
    package static func checkObject(_ bytes: [UInt8]) throws(PayloadError) {
        let kind: JSONValue.Kind
        do {
            kind = try JSONParser.withParser(over: bytes, rules: .rfc8259) { parser throws(JSONParseError) in
                try parser.validateDocument().kind
            }
        } catch {
            throw PayloadError(field: "payload", message: "not valid JSON: \(error)")
        }
        guard kind == .object else {
            throw PayloadError(field: "payload", message: "must be a JSON object, not \(kind)")
        }
    }
}
