/// The facts about a device-push body that APNs-style validation needs, gathered in one pass over the bytes.
///
/// The whole document is validated as JSON (`JSONParser.Rules.rfc8259`: a repeated key is not refused, as APNs does
/// not document refusing it), but only the top-level `aps` member and a few Live Activity keys inside it are looked
/// at; nothing else is decoded. This keeps mock-apns's per-request check to a byte walk that allocates nothing.
package struct PayloadShape {
    package enum Event: Equatable {
        case missing, notAString, unknown, start, update, end
    }

    /// Whether the top-level object has an `aps` member that is itself an object.
    package var hasAPSObject = false
    package var event = Event.missing
    /// Whether `aps.timestamp` is present at all, and whether it is a non-negative integer literal.
    package var hasTimestamp = false
    package var timestampIsInteger = false
    package var hasAttributesType = false
    package var hasAttributes = false
    package var hasInputPushToken = false
    package var hasInputPushChannel = false

    /// Inspects `body`; nil when it is not a well-formed JSON document whose top level is an object.
    package static func inspect(_ body: some Collection<UInt8>) -> PayloadShape? {
        shape(of: body)
    }

    /// `inspect` over contiguous bytes, specialised here: the generic one runs unspecialised from another module
    /// (mock-apns inspects the body of every request it receives).
    package static func inspect(_ body: UnsafeBufferPointer<UInt8>) -> PayloadShape? {
        shape(of: body)
    }

    private static func shape(of body: some Collection<UInt8>) -> PayloadShape? {
        do {
            return try JSONParser.withParser(over: body, rules: .rfc8259) { parser throws(JSONParseError) in
                var shape = PayloadShape()
                guard try parser.peekKind() == .object else { return nil }
                try parser.readObject { key, parser throws(JSONParseError) in
                    if parser.string(key, equals: "aps"), try parser.peekKind() == .object {
                        shape.hasAPSObject = true
                        try parser.readObject { key, parser throws(JSONParseError) in
                            try shape.readAPSMember(key, &parser)
                        }
                    } else {
                        try parser.skipValue()
                    }
                }
                try parser.finish()
                return shape
            }
        } catch {
            return nil
        }
    }

    private mutating func readAPSMember(
        _ key: JSONParser.StringToken, _ parser: inout JSONParser
    ) throws(JSONParseError) {
        if parser.string(key, equals: "event") {
            guard try parser.peekKind() == .string else {
                event = .notAString
                try parser.skipValue()
                return
            }
            let value = try parser.readString()
            if parser.string(value, equals: "start") {
                event = .start
            } else if parser.string(value, equals: "update") {
                event = .update
            } else if parser.string(value, equals: "end") {
                event = .end
            } else {
                event = .unknown
            }
        } else if parser.string(key, equals: "timestamp") {
            hasTimestamp = true
            if try parser.peekKind() == .number {
                let value = try parser.readInteger()
                timestampIsInteger = (value ?? -1) >= 0
            } else {
                timestampIsInteger = false
                try parser.skipValue()
            }
        } else {
            if parser.string(key, equals: "attributes-type") {
                hasAttributesType = true
            } else if parser.string(key, equals: "attributes") {
                hasAttributes = true
            } else if parser.string(key, equals: "input-push-token") {
                hasInputPushToken = true
            } else if parser.string(key, equals: "input-push-channel") {
                hasInputPushChannel = true
            }
            try parser.skipValue()
        }
    }
}
