/// The facts about a device-push body that APNs-style validation needs, gathered in one pass over the bytes.
///
/// The whole document is validated as strict JSON, but only the top-level `aps` member and a few Live Activity keys
/// inside it are looked at; nothing else is decoded. This keeps mock-apns's per-request check to a byte walk.
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
        do {
            return try JSONByteScanner.withScanner(over: body) { scanner in
                var shape = PayloadShape()
                guard try scanner.peekKind() == .object else { return nil }
                try scanner.readObject { key, scanner in
                    if scanner.string(key, equals: "aps"), try scanner.peekKind() == .object {
                        shape.hasAPSObject = true
                        try scanner.readObject { key, scanner in try shape.readAPSMember(key, &scanner) }
                    } else {
                        try scanner.skipValue()
                    }
                }
                try scanner.finish()
                return shape
            }
        } catch {
            return nil
        }
    }

    private mutating func readAPSMember(_ key: JSONByteScanner.StringToken, _ scanner: inout JSONByteScanner) throws {
        if scanner.string(key, equals: "event") {
            guard try scanner.peekKind() == .string else {
                event = .notAString
                try scanner.skipValue()
                return
            }
            let value = try scanner.readString()
            if scanner.string(value, equals: "start") {
                event = .start
            } else if scanner.string(value, equals: "update") {
                event = .update
            } else if scanner.string(value, equals: "end") {
                event = .end
            } else {
                event = .unknown
            }
        } else if scanner.string(key, equals: "timestamp") {
            hasTimestamp = true
            if try scanner.peekKind() == .number {
                let value = try scanner.readNumber()
                timestampIsInteger = (value ?? -1) >= 0
            } else {
                timestampIsInteger = false
                try scanner.skipValue()
            }
        } else {
            if scanner.string(key, equals: "attributes-type") {
                hasAttributesType = true
            } else if scanner.string(key, equals: "attributes") {
                hasAttributes = true
            } else if scanner.string(key, equals: "input-push-token") {
                hasInputPushToken = true
            } else if scanner.string(key, equals: "input-push-channel") {
                hasInputPushChannel = true
            }
            try scanner.skipValue()
        }
    }
}
