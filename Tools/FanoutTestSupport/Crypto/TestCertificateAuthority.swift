import CFanoutShims
import COpenSSL
package import FanoutTransport
import Foundation

/// The files mock-apns (`--tls-dir DIR`) and tests need: a CA, a server certificate and key signed by it,
/// an ES256 APNs auth key (.p8) with its public half, and a provider (client) certificate signed by the CA for
/// `clientTopic`, as PEM certificate and key and as a PKCS#12 file with password `clientP12Password`.
package struct TestTLSMaterial: Sendable, Hashable {
    package static let caFileName = "ca.pem"
    package static let serverCertificateFileName = "server.pem"
    package static let serverKeyFileName = "server-key.pem"
    package static let authKeyFileName = "auth-key.p8"
    package static let authKeyPublicFileName = "auth-key.pub.pem"
    package static let clientCertificateFileName = "client.pem"
    package static let clientKeyFileName = "client-key.pem"
    package static let clientP12FileName = "client.p12"
    /// The password of `client.p12`.
    package static let clientP12Password = "fanout-test"
    /// The bundle id the client certificate is for: it covers this topic and its `.voip` and `.complication`
    /// variants, as Apple's do.
    package static let clientTopic = "com.example.app"

    /// The directory holding the files.
    package let directory: String
    /// The CA certificate (PEM). Clients trust this.
    package let caPEMPath: String
    /// The server certificate (PEM), signed by the CA.
    package let serverCertPath: String
    /// The server's EC P-256 private key (PKCS#8 PEM, mode 0600).
    package let serverKeyPath: String
    /// The APNs auth key (PKCS#8 PEM `.p8`, mode 0600) that signs provider tokens.
    package let authKeyP8Path: String
    /// The public half of the auth key (PEM), for verifying provider tokens.
    package let authKeyPublicPEMPath: String
    /// The provider certificate (PEM), signed by the CA, for `clientTopic`.
    package let clientCertPath: String
    /// Its private key (PKCS#8 PEM, mode 0600).
    package let clientKeyPath: String
    /// Both in one PKCS#12 file (mode 0600), password `clientP12Password`.
    package let clientP12Path: String

    /// The standard file paths inside `directory` (does not touch the file system).
    package init(directory: String) {
        self.directory = directory
        func path(_ name: String) -> String { (directory as NSString).appendingPathComponent(name) }
        caPEMPath = path(Self.caFileName)
        serverCertPath = path(Self.serverCertificateFileName)
        serverKeyPath = path(Self.serverKeyFileName)
        authKeyP8Path = path(Self.authKeyFileName)
        authKeyPublicPEMPath = path(Self.authKeyPublicFileName)
        clientCertPath = path(Self.clientCertificateFileName)
        clientKeyPath = path(Self.clientKeyFileName)
        clientP12Path = path(Self.clientP12FileName)
    }

    /// All eight file paths.
    package var allPaths: [String] {
        [
            caPEMPath, serverCertPath, serverKeyPath, authKeyP8Path, authKeyPublicPEMPath, clientCertPath,
            clientKeyPath, clientP12Path,
        ]
    }

    /// Reuses the eight files in `directory` if they all exist; otherwise creates `directory` and writes a
    /// fresh set (new CA, server certificate for `hostnames`/`ipAddresses`, new auth key).
    ///
    /// Reuse does not check that existing files match `hostnames`. Concurrent callers on one directory are
    /// serialised with a lock file (`.fanout-tls.lock`).
    package static func createOrReuse(
        in directory: String, hostnames: [String] = ["localhost"], ipAddresses: [String] = ["127.0.0.1"]
    ) throws -> TestTLSMaterial {
        let material = TestTLSMaterial(directory: directory)
        try CryptoFile.makeDirectory(directory)
        return try CryptoFile.withDirectoryLock(directory) {
            if material.allPaths.allSatisfy({ FileManager.default.fileExists(atPath: $0) }) { return material }
            try material.write(
                certificateAuthority: TestCertificateAuthority.generate(), hostnames: hostnames,
                ipAddresses: ipAddresses, authKey: ES256PrivateKey.generate())
            return material
        }
    }

    /// Always writes a fresh set of eight files into `directory` (created if needed), replacing existing ones.
    ///
    /// Pass `certificateAuthority` to sign with an existing CA (for example a server certificate for a wrong
    /// hostname under the same CA), and `authKey` to reuse an auth key; each is generated when nil.
    package static func create(
        in directory: String, hostnames: [String] = ["localhost"], ipAddresses: [String] = ["127.0.0.1"],
        certificateAuthority: TestCertificateAuthority? = nil, authKey: ES256PrivateKey? = nil
    ) throws -> TestTLSMaterial {
        let material = TestTLSMaterial(directory: directory)
        try CryptoFile.makeDirectory(directory)
        try CryptoFile.withDirectoryLock(directory) {
            try material.write(
                certificateAuthority: certificateAuthority ?? TestCertificateAuthority.generate(),
                hostnames: hostnames, ipAddresses: ipAddresses, authKey: authKey ?? ES256PrivateKey.generate())
        }
        return material
    }

    private func write(
        certificateAuthority: TestCertificateAuthority, hostnames: [String], ipAddresses: [String],
        authKey: ES256PrivateKey
    ) throws {
        let server = try certificateAuthority.issueServerCertificate(hostnames: hostnames, ipAddresses: ipAddresses)
        try CryptoFile.write(Array(certificateAuthority.certificatePEM().utf8), to: caPEMPath, mode: 0o644)
        try CryptoFile.write(Array(server.certificatePEM.utf8), to: serverCertPath, mode: 0o644)
        try CryptoFile.write(Array(server.key.pemPKCS8().utf8), to: serverKeyPath, mode: 0o600)
        try CryptoFile.write(Array(authKey.pemPKCS8().utf8), to: authKeyP8Path, mode: 0o600)
        try CryptoFile.write(Array(authKey.publicKey.pem().utf8), to: authKeyPublicPEMPath, mode: 0o644)
        let client = try certificateAuthority.issueProviderCertificate(bundleID: Self.clientTopic)
        try CryptoFile.write(Array(client.certificatePEM.utf8), to: clientCertPath, mode: 0o644)
        try CryptoFile.write(Array(client.key.pemPKCS8().utf8), to: clientKeyPath, mode: 0o600)
        try CryptoFile.write(try client.pkcs12(password: Self.clientP12Password), to: clientP12Path, mode: 0o600)
    }
}

