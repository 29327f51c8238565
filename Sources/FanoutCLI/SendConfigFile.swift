import CommandLineSupport
import Fanout
import FanoutJobFile
import FanoutObservability
import FanoutPolicy
import Foundation

/// `fanout send --config FILE`: a JSON object such as
/// `{"endpoint": "localhost:8443" | "sandbox" | "production", "ca_file": "...", "key_path": "...",
///   "key_id": "...", "team_id": "...", "cert_path": "app.p12", "cert_password_env": "VAR",
///   "cert_password_file": "...", "cert_key_path": "...", "loops": 2, "connections": 2, "max_attempts": 8,
///   "request_timeout_seconds": 30, "proxy": "http://user:password@proxy.example.com:3128" | "none",
///   "rate_limits": {"default": {"requests_per_hour": 250000, "burst_seconds": 60,
///                   "counting": "job" | "notification", "policy": "wait" | "reject" | "demote"},
///                   "workspaces": {"acme": {...}}}}`.
/// Every key is optional; an unknown key is an error (a typo must not be ignored).
struct SendConfigFile {
    /// Endpoint, CA file and credentials, the same settings the flags give.
    var connection = ConnectionFlags()
    var loops: Int?
    var connections: Int?
    var maxAttempts: Int?
    var defaultBudget = RateBudget.jobFileDefault
    var workspaceBudgets: [String: RateBudget] = [:]

    static let keys: Set<String> = [
        "endpoint", "ca_file", "key_path", "key_id", "team_id", "loops", "connections", "max_attempts",
        "request_timeout_seconds", "rate_limits", "proxy", "cert_path", "cert_key_path", "cert_password_env",
        "cert_password_file",
    ]

