import CommandLineSupport
import Fanout
import FanoutCore
import FanoutJobFile
import FanoutObservability
import Foundation

/// `fanout push`: one notification to one device, APNs's curl.
enum PushCommand {
    static let usage = """
        fanout push: send one notification and print APNs's answer.

        usage: fanout push --token HEX --topic TOPIC --payload JSON|@FILE
                           [--push-type TYPE] [--priority 10|5|1] [--expiration UNIX] [--collapse-id ID]
                           [--apns-id UUID] [--endpoint HOST:PORT | --sandbox | --production] [--ca-file PEM]
                           [--key P8 --key-id ID --team-id ID | --cert P12 (--cert-password-env VAR |
                           --cert-password-file FILE) | --cert PEM [--cert-key PEM]]
                           [--request-timeout SECONDS] [--attempts N] [--proxy URL|none]

          --token HEX           device token (64 to 200 hex digits)
          --topic TOPIC         apns-topic: the bundle id, with the push type's suffix
                                (e.g. com.acme.app.push-type.liveactivity)
          --payload JSON|@FILE  the JSON payload, inline or from a file
          --push-type TYPE      alert (default), background, liveactivity, voip, ...
          --endpoint HOST:PORT  send there (mock-apns); default --production (api.push.apple.com:443)
          --sandbox             api.sandbox.push.apple.com:443
          --ca-file PEM         trust this CA instead of the system store (certificates are always checked)
          --key P8, --key-id ID, --team-id ID
                                the APNs signing key and its ids; default from APNS_KEY_PATH,
                                APNS_KEY_ID, APNS_TEAM_ID
          --cert FILE           authenticate with the app's push certificate instead: a PKCS#12 file
                                (.p12) or PEM; requests then carry no provider token
          --cert-password-env VAR, --cert-password-file FILE
                                where the .p12 file's password is (never on the command line)
          --cert-key PEM        the PEM certificate's unencrypted private key, when not in the --cert file
          --request-timeout SECONDS
                                how long to wait for APNs's answer (default 30); past it the stream is
                                reset, and the notification may or may not have been delivered
          --proxy URL|none      reach Apple through this HTTP proxy (CONNECT; http://[user:password@]host:port);
                                default HTTPS_PROXY unless NO_PROXY names the host; none: directly
          --attempts N          sends for an error that may be transient (5xx, 429, a lost connection,
                                a timeout), default 1; refused or unprocessed streams are resent up to
                                8 times besides

        Exit status: 0 when APNs answered 200; 1 when it answered an error or did not answer in time;
        2 for bad arguments, an unusable key or certificate (missing, wrong password, expired, not for the
        topic), or an endpoint that cannot be reached (nothing delivered).
        """

    struct Options {
        var token: String?
        var topic: String?
        var payload: [UInt8]?
        var pushType = PushType.alert
        var priority: Int?
        var expiration: Int64?
        var collapseID: String?
        var apnsID: String?
        var attempts = 1
        var connection = ConnectionFlags()
        /// Set by `parse` once the key path and both ids are known.
        var credentials: ProviderCredentials?
    }

    static func parse(_ arguments: [String], environment: [String: String]) throws(UsageError) -> Options? {
        var options = Options()
        var cursor = ArgumentCursor(arguments)
        while let flag = try cursor.nextFlag() {
            switch flag {
            case "--help", "-h": return nil
            case "--token": options.token = try cursor.string()
            case "--topic": options.topic = try cursor.string()
            case "--payload": options.payload = try readPayload(try cursor.string())
            case "--push-type":
                let text = try cursor.string()
                guard let type = PushType(rawValue: text) else {
                    throw UsageError(
                        "--push-type '\(text)' is not an APNs push type (alert, background, liveactivity, voip, ...)")
                }
                options.pushType = type
            case "--priority": options.priority = try cursor.int(in: 1...10)
            case "--expiration": options.expiration = Int64(try cursor.int(in: 0...Int(Int64.max)))
            case "--collapse-id": options.collapseID = try cursor.string()
            case "--apns-id": options.apnsID = try cursor.string()
            case "--attempts": options.attempts = try cursor.int(in: 1...100)
            default:
                guard try options.connection.take(flag, from: &cursor) else {
                    throw UsageError("unknown option \(flag) (see fanout push --help)")
                }
            }
        }
        options.connection.fill(environment: environment)
        guard let token = options.token else { throw UsageError("--token HEX is required") }
        guard DeviceToken.isValid(token) else {
            throw UsageError("--token must be an even number (64 to 200) of hex digits")
        }
        guard options.topic != nil else { throw UsageError("--topic is required") }
        guard let payload = options.payload else { throw UsageError("--payload JSON|@FILE is required") }
        guard (try? JSONSerialization.jsonObject(with: Data(payload))) is [String: Any] else {
            throw UsageError("--payload is not a JSON object")
        }
        options.credentials = try options.connection.credentials()
        return options
    }