/// A leaf certificate and its private key, in memory.
package struct TestServerCertificate: Sendable {
    /// The certificate (PEM).
    package let certificatePEM: String
    /// The EC P-256 private key.
    package let key: ES256PrivateKey
    /// The private key as PKCS#8 PEM.
    package var privateKeyPEM: String { key.pemPKCS8() }

    package init(certificatePEM: String, key: ES256PrivateKey) {
        self.certificatePEM = certificatePEM
        self.key = key
    }

    /// The certificate and its key as a PKCS#12 file (DER) protected by `password`, with OpenSSL's default
    /// algorithms (as `openssl pkcs12 -export` writes one), or with `legacy` the older ones (RC2-40 for the
    /// certificate, 3DES for the key) that Keychain Access used before macOS 14, for which this process loads
    /// OpenSSL 3's legacy provider.
    package func pkcs12(password: String, name: String = "Fanout test provider certificate", legacy: Bool = false)
        throws -> [UInt8]
    {
        if legacy, OSSL_PROVIDER_available(nil, "legacy") == 0 {
            _ = OSSL_PROVIDER_try_load(nil, "legacy", 1)  // Never unloaded: kept for the process's life.
        }
        let keyAlgorithm = legacy ? NID_pbe_WithSHA1And3_Key_TripleDES_CBC : 0
        let certificateAlgorithm = legacy ? NID_pbe_WithSHA1And40BitRC2_CBC : 0
        OpenSSLErrorQueue.clear()
        // Owned: freed by defer.
        let parsed = try OpenSSLBIO.withReadOnly(Array(certificatePEM.utf8)) { bio in
            PEM_read_bio_X509(bio, nil, nil, nil)
        }
        guard let certificate = parsed else {
            throw CryptoError(.certificateFailed, "reading the certificate back failed", includeOpenSSLErrors: true)
        }
        defer { X509_free(certificate) }
        // Owned: freed by defer. PKCS12_create takes references of its own to the key and the certificate.
        guard
            let p12 = PKCS12_create(
                password, name, key.pkey, certificate, nil, keyAlgorithm, certificateAlgorithm, 0, 0, 0)
        else {
            throw CryptoError(.certificateFailed, "PKCS12_create failed", includeOpenSSLErrors: true)
        }
        defer { PKCS12_free(p12) }
        guard let bytes = OpenSSLBIO.collect({ bio in i2d_PKCS12_bio(bio, p12) == 1 }) else {
            throw CryptoError(.certificateFailed, "i2d_PKCS12_bio failed", includeOpenSSLErrors: true)
        }
        return bytes
    }
}