    static func load(_ path: String?) throws(UsageError) -> SendConfigFile {
        var config = SendConfigFile()
        guard let path else { return config }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw UsageError("config file \(path) cannot be read")
        }
        guard let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] else {
            throw UsageError("config file \(path) is not a JSON object")
        }
        if object["cert_password"] != nil {
            throw UsageError(
                "config file \(path): the certificate's password is not kept in the config file: give "
                    + "cert_password_env or cert_password_file")
        }
        try rejectUnknown(in: object, known: keys, field: nil, path: path)
        func string(_ key: String) throws(UsageError) -> String? {
            guard let value = object[key] else { return nil }
            guard let text = value as? String else { throw UsageError("config file \(path): \(key) must be a string") }
            return text
        }
        func integer(_ key: String) throws(UsageError) -> Int? {
            guard let value = object[key] else { return nil }
            guard let number = value as? Int, number > 0 else {
                throw UsageError("config file \(path): \(key) must be a positive whole number")
            }
            return number
        }
        switch try string("endpoint") {
        case nil: break
        case "sandbox": config.connection.endpoint = .sandbox
        case "production": config.connection.endpoint = .production
        case let text?:
            guard let (host, port) = ArgumentCursor.parseHostPort(text) else {
                throw UsageError("config file \(path): endpoint must be HOST:PORT, sandbox or production")
            }
            config.connection.endpoint = APNsEndpoint(host: host, port: port)
        }
        config.connection.caFile = try string("ca_file")
        config.connection.proxy = try string("proxy")
        config.connection.keyPath = try string("key_path")
        config.connection.keyID = try string("key_id")
        config.connection.teamID = try string("team_id")
        config.connection.certificatePath = try string("cert_path")
        config.connection.certificateKeyPath = try string("cert_key_path")
        config.connection.certificatePasswordEnv = try string("cert_password_env")
        config.connection.certificatePasswordFile = try string("cert_password_file")
        if config.connection.certificatePath != nil && config.connection.keyPath != nil {
            throw UsageError(
                "config file \(path): give a signing key (key_path) or a certificate (cert_path), not both")
        }
        config.loops = try integer("loops")
        config.connections = try integer("connections")
        config.maxAttempts = try integer("max_attempts")
        if let value = object["request_timeout_seconds"] {
            // A JSON true is an NSNumber too; its objCType is "c".
            guard let number = value as? NSNumber, String(cString: number.objCType) != "c",
                case let seconds = number.doubleValue, seconds > 0, seconds <= 86_400
            else {
                throw UsageError(
                    "config file \(path): request_timeout_seconds must be a number of seconds from 0 to 86400")
            }
            config.connection.requestTimeout = .milliseconds(Int64((seconds * 1000).rounded()))
        }
        if let limits = object["rate_limits"] {
            guard let limits = limits as? [String: Any] else {
                throw UsageError("config file \(path): rate_limits must be an object")
            }
            try rejectUnknown(in: limits, known: ["default", "workspaces"], field: "rate_limits", path: path)
            if let base = limits["default"] {
                config.defaultBudget = try budget(base, field: "rate_limits.default", path: path)
            }
            if let value = limits["workspaces"] {
                guard let workspaces = value as? [String: Any] else {
                    throw UsageError("config file \(path): rate_limits.workspaces must be an object")
                }
                for (name, value) in workspaces {
                    config.workspaceBudgets[name] = try budget(
                        value, field: "rate_limits.workspaces.\(name)", path: path)
                }
            }
        }
        return config
    }

    private static func budget(_ value: Any, field: String, path: String) throws(UsageError) -> RateBudget {
        guard let object = value as? [String: Any] else {
            throw UsageError("config file \(path): \(field) must be an object")
        }
        try rejectUnknown(
            in: object, known: ["requests_per_hour", "burst_seconds", "counting", "policy"], field: field, path: path)
        func wholeNumber(_ key: String, default fallback: Int) throws(UsageError) -> Int {
            guard let value = object[key] else { return fallback }
            // A JSON true is an NSNumber too (objCType "c"); a fraction or a string is refused, not read as the
            // default.
            guard let number = value as? NSNumber, String(cString: number.objCType) != "c",
                number.doubleValue == number.doubleValue.rounded(), let whole = Int(exactly: number.doubleValue)
            else { throw UsageError("config file \(path): \(field).\(key) must be a whole number") }
            return whole
        }
        func text(_ key: String, default fallback: String) throws(UsageError) -> String {
            guard let value = object[key] else { return fallback }
            guard let string = value as? String else {
                throw UsageError("config file \(path): \(field).\(key) must be a string")
            }
            return string
        }
        let perHour = try wholeNumber("requests_per_hour", default: 250_000)
        let burst = try wholeNumber("burst_seconds", default: 60)
        let counting: RateCountingUnit
        switch try text("counting", default: "job") {
        case "job": counting = .job
        case "notification": counting = .notification
        default: throw UsageError("config file \(path): \(field).counting must be job or notification")
        }
        guard let policy = RateLimitPolicy(rawValue: try text("policy", default: "wait")) else {
            throw UsageError("config file \(path): \(field).policy must be wait, reject or demote")
        }
        guard perHour > 0, burst > 0 else {
            throw UsageError("config file \(path): \(field) needs positive requests_per_hour and burst_seconds")
        }
        return RateBudget(requestsPerHour: perHour, burstSeconds: burst, countingUnit: counting, policy: policy)
    }

    /// Refuses a key of `object` not in `known`, naming it: a misspelt limit must not silently become the default.
    private static func rejectUnknown(in object: [String: Any], known: Set<String>, field: String?, path: String)
        throws(UsageError)
    {
        guard let unknown = object.keys.sorted().first(where: { !known.contains($0) }) else { return }
        let place = field.map { "\(path): \($0)" } ?? path
        throw UsageError(
            "config file \(place): unknown key \"\(unknown)\" (known: \(known.sorted().joined(separator: ", ")))")
    }

    func rateLimits() throws(UsageError) -> RateLimiterRegistry {
        do {
            return try RateLimiterRegistry(defaultBudget: defaultBudget, overrides: workspaceBudgets)
        } catch {
            throw UsageError("rate limits: \(error.message)")
        }
    }
}
