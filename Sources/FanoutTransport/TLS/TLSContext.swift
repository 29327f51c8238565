import CFanoutShims
import COpenSSL
import Foundation

/// How a client checks the server: against the system trust store, or against a given CA file.
/// Verification (chain and host name) is always on; a test CA replaces the trust store, it never
/// turns checking off.
package struct TLSClientConfiguration: Sendable {
    /// PEM file of CA certificates to trust instead of the system store (`--ca-file`).
    package var caFile: String?
    /// Milliseconds the TLS handshake may take.
    package var handshakeTimeoutMilliseconds: UInt64
    /// The certificate and key the client authenticates with (APNs certificate-based auth); nil: none.
    package var identity: TLSClientIdentity?

    package init(
        caFile: String? = nil, handshakeTimeoutMilliseconds: UInt64 = 10_000, identity: TLSClientIdentity? = nil
    ) {
        self.caFile = caFile
        self.handshakeTimeoutMilliseconds = handshakeTimeoutMilliseconds
        self.identity = identity
    }
}

/// A server's certificate and key, and which ALPN protocols it offers (mock-apns, tests).
package struct TLSServerConfiguration: Sendable {
    package var certificateFile: String
    package var privateKeyFile: String
    /// ALPN protocols the server selects from, in preference order. `["h2"]` for mock-apns; tests use
    /// `["http/1.1"]` to play a server that offers no h2.
    package var alpnProtocols: [String]
    /// PEM CA certificates that client certificates are checked against (mock-apns `--client-ca`). A client that
    /// presents a certificate they do not verify fails the handshake; one that presents none is let through (the
    /// server decides what it may do). Nil: no client certificate is asked for.
    package var clientCAFile: String?

    package init(
        certificateFile: String, privateKeyFile: String, alpnProtocols: [String] = ["h2"], clientCAFile: String? = nil
    ) {
        self.certificateFile = certificateFile
        self.privateKeyFile = privateKeyFile
        self.alpnProtocols = alpnProtocols
        self.clientCAFile = clientCAFile
    }
}

