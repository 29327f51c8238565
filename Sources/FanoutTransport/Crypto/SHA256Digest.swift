import COpenSSL

/// SHA-256 (`OpenSSLDigest`), and a comparison whose time does not depend on where two
/// digests differ (`CRYPTO_memcmp`). `fanout serve` keeps API keys only as these digests.
package enum SHA256Digest {
    /// The 32-byte digest of `bytes`.
    package static func hash(_ bytes: some Collection<UInt8>) -> [UInt8] {
        OpenSSLDigest.sha256(Array(bytes))
    }

    /// Lowercase hex of the digest of `text`'s UTF-8 bytes.
    package static func hexHash(_ text: String) -> String {
        OpenSSLDigest.hex(hash(Array(text.utf8)))
    }

    /// Whether two digests are equal, in time that depends only on their length.
    package static func constantTimeEquals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        return a.withUnsafeBytes { left in
            b.withUnsafeBytes { right in CRYPTO_memcmp(left.baseAddress, right.baseAddress, a.count) == 0 }
        }
    }
}
