// libFuzzer target `request-validator`: mock-apns's check of a device-push request
// (`APNsRequestValidator.check(method:path:headers:body:)`), and of broadcast sends and channel-management requests
// (`BroadcastRequestValidator`, `ChannelRequestValidator`) on the same input.
//
// Input framing (so the seed corpus stays readable):
//
//     POST                                  <- :method (first line)
//     /3/device/<hex token>                 <- :path (second line)
//     apns-topic: com.acme.app              <- one header per line, `name: value` (split at the first ':',
//     apns-push-type: alert                    one space after it dropped; a line without ':' is a name with an
//                                              empty value)
//                                           <- a blank line, then the body, byte for byte, to the end
//     {"aps":{"alert":"hi"}}
//
// Properties, beyond not crashing:
// - `validate` is `check`'s failure; a rejection carries the status APNs uses for its reason.
// - An accepted request's parsed fields match what was sent (token lowercased, priority 1/5/10 and allowed for the
//   push type, body within the size limit and a JSON object).
// - The sender and the validator agree: the accepted request's fields, rebuilt as `NotificationHeaders` and laid out
//   by `headerFields(deviceToken:authority:)` (what Fanout sends), are accepted again with the same fields.
import FanoutCore
import MockAPNsValidation

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRequestValidator(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let request = FramedRequest(UnsafeBufferPointer(start: data, count: size))
    let validator = APNsRequestValidator()
    let result = validator.check(
        method: request.method, path: request.path, headers: request.headers, body: request.body)
    let rejection = validator.validate(
        method: request.method, path: request.path, headers: request.headers, body: request.body)
    _ = APNsRequestValidator.bearerToken(in: request.headers)

    switch result {
    case .failure(let failure):
        require(rejection == failure, "validate \(String(describing: rejection)) differs from check \(failure)")
        require(
            failure.status == (APNsReason.statusFor(failure.reason) ?? 400),
            "\(failure): the status is not the reason's")
        require([400, 404, 405, 413].contains(failure.status), "unexpected status \(failure.status)")
    case .success(let accepted):
        require(rejection == nil, "validate rejects what check accepts: \(String(describing: rejection))")
        let pathToken = request.path.utf8.dropFirst("/3/device/".utf8.count)
        require(
            accepted.deviceToken.hex.utf8.elementsEqual(pathToken.map { $0 | 0x20 }),
            "token \(accepted.deviceToken.hex) is not the path's, lowercased")
        require([1, 5, 10].contains(accepted.priority), "priority \(accepted.priority)")
        require(accepted.pushType.allowsPriority(accepted.priority), "priority not allowed for the push type")
        require(accepted.pushType.acceptsTopic(accepted.topic) && !accepted.topic.isEmpty, "topic accepted wrongly")
        require(!request.body.isEmpty && request.body.count <= accepted.pushType.payloadSizeLimit, "body size")
        require(PayloadShape.inspect(request.body) != nil, "an accepted body is not a JSON object")
        if let expiration = accepted.expiration { require(expiration >= 0, "negative expiration") }
        if let apnsID = accepted.apnsID { require(APNsID.isValid(apnsID), "invalid apns-id accepted") }
        resend(accepted, body: request.body)
    }
    checkBroadcastValidators(request)
    return 0
}

/// The broadcast-send and channel-management validators on the same input (a `/4/...` or `/1/apps/...` path in the
/// seed corpus reaches them): no crash, 4xx statuses only, and what they accept holds together.
private func checkBroadcastValidators(_ request: FramedRequest) {
    let knownChannel = "AAAAAAAAAAAAAAAAAAAAAA=="
    let broadcast = BroadcastRequestValidator().check(
        method: request.method, path: request.path, headers: request.headers, body: request.body,
        channelPolicy: { _, channel in channel == knownChannel ? .noMessageStored : .mostRecentMessageStored })
    switch broadcast {
    case .failure(let failure):
        require([400, 404, 405, 413].contains(failure.status), "broadcast: unexpected status \(failure.status)")
    case .success(let accepted):
        require(request.path.hasPrefix("/4/broadcasts/apps/"), "broadcast accepted on \(request.path)")
        require(ChannelID.isWellFormed(accepted.channelID), "malformed channel id accepted")
        require([1, 5, 10].contains(accepted.priority), "broadcast priority \(accepted.priority)")
        require(accepted.expiration >= 0, "negative expiration")
        require(accepted.channelID != knownChannel || accepted.expiration == 0, "policy 0 with an expiration")
        require(
            !request.body.isEmpty && request.body.count <= BroadcastRequestValidator.payloadSizeLimit, "body size")
        if let requestID = accepted.requestID { require(BroadcastRules.isValidRequestID(requestID), "request id") }
    }
    switch ChannelRequestValidator().check(
        method: request.method, path: request.path, headers: request.headers, body: request.body)
    {
    case .failure(let failure):
        require([400, 404, 405].contains(failure.status), "channels: unexpected status \(failure.status)")
    case .success(let accepted):
        require(!accepted.bundleID.isEmpty && !accepted.bundleID.contains("/"), "bundle id \(accepted.bundleID)")
        switch accepted.operation {
        case .read(let channel), .delete(let channel):
            require(ChannelID.isWellFormed(channel), "malformed channel id accepted")
        case .create, .list: break
        }
    }
}

/// Lays out an accepted request the way Fanout sends one and checks the validator accepts it again, unchanged.
private func resend(_ accepted: ValidatedDeviceRequest, body: [UInt8]) {
    let headers = NotificationHeaders(
        pushType: accepted.pushType, topic: accepted.topic, priority: accepted.priority,
        expiration: accepted.expiration, collapseID: accepted.collapseID, apnsID: accepted.apnsID,
        bearerToken: accepted.bearerToken)
    // The sender is stricter (no control characters in header values); only what it would send is compared.
    guard let fields = try? headers.headerFields(deviceToken: accepted.deviceToken, authority: "api.push.apple.com")
    else { return }
    let method = fields.first { $0.name == ":method" }?.value ?? ""
    let path = fields.first { $0.name == ":path" }?.value ?? ""
    let result = APNsRequestValidator().check(
        method: method, path: path, headers: fields.map { (name: $0.name, value: $0.value) }, body: body)
    switch result {
    case .failure(let rejection):
        require(false, "the validator rejects what Fanout sends for an accepted request: \(rejection), \(fields)")
    case .success(let again):
        require(again == accepted, "fields changed on the way through the sender: \(again) vs \(accepted)")
    }
}
