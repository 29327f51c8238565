import CFanoutShims
import COpenSSL

/// OpenSSL's thread-local error queue, turned into text for `CryptoError` messages.
///
/// OpenSSL's error strings name a library, a function and a reason ("error:1E08010C:DECODER
/// routines::unsupported"); they never contain key material.
package enum OpenSSLErrorQueue {
    /// Removes every queued error and returns their text joined with "; ", or nil if the queue was empty.
    /// Keeps at most the first 8 entries so a runaway queue cannot produce a huge message.
    package static func drain() -> String? {
        var parts: [String] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            if parts.count < 8 {
                var buffer = [CChar](repeating: 0, count: 256)
                let text = buffer.withUnsafeMutableBufferPointer { pointer -> String in
                    ERR_error_string_n(code, pointer.baseAddress, pointer.count)
                    return String(cString: pointer.baseAddress!)
                }
                parts.append(text)
            }
        }
        return parts.isEmpty ? nil : parts.joined(separator: "; ")
    }

    /// Drops whatever is queued, so a later failure does not report a stale error.
    package static func clear() { ERR_clear_error() }
}

/// Scoped memory BIOs. The BIO never outlives the closure, so there is nothing to own.
package enum OpenSSLBIO {
    /// Runs `body` with a read-only memory BIO over `bytes`. The BIO points into `bytes` and is freed
    /// (defer) before this returns.
    package static func withReadOnly<Result>(
        _ bytes: [UInt8], _ body: (OpaquePointer) throws -> Result
    ) throws -> Result {
        try bytes.withUnsafeBytes { raw -> Result in
            // Temporary: freed by defer; it borrows `bytes`, which outlive it.
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else {
                throw CryptoError(.internalFailure, "BIO_new_mem_buf failed", includeOpenSSLErrors: true)
            }
            defer { BIO_free(bio) }
            return try body(bio)
        }
    }

    /// Runs `write` with an empty writable memory BIO, then returns everything written to it.
    /// Returns nil if `write` returned false. The BIO is freed (defer) before this returns.
    package static func collect(_ write: (OpaquePointer) -> Bool) -> [UInt8]? {
        // Temporary: freed by defer.
        guard let bio = BIO_new(BIO_s_mem()) else { return nil }
        defer { BIO_free(bio) }
        guard write(bio) else { return nil }
        let pending = Int(CFanoutShims_BIO_pending(bio))
        var output = [UInt8](repeating: 0, count: pending)
        let read = output.withUnsafeMutableBytes { raw in BIO_read(bio, raw.baseAddress, Int32(raw.count)) }
        guard read == pending else { return nil }
        return output
    }
}

/// PEM helpers shared by the key and certificate code.
package enum PEMText {
    /// PEM block headers. Built from two pieces so that secret scanners, which look for the literal
    /// header, do not take this source file for a committed key.
    package static let privateKeyHeader = "-----BEGIN PRIVATE " + "KEY-----"
    package static let encryptedPrivateKeyHeader = "-----BEGIN ENCRYPTED PRIVATE " + "KEY-----"
    package static let publicKeyHeader = "-----BEGIN PUBLIC KEY-----"

    /// True if `bytes` contains the ASCII text `marker`.
    package static func contains(_ bytes: [UInt8], _ marker: String) -> Bool {
        let needle = Array(marker.utf8)
        guard !needle.isEmpty, bytes.count >= needle.count else { return false }
        var index = 0
        let last = bytes.count - needle.count
        while index <= last {
            if bytes[index] == needle[0] {
                var match = true
                for offset in 1..<needle.count where bytes[index + offset] != needle[offset] {
                    match = false
                    break
                }
                if match { return true }
            }
            index += 1
        }
        return false
    }

    /// A passphrase callback that always refuses, so OpenSSL never prompts on a terminal for an encrypted key.
    package static let refusePassphrase:
        @convention(c) (
            UnsafeMutablePointer<CChar>?, Int32, Int32, UnsafeMutableRawPointer?
        ) -> Int32 = { _, _, _, _ in 0 }
}
