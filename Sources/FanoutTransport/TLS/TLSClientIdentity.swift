import CFanoutShims
import COpenSSL
import Foundation

/// What a provider certificate says about itself: whom it names, when it expires, which APNs topics and
/// environments it covers. Read from the certificate once; holds no key material.
package struct CertificateDetails: Sendable, Hashable {
    /// The subject's common name (Apple's: `Apple Push Services: com.example.app`); empty when it has none.
    package var commonName: String
    /// Validity, in seconds since 1970 (UTC).
    package var notBefore: Int64
    package var notAfter: Int64
    /// The APNs topics it covers: the topic extension's strings (Apple OID 1.2.840.113635.100.6.3.6), else the
    /// subject's UID (the bundle id, in certificates that predate the extension). Empty: it names none.
    package var topics: [String]
    /// Whether it carries Apple's development (1.2.840.113635.100.6.3.1) or production (…6.3.2) push extension.
    package var development: Bool
    package var production: Bool

    package init(
        commonName: String, notBefore: Int64, notAfter: Int64, topics: [String], development: Bool, production: Bool
    ) {
        self.commonName = commonName
        self.notBefore = notBefore
        self.notAfter = notAfter
        self.topics = topics
        self.development = development
        self.production = production
    }

    /// Apple's OIDs for push certificates.
    package static let topicsOID = "1.2.840.113635.100.6.3.6"
    package static let developmentOID = "1.2.840.113635.100.6.3.1"
    package static let productionOID = "1.2.840.113635.100.6.3.2"

    /// Reads `certificate` (borrowed: an `X509 *` the caller keeps owning).
    package init(certificate: OpaquePointer) {
        // Borrowed: the certificate's own subject name.
        let subject = X509_get_subject_name(certificate)
        commonName = Self.nameEntry(subject, nid: NID_commonName) ?? ""
        // Borrowed: the certificate's own time fields.
        notBefore = Self.seconds(X509_get0_notBefore(certificate))
        notAfter = Self.seconds(X509_get0_notAfter(certificate))
        development = Self.extensionValue(certificate, oid: Self.developmentOID) != nil
        production = Self.extensionValue(certificate, oid: Self.productionOID) != nil
        if let value = Self.extensionValue(certificate, oid: Self.topicsOID) {
            topics = Self.topics(fromExtensionValue: value)
        } else if let uid = Self.nameEntry(subject, nid: NID_userId) {
            topics = [uid]
        } else {
            topics = []
        }
    }

    /// Whether a request for `topic` may go out on this certificate: it names the topic, or it names no topic at
    /// all (not an Apple push certificate: nothing to check against).
    package func covers(topic: String) -> Bool { Self.covers(topic: topic, topics: topics) }

    /// `covers(topic:)` for a list of topics.
    package static func covers(topic: String, topics: [String]) -> Bool { topics.isEmpty || topics.contains(topic) }

    /// Topic suffixes of the push types APNs takes with token authentication only (Live Activities sent to device
    /// tokens, location queries): no certificate covers them.
    package static let tokenOnlySuffixes = [".push-type.liveactivity", ".location-query"]

    /// The strings of the topic extension's value: a DER SEQUENCE whose UTF8String (or other string) elements are
    /// topics, the bundle id and its suffixed variants; elements of other types (the nested SEQUENCEs naming each
    /// topic's kind) are skipped. Malformed DER yields the topics read before the fault.
    package static func topics(fromExtensionValue der: [UInt8]) -> [String] {
        var outer = DERReader(der[...])
        guard let sequence = outer.next(), sequence.tag == 0x30 else { return [] }
        var inner = DERReader(sequence.content)
        var topics: [String] = []
        while let element = inner.next() {
            switch element.tag {
            case 0x0C, 0x13, 0x16:  // UTF8String, PrintableString, IA5String
                topics.append(String(decoding: element.content, as: UTF8.self))
            default:
                continue
            }
        }
        return topics
    }

    /// The first entry of `nid` in `name` (borrowed) as UTF-8, or nil.
    private static func nameEntry(_ name: OpaquePointer?, nid: Int32) -> String? {
        guard let name else { return nil }
        let index = X509_NAME_get_index_by_NID(name, nid, -1)
        // Borrowed: the name's own entry and its data.
        guard index >= 0, let entry = X509_NAME_get_entry(name, index),
            let data = X509_NAME_ENTRY_get_data(entry)
        else { return nil }
        // Owned: allocated by ASN1_STRING_to_UTF8, freed by defer.
        var utf8: UnsafeMutablePointer<UInt8>?
        let length = ASN1_STRING_to_UTF8(&utf8, data)
        guard length >= 0, let utf8 else { return nil }
        defer { CFanoutShims_OPENSSL_free(utf8) }
        return String(decoding: UnsafeBufferPointer(start: utf8, count: Int(length)), as: UTF8.self)
    }

    /// An ASN1_TIME (borrowed) as seconds since 1970, or 0 when it cannot be read.
    private static func seconds(_ time: UnsafePointer<ASN1_TIME>?) -> Int64 {
        guard let time else { return 0 }
        var parts = tm()
        guard ASN1_TIME_to_tm(time, &parts) == 1 else { return 0 }
        return Int64(timegm(&parts))
    }

    /// The DER value (the extension's OCTET STRING contents) of the extension `oid` of `certificate` (borrowed).
    private static func extensionValue(_ certificate: OpaquePointer, oid: String) -> [UInt8]? {
        // Owned: freed by defer.
        guard let object = OBJ_txt2obj(oid, 1) else { return nil }
        defer { ASN1_OBJECT_free(object) }
        let index = X509_get_ext_by_OBJ(certificate, object, -1)
        // Borrowed: the certificate's own extension and its data.
        guard index >= 0, let ext = X509_get_ext(certificate, index), let data = X509_EXTENSION_get_data(ext) else {
            return nil
        }
        let length = Int(ASN1_STRING_length(data))
        guard length > 0, let bytes = ASN1_STRING_get0_data(data) else { return [] }
        return Array(UnsafeBufferPointer(start: bytes, count: length))
    }
}

