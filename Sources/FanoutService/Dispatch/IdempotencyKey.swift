import FanoutTransport

/// A request's `Idempotency-Key` with a digest of the request it came with (its method, path and body), so that the
/// key sent again with the same request returns the first dispatch, and sent with another request is refused
/// (`422`, as the IETF draft on the header asks) instead of answering with a dispatch of something else.
package struct IdempotencyKey: Sendable, Equatable {
    /// The key as the client sent it (per workspace; a Pushwoosh request of several notifications numbers it).
    package let key: String
    /// Lowercase hex SHA-256 of the request.
    package let requestDigest: String

    package init(key: String, requestDigest: String) {
        self.key = key
        self.requestDigest = requestDigest
    }

    /// The key of `method path` with `body`.
    package init(key: String, method: String, path: String, body: [UInt8]) {
        self.key = key
        requestDigest = OpenSSLDigest.hex(SHA256Digest.hash(Array("\(method) \(path)\n".utf8) + body))
    }

    /// The same request's key for its `index`th dispatch (a Pushwoosh request makes one per notification).
    package func numbered(_ index: Int) -> IdempotencyKey {
        IdempotencyKey(key: "\(key)#\(index)", requestDigest: requestDigest)
    }

    /// Whether a key taken with `earlierDigest` may answer this request: the same request, or one recorded before
    /// digests were kept (nil).
    package func matches(_ earlierDigest: String?) -> Bool {
        earlierDigest.map { $0 == requestDigest } ?? true
    }
}
