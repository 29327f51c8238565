import FanoutCore
import FanoutTestSupport
import FanoutTransport
import Foundation

/// encode: in process, what one notification costs in payload encoding and header-block building
/// when a 1 KiB Live Activity payload and its header block are made once per job and shared by
/// its 10,000 notifications, versus made again for every token. Both paths hand each notification
/// the same thing (the payload bytes and the header block, stored in a ring the way a send queue
/// holds them), so the difference is the encoding alone.
func runEncode(_ bench: BenchContext) throws {
    let tokensPerJob = 10_000
    let jobsPerRun = bench.quick ? 5 : 100
    let perTokenNotifications = bench.quick ? 2_000 : 20_000
    let runs = max(bench.runs, bench.quick ? 3 : 5)
    let fixture = try EncodeFixture()
    var sink = EncodeSink()
    // Warm up both paths (caches, lazy initialisers) before measuring.
    try fixture.perJob(jobs: 1, tokensPerJob: 1_000, into: &sink)
    try fixture.perToken(notifications: 1_000, into: &sink)
    let before = processUsage()
    var perJobNanos: [Double] = []
    var perTokenNanos: [Double] = []
    for _ in 0..<runs {
        var start = DispatchTime.now()
        try fixture.perJob(jobs: jobsPerRun, tokensPerJob: tokensPerJob, into: &sink)
        perJobNanos.append(
            Double(DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds)
                / Double(jobsPerRun * tokensPerJob))
        start = DispatchTime.now()
        try fixture.perToken(notifications: perTokenNotifications, into: &sink)
        perTokenNanos.append(
            Double(DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds) / Double(perTokenNotifications))
    }
    let cpuSeconds = processUsage().cpuSeconds - before.cpuSeconds
    let perJob = Spread(perJobNanos)
    let perToken = Spread(perTokenNanos)
    let ratio = perToken.median / perJob.median
    print(
        String(
            format:
                "encode: %d-byte Live Activity payload + header block: once per job (%d tokens) %.1f ns/notification "
                + "[%.1f-%.1f], once per token %.0f ns/notification [%.0f-%.0f]; per job x%.0f cheaper (goal >= 50)",
            fixture.payloadSize, tokensPerJob, perJob.median, perJob.min, perJob.max, perToken.median, perToken.min,
            perToken.max, ratio))
    let notifications = jobsPerRun * tokensPerJob + perTokenNotifications
    bench.record([
        "scenario": "encode", "notifications": notifications, "payload_bytes": fixture.payloadSize,
        "tokens_per_job": tokensPerJob, "per_job_ns_per_notification": perJob.median,
        "per_job_ns_min": perJob.min, "per_job_ns_max": perJob.max,
        "per_token_ns_per_notification": perToken.median, "per_token_ns_min": perToken.min,
        "per_token_ns_max": perToken.max, "per_job_cheaper_ratio": ratio,
        "rate": 1e9 / perJob.median,
        "seconds":
            (perJob.median * Double(jobsPerRun * tokensPerJob)
            + perToken.median * Double(perTokenNotifications)) / 1e9,
        "cpu_seconds": cpuSeconds / Double(runs), "peak_rss_mb": processUsage().peakRSSMegabytes,
        "checksum": sink.checksum(),
        "key_figure": String(
            format: "per job %.1f ns vs per token %.0f ns per notification: x%.0f", perJob.median, perToken.median,
            ratio),
    ])
}

/// Where each notification's payload and header block go: a ring, as a send queue would hold them.
struct EncodeSink {
    var ring: [(payload: [UInt8], block: HeaderBlock?)] = Array(repeating: ([], nil), count: 256)
    var next = 0

    mutating func hand(_ payload: [UInt8], _ block: HeaderBlock) {
        ring[next & 255] = (payload, block)
        next &+= 1
    }

    /// Something that depends on every slot, so nothing stored here can be optimised away.
    func checksum() -> Int { ring.reduce(next) { $0 &+ $1.payload.count &+ ($1.block == nil ? 0 : 1) } }
}

/// A 1 KiB Live Activity update with an alert, and its headers with a provider token of realistic length.
struct EncodeFixture {
    let content: LiveActivityContent
    let headers: NotificationHeaders
    let authority = "api.push.apple.com"
    let payloadSize: Int

    init() throws {
        var content = try liveActivityContent(index: 1, size: 1024)
        // Pad the content state until the payload is exactly 1 KiB.
        let size = try content.encode().count
        if size != 1024 { content = try liveActivityContent(index: 1, size: 1024 + (1024 - size)) }
        self.content = content
        payloadSize = try content.encode().count
        var headers = benchHeaders
        // An ES256 JWT is about 200 characters: header.claims.signature, base64url.
        headers.bearerToken =
            "eyJhbGciOiJFUzI1NiIsImtpZCI6IkJFTkNIS0VZMDEifQ.eyJpc3MiOiJCRU5DSFRFQU0xIiwiaWF0IjoxNzY0NDYwODAwfQ."
            + String(repeating: "A", count: 86)
        self.headers = headers
    }

    /// The job's constant headers as a `HeaderBlock`, the way the engine builds it: every field
    /// but `:path` and `apns-id`, the provider token indexed.
    func headerBlock(token: DeviceToken) throws -> HeaderBlock {
        var fields: [(name: String, value: String, neverIndex: Bool)] = []
        for field in try headers.headerFields(deviceToken: token, authority: authority)
        where field.name != ":path" && field.name != "apns-id" {
            fields.append((field.name, field.value, field.name == "authorization" ? false : field.neverIndex))
        }
        return HeaderBlock(fields)
    }

    /// Encodes once per job; every notification of the job reuses the bytes and the block.
    func perJob(jobs: Int, tokensPerJob: Int, into sink: inout EncodeSink) throws {
        let placeholder = DeviceToken(String(repeating: "0", count: 64))!
        for _ in 0..<jobs {
            let payload = try content.encode()
            let block = try headerBlock(token: placeholder)
            for _ in 0..<tokensPerJob { sink.hand(payload, block) }
        }
    }

    /// Encodes the payload and builds the header block again for every notification.
    func perToken(notifications: Int, into sink: inout EncodeSink) throws {
        let token = DeviceToken(benchToken(7))!
        for _ in 0..<notifications {
            let payload = try content.encode()
            sink.hand(payload, try headerBlock(token: token))
        }
    }
}