/// A throwaway certificate authority for tests and mock-apns: an EC P-256 key and a self-signed X509v3 CA
/// certificate (CA:TRUE, keyCertSign/cRLSign, valid from 1 hour ago for 10 years).
///
/// Immutable after init; OpenSSL only reads the certificate and key when issuing, hence `@unchecked Sendable`.
package final class TestCertificateAuthority: @unchecked Sendable {
    /// The CA's private key (owns its own `EVP_PKEY`).
    package let key: ES256PrivateKey
    /// Owned: freed in deinit (X509_free).
    let certificate: OpaquePointer

    /// Takes ownership of `certificate`.
    private init(key: ES256PrivateKey, owning certificate: OpaquePointer) {
        self.key = key
        self.certificate = certificate
    }

    deinit { X509_free(certificate) }

    /// A new CA with a fresh key and a random serial. Two calls give two unrelated CAs.
    package static func generate(commonName: String = "Fanout Test CA") throws -> TestCertificateAuthority {
        let key = try ES256PrivateKey.generate()
        let certificate = try CertificateBuilder.build(
            subjectKey: key, commonName: commonName, issuer: nil,
            extensions: [
                (NID_basic_constraints, "critical,CA:TRUE"),
                (NID_key_usage, "critical,keyCertSign,cRLSign"),
                (NID_subject_key_identifier, "hash"),
            ])
        return TestCertificateAuthority(key: key, owning: certificate)
    }

    /// The CA certificate (PEM).
    package func certificatePEM() -> String { CertificateBuilder.pem(certificate) }

    /// Issues a server certificate signed by this CA, with a fresh EC P-256 key: CN = first hostname,
    /// subjectAltName = DNS:`hostnames` + IP:`ipAddresses`, extendedKeyUsage serverAuth, CA:FALSE.
    /// Pass `hostnames: ["wrong.example"], ipAddresses: []` for a certificate that must fail hostname checks.
    package func issueServerCertificate(
        hostnames: [String] = ["localhost"], ipAddresses: [String] = ["127.0.0.1"], commonName: String? = nil
    ) throws -> TestServerCertificate {
        try CertificateBuilder.serverCertificate(
            hostnames: hostnames, ipAddresses: ipAddresses, commonName: commonName, issuer: self)
    }

    /// Issues an APNs provider (client) certificate as Apple's look: CN `Apple Push Services: <bundleID>`, UID
    /// `bundleID`, extendedKeyUsage clientAuth, Apple's development and production marks, and the topic extension
    /// (1.2.840.113635.100.6.3.6) naming `bundleID` and its `.voip` and `.complication` variants; valid from an hour
    /// ago for `validDays` days.
    package func issueProviderCertificate(bundleID: String, validDays: Int32 = CertificateBuilder.validityDays) throws
        -> TestServerCertificate
    {
        try CertificateBuilder.providerCertificate(bundleID: bundleID, validDays: validDays, issuer: self)
    }

    /// A self-signed server certificate (its own issuer, trusted by no CA), e.g. to test rejection.
    package static func generateSelfSigned(
        hostnames: [String] = ["localhost"], ipAddresses: [String] = ["127.0.0.1"], commonName: String? = nil
    ) throws -> TestServerCertificate {
        try CertificateBuilder.serverCertificate(
            hostnames: hostnames, ipAddresses: ipAddresses, commonName: commonName, issuer: nil)
    }
}

/// X509 construction with OpenSSL. Every X509 returned is owned by the caller.
enum CertificateBuilder {
    static let validityStart: Int = -3600  // one hour ago, to tolerate clock skew
    static let validityDays: Int32 = 3650  // ten years

