/// One `--fail RATE:STATUS:REASON` rule: that share of requests gets that error.
public struct InjectedFailure: Sendable, Equatable {
    public var rate: Double
    public var status: Int
    public var reason: String

    public init(rate: Double, status: Int, reason: String) {
        self.rate = rate
        self.status = status
        self.reason = reason
    }

    /// Parses `RATE:STATUS:REASON`, e.g. `0.05:503:ServiceUnavailable`.
    public init?(parsing text: String) {
        let parts = text.split(separator: ":", maxSplits: 2).map(String.init)
        guard parts.count == 3, let rate = Double(parts[0]), (0...1).contains(rate), let status = Int(parts[1]),
            (400...599).contains(status), !parts[2].isEmpty
        else { return nil }
        self.init(rate: rate, status: status, reason: parts[2])
    }
}

/// Everything `mock-apns` can be told, with the defaults product.md gives.
public struct MockOptions: Sendable {
    public enum TLSMode: Sendable, Equatable {
        /// Create or reuse a CA, server certificate and signing key in a directory.
        case directory(String)
        /// Use this certificate chain and key.
        case files(certificate: String, key: String)
    }

    public var host = "127.0.0.1"
    public var port = 0
    public var tls: TLSMode?
    /// PEM public key or .p8 private key to verify provider tokens with; nil with `tls` directory uses its key.
    public var authKeyPath: String?
    public var noAuth = false
    public var keyID: String?
    public var teamID: String?
    public var maxStreams: UInt32 = 1000
    public var threads = 1
    public var statsPath: String?
    public var recordPath: String?
    public var unregisteredPath: String?
    public var failures: [InjectedFailure] = []
    public var latencyMilliseconds: UInt64 = 0
    public var goawayEvery = 0
    public var dropEvery = 0
    public var refuseEvery = 0
    public var throttleAfterReject = false
    public var tokenMaxAge: Int64 = 3600
    public var seed: UInt64 = 1

    public init() {}
}
