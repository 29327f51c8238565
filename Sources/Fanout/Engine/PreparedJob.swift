public import FanoutCore
import FanoutTransport
import Synchronization

/// A job made ready to send, shared read-only by every loop: the payload encoded once into a
/// `SharedBody`, and the constant header block built once per provider token (the token changes
/// every 50 minutes; only `:path` and `apns-id` change per notification).
final class PreparedJob: Sendable {
    let id: String
    let run: FanoutRun
    let body: SharedBody
    let headers: NotificationHeaders
    /// Unix seconds after which the notification is `expired` instead of sent; nil for none (0).
    let expiresAt: Int64?
    private let authority: String
    private let cachedBlock = Mutex<(bearer: String?, block: HeaderBlock)?>(nil)

    /// - Parameter payload: the job's payload, already encoded (once).
    init(job: FanoutJob, payload: [UInt8], run: FanoutRun, authority: String) {
        id = job.id
        self.run = run
        body = SharedBody(payload)
        var headers = job.headers
        headers.apnsID = nil
        headers.bearerToken = nil
        self.headers = headers
        expiresAt = (job.headers.expiration ?? 0) > 0 ? job.headers.expiration : nil
        self.authority = authority
    }

    /// The same job at another priority (a `demote`d Live Activity update): same payload bytes.
    init(demoting job: PreparedJob, to priority: Int) {
        id = job.id
        run = job.run
        body = job.body
        var headers = job.headers
        headers.priority = priority
        self.headers = headers
        expiresAt = job.expiresAt
        authority = job.authority
    }

    /// The constant headers with `authorization: bearer <token>` (nil: none). Built once per token.
    func headerBlock(bearer: String?) -> HeaderBlock {
        if let cached = cachedBlock.withLock({ $0 }), cached.bearer == bearer { return cached.block }
        var headers = self.headers
        headers.bearerToken = bearer
        var fields: [(name: String, value: String, neverIndex: Bool)] = []
        // The token only fills :path, which the block leaves out; any valid token will do here.
        let placeholder = DeviceToken(String(repeating: "0", count: 64))!
        let built = (try? headers.headerFields(deviceToken: placeholder, authority: authority)) ?? []
        for field in built where field.name != ":path" && field.name != "apns-id" {
            // The provider token goes into HPACK's dynamic table: it is the same on every stream for
            // 50 minutes, so after the first request it costs one byte instead of ~200 bytes of
            // Huffman coding per stream (Netty-based clients such as Pushy do the same). :path and
            // apns-id, which change per stream, stay out of the table.
            let indexed = field.name == "authorization"
            fields.append((field.name, field.value, indexed ? false : field.neverIndex))
        }
        let block = HeaderBlock(fields)
        cachedBlock.withLock { $0 = (bearer, block) }
        return block
    }
}
