/// One `--fail RATE:STATUS:REASON` rule: that share of requests gets that error.
package struct InjectedFailure: Sendable, Equatable {
    package var rate: Double
    package var status: Int
    package var reason: String

    package init(rate: Double, status: Int, reason: String) {
        self.rate = rate
        self.status = status
        self.reason = reason
    }

    /// Parses `RATE:STATUS:REASON`, e.g. `0.05:503:ServiceUnavailable`.
    package init?(parsing text: String) {
        let parts = text.split(separator: ":", maxSplits: 2).map(String.init)
        guard parts.count == 3, let rate = Double(parts[0]), (0...1).contains(rate), let status = Int(parts[1]),
            (400...599).contains(status), !parts[2].isEmpty
        else { return nil }
        self.init(rate: rate, status: status, reason: parts[2])
    }
}

/// A host and port to listen on; port 0 picks a free one.
package struct MockListenAddress: Sendable, Equatable {
    package var host: String
    package var port: Int

    package init(host: String = "127.0.0.1", port: Int = 0) {
        self.host = host
        self.port = port
    }
}

/// The APNs environment one mock process plays, as Apple's hosts each serve one: channels created here exist here
/// only (a development channel cannot be used in production).
package enum MockEnvironment: String, Sendable, CaseIterable {
    case development, production
}

/// Everything `mock-apns` can be told, with the defaults docs/MOCK-APNS.md gives.
package struct MockOptions: Sendable {
    package enum TLSMode: Sendable, Equatable {
        /// Create or reuse a CA, server certificate and signing key in a directory.
        case directory(String)
        /// Use this certificate chain and key.
        case files(certificate: String, key: String)
        /// No TLS: HTTP/2 in cleartext with prior knowledge (`--h2c`), for clients and load generators that
        /// should not pay for TLS (h2load `http://`, curl `--http2-prior-knowledge`).
        case cleartext
    }

    package var host = "127.0.0.1"
    package var port = 0
    package var tls: TLSMode?
    /// PEM public key or .p8 private key to verify provider tokens with; nil with `tls` directory uses its key.
    package var authKeyPath: String?
    package var noAuth = false
    /// `--client-ca FILE`: PEM CA certificates that client (provider) certificates must verify with. A client that
    /// presents one it verifies is authenticated by it (no provider token needed); one that presents a certificate
    /// it does not verify fails the TLS handshake; one that presents none must send a valid provider token (with
    /// `--no-auth` too: then its requests get 403 `MissingProviderToken`).
    package var clientCAPath: String?
    package var keyID: String?
    package var teamID: String?
    package var maxStreams: UInt32 = 1000
    package var threads = 1
    package var statsPath: String?
    package var recordPath: String?
    package var unregisteredPath: String?
    package var failures: [InjectedFailure] = []
    package var latencyMilliseconds: UInt64 = 0
    package var goawayEvery = 0
    package var dropEvery = 0
    package var refuseEvery = 0
    /// Every Nth stream is accepted and never answered (a server that hangs while PINGs still work).
    package var blackholeEvery = 0
    /// Every stream after the Nth is accepted and never answered (nil: off; 0: every stream): the server hangs.
    package var blackholeAfter: Int?
    /// Keep every accepted notification's payload, by token (tests that check what a device got; no
    /// flag: it grows with the tokens).
    package var capturePayloads = false
    package var throttleAfterReject = false
    package var tokenMaxAge: Int64 = 3600
    package var seed: UInt64 = 1
    /// Where the channel-management API (`/1/apps/{bundleId}/channels`, `all-channels`) listens; nil: not served.
    /// Same TLS material and provider-token checks as the push listener.
    package var manageListen: MockListenAddress?
    /// The environment this mock is (stats, docs); channels are kept per app within it.
    package var environment = MockEnvironment.development
    /// Channels one app may have; creating one more gets `CannotCreateChannelConfig`. Apple's limit is 10,000 per
    /// app and environment; tests lower it to check the limit cheaply.
    package var maxChannelsPerApp = 10_000

    package init() {}
}
