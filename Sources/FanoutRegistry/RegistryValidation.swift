import FanoutCore

/// The registry's input rules, in one place: every write path (apply, import, command line) goes through them, so a
/// bad token or an overlong id is refused with the same field name and message whichever way it came in.
package enum RegistryValidation {
    /// The longest activity id, device id, user id, attributes type, channel id or bundle id, in UTF-8 bytes.
    package static let maximumIdentifierBytes = 256

    /// A token as lowercase hex; "" when `allowEmpty` and it is empty (a stop).
    package static func token(_ text: String, field: String, allowEmpty: Bool) throws(RegistryError) -> String {
        if text.isEmpty {
            guard allowEmpty else { throw .invalid(field, "must not be empty") }
            return ""
        }
        guard let token = DeviceToken(text) else {
            throw .invalid(
                field,
                "\(excerpt(text)) is not a device token (\(DeviceToken.hexLengthRange.lowerBound) to "
                    + "\(DeviceToken.hexLengthRange.upperBound) hex digits, an even number)")
        }
        return token.hex
    }

    /// A required identifier: not empty, at most 256 bytes.
    package static func identifier(_ text: String, field: String) throws(RegistryError) -> String {
        guard !text.isEmpty else { throw .invalid(field, "must not be empty") }
        let count = text.utf8.count
        guard count <= maximumIdentifierBytes else {
            throw .invalid(field, "is \(count) bytes long, over the \(maximumIdentifierBytes)-byte limit")
        }
        return text
    }

    /// An optional identifier: nil stays nil; otherwise as `identifier`.
    package static func optionalIdentifier(_ text: String?, field: String) throws(RegistryError) -> String? {
        guard let text else { return nil }
        return try identifier(text, field: field)
    }

    /// A time in Unix milliseconds: not negative.
    package static func time(_ value: Int64?, field: String) throws(RegistryError) -> Int64? {
        guard let value else { return nil }
        guard value >= 0 else { throw .invalid(field, "\(value) is before 1970") }
        return value
    }

    /// The start of `text`, quoted, for messages (a whole line of garbage would drown the message).
    package static func excerpt(_ text: String) -> String {
        let limit = 80
        if text.utf8.count <= limit { return JSONStringEscaping.quoted(text) }
        return JSONStringEscaping.quoted(String(text.prefix(limit))) + "…"
    }
}
