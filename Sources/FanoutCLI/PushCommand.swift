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
                           [--key P8 --key-id ID --team-id ID]

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

        Exit status: 0 when APNs answered 200; 1 when it answered an error; 2 for bad arguments,
        an unusable key, or an endpoint that cannot be reached (nothing delivered).
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
        var configuration = APNsClientConfiguration(
            endpoint: options.connection.endpoint ?? .production,
            credentials: options.credentials, caFile: options.connection.caFile)
        configuration.connectTimeoutMilliseconds = 5000
        let client: APNsClient
        do {
            client = try APNsClient(configuration: configuration)
        } catch {
            return fail(error.message)
        }
        // Only once the key has loaded: an unusable key gets its one error line, nothing else.
        if let warning = configuration.credentials?.permissionWarning() {
            FileHandle.standardError.write(Data("fanout push: warning: \(warning)\n".utf8))
        }
        do {
            let response = try await client.send(
                PushNotification(deviceToken: options.token!, headers: headers, payload: options.payload!))
            var line = "status: \(response.status)"
            if let reason = response.reason { line += "\nreason: \(reason)" }
            if let timestamp = response.timestamp { line += "\ntimestamp: \(timestamp)" }
            line += "\napns-id: \(response.apnsID ?? "-")"
            if let unique = response.apnsUniqueID { line += "\napns-unique-id: \(unique)" }
            print(line)
            await client.shutdown()
            return response.status == 200 ? 0 : 1
        } catch {
            await client.shutdown()
            return fail(error.message)
        }
    }

    private static func fail(_ message: String) -> Int32 {
        FileHandle.standardError.write(Data("fanout push: \(message)\n".utf8))
        return 2
    }
}