    static func providerCertificate(bundleID: String, validDays: Int32, issuer: TestCertificateAuthority) throws
        -> TestServerCertificate
    {
        let key = try ES256PrivateKey.generate()
        let topics = [bundleID, bundleID + ".voip", bundleID + ".complication"]
        let kinds = ["app", "voip", "complication"]
        // SEQUENCE { UTF8String topic, SEQUENCE { UTF8String kind } ... }, as Apple's topic extension holds.
        func tlv(_ tag: UInt8, _ content: [UInt8]) -> [UInt8] {
            precondition(content.count < 128, "short-form DER length")
            return [tag, UInt8(content.count)] + content
        }
        var elements: [UInt8] = []
        for (topic, kind) in zip(topics, kinds) {
            elements += tlv(0x0C, Array(topic.utf8)) + tlv(0x30, tlv(0x0C, Array(kind.utf8)))
        }
        let sequence = elements.count < 128 ? tlv(0x30, elements) : [0x30, 0x81, UInt8(elements.count)] + elements
        let hex = sequence.map { String(format: "%02X", $0) }.joined()
        let certificate = try build(
            subjectKey: key, commonName: "Apple Push Services: \(bundleID)", subjectUID: bundleID,
            issuer: (issuer.certificate, issuer.key), validDays: validDays,
            extensions: [
                (NID_basic_constraints, "critical,CA:FALSE"),
                (NID_key_usage, "critical,digitalSignature"),
                (NID_ext_key_usage, "clientAuth"),
                (NID_subject_key_identifier, "hash"),
                (NID_authority_key_identifier, "keyid:always"),
            ],
            namedExtensions: [
                (CertificateDetails.developmentOID, "DER:0500"),
                (CertificateDetails.productionOID, "DER:0500"),
                (CertificateDetails.topicsOID, "DER:" + hex),
            ])
        defer { X509_free(certificate) }  // Temporary: only its PEM text leaves this function.
        return TestServerCertificate(certificatePEM: pem(certificate), key: key)
    }

    static func serverCertificate(
        hostnames: [String], ipAddresses: [String], commonName: String?, issuer: TestCertificateAuthority?
    ) throws -> TestServerCertificate {
        guard !hostnames.isEmpty || !ipAddresses.isEmpty else {
            throw CryptoError(.invalidArgument, "a server certificate needs at least one hostname or IP address")
        }
        for name in hostnames + ipAddresses where name.isEmpty || name.contains(",") || name.contains(" ") {
            throw CryptoError(.invalidArgument, "invalid subjectAltName entry \"\(name)\" (empty, comma or space)")
        }
        let subjectAltName = (hostnames.map { "DNS:\($0)" } + ipAddresses.map { "IP:\($0)" }).joined(separator: ",")
        let key = try ES256PrivateKey.generate()
        var extensions: [(Int32, String)] = [
            (NID_basic_constraints, "critical,CA:FALSE"),
            (NID_key_usage, "critical,digitalSignature"),
            (NID_ext_key_usage, "serverAuth"),
            (NID_subject_key_identifier, "hash"),
        ]
        if issuer != nil { extensions.append((NID_authority_key_identifier, "keyid:always")) }
        extensions.append((NID_subject_alt_name, subjectAltName))
        let certificate = try build(
            subjectKey: key, commonName: commonName ?? hostnames.first ?? ipAddresses[0],
            issuer: issuer.map { ($0.certificate, $0.key) }, extensions: extensions)
        defer { X509_free(certificate) }  // Temporary: only its PEM text leaves this function.
        return TestServerCertificate(certificatePEM: pem(certificate), key: key)
    }

    /// Builds and signs an X509v3 certificate for `subjectKey`. `issuer` nil means self-signed.
    /// Returns an owned X509 (the caller frees it).
    static func build(
        subjectKey: ES256PrivateKey, commonName: String, subjectUID: String? = nil,
        issuer: (certificate: OpaquePointer, key: ES256PrivateKey)?, validDays: Int32 = validityDays,
        extensions: [(nid: Int32, value: String)], namedExtensions: [(name: String, value: String)] = []
    ) throws -> OpaquePointer {
        OpenSSLErrorQueue.clear()
        // Owned until returned; freed here on any failure.
        guard let certificate = X509_new() else {
            throw CryptoError(.internalFailure, "X509_new failed", includeOpenSSLErrors: true)
        }
        do {
            try fill(
                certificate, subjectKey: subjectKey, commonName: commonName, subjectUID: subjectUID, issuer: issuer,
                validDays: validDays, extensions: extensions, namedExtensions: namedExtensions)
        } catch {
            X509_free(certificate)
            throw error
        }
        return certificate
    }

