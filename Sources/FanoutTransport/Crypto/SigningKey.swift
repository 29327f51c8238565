import COpenSSL
package import Foundation

/// An ES256 (ECDSA P-256 + SHA-256) private key: the APNs auth key from a `.p8` file.
///
/// Immutable after init. OpenSSL allows concurrent signing with one `EVP_PKEY` (each signature uses its own
/// `EVP_MD_CTX`), hence `@unchecked Sendable`.
package final class ES256PrivateKey: @unchecked Sendable {
    /// Owned: freed in deinit (EVP_PKEY_free).
    package let pkey: OpaquePointer
    /// The matching public key (a separate, public-only `EVP_PKEY`).
    package let publicKey: ES256PublicKey

    /// Takes ownership of `pkey`, which must already be a validated P-256 key.
    private init(owning pkey: OpaquePointer, publicKey: ES256PublicKey) {
        self.pkey = pkey
        self.publicKey = publicKey
    }

    deinit { EVP_PKEY_free(pkey) }

    /// Loads a private key from a PEM file: an APNs `.p8` (a PEM `PRIVATE KEY` block, PKCS#8).
    /// Throws if the file is missing or unreadable, is not PEM, or holds anything but an EC P-256 key.
    package convenience init(pemFilePath path: String) throws {
        var bytes = try CryptoFile.read(path, what: "private key")
        defer { bytes.withUnsafeMutableBufferPointer { $0.update(repeating: 0) } }  // Best-effort wipe.
        let pkey = try Self.parse(bytes, source: path)
        try self.init(validated: pkey, source: path)
    }

    /// Loads a private key from PEM bytes (the contents of a `.p8` file).
    package convenience init(pemData: Data) throws {
        let pkey = try Self.parse([UInt8](pemData), source: "PEM data")
        try self.init(validated: pkey, source: "PEM data")
    }

    /// Loads a private key from PEM text (the contents of a `.p8` file).
    package convenience init(pem: String) throws {
        var bytes = Array(pem.utf8)
        defer { bytes.withUnsafeMutableBufferPointer { $0.update(repeating: 0) } }  // Best-effort wipe of this copy.
        let pkey = try Self.parse(bytes, source: "PEM data")
        try self.init(validated: pkey, source: "PEM data")
    }

    /// Checks the curve, derives the public key, then takes ownership; frees `pkey` on failure.
    private convenience init(validated pkey: OpaquePointer, source: String) throws {
        let publicKey: ES256PublicKey
        do {
            try ES256Key.requireP256(pkey, source: source, what: "private key")
            publicKey = try ES256PublicKey(derivedFrom: pkey, source: source)
        } catch {
            EVP_PKEY_free(pkey)
            throw error
        }
        self.init(owning: pkey, publicKey: publicKey)
    }

    /// Generates a fresh P-256 key (for tests, the mock server and test certificates).
    package static func generate() throws -> ES256PrivateKey {
        // Temporary: freed by defer.
        guard let context = EVP_PKEY_CTX_new_id(EVP_PKEY_EC, nil) else {
            throw CryptoError(.internalFailure, "EVP_PKEY_CTX_new_id(EC) failed", includeOpenSSLErrors: true)
        }
        defer { EVP_PKEY_CTX_free(context) }
        // Owned by the returned ES256PrivateKey (freed on failure by init(validated:source:)).
        var generated: OpaquePointer?
        guard EVP_PKEY_keygen_init(context) == 1,
            EVP_PKEY_CTX_set_ec_paramgen_curve_nid(context, NID_X9_62_prime256v1) == 1,
            EVP_PKEY_keygen(context, &generated) == 1, let pkey = generated
        else {
            throw CryptoError(.internalFailure, "P-256 key generation failed", includeOpenSSLErrors: true)
        }
        return try ES256PrivateKey(validated: pkey, source: "generated key")
    }

    /// The key as unencrypted PKCS#8 PEM (a `PRIVATE KEY` block), the format of an APNs `.p8` file.
    package func pemPKCS8() -> String {
        guard
            let bytes = OpenSSLBIO.collect({ bio in
                PEM_write_bio_PKCS8PrivateKey(bio, pkey, nil, nil, 0, nil, nil) == 1
            })
        else {
            // Only an allocation failure can get here; the message carries no key material.
            preconditionFailure("PEM_write_bio_PKCS8PrivateKey failed: \(OpenSSLErrorQueue.drain() ?? "no detail")")
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Signs `message` with ECDSA P-256 over SHA-256 and returns the raw 64-byte r‖s signature (JWS form).
    package func signature(for message: some Collection<UInt8>) throws -> [UInt8] {
        let message = Array(message)
        return try message.withUnsafeBytes { try sign($0) }
    }

    /// EVP_DigestSign over `message`, converting OpenSSL's DER signature to raw r‖s.
    func sign(_ message: UnsafeRawBufferPointer) throws -> [UInt8] {
        // Temporary: freed by defer.
        guard let context = EVP_MD_CTX_new() else {
            throw CryptoError(.internalFailure, "EVP_MD_CTX_new failed", includeOpenSSLErrors: true)
        }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, pkey) == 1 else {
            throw CryptoError(.signingFailed, "EVP_DigestSignInit failed", includeOpenSSLErrors: true)
        }
        let data = message.baseAddress?.assumingMemoryBound(to: UInt8.self)
        var length = 0
        guard EVP_DigestSign(context, nil, &length, data, message.count) == 1, length > 0 else {
            throw CryptoError(.signingFailed, "EVP_DigestSign (size query) failed", includeOpenSSLErrors: true)
        }
        var der = [UInt8](repeating: 0, count: length)
        let ok = der.withUnsafeMutableBufferPointer { out in
            EVP_DigestSign(context, out.baseAddress, &length, data, message.count) == 1
        }
        guard ok else { throw CryptoError(.signingFailed, "EVP_DigestSign failed", includeOpenSSLErrors: true) }
        guard let raw = ECDSASignature.rawFromDER(Array(der.prefix(length))) else {
            throw CryptoError(.signingFailed, "OpenSSL returned an ECDSA signature that is not valid DER")
        }
        return raw
    }

    /// Parses PEM private-key bytes. Returns an owned `EVP_PKEY` (the caller must free it) or throws
    /// a message that names `source` and the problem, never the bytes.
    private static func parse(_ bytes: [UInt8], source: String) throws -> OpaquePointer {
        OpenSSLErrorQueue.clear()
        if PEMText.contains(bytes, PEMText.encryptedPrivateKeyHeader) {
            throw CryptoError(
                .unsupportedKey, "private key in \(source) is encrypted; APNs .p8 keys are unencrypted PKCS#8",
                path: pathOrNil(source))
        }
        if !PEMText.contains(bytes, "PRIVATE KEY-----") {
            let what = PEMText.contains(bytes, "-----BEGIN ") ? "a PEM file without a private key" : "not a PEM file"
            throw CryptoError(
                .malformedKey, "\(source) is \(what); expected an ES256 key \"\(PEMText.privateKeyHeader)\" (.p8)",
                path: pathOrNil(source))
        }
        let parsed = try OpenSSLBIO.withReadOnly(bytes) { bio in
            PEM_read_bio_PrivateKey(bio, nil, PEMText.refusePassphrase, nil)
        }
        guard let pkey = parsed else {
            throw CryptoError(
                .malformedKey, "could not parse the private key in \(source)", path: pathOrNil(source),
                includeOpenSSLErrors: true)
        }
        return pkey
    }
}

/// An ES256 (ECDSA P-256) public key, used to verify provider tokens.
///
/// Immutable after init; verification with a shared `EVP_PKEY` is thread-safe, hence `@unchecked Sendable`.
package final class ES256PublicKey: @unchecked Sendable, Equatable {
    /// Owned: freed in deinit (EVP_PKEY_free).
    package let pkey: OpaquePointer

    /// Takes ownership of `pkey`, which must already be a validated P-256 key.
    private init(owning pkey: OpaquePointer) {
        self.pkey = pkey
    }

    deinit { EVP_PKEY_free(pkey) }

    /// Loads a public key from a PEM file holding either `-----BEGIN PUBLIC KEY-----` or a private key
    /// (an APNs `.p8`), in which case the public half is derived. This is what `mock-apns --auth-key` takes.
    package convenience init(pemFilePath path: String) throws {
        var bytes = try CryptoFile.read(path, what: "key")
        defer { bytes.withUnsafeMutableBufferPointer { $0.update(repeating: 0) } }  // Best-effort wipe.
        try self.init(pemBytes: bytes, source: path)
    }

    /// Loads a public key from PEM bytes: a public key, or a private key whose public half is derived.
    package convenience init(pemData: Data) throws {
        try self.init(pemBytes: [UInt8](pemData), source: "PEM data")
    }

    /// Loads a public key from PEM text: a public key, or a private key whose public half is derived.
    package convenience init(pem: String) throws {
        try self.init(pemBytes: Array(pem.utf8), source: "PEM data")
    }

    private convenience init(pemBytes bytes: [UInt8], source: String) throws {
        OpenSSLErrorQueue.clear()
        if PEMText.contains(bytes, "PRIVATE KEY-----") {
            let privateKey: ES256PrivateKey
            if source == "PEM data" {
                privateKey = try ES256PrivateKey(pemData: Data(bytes))
            } else {
                // Re-read through the path so errors name the file.
                privateKey = try ES256PrivateKey(pemFilePath: source)
            }
            try self.init(derivedFrom: privateKey.pkey, source: source)
            return
        }
        guard PEMText.contains(bytes, PEMText.publicKeyHeader) else {
            throw CryptoError(
                .malformedKey,
                "\(source) holds no \"\(PEMText.publicKeyHeader)\" or \"\(PEMText.privateKeyHeader)\" block",
                path: pathOrNil(source))
        }
        let parsed = try OpenSSLBIO.withReadOnly(bytes) { bio in
            PEM_read_bio_PUBKEY(bio, nil, PEMText.refusePassphrase, nil)
        }
        guard let pkey = parsed else {
            throw CryptoError(
                .malformedKey, "could not parse the public key in \(source)", path: pathOrNil(source),
                includeOpenSSLErrors: true)
        }
        do {
            try ES256Key.requireP256(pkey, source: source, what: "public key")
        } catch {
            EVP_PKEY_free(pkey)
            throw error
        }
        self.init(owning: pkey)
    }

    /// Builds a public-only copy of `privateKey` (a new `EVP_PKEY`, via its SubjectPublicKeyInfo DER).
    /// Does not take ownership of `privateKey`.
    convenience init(derivedFrom privateKey: OpaquePointer, source: String) throws {
        let length = i2d_PUBKEY(privateKey, nil)
        guard length > 0 else {
            throw CryptoError(
                .internalFailure, "cannot encode the public key of \(source)", path: pathOrNil(source),
                includeOpenSSLErrors: true)
        }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { out -> Int32 in
            var cursor: UnsafeMutablePointer<UInt8>? = out.baseAddress
            return i2d_PUBKEY(privateKey, &cursor)
        }
        let decoded = der.withUnsafeBufferPointer { input -> OpaquePointer? in
            var cursor: UnsafePointer<UInt8>? = input.baseAddress
            return d2i_PUBKEY(nil, &cursor, input.count)
        }
        guard written == length, let pkey = decoded else {
            if let decoded { EVP_PKEY_free(decoded) }
            throw CryptoError(
                .internalFailure, "cannot derive the public key of \(source)", path: pathOrNil(source),
                includeOpenSSLErrors: true)
        }
        self.init(owning: pkey)
    }

    /// The key as PEM SubjectPublicKeyInfo (`-----BEGIN PUBLIC KEY-----`).
    package func pem() -> String {
        guard let bytes = OpenSSLBIO.collect({ bio in PEM_write_bio_PUBKEY(bio, pkey) == 1 }) else {
            preconditionFailure("PEM_write_bio_PUBKEY failed: \(OpenSSLErrorQueue.drain() ?? "no detail")")
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// True if `signature` (raw 64-byte r‖s) is a valid ES256 signature of `message` by this key.
    package func isValidSignature(_ signature: some Collection<UInt8>, for message: some Collection<UInt8>) -> Bool {
        guard let der = ECDSASignature.derFromRaw(signature) else { return false }
        let message = Array(message)
        return message.withUnsafeBytes { verify(derSignature: der, message: $0) }
    }

    /// EVP_DigestVerify of a DER signature. Leaves OpenSSL's error queue empty.
    package func verify(derSignature: [UInt8], message: UnsafeRawBufferPointer) -> Bool {
        // Temporary: freed by defer.
        guard let context = EVP_MD_CTX_new() else { return false }
        defer {
            EVP_MD_CTX_free(context)
            OpenSSLErrorQueue.clear()
        }
        guard EVP_DigestVerifyInit(context, nil, EVP_sha256(), nil, pkey) == 1 else { return false }
        let data = message.baseAddress?.assumingMemoryBound(to: UInt8.self)
        return derSignature.withUnsafeBufferPointer { signature in
            EVP_DigestVerify(context, signature.baseAddress, signature.count, data, message.count) == 1
        }
    }

    /// Same key material (EVP_PKEY_eq).
    package static func == (lhs: ES256PublicKey, rhs: ES256PublicKey) -> Bool {
        defer { OpenSSLErrorQueue.clear() }
        return EVP_PKEY_eq(lhs.pkey, rhs.pkey) == 1
    }
}

/// Checks shared by private and public keys.
enum ES256Key {
    /// Throws `.unsupportedKey` unless `pkey` is an EC key on P-256 (prime256v1).
    static func requireP256(_ pkey: OpaquePointer, source: String, what: String) throws {
        let type = EVP_PKEY_get_base_id(pkey)
        guard type == EVP_PKEY_EC else {
            let name = EVP_PKEY_get0_type_name(pkey).map { String(cString: $0) } ?? "type \(type)"
            throw CryptoError(
                .unsupportedKey, "\(what) in \(source) has key type \(name); APNs tokens need an EC P-256 (ES256) key",
                path: pathOrNil(source))
        }
        var name = [CChar](repeating: 0, count: 80)
        var length = 0
        let curve = name.withUnsafeMutableBufferPointer { buffer -> String? in
            guard EVP_PKEY_get_group_name(pkey, buffer.baseAddress, buffer.count, &length) == 1 else { return nil }
            return String(cString: buffer.baseAddress!)
        }
        guard let curve, OBJ_sn2nid(curve) == NID_X9_62_prime256v1 || curve == "P-256" else {
            throw CryptoError(
                .unsupportedKey,
                "\(what) in \(source) is an EC key on curve \(curve ?? "unknown"); ES256 needs P-256 (prime256v1)",
                path: pathOrNil(source))
        }
        OpenSSLErrorQueue.clear()
    }
}

/// Sources are either a file path or a description like "PEM data"; only paths go into `CryptoError.path`.
func pathOrNil(_ source: String) -> String? {
    source == "PEM data" || source == "generated key" ? nil : source
}
