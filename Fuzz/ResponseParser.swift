// libFuzzer target `response-parser`: how Fanout reads APNs's answer to a push.
//
// Input framing (so the seed corpus stays readable): an optional first line `<status>` of one to three digits,
// then the error body as received. Without the status line the whole input is the body and the status is 400.
//
// Properties, beyond not crashing:
// - `APNsResponse.parse` (both overloads) records the status and ids as given and takes reason and timestamp from
//   `parseErrorBody`, which never fails.
// - When the body is a strict JSON object (`JSONValue.parse`), `reason` is its string `reason` member and
//   `timestamp` its integer `timestamp` member, when those have the right type (the last one wins when a key
//   repeats, which the RFC 8259 rules the response is read under allow; the strict rules refuse repeats).
// - `errorBody(reason:timestamp:)` of what was read parses back to the same reason and timestamp (mock-apns writes
//   bodies with it, the engine reads them back).
// - `reasonClass` and `invalidatesToken` answer for every status and reason.
import FanoutCore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzResponseParser(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let input = UnsafeBufferPointer(start: data, count: size)
    var status = 400
    var body = input[...]
    if let newline = input.prefix(4).firstIndex(of: UInt8(ascii: "\n")), newline > 0,
        input[..<newline].allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") })
    {
        status = Int(String(decoding: input[..<newline], as: UTF8.self))!
        body = input[(newline + 1)...]
    }

    let apnsID = "eabeae54-14a8-11e5-b60b-1697f925ec7b"
    let response = APNsResponse.parse(status: status, apnsID: apnsID, apnsUniqueID: nil, body: body)
    require(response.status == status && response.apnsID == apnsID, "status or apns-id not kept")
    let (reason, timestamp) = APNsResponse.parseErrorBody(body)
    if body.isEmpty {
        require(response.reason == nil && response.timestamp == nil, "an empty body yields a reason or timestamp")
    } else {
        require(response.reason == reason && response.timestamp == timestamp, "parse and parseErrorBody disagree")
    }
    let byHeaders = APNsResponse.parse(
        status: status, headers: [(name: "APNS-ID", value: apnsID), (name: "apns-unique-id", value: "u")],
        body: Array(body))
    require(byHeaders.apnsID == apnsID && byHeaders.apnsUniqueID == "u", "headers not read case-insensitively")
    require(byHeaders.reason == response.reason && byHeaders.timestamp == response.timestamp, "overloads disagree")

    _ = response.reasonClass
    _ = response.invalidatesToken
    _ = response.isSuccess
    if let reason {
        _ = reason.description
        _ = APNsReason.statusFor(reason)
    }

    // Against the strict parser, where it accepts the body.
    if case .object(let object)? = try? JSONValue.parse(body) {
        var expectedReason: APNsReason?
        var expectedTimestamp: Int64?
        for member in object {
            if member.key == "reason", case .string(let text) = member.value { expectedReason = APNsReason(text) }
            if member.key == "timestamp", case .number(let number) = member.value, let value = number.int64Value {
                expectedTimestamp = value
            }
        }
        // Keys are compared by their bytes in the scan and as Swift strings here; they agree for the ASCII keys.
        require(
            reason == expectedReason, "reason \(String(describing: reason)) vs \(String(describing: expectedReason))")
        require(
            timestamp == expectedTimestamp,
            "timestamp \(String(describing: timestamp)) vs \(String(describing: expectedTimestamp))")
    }

    // What the mock writes, the engine reads back.
    if let reason {
        let written = APNsResponse.errorBody(reason: reason, timestamp: timestamp)
        let (readReason, readTimestamp) = APNsResponse.parseErrorBody(written)
        require(readReason == reason, "errorBody \(shown(written)) reads back as \(String(describing: readReason))")
        require(readTimestamp == timestamp, "errorBody timestamp \(String(describing: timestamp)) reads back wrong")
    }
    return 0
}