/// An OpenSSL `SSL_CTX`, shared by every connection of one configuration (SSL_CTX is thread-safe
/// once configured).
package final class TLSContext: @unchecked Sendable {
    /// Owned: freed in deinit.
    package let context: OpaquePointer
    package let isServer: Bool
    /// ALPN protocols in wire format (length-prefixed), kept alive for the select callback.
    /// Owned: freed in deinit.
    private let alpnWire: UnsafeMutableBufferPointer<UInt8>

    /// A client context: TLS 1.2+, peer verification on, ALPN "h2".
    package init(client configuration: TLSClientConfiguration) throws(TransportError) {
        guard let context = SSL_CTX_new(TLS_client_method()) else {
            throw TransportError(.tlsConfiguration, "cannot create TLS context: \(tlsErrorQueueDescription())")
        }
        self.context = context
        isServer = false
        alpnWire = Self.wireFormat(["h2"])
        _ = CFanoutShims_SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION)
        // A write TLS could not take yet is retried from SecureChannel's backlog, not from the
        // buffer first handed to SSL_write.
        _ = CFanoutShims_SSL_CTX_set_mode(context, Int(SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER))
        SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
        if let caFile = configuration.caFile {
            guard FileManager.default.isReadableFile(atPath: caFile) else {
                throw TransportError(.tlsConfiguration, "CA file \(caFile) cannot be read")
            }
            guard SSL_CTX_load_verify_locations(context, caFile, nil) == 1 else {
                throw TransportError(
                    .tlsConfiguration,
                    "CA file \(caFile) holds no usable PEM certificate: \(tlsErrorQueueDescription())")
            }
        } else {
            SSL_CTX_set_default_verify_paths(context)
        }
        if let identity = configuration.identity {
            // Each call takes a reference of its own; the identity keeps owning its objects.
            guard SSL_CTX_use_certificate(context, identity.certificate) == 1,
                SSL_CTX_use_PrivateKey(context, identity.privateKey) == 1,
                SSL_CTX_check_private_key(context) == 1,
                identity.chainCertificates.allSatisfy({ CFanoutShims_SSL_CTX_add1_chain_cert(context, $0) == 1 })
            else {
                throw TransportError(
                    .tlsConfiguration, "client certificate is not usable: \(tlsErrorQueueDescription())")
            }
        }
        let rc = SSL_CTX_set_alpn_protos(context, alpnWire.baseAddress, UInt32(alpnWire.count))
        precondition(rc == 0, "SSL_CTX_set_alpn_protos failed")
    }

    /// A server context with a certificate chain and key, offering `alpnProtocols`.
    package init(server configuration: TLSServerConfiguration) throws(TransportError) {
        guard let context = SSL_CTX_new(TLS_server_method()) else {
            throw TransportError(.tlsConfiguration, "cannot create TLS context: \(tlsErrorQueueDescription())")
        }
        self.context = context
        isServer = true
        alpnWire = Self.wireFormat(configuration.alpnProtocols)
        _ = CFanoutShims_SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION)
        // A write TLS could not take yet is retried from SecureChannel's backlog, not from the
        // buffer first handed to SSL_write.
        _ = CFanoutShims_SSL_CTX_set_mode(context, Int(SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER))
        guard SSL_CTX_use_certificate_chain_file(context, configuration.certificateFile) == 1 else {
            throw TransportError(
                .tlsConfiguration,
                "certificate file \(configuration.certificateFile) is not usable: \(tlsErrorQueueDescription())")
        }
        guard SSL_CTX_use_PrivateKey_file(context, configuration.privateKeyFile, SSL_FILETYPE_PEM) == 1,
            SSL_CTX_check_private_key(context) == 1
        else {
            throw TransportError(
                .tlsConfiguration,
                "private key file \(configuration.privateKeyFile) is not usable or does not match the certificate")
        }
        if let clientCAFile = configuration.clientCAFile {
            // Owned by the context once set (SSL_CTX_set_client_CA_list takes the list).
            guard SSL_CTX_load_verify_locations(context, clientCAFile, nil) == 1,
                let names = SSL_load_client_CA_file(clientCAFile)
            else {
                throw TransportError(
                    .tlsConfiguration,
                    "client CA file \(clientCAFile) holds no usable PEM certificate: \(tlsErrorQueueDescription())")
            }
            SSL_CTX_set_client_CA_list(context, names)
            SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
        }
        // The callback reads alpnWire through this unretained pointer; the context (and so the
        // callback) never outlives self, which frees it in deinit.
        SSL_CTX_set_alpn_select_cb(context, tlsALPNSelectCallback, Unmanaged.passUnretained(self).toOpaque())
    }

    deinit {
        SSL_CTX_free(context)
        alpnWire.deallocate()
    }

    private static func wireFormat(_ protocols: [String]) -> UnsafeMutableBufferPointer<UInt8> {
        var bytes: [UInt8] = []
        for name in protocols {
            bytes.append(UInt8(name.utf8.count))
            bytes.append(contentsOf: name.utf8)
        }
        let buffer = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: max(bytes.count, 1))
        _ = buffer.initialize(from: bytes)
        return UnsafeMutableBufferPointer(rebasing: buffer[0..<bytes.count])
    }

    fileprivate func selectALPN(
        _ out: UnsafeMutablePointer<UnsafePointer<UInt8>?>?, _ outLength: UnsafeMutablePointer<UInt8>?,
        _ offered: UnsafePointer<UInt8>?, _ offeredLength: UInt32
    ) -> Int32 {
        var selected: UnsafeMutablePointer<UInt8>?
        var selectedLength: UInt8 = 0
        let rc = SSL_select_next_proto(
            &selected, &selectedLength, alpnWire.baseAddress, UInt32(alpnWire.count), offered, offeredLength)
        guard rc == OPENSSL_NPN_NEGOTIATED, let selected else { return SSL_TLSEXT_ERR_NOACK }
        out?.pointee = UnsafePointer(selected)
        outLength?.pointee = selectedLength
        return SSL_TLSEXT_ERR_OK
    }
}

private func tlsALPNSelectCallback(
    _ ssl: OpaquePointer?, _ out: UnsafeMutablePointer<UnsafePointer<UInt8>?>?,
    _ outLength: UnsafeMutablePointer<UInt8>?, _ offered: UnsafePointer<UInt8>?, _ offeredLength: UInt32,
    _ arg: UnsafeMutableRawPointer?
) -> Int32 {
    guard let arg else { return SSL_TLSEXT_ERR_NOACK }
    return Unmanaged<TLSContext>.fromOpaque(arg).takeUnretainedValue().selectALPN(
        out, outLength, offered, offeredLength)
}

/// OpenSSL's error queue as one line, and the queue cleared. Holds library error strings only.
package func tlsErrorQueueDescription() -> String {
    var parts: [String] = []
    var buffer = [CChar](repeating: 0, count: 256)
    while true {
        let code = ERR_get_error()
        if code == 0 { break }
        ERR_error_string_n(code, &buffer, buffer.count)
        let length = buffer.firstIndex(of: 0) ?? buffer.count
        parts.append(String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self))
    }
    return parts.isEmpty ? "no detail from OpenSSL" : parts.joined(separator: "; ")
}

/// A client TLS context that many connections share (one `SSL_CTX`, one trust store load).
package final class TLSClientContext: Sendable {
    package let context: TLSContext
    package let configuration: TLSClientConfiguration

    /// Loads the trust store (the CA file, or the system's). Throws `.tlsConfiguration` with a clear message.
    package init(_ configuration: TLSClientConfiguration) throws(TransportError) {
        self.configuration = configuration
        context = try TLSContext(client: configuration)
    }
}

/// A server TLS context shared by every accepted connection.
package final class TLSServerContext: Sendable {
    package let context: TLSContext

    package init(_ configuration: TLSServerConfiguration) throws(TransportError) {
        context = try TLSContext(server: configuration)
    }
}
