import COpenSSL

/// SHA-256 through OpenSSL's one-shot `EVP_Digest`, and a comparison whose time does not depend on where two
/// digests differ (`CRYPTO_memcmp`). `fanout serve` keeps API keys only as these digests.
package enum SHA256Digest {
    /// The 32-byte digest of `bytes`.
    package static func hash(_ bytes: some Collection<UInt8>) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        let input = Array(bytes)
        var length: UInt32 = 0
        let status = input.withUnsafeBytes { message in
            digest.withUnsafeMutableBytes { output in
                // Nothing allocated is kept: EVP_Digest makes and frees its own context.
                EVP_Digest(
                    message.baseAddress, message.count, output.baseAddress!.assumingMemoryBound(to: UInt8.self),
                    &length, EVP_sha256(), nil)
            }
        }
        precondition(status == 1 && length == 32, "EVP_Digest(SHA-256) failed")
        return digest
    }

    /// Lowercase hex of the digest of `text`'s UTF-8 bytes.
    package static func hexHash(_ text: String) -> String {
        hash(Array(text.utf8)).map { byte in
            let digits = Array("0123456789abcdef".utf8)
            return String(decoding: [digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]], as: UTF8.self)
        }.joined()
    }

    /// Whether two digests are equal, in time that depends only on their length.
    package static func constantTimeEquals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        return a.withUnsafeBytes { left in
            b.withUnsafeBytes { right in CRYPTO_memcmp(left.baseAddress, right.baseAddress, a.count) == 0 }
        }
    }
}