    private static func readPayload(_ value: String) throws(UsageError) -> [UInt8] {
        guard value.hasPrefix("@") else { return Array(value.utf8) }
        let path = String(value.dropFirst())
        guard let data = FileManager.default.contents(atPath: path) else {
            throw UsageError("--payload file \(path) cannot be read")
        }
        return [UInt8](data)
    }

    /// Runs the command; returns the exit status.
    static func run(_ arguments: [String]) async -> Int32 {
        let options: Options
        do {
            guard let parsed = try parse(arguments, environment: ProcessInfo.processInfo.environment) else {
                print(usage)
                return 0
            }
            options = parsed
        } catch {
            return fail(error.message)
        }
        let headers = NotificationHeaders(
            pushType: options.pushType, topic: options.topic!, priority: options.priority,
            expiration: options.expiration,
            collapseID: options.collapseID, apnsID: options.apnsID)
        do {
            try headers.validate()
        } catch {
            return fail(error.description)
        }
        // A certificate is read and checked before anything is sent: unusable, expired, or for another topic.
        do {
            if let checked = try CertificateCheck.check(options.credentials, topics: [options.topic!]),
                let warning = checked.warning
            {
                StandardStream.error.write("fanout push: warning: \(warning)\n")
            }
        } catch {
            return fail(error.message)
        }
        let endpoint = options.connection.endpoint ?? .production
        var configuration = FanoutEngineConfiguration(
            endpoint: endpoint, credentials: options.credentials, caFile: options.connection.caFile)
        do {
            configuration.proxy = try options.connection.proxy(
                for: endpoint.host, environment: ProcessInfo.processInfo.environment)
        } catch {
            return fail(error.message)
        }
        // One notification: one loop, one connection, no workspace budget; connection failures end it
        // at once instead of after a round of reconnects.
        configuration.loops = 1
        configuration.connectionsPerLoop = 1
        configuration.rateLimits = nil
        configuration.maxAttempts = options.attempts
        configuration.maxConnectAttempts = 1
        configuration.connectTimeout = .seconds(5)
        configuration.requestTimeout = options.connection.requestTimeout ?? configuration.requestTimeout
        let engine: FanoutEngine
        do {
            engine = try FanoutEngine(configuration: configuration)
        } catch {
            return fail(error.message)
        }
        // Only once the key has loaded: an unusable key gets its one error line, nothing else.
        if let warning = configuration.credentials?.permissionWarning() {
            StandardStream.error.write("fanout push: warning: \(warning)\n")
        }
        let result: NotificationResult
        do {
            result = try await engine.send(
                PushNotification(deviceToken: options.token!, headers: headers, payload: options.payload!))
        } catch {
            await engine.shutdown(gracePeriod: .zero)
            return fail(error.message)
        }
        await engine.shutdown(gracePeriod: .zero)
        return report(result, endpoint: endpoint, requestTimeout: configuration.requestTimeout)
    }

    /// Prints APNs's answer (exit 0 for 200, else 1), or the one line saying why there was none.
    private static func report(_ result: NotificationResult, endpoint: APNsEndpoint, requestTimeout: Duration?)
        -> Int32
    {
        guard let status = result.status else {
            let reason = result.reason ?? "NotSent"
            if reason == "Timeout", let requestTimeout {
                StandardStream.error.write(
                    "fanout push: \(endpoint): no answer within \(requestTimeout) (Timeout); the notification "
                        + "may or may not have been delivered\n")
                return 1
            }
            let connectionFailed = "ConnectionFailed: "
            let message = reason.hasPrefix(connectionFailed) ? String(reason.dropFirst(connectionFailed.count)) : reason
            return fail("\(endpoint): \(message)")
        }
        var line = "status: \(status)"
        if let reason = result.reason { line += "\nreason: \(reason)" }
        if let timestamp = result.timestamp { line += "\ntimestamp: \(timestamp)" }
        line += "\napns-id: \(result.apnsID ?? "-")"
        if let unique = result.apnsUniqueID { line += "\napns-unique-id: \(unique)" }
        print(line)
        return status == 200 ? 0 : 1
    }

    private static func fail(_ message: String) -> Int32 {
        StandardStream.error.write("fanout push: \(message)\n")
        return 2
    }
}
