// libFuzzer target `job-line`: `fanout send`'s job-line parser (`JobLineParser.parse(line:lineNumber:…)`).
//
// The parser lives in FanoutJobFormat, which needs only FanoutCore (the engine's `FanoutJob` is made from its
// `ParsedJob` in FanoutJobFile, outside the fuzzer), and the request is checked by MockAPNsValidation. The whole
// input is one line. A relative `tokens_file` resolves against $FANOUT_FUZZ_JOB_DIR (scripts/fuzz.sh makes one
// holding `tokens.txt`), or `.`.
//
// Properties, beyond not crashing:
// - A refusal names the line (`line 7: …`), carries the id when one was read, and has a message.
// - An accepted job is one the engine can send: its headers validate, its payload encodes within the size limit,
//   every inline token is a valid lowercase token, and the request Fanout builds from it (headers laid out by
//   `headerFields`, the encoded payload) passes mock-apns's validator. A raw `payload` is sent as given, so for it
//   only `BadPayload` (no `aps`, or a Live Activity body that breaks the rules) is tolerated; a payload built from
//   `live_activity` must pass.
import FanoutCore
import FanoutJobFormat
import MockAPNsValidation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

private let jobDirectory: String = {
    if let value = getenv("FANOUT_FUZZ_JOB_DIR") { return String(cString: value) }
    return "."
}()

private let placeholderToken = DeviceToken(String(repeating: "ab", count: 32))!

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJobLine(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let line = UnsafeBufferPointer(start: data, count: size)
    let result = JobLineParser().parse(line: line, lineNumber: 7, jobFileDirectory: jobDirectory, now: 1_764_460_800)
    switch result {
    case .failure(let error):
        require(error.lineNumber == 7, "line number \(error.lineNumber)")
        require(error.description.hasPrefix("line 7: "), "description \(error.description.debugDescription)")
        require(!error.message.isEmpty, "empty message")
        if let id = error.jobID { require(!id.isEmpty, "empty job id in an error") }
    case .success(let parsed):
        check(parsed.job, line: line)
    }
    return 0
}

private func check(_ job: ParsedJob, line: UnsafeBufferPointer<UInt8>) {
    require(!job.id.isEmpty && !job.workspace.isEmpty, "empty id or workspace accepted: \(shown(line))")
    do {
        try job.headers.validate()
    } catch {
        require(false, "accepted headers do not validate: \(error): \(shown(line))")
    }
    let payload: [UInt8]
    do {
        payload = try job.payload.encode()
    } catch {
        violated("an accepted job's payload does not encode: \(error): \(shown(line))", file: #fileID, line: #line)
    }
    do {
        try PayloadLimits.check(payload, pushType: job.headers.pushType)
    } catch {
        require(false, "an accepted job's payload is out of limits: \(error): \(shown(line))")
    }

    var token = placeholderToken
    switch job.recipients {
    case .tokens(let tokens):
        require(!tokens.isEmpty, "a job with no tokens accepted")
        for text in tokens {
            require(DeviceToken(text)?.hex == text, "token \(text.debugDescription) is not valid lowercase hex")
        }
        token = DeviceToken(tokens[0])!
    case .file(let path):
        require(!path.isEmpty, "empty tokens_file accepted")
    case .activity(let app, let id), .channel(let app, let id, _):
        require(!app.isEmpty && !id.isEmpty, "a registry or channel job without its app or id accepted")
    case .pushToStart(let app, _, _, _), .devices(let app, _):
        require(!app.isEmpty, "a registry job without its app accepted")
    }

    // The request as the engine sends it: the job's headers with a fresh apns-id and a bearer token.
    var headers = job.headers
    headers.apnsID = "eabeae54-14a8-11e5-b60b-1697f925ec7b"
    headers.bearerToken = "eyJhbGciOiJFUzI1NiJ9.e30.c2ln"
    let fields: [HeaderField]
    do {
        fields = try headers.headerFields(deviceToken: token, authority: "api.push.apple.com")
    } catch {
        violated("headerFields refuses an accepted job: \(error): \(shown(line))", file: #fileID, line: #line)
    }
    let rejection = APNsRequestValidator().validate(
        method: "POST", path: NotificationHeaders.path(for: token), headers: fields.map { ($0.name, $0.value) },
        body: payload)
    guard let rejection else { return }
    if case .raw = job.payload, rejection.reason == .badPayload { return }
    require(
        false,
        "mock-apns rejects the request built from an accepted job with \(rejection); payload \(shown(payload)); "
            + "line \(shown(line))")
}
