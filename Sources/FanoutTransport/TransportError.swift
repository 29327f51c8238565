/// A failure of the connection layer: what failed, and a message for people. Messages never carry
/// keys, tokens or request bodies.
public struct TransportError: Error, Sendable, CustomStringConvertible, Equatable {
    /// What failed. A struct over a string so that kinds can be added without breaking callers.
    public struct Kind: Hashable, Sendable, CustomStringConvertible {
        let name: String
        public var description: String { name }

        /// The host name did not resolve.
        public static let resolveFailed = Kind(name: "resolve-failed")
        /// TCP connect was refused or failed.
        public static let connectFailed = Kind(name: "connect-failed")
        /// TCP connect did not finish in time.
        public static let connectTimeout = Kind(name: "connect-timeout")
        /// The server's certificate does not chain to a trusted CA.
        public static let tlsUnknownCA = Kind(name: "tls-unknown-ca")
        /// The server's certificate is not valid for the host name we connected to.
        public static let tlsHostnameMismatch = Kind(name: "tls-hostname-mismatch")
        /// The server's certificate failed another check (expired, not yet valid, bad purpose, ...).
        public static let tlsCertificateInvalid = Kind(name: "tls-certificate-invalid")
        /// The server did not select `h2` through ALPN.
        public static let tlsNoH2 = Kind(name: "tls-no-h2")
        /// The TLS handshake did not finish in time.
        public static let tlsHandshakeTimeout = Kind(name: "tls-handshake-timeout")
        /// The TLS handshake failed for another reason (protocol version, alert from the peer, ...).
        public static let tlsHandshakeFailed = Kind(name: "tls-handshake-failed")
        /// TLS configuration could not be built (CA file unreadable, bad certificate or key file).
        public static let tlsConfiguration = Kind(name: "tls-configuration")
        /// The peer closed the connection, or it broke.
        public static let connectionClosed = Kind(name: "connection-closed")
        /// The peer violated HTTP/2, or nghttp2 reported a fatal error.
        public static let protocolError = Kind(name: "protocol-error")
        /// The peer sent GOAWAY; the stream was not processed.
        public static let goaway = Kind(name: "goaway")
        /// The connection was closed by our side (shutdown).
        public static let cancelled = Kind(name: "cancelled")
    }

    public let kind: Kind
    public let message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { message }
}
