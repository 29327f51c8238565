// libFuzzer target `json`: FanoutCore's JSON reader (`JSONParser`) on arbitrary bytes, under both of its rules.
//
// - `JSONValue.parse` (the strict tree parser) and `RawJSON(validating:)` (the strict validator that keeps bytes)
//   accept exactly the same documents, and agree on the value (`RawJSON.value` traps if its bytes do not parse).
// - The compact encoding of a parsed value parses back to the same value.
// - `RawJSON.members()` lists an object's keys in order, each member's bytes parsing to the tree's member.
// - Scanning under the RFC 8259 rules (how mock-apns and the response parser read bodies) accepts everything the
//   strict rules accept; when it accepts more, the strict refusal is one of the two documented extra rules (duplicate
//   keys, lone surrogates in \u escapes).
import FanoutCore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJSON(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = UnsafeBufferPointer(start: data, count: size)

    var strictError: JSONParseError?
    let tree: JSONValue?
    do {
        tree = try JSONValue.parse(bytes)
    } catch {
        tree = nil
        strictError = error
        require(error.offset >= 0 && error.offset <= size, "error offset \(error.offset) outside 0...\(size)")
    }
    let raw = try? RawJSON(validating: bytes)
    require((tree == nil) == (raw == nil), "JSONValue.parse and RawJSON(validating:) disagree on \(shown(bytes))")

    let scanAccepts: Bool
    do {
        scanAccepts = try JSONParser.withParser(over: bytes, rules: .rfc8259) { parser throws(JSONParseError) in
            try parser.skipValue()
            try parser.finish()
            return true
        }
    } catch {
        scanAccepts = false
    }
    if let strictError {
        if scanAccepts {
            let message = strictError.message
            require(
                message.hasPrefix("duplicate key") || message.contains("surrogate"),
                "the RFC 8259 rules accept what the strict rules refuse for \"\(message)\": \(shown(bytes))")
        }
    } else {
        require(scanAccepts, "the RFC 8259 rules refuse a document the strict rules accept: \(shown(bytes))")
    }

    guard let tree, let raw else { return 0 }
    require(raw.kind == tree.kind, "kinds differ: \(raw.kind) vs \(tree.kind)")
    require(raw.value == tree, "RawJSON.value differs from JSONValue.parse")

    let encoded = tree.encoded()
    let reparsed = try? JSONValue.parse(encoded)
    require(reparsed == tree, "the compact encoding \(shown(encoded)) does not parse back to the value")
    require(RawJSON(tree).bytes == encoded, "RawJSON(value) is not the compact encoding")

    if case .object(let object) = tree {
        let members = raw.members()
        require(
            members.map(\.key) == object.map(\.key),
            "RawJSON.members() keys \(members.map(\.key)) differ from the tree's \(object.map(\.key))")
        for member in members {
            require(member.value.value == object[member.key], "member \(member.key.debugDescription) differs")
            require(raw.member(member.key) != nil, "member(\(member.key.debugDescription)) is nil")
        }
    }
    visitNumbers(tree)
    _ = tree.description
    return 0
}

/// Reads every number both ways: an integer literal's `int64Value` and `doubleValue` agree.
private func visitNumbers(_ value: JSONValue) {
    switch value {
    case .number(let number):
        let double = number.doubleValue
        if let integer = number.int64Value {
            require(number.isInteger, "int64Value of a non-integer literal \(number.literal)")
            // Both round the same integer to the nearest Double.
            require(Double(integer) == double, "\(number.literal): int64Value \(integer) vs doubleValue \(double)")
        }
    case .array(let elements):
        for element in elements { visitNumbers(element) }
    case .object(let object):
        for member in object { visitNumbers(member.value) }
    default:
        break
    }
}
