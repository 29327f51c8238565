/// A failure of the connection layer: what failed, and a message for people. Messages never carry
/// keys, tokens or request bodies.
package struct TransportError: Error, Sendable, CustomStringConvertible, Equatable {
    /// What failed. A struct over a string so that kinds can be added without breaking callers.
    package struct Kind: Hashable, Sendable, CustomStringConvertible {
        let name: String
        package var description: String { name }

        /// The host name did not resolve.
        package static let resolveFailed = Kind(name: "resolve-failed")
        /// TCP connect was refused or failed.
        package static let connectFailed = Kind(name: "connect-failed")
        /// TCP connect did not finish in time.
        package static let connectTimeout = Kind(name: "connect-timeout")
        /// The server's certificate does not chain to a trusted CA.
        package static let tlsUnknownCA = Kind(name: "tls-unknown-ca")
        /// The server's certificate is not valid for the host name we connected to.
        package static let tlsHostnameMismatch = Kind(name: "tls-hostname-mismatch")
        /// The server's certificate failed another check (expired, not yet valid, bad purpose, ...).
        package static let tlsCertificateInvalid = Kind(name: "tls-certificate-invalid")
        /// The server did not select `h2` through ALPN.
        package static let tlsNoH2 = Kind(name: "tls-no-h2")
        /// The TLS handshake did not finish in time.
        package static let tlsHandshakeTimeout = Kind(name: "tls-handshake-timeout")
        /// The TLS handshake failed for another reason (protocol version, alert from the peer, ...).
        package static let tlsHandshakeFailed = Kind(name: "tls-handshake-failed")
        /// TLS configuration could not be built (CA file unreadable, bad certificate or key file).
        package static let tlsConfiguration = Kind(name: "tls-configuration")
        /// The peer closed the connection, or it broke.
        package static let connectionClosed = Kind(name: "connection-closed")
        /// The peer ended the TLS session with an alert after the handshake: a TLS 1.3 server refusing the client's
        /// certificate does so (`alert unknown ca`, `alert certificate required`, ...).
        package static let tlsAlert = Kind(name: "tls-alert")
        /// The peer violated HTTP/2, or nghttp2 reported a fatal error.
        package static let protocolError = Kind(name: "protocol-error")
        /// The peer sent GOAWAY; the stream was not processed.
        package static let goaway = Kind(name: "goaway")
        /// TLS could not encrypt outbound data (SSL_write failed); the connection is torn down.
        package static let tlsWriteFailed = Kind(name: "tls-write-failed")
        /// A request passed its deadline before the connection could open a stream for it.
        package static let timedOut = Kind(name: "timed-out")
        /// Output waited a whole write timeout without any of it leaving (a peer that does not read): the connection
        /// was closed.
        package static let writeTimeout = Kind(name: "write-timeout")
        /// The HTTP proxy refused the `CONNECT` (an answer other than 2xx, or none it could send) or closed the
        /// connection before answering.
        package static let proxyRefused = Kind(name: "proxy-refused")
        /// The HTTP proxy wants other credentials (407) or forbids the destination (403): trying again will not help.
        package static let proxyAuthentication = Kind(name: "proxy-authentication")
        /// The connection was closed by our side (shutdown).
        package static let cancelled = Kind(name: "cancelled")
        /// The event loop has stopped (or is stopping) and refuses new work.
        package static let loopStopped = Kind(name: "loop-stopped")
    }

    package let kind: Kind
    package let message: String

    package init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    package var description: String { message }
}
