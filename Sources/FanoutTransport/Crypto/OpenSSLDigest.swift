import COpenSSL

/// One-shot digests through OpenSSL's `EVP_Digest`, and their lowercase hex: SHA-256 for the API keys `fanout serve`
/// keeps (`SHA256Digest`), SHA-1 for the names Redis gives Lua scripts (`EVALSHA`).
package enum OpenSSLDigest {
    /// The 20-byte SHA-1 of `bytes`.
    package static func sha1(_ bytes: [UInt8]) -> [UInt8] {
        digest(bytes, EVP_sha1(), length: 20)
    }

    /// The 32-byte SHA-256 of `bytes`.
    package static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        digest(bytes, EVP_sha256(), length: 32)
    }

    /// `digest` as lowercase hex.
    package static func hex(_ digest: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(digest.count * 2)
        for byte in digest {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// - Parameter algorithm: an `EVP_MD` from OpenSSL's static table (`EVP_sha1()`, ...): not owned, never freed.
    private static func digest(_ bytes: [UInt8], _ algorithm: OpaquePointer?, length: Int) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: length)
        var written: UInt32 = 0
        let status = bytes.withUnsafeBytes { message in
            digest.withUnsafeMutableBytes { output in
                // Nothing allocated is kept: EVP_Digest makes and frees its own context.
                EVP_Digest(
                    message.baseAddress, message.count, output.baseAddress!.assumingMemoryBound(to: UInt8.self),
                    &written, algorithm, nil)
            }
        }
        precondition(status == 1 && written == length, "EVP_Digest failed")
        return digest
    }
}
