import COpenSSL

/// HMAC-SHA256 (RFC 2104) through OpenSSL's one-shot `HMAC`: `fanout serve` signs its webhook deliveries with it.
package enum HMACSHA256 {
    /// The 32-byte MAC of `message` under `key`.
    package static func mac(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let result = key.withUnsafeBytes { keyBytes in
            message.withUnsafeBytes { messageBytes in
                output.withUnsafeMutableBytes { out in
                    // Writes into `out` (ours); allocates nothing that outlives the call. The digest comes from
                    // OpenSSL's static table (not owned).
                    HMAC(
                        EVP_sha256(), keyBytes.baseAddress, Int32(key.count),
                        messageBytes.baseAddress?.assumingMemoryBound(to: UInt8.self), messageBytes.count,
                        out.baseAddress!.assumingMemoryBound(to: UInt8.self), &length)
                }
            }
        }
        precondition(result != nil && length == 32, "HMAC-SHA256 failed")
        return output
    }

    /// The MAC as lowercase hex.
    package static func hex(key: [UInt8], message: [UInt8]) -> String {
        OpenSSLDigest.hex(mac(key: key, message: message))
    }
}
