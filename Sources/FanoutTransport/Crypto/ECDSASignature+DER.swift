import COpenSSL

/// Converts ECDSA P-256 signatures between OpenSSL's DER `ECDSA-Sig-Value` and JWS's raw 64-byte r‖s.
package enum ECDSASignature {
    /// Bytes in r and in s for P-256.
    package static let componentLength = 32

    /// DER `SEQUENCE { INTEGER r, INTEGER s }` → raw r‖s (each left-padded to 32 bytes). Nil if malformed.
    package static func rawFromDER(_ der: [UInt8]) -> [UInt8]? {
        der.withUnsafeBufferPointer { buffer -> [UInt8]? in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            // Temporary: freed by the defer below.
            guard let signature = d2i_ECDSA_SIG(nil, &cursor, buffer.count) else {
                OpenSSLErrorQueue.clear()
                return nil
            }
            defer { ECDSA_SIG_free(signature) }
            // Borrowed: r and s belong to `signature`.
            var r: OpaquePointer?
            var s: OpaquePointer?
            ECDSA_SIG_get0(signature, &r, &s)
            guard let r, let s else { return nil }
            var raw = [UInt8](repeating: 0, count: 2 * componentLength)
            let ok = raw.withUnsafeMutableBufferPointer { out -> Bool in
                let length = Int32(componentLength)
                return BN_bn2binpad(r, out.baseAddress!, length) == length
                    && BN_bn2binpad(s, out.baseAddress! + componentLength, length) == length
            }
            return ok ? raw : nil
        }
    }

    /// Raw r‖s (exactly 64 bytes) → DER `ECDSA-Sig-Value`. Nil if the length is wrong.
    package static func derFromRaw(_ raw: some Collection<UInt8>) -> [UInt8]? {
        let raw = Array(raw)
        guard raw.count == 2 * componentLength else { return nil }
        // Temporary: freed by the defer below (it also frees r and s once set0 has taken them).
        guard let signature = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(signature) }
        let taken = raw.withUnsafeBufferPointer { input -> Bool in
            let length = Int32(componentLength)
            // Owned until ECDSA_SIG_set0 succeeds, then owned by `signature`.
            guard let r = BN_bin2bn(input.baseAddress!, length, nil) else { return false }
            guard let s = BN_bin2bn(input.baseAddress! + componentLength, length, nil) else {
                BN_free(r)
                return false
            }
            guard ECDSA_SIG_set0(signature, r, s) == 1 else {
                BN_free(r)
                BN_free(s)
                return false
            }
            return true
        }
        guard taken else {
            OpenSSLErrorQueue.clear()
            return nil
        }
        let length = i2d_ECDSA_SIG(signature, nil)
        guard length > 0 else { return nil }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { out -> Int32 in
            var cursor: UnsafeMutablePointer<UInt8>? = out.baseAddress
            return i2d_ECDSA_SIG(signature, &cursor)
        }
        return written == length ? der : nil
    }
}