    private static func fill(
        _ certificate: OpaquePointer, subjectKey: ES256PrivateKey, commonName: String, subjectUID: String?,
        issuer: (certificate: OpaquePointer, key: ES256PrivateKey)?, validDays: Int32,
        extensions: [(nid: Int32, value: String)], namedExtensions: [(name: String, value: String)]
    ) throws {
        func check(_ ok: Bool, _ step: String) throws {
            if !ok {
                throw CryptoError(
                    .certificateFailed, "building certificate \"\(commonName)\": \(step) failed",
                    includeOpenSSLErrors: true)
            }
        }
        try check(X509_set_version(certificate, 2) == 1, "X509_set_version")  // 2 means X509v3

        // Random positive 128-bit serial (top bit cleared, never zero).
        var serialBytes = [UInt8](repeating: 0, count: 16)
        try check(RAND_bytes(&serialBytes, Int32(serialBytes.count)) == 1, "RAND_bytes")
        serialBytes[0] = (serialBytes[0] & 0x7F) | 0x40
        // Temporary: freed by defer.
        guard let serial = BN_bin2bn(serialBytes, Int32(serialBytes.count), nil) else {
            try check(false, "BN_bin2bn")
            return
        }
        defer { BN_free(serial) }
        // X509_get_serialNumber returns the certificate's own ASN1_INTEGER (borrowed); BN_to_ASN1_INTEGER fills it.
        try check(BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(certificate)) != nil, "BN_to_ASN1_INTEGER")

        // Borrowed: the certificate's own time fields.
        try check(X509_gmtime_adj(CFanoutShims_X509_getm_notBefore(certificate), validityStart) != nil, "notBefore")
        try check(
            X509_time_adj_ex(CFanoutShims_X509_getm_notAfter(certificate), validDays, 0, nil) != nil, "notAfter")

        // Borrowed: the certificate's own subject name.
        let subject = X509_get_subject_name(certificate)
        try check(
            X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_UTF8, commonName, -1, -1, 0) == 1, "subject CN")
        if let subjectUID {
            try check(
                X509_NAME_add_entry_by_txt(subject, "UID", MBSTRING_UTF8, subjectUID, -1, -1, 0) == 1, "subject UID")
        }
        let issuerName = issuer.map { X509_get_subject_name($0.certificate) } ?? subject
        try check(X509_set_issuer_name(certificate, issuerName) == 1, "X509_set_issuer_name")  // copies the name
        try check(X509_set_pubkey(certificate, subjectKey.pkey) == 1, "X509_set_pubkey")  // takes its own reference

        // The context only borrows the two certificates for the duration of the loop.
        var context = X509V3_CTX()
        X509V3_set_ctx(&context, issuer?.certificate ?? certificate, certificate, nil, nil, 0)
        for (nid, value) in extensions {
            // Temporary: X509_add_ext copies it; freed by defer.
            guard let ext = X509V3_EXT_conf_nid(nil, &context, nid, value) else {
                try check(false, "extension \(String(cString: OBJ_nid2sn(nid))) = \(value)")
                return
            }
            defer { X509_EXTENSION_free(ext) }
            try check(X509_add_ext(certificate, ext, -1) == 1, "X509_add_ext")
        }
        for (name, value) in namedExtensions {
            // Temporary: X509_add_ext copies it; freed by defer. An OID name with a `DER:` value is a generic
            // extension.
            guard let ext = X509V3_EXT_conf(nil, &context, name, value) else {
                try check(false, "extension \(name) = \(value)")
                return
            }
            defer { X509_EXTENSION_free(ext) }
            try check(X509_add_ext(certificate, ext, -1) == 1, "X509_add_ext")
        }
        let signingKey = issuer?.key ?? subjectKey
        try check(X509_sign(certificate, signingKey.pkey, EVP_sha256()) > 0, "X509_sign")
    }

    /// The certificate as PEM.
    static func pem(_ certificate: OpaquePointer) -> String {
        guard let bytes = OpenSSLBIO.collect({ bio in PEM_write_bio_X509(bio, certificate) == 1 }) else {
            preconditionFailure("PEM_write_bio_X509 failed: \(OpenSSLErrorQueue.drain() ?? "no detail")")
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
