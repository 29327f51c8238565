import FanoutCore
package import FanoutTestSupport
import FanoutTransport
import Foundation

/// mock-apns as a library: an APNs look-alike over real HTTP/2 and TLS (or cleartext HTTP/2 with `--h2c`), started on any port (0 for
/// a free one), used by the `mock-apns` binary and in-process by tests.
///
/// `@unchecked Sendable`: immutable after init; the stats timer is only cancelled.
package final class MockAPNsServer: @unchecked Sendable {
    package let host: String
    /// The port bound (the real one when 0 was asked).
    package let port: Int
    package let stats: MockStats
    /// This environment's broadcast channels: what the management listener creates and broadcasts are checked
    /// against. Tests of other components create and look up channels here directly.
    package let channels: MockChannels
    /// The management listener's port (the real one when 0 was asked); nil without `manageListen`.
    package let managePort: Int?
    package let manageHost: String?
    /// The generated or reused material when started with a TLS directory.
    package let tlsMaterial: TestTLSMaterial?
    private let server: HTTP2Server
    private let manageServer: HTTP2Server?
    private let shared: MockShared
    private let statsTimer: DispatchSourceTimer?

    /// Starts listening. Throws `MockStartError` with a message naming what is wrong.
    package init(options: MockOptions) throws {
        var material: TestTLSMaterial?
        /// The certificate chain and key to serve; nil in cleartext.
        let certificateAndKey: (certificate: String, key: String)?
        switch options.tls {
        case .directory(let directory):
            do {
                material = try TestTLSMaterial.createOrReuse(in: directory)
            } catch {
                throw MockStartError("cannot create TLS material in \(directory): \(error)")
            }
            certificateAndKey = (material!.serverCertPath, material!.serverKeyPath)
        case .files(let certificateFile, let keyFile):
            certificateAndKey = (certificateFile, keyFile)
        case .cleartext:
            certificateAndKey = nil
        case nil:
            throw MockStartError("mock-apns needs --tls-dir DIR, --cert PEM --key PEM or --h2c")
        }
        tlsMaterial = material

        var verifier: ProviderTokenVerifier?
        if !options.noAuth {
            guard let keyPath = options.authKeyPath ?? material?.authKeyPublicPEMPath else {
                throw MockStartError("provider-token checks need --auth-key PEM_OR_P8 (or --tls-dir, or --no-auth)")
            }
            let publicKey: ES256PublicKey
            do {
                publicKey = try ES256PublicKey(pemFilePath: keyPath)
            } catch {
                throw MockStartError("cannot load --auth-key: \(error)")
            }
            verifier = ProviderTokenVerifier(
                publicKey: publicKey, expectedKeyID: options.keyID, expectedTeamID: options.teamID,
                maxAge: options.tokenMaxAge)
        }

        var unregistered: [String: UnregisteredDate] = [:]
        if let path = options.unregisteredPath {
            guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
                throw MockStartError("cannot read --unregistered file \(path)")
            }
            for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                let fields = line.split(whereSeparator: \.isWhitespace)
                guard let token = fields.first else { continue }
                switch fields.count {
                case 1:
                    unregistered[token.lowercased()] = .answered
                case 2:
                    guard let milliseconds = Int64(fields[1]), milliseconds >= 0 else {
                        throw MockStartError(
                            "--unregistered file \(path) line \(index + 1): the date is not Unix milliseconds")
                    }
                    unregistered[token.lowercased()] = .fixed(milliseconds)
                default:
                    throw MockStartError(
                        "--unregistered file \(path) line \(index + 1): expected a token and at most a date")
                }
            }
        }
        let record = try options.recordPath.map { try MockRecord(path: $0) }
        let stats = MockStats()
        let channels = MockChannels(
            environment: options.environment, maxPerApp: options.maxChannelsPerApp, stats: stats)
        let shared = MockShared(
            options: options, verifier: verifier, unregistered: unregistered, stats: stats, record: record,
            channels: channels)
        let tls: TLSServerContext?
        do {
            tls = try certificateAndKey.map { files throws(TransportError) in
                try TLSServerContext(
                    TLSServerConfiguration(
                        certificateFile: files.certificate, privateKeyFile: files.key,
                        clientCAFile: options.clientCAPath))
            }
        } catch {
            throw MockStartError(error.message)
        }
        do {
            server = try HTTP2Server(
                host: options.host, port: options.port, threads: options.threads, tls: tls,
                initialMaxStreams: verifier == nil ? options.maxStreams : 1,
                makeHandler: { loop in MockRequestHandler(shared: shared, loop: loop) })
        } catch {
            throw MockStartError(error.message)
        }
        if let manage = options.manageListen {
            // One loop: management calls are rare next to pushes.
            do {
                manageServer = try HTTP2Server(
                    host: manage.host, port: manage.port, threads: 1, tls: tls,
                    initialMaxStreams: verifier == nil ? options.maxStreams : 1,
                    makeHandler: { _ in MockManageHandler(shared: shared) })
            } catch {
                server.shutdown()
                throw MockStartError("--manage-listen: \(error.message)")
            }
        } else {
            manageServer = nil
        }
        self.host = options.host
        self.port = server.port
        self.manageHost = options.manageListen?.host
        self.managePort = manageServer?.port
        self.stats = stats
        self.channels = channels
        self.shared = shared

        if options.statsPath != nil || record != nil {
            let timer = DispatchSource.makeTimerSource(queue: .global())
            timer.schedule(deadline: .now() + 1, repeating: 1)
            timer.setEventHandler { [shared] in
                shared.record?.flush()
                if let path = shared.options.statsPath { shared.stats.write(to: path) }
            }
            timer.resume()
            statsTimer = timer
            if let path = options.statsPath { stats.write(to: path) }
        } else {
            statsTimer = nil
        }
    }

    /// Stops serving, and writes the stats and record files one last time.
    package func shutdown() {
        statsTimer?.cancel()
        manageServer?.shutdown()
        server.shutdown()
        shared.record?.flush()
        if let path = shared.options.statsPath { stats.write(to: path) }
    }
}
