import CFanoutShims
import COpenSSL
import Foundation

/// One TLS session over two OpenSSL memory BIOs: ciphertext in from the socket, ciphertext out to
/// the socket, plaintext in and out for HTTP/2. It does no I/O itself (node's and swift-nio-ssl's
/// model), so the loop owns every socket call. Confined to its connection's loop.
package final class TLSEngine {
    package enum HandshakeProgress {
        case inProgress
        case done
        case failed(TransportError)
    }

    /// Owned: freed in deinit with `SSL_free`, which also frees both BIOs.
    private let ssl: OpaquePointer
    /// Owned by `ssl` (SSL_set_bio transferred it): ciphertext from the network.
    private let networkIn: OpaquePointer
    /// Owned by `ssl`: ciphertext for the network.
    private let networkOut: OpaquePointer
    private let host: String
    private let context: TLSContext
    private(set) var handshakeDone = false

    /// A client session for `host` (SNI and certificate name check), or a server session.
    package init(context: TLSContext, host: String = "") throws(TransportError) {
        guard let ssl = SSL_new(context.context) else {
            throw TransportError(.tlsConfiguration, "cannot create TLS session: \(tlsErrorQueueDescription())")
        }
        self.ssl = ssl
        self.context = context
        self.host = host
        guard let input = BIO_new(BIO_s_mem()), let output = BIO_new(BIO_s_mem()) else {
            SSL_free(ssl)
            throw TransportError(.tlsConfiguration, "cannot create TLS buffers")
        }
        // An empty input BIO means "wait for more", not end of stream.
        _ = CFanoutShims_BIO_set_mem_eof_return(input, -1)
        _ = CFanoutShims_BIO_set_mem_eof_return(output, -1)
        SSL_set_bio(ssl, input, output)
        networkIn = input
        networkOut = output
        if context.isServer {
            SSL_set_accept_state(ssl)
        } else {
            SSL_set_connect_state(ssl)
            if Self.isIPAddress(host) {
                // Certificates name IP addresses in iPAddress SANs; no SNI for literals (RFC 6066).
                X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host)
            } else {
                _ = CFanoutShims_SSL_set_tlsext_host_name(ssl, host)
                SSL_set1_host(ssl, host)
            }
        }
    }

    deinit {
        ciphertextScratch?.deallocate()
        SSL_free(ssl)
    }

    package static func isIPAddress(_ host: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
    }

    /// Hands ciphertext from the socket to TLS.
    package func feed(_ ciphertext: UnsafeRawBufferPointer) {
        guard let base = ciphertext.baseAddress, ciphertext.count > 0 else { return }
        let written = BIO_write(networkIn, base, Int32(ciphertext.count))
        assert(written == Int32(ciphertext.count), "memory BIO refused input")
    }

    /// Advances the handshake with what has been fed so far.
    package func advanceHandshake() -> HandshakeProgress {
        if handshakeDone { return .done }
        ERR_clear_error()
        let rc = SSL_do_handshake(ssl)
        if rc == 1 {
            handshakeDone = true
            if !context.isServer, negotiatedProtocol() != "h2" {
                return .failed(TransportError(.tlsNoH2, "TLS to \(host): server did not offer HTTP/2 (ALPN h2)"))
            }
            return .done
        }
        let error = SSL_get_error(ssl, rc)
        if error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE { return .inProgress }
        return .failed(handshakeError())
    }

    /// What the peer's certificate says, or nil when it presented none. A server that asks for client
    /// certificates (`clientCAFile`) has verified it before the handshake finished.
    package func peerCertificate() -> CertificateDetails? {
        // Owned: a reference of our own, freed by defer.
        guard let certificate = SSL_get1_peer_certificate(ssl) else { return nil }
        defer { X509_free(certificate) }
        return CertificateDetails(certificate: certificate)
    }

    /// The ALPN protocol chosen, or nil.
    package func negotiatedProtocol() -> String? {
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length > 0 else { return nil }
        return String(decoding: UnsafeBufferPointer(start: data, count: Int(length)), as: UTF8.self)
    }

    private func handshakeError() -> TransportError {
        let queue = tlsErrorQueueDescription()
        let verify = SSL_get_verify_result(ssl)
        if !context.isServer, verify != X509_V_OK {
            let detail = String(cString: X509_verify_cert_error_string(verify))
            switch Int32(verify) {
            case X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH:
                return TransportError(
                    .tlsHostnameMismatch,
                    "TLS to \(host): the server's certificate is not valid for \(host) (\(detail))")
            case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY, X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT,
                X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT, X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN,
                X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE, X509_V_ERR_CERT_UNTRUSTED:
                return TransportError(
                    .tlsUnknownCA, "TLS to \(host): the server's certificate is signed by an unknown CA (\(detail))")
            default:
                return TransportError(
                    .tlsCertificateInvalid, "TLS to \(host): the server's certificate was refused (\(detail))")
            }
        }
        let who = context.isServer ? "TLS accept" : "TLS to \(host)"
        return TransportError(.tlsHandshakeFailed, "\(who): handshake failed (\(queue))")
    }

    /// Decrypts into `buffer`. Returns the byte count, 0 when nothing is ready, nil when the peer
    /// closed TLS or the session broke.
    package func readPlaintext(into buffer: UnsafeMutableRawBufferPointer) -> Int? {
        let rc = SSL_read(ssl, buffer.baseAddress, Int32(buffer.count))
        if rc > 0 { return Int(rc) }
        let error = SSL_get_error(ssl, rc)
        if error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE { return 0 }
        if error == SSL_ERROR_SSL {
            readFailure = "TLS to \(host.isEmpty ? "the peer" : host) ended: \(tlsErrorQueueDescription())"
        }
        ERR_clear_error()
        return nil
    }

    /// Why the last `readPlaintext` returned nil when TLS failed (an alert from the peer, with OpenSSL's words for
    /// it) rather than the peer closing cleanly; nil otherwise.
    package private(set) var readFailure: String?

    /// What became of plaintext handed to `writePlaintext`.
    package enum WriteOutcome: Equatable {
        /// All of it was encrypted into the output BIO.
        case written
        /// TLS needs to read (or write) first, as in a renegotiation: none of it was taken; hand the
        /// same bytes again, possibly with more after them, once more input has been fed.
        case retryLater
        /// The session is broken (or closed); nothing more can be sent.
        case failed(TransportError)
    }

    /// Encrypts `plaintext` into the output BIO. Memory BIOs grow, so it is all taken unless TLS must
    /// first read (`retryLater`) or the session failed.
    package func writePlaintext(_ plaintext: UnsafeRawBufferPointer) -> WriteOutcome {
        guard let base = plaintext.baseAddress, plaintext.count > 0 else { return .written }
        ERR_clear_error()
        let rc = SSL_write(ssl, base, Int32(plaintext.count))
        if rc > 0 {
            // Without SSL_MODE_ENABLE_PARTIAL_WRITE, success means all of it.
            assert(rc == Int32(plaintext.count), "partial SSL_write")
            return .written
        }
        switch SSL_get_error(ssl, rc) {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
            return .retryLater
        case SSL_ERROR_ZERO_RETURN:
            return .failed(TransportError(.tlsWriteFailed, "TLS write failed: the TLS session was closed"))
        default:
            return .failed(TransportError(.tlsWriteFailed, "TLS write failed: \(tlsErrorQueueDescription())"))
        }
    }

    /// Ciphertext waiting for the socket.
    package var pendingCiphertext: Int { CFanoutShims_BIO_pending(networkOut) }

    /// Owned: allocated on first use, grown as needed, freed in deinit. Where `withCiphertext` reads the output BIO, so
    /// a flush allocates nothing. (Lending the BIO's own memory and resetting it would be dearer: a memory BIO's reset
    /// clears its whole capacity, 5.5% of the sender's loop thread.)
    private var ciphertextScratch: UnsafeMutableRawBufferPointer?

    /// Lends `body` all waiting ciphertext, read out of the output BIO into a reused buffer: `body` must write
    /// or copy the bytes before it returns. Does nothing when there is none.
    package func withCiphertext(_ body: (UnsafeRawBufferPointer) -> Void) {
        let pending = pendingCiphertext
        guard pending > 0 else { return }
        if (ciphertextScratch?.count ?? 0) < pending {
            ciphertextScratch?.deallocate()
            ciphertextScratch = .allocate(byteCount: max(pending, 64 * 1024), alignment: 16)
        }
        let scratch = ciphertextScratch!
        let read = BIO_read(networkOut, scratch.baseAddress, Int32(pending))
        assert(read == Int32(pending))
        body(UnsafeRawBufferPointer(rebasing: scratch[0..<Int(max(read, 0))]))
    }

    /// Queues a TLS close_notify.
    package func shutdown() {
        if handshakeDone { SSL_shutdown(ssl) }
    }
}