/// A minimal reader of DER tag-length-value elements (single-byte tags, definite lengths), enough for the topic
/// extension.
private struct DERReader {
    var bytes: ArraySlice<UInt8>

    init(_ bytes: ArraySlice<UInt8>) { self.bytes = bytes }

    /// The next element, or nil at the end or at a malformed element.
    mutating func next() -> (tag: UInt8, content: ArraySlice<UInt8>)? {
        guard bytes.count >= 2 else { return nil }
        var index = bytes.startIndex
        let tag = bytes[index]
        index += 1
        var length = Int(bytes[index])
        index += 1
        if length & 0x80 != 0 {
            let count = length & 0x7F
            guard count >= 1, count <= 4, bytes.endIndex - index >= count else { return nil }
            length = 0
            for _ in 0..<count {
                length = length << 8 | Int(bytes[index])
                index += 1
            }
        }
        guard bytes.endIndex - index >= length else { return nil }
        let content = bytes[index..<(index + length)]
        bytes = bytes[(index + length)...]
        return (tag, content)
    }
}

/// A client certificate, its private key and the intermediate certificates to present with it: what a TLS client
/// authenticates with (APNs certificate-based provider authentication).
///
/// Immutable after init; OpenSSL only reads the objects (SSL_CTX_use_* take references of their own), hence
/// `@unchecked Sendable`. Errors name the file and the cause, never the password or key bytes.
package final class TLSClientIdentity: @unchecked Sendable {
    /// Owned: freed in deinit (X509_free).
    let certificate: OpaquePointer
    /// Owned: freed in deinit (EVP_PKEY_free).
    let privateKey: OpaquePointer
    /// Owned, with every certificate in it: freed together in deinit (sk_X509_pop_free); nil when there is none.
    let chain: OpaquePointer?
    /// What the certificate says about itself.
    package let details: CertificateDetails

    /// Takes ownership of the three; frees them all (and throws) when the key does not match the certificate.
    private init(
        owningCertificate certificate: OpaquePointer, privateKey: OpaquePointer, chain: OpaquePointer?,
        source: String
    ) throws {
        guard X509_check_private_key(certificate, privateKey) == 1 else {
            X509_free(certificate)
            EVP_PKEY_free(privateKey)
            if let chain { CFanoutShims_sk_X509_pop_free(chain) }
            throw CryptoError(
                .malformedCertificate, "the private key in \(source) does not belong to its certificate", path: source)
        }
        self.certificate = certificate
        self.privateKey = privateKey
        self.chain = chain
        details = CertificateDetails(certificate: certificate)
        OpenSSLErrorQueue.clear()
    }

    deinit {
        X509_free(certificate)
        EVP_PKEY_free(privateKey)
        if let chain { CFanoutShims_sk_X509_pop_free(chain) }
    }

    /// The intermediate certificates (borrowed from `chain`, valid while self lives).
    var chainCertificates: [OpaquePointer] {
        guard let chain else { return [] }
        return (0..<CFanoutShims_sk_X509_num(chain)).compactMap { CFanoutShims_sk_X509_value(chain, $0) }
    }

    /// Loads a PKCS#12 file (`.p12`, as Keychain Access exports a push certificate) opened with `password`.
    /// - Throws: `CryptoError` `.fileNotFound` / `.fileUnreadable` for the file, `.wrongPassword` when its
    ///   integrity check fails with `password`, `.malformedCertificate` when it is not PKCS#12 or holds no
    ///   certificate and key.
    package static func pkcs12(path: String, password: String) throws -> TLSClientIdentity {
        let bytes = try CryptoFile.read(path, what: "certificate")
        OpenSSLErrorQueue.clear()
        // Owned: freed by defer.
        let parsed = try OpenSSLBIO.withReadOnly(bytes) { bio in d2i_PKCS12_bio(bio, nil) }
        guard let p12 = parsed else {
            throw CryptoError(
                .malformedCertificate, "certificate file \(path) is not a PKCS#12 (.p12) file", path: path)
        }
        defer { PKCS12_free(p12) }
        // An empty password may have been encoded either as "" or as none at all; try both.
        let passwords: [String?] = password.isEmpty ? ["", nil] : [password]
        var opening: String??
        if PKCS12_mac_present(p12) == 1 {
            opening = passwords.first { candidate in
                candidate.withOptionalCString { PKCS12_verify_mac(p12, $0, -1) == 1 }
            }
            guard opening != nil else {
                throw CryptoError(.wrongPassword, "wrong password for certificate file \(path)", path: path)
            }
        } else {
            opening = .some(passwords[0])
        }
        var key: OpaquePointer?
        var certificate: OpaquePointer?
        var chain: OpaquePointer?
        func parse() -> Bool {
            OpenSSLErrorQueue.clear()
            return (opening ?? nil).withOptionalCString { PKCS12_parse(p12, $0, &key, &certificate, &chain) == 1 }
        }
        // Files exported with older algorithms (RC2, 3DES: macOS Keychain Access before macOS 14) need OpenSSL 3's
        // legacy provider; it is loaded only for such a file, beside the default provider.
        if !parse() {
            if OSSL_PROVIDER_available(nil, "legacy") == 0 {
                _ = OSSL_PROVIDER_try_load(nil, "legacy", 1)  // Never unloaded: kept for the process's life.
            }
            guard parse() else {
                throw CryptoError(
                    .malformedCertificate, "certificate file \(path) cannot be opened", path: path,
                    includeOpenSSLErrors: true)
            }
        }
        // Owned from here: PKCS12_parse allocated them for the caller.
        guard let certificate, let key else {
            if let certificate { X509_free(certificate) }
            if let key { EVP_PKEY_free(key) }
            if let chain { CFanoutShims_sk_X509_pop_free(chain) }
            throw CryptoError(
                .malformedCertificate, "certificate file \(path) holds no certificate with its private key",
                path: path)
        }
        return try TLSClientIdentity(owningCertificate: certificate, privateKey: key, chain: chain, source: path)
    }

    /// Loads a PEM certificate (followed by any intermediates) from `certificatePath` and its unencrypted PEM
    /// private key from `keyPath` (which may be the same file).
    /// - Throws: `CryptoError` naming the file: not found, unreadable, no PEM certificate, no (or an encrypted)
    ///   private key, or a key that does not belong to the certificate.
    package static func pem(certificatePath: String, keyPath: String) throws -> TLSClientIdentity {
        let certificateBytes = try CryptoFile.read(certificatePath, what: "certificate")
        var keyBytes = try CryptoFile.read(keyPath, what: "certificate key")
        defer { keyBytes.withUnsafeMutableBufferPointer { $0.update(repeating: 0) } }  // Best-effort wipe.
        OpenSSLErrorQueue.clear()
        let (certificate, chain) = try OpenSSLBIO.withReadOnly(certificateBytes) {
            bio -> (OpaquePointer?, OpaquePointer?) in
            // Owned: returned to the caller, or freed below.
            guard let leaf = PEM_read_bio_X509(bio, nil, refusePassphrase, nil) else { return (nil, nil) }
            // Owned: the stack and what it holds, returned to the caller.
            var stack: OpaquePointer?
            while let next = PEM_read_bio_X509(bio, nil, refusePassphrase, nil) {
                if stack == nil { stack = OPENSSL_sk_new_null() }
                guard let stack, OPENSSL_sk_push(stack, UnsafeRawPointer(next)) > 0 else {
                    X509_free(next)
                    break
                }
            }
            OpenSSLErrorQueue.clear()  // the end of the file, read as a failed PEM read
            return (leaf, stack)
        }
        guard let certificate else {
            throw CryptoError(
                .malformedCertificate, "certificate file \(certificatePath) holds no PEM certificate",
                path: certificatePath)
        }
        // Owned: handed to the identity, or freed on failure.
        let key = try? OpenSSLBIO.withReadOnly(keyBytes) { bio in
            PEM_read_bio_PrivateKey(bio, nil, refusePassphrase, nil)
        }
        guard let key = key ?? nil else {
            X509_free(certificate)
            if let chain { CFanoutShims_sk_X509_pop_free(chain) }
            let encrypted = PEMText.contains(keyBytes, PEMText.encryptedPrivateKeyHeader)
            throw CryptoError(
                .malformedKey,
                encrypted
                    ? "certificate key file \(keyPath) is encrypted; give it unencrypted (mode 0600)"
                    : "certificate key file \(keyPath) holds no PEM private key", path: keyPath)
        }
        return try TLSClientIdentity(
            owningCertificate: certificate, privateKey: key, chain: chain,
            source: keyPath == certificatePath ? certificatePath : "\(keyPath) and \(certificatePath)")
    }
}

/// A PEM passphrase callback that gives none, so that an encrypted key fails instead of OpenSSL prompting on the
/// terminal.
private let refusePassphrase:
    @convention(c) (
        UnsafeMutablePointer<CChar>?, Int32, Int32, UnsafeMutableRawPointer?
    ) -> Int32 = { _, _, _, _ in -1 }

extension Optional where Wrapped == String {
    /// Runs `body` with the string as a C string, or with nil.
    fileprivate func withOptionalCString<Result>(_ body: (UnsafePointer<CChar>?) -> Result) -> Result {
        guard let self else { return body(nil) }
        return self.withCString(body)
    }
}
