import Fanout
import FanoutCore
package import FanoutTransport
import Foundation

/// What happened, as a webhook event's `type` (docs/WEBHOOKS.md).
package enum WebhookEventType: String, Sendable, CaseIterable, Hashable {
    case dispatchAccepted = "dispatch.accepted"
    case dispatchFinished = "dispatch.finished"
    case dispatchFailed = "dispatch.failed"
    case tokenRemoved = "token.removed"
    case activityEnded = "activity.ended"
}

/// One webhook endpoint of a workspace (`workspaces.NAME.webhooks[i]` in `fanout serve`'s config):
/// ```json
/// {"url": "https://hooks.example.com/fanout", "secret_env": "ACME_WEBHOOK_SECRET" | "secret_file": "hook.secret",
///  "events": ["dispatch.finished", "token.removed"], "timeout_seconds": 10, "retry_seconds": 1,
///  "max_retry_seconds": 300, "concurrency": 4, "ca_file": null}
/// ```
/// The signing secret is never in the config: an environment variable or a file names where it is, read at start.
package struct WebhookEndpointConfiguration: Sendable {
    package var workspace: String
    /// Its place in the workspace's list: labels its metrics (the URL may carry a receiver's own token).
    package var index: Int
    package var url: String
    package var target: HTTP1Post.Target
    package var secretEnv: String?
    package var secretFile: String?
    /// The event types sent to it (every type when the config names none).
    package var events: Set<WebhookEventType>
    /// How long one delivery may take, connection to status line.
    package var timeout: Duration = .seconds(10)
    /// The first retry's delay; each further one doubles it, up to `maxRetryDelay`.
    package var retryDelay: Duration = .seconds(1)
    package var maxRetryDelay: Duration = .seconds(300)
    /// PEM CAs for an `https` receiver, instead of the system's.
    package var caFile: String?
    /// Deliveries in flight at once: events are spread over this many lanes by their activity (else dispatch, else
    /// token), each lane in order. 1 keeps every event of the endpoint in one order.
    package var concurrency = 4

    /// The outbox's name for the endpoint: its workspace and URL (an endpoint keeps its backlog across restarts
    /// while its URL stays; one whose URL changes starts afresh).
    package var key: String { workspace + " " + url }

    /// Its metrics' `endpoint` label: `<workspace>/<index>`.
    package var metricLabel: String { "\(workspace)/\(index)" }

    /// `workspaces.NAME.webhooks[i]`, for errors and logs.
    package var path: String { "workspaces.\(workspace).webhooks[\(index)]" }

    /// The signing secret, read from the environment or its file now; the error names the config key, never the
    /// secret.
    package func secret(environment: [String: String]) throws(ServiceConfigurationError) -> [UInt8] {
        if let name = secretEnv {
            guard let value = environment[name], !value.isEmpty else {
                throw ServiceConfigurationError(path + ".secret_env", "environment variable \(name) is not set")
            }
            return Array(value.utf8)
        }
        guard let file = secretFile, let text = ProviderCredentials.readPasswordFile(file), !text.isEmpty else {
            throw ServiceConfigurationError(path + ".secret_file", "\(secretFile ?? "") cannot be read or is empty")
        }
        return Array(text.utf8)
    }
}

/// Reads `webhooks` of a workspace.
enum WebhookConfigurationReader {
    static func read(
        _ value: JSONValue?, workspace: String, path: String, resolve: (String) -> String
    ) throws(ServiceConfigurationError) -> [WebhookEndpointConfiguration] {
        guard let value, !value.isNull else { return [] }
        guard let array = value.arrayValue else {
            throw ServiceConfigurationError(path, "must be an array of endpoints")
        }
        var endpoints: [WebhookEndpointConfiguration] = []
        var urls: Set<String> = []
        for (index, element) in array.enumerated() {
            let here = "\(path)[\(index)]"
            let known: Set<String> = [
                "url", "secret_env", "secret_file", "secret", "events", "timeout_seconds", "retry_seconds",
                "max_retry_seconds", "ca_file", "concurrency",
            ]
            guard let object = element.objectValue else { throw ServiceConfigurationError(here, "must be an object") }
            for member in object where !known.contains(member.key) {
                throw ServiceConfigurationError(
                    "\(here).\(member.key)", "unknown key (known: \(known.sorted().joined(separator: ", ")))")
            }
            if object["secret"] != nil {
                throw ServiceConfigurationError(
                    "\(here).secret", "the signing secret is not kept in the config: give secret_env or secret_file")
            }
            guard let url = object["url"]?.stringValue, !url.isEmpty else {
                throw ServiceConfigurationError("\(here).url", "is required (an http:// or https:// URL)")
            }
            guard let target = HTTP1Post.Target(url: url) else {
                throw ServiceConfigurationError(
                    "\(here).url", "must be an http:// or https:// URL with a host and no user or password")
            }
            guard urls.insert(url).inserted else {
                throw ServiceConfigurationError("\(here).url", "is listed twice in the workspace")
            }
            let secretEnv = try string(object, "secret_env", here)
            let secretFile = try string(object, "secret_file", here).map(resolve)
            switch (secretEnv, secretFile) {
            case (nil, nil):
                throw ServiceConfigurationError(
                    "\(here).secret_env", "give the signing secret: secret_env or secret_file")
            case (_?, _?):
                throw ServiceConfigurationError("\(here).secret_file", "give the secret one way: secret_env or this")
            default: break
            }
            var events = Set(WebhookEventType.allCases)
            if let list = object["events"], !list.isNull {
                guard let names = list.arrayValue, !names.isEmpty else {
                    throw ServiceConfigurationError("\(here).events", "must be a non-empty array of event types")
                }
                events = []
                for (position, name) in names.enumerated() {
                    guard let text = name.stringValue, let type = WebhookEventType(rawValue: text) else {
                        throw ServiceConfigurationError(
                            "\(here).events[\(position)]",
                            "must be one of \(WebhookEventType.allCases.map(\.rawValue).joined(separator: ", "))")
                    }
                    events.insert(type)
                }
            }
            var endpoint = WebhookEndpointConfiguration(
                workspace: workspace, index: index, url: url, target: target, secretEnv: secretEnv,
                secretFile: secretFile, events: events, caFile: try string(object, "ca_file", here).map(resolve))
            if let seconds = try seconds(object, "timeout_seconds", here) { endpoint.timeout = seconds }
            if let seconds = try seconds(object, "retry_seconds", here) { endpoint.retryDelay = seconds }
            if let seconds = try seconds(object, "max_retry_seconds", here) {
                endpoint.maxRetryDelay = seconds
            } else {
                endpoint.maxRetryDelay = max(endpoint.maxRetryDelay, endpoint.retryDelay)
            }
            if let value = object["concurrency"], !value.isNull {
                guard let lanes = value.int64Value, (1...32).contains(lanes) else {
                    throw ServiceConfigurationError("\(here).concurrency", "must be a whole number from 1 to 32")
                }
                endpoint.concurrency = Int(lanes)
            }
            guard endpoint.maxRetryDelay >= endpoint.retryDelay else {
                throw ServiceConfigurationError("\(here).max_retry_seconds", "must be at least retry_seconds")
            }
            endpoints.append(endpoint)
        }
        return endpoints
    }

    /// `true` or `false` (absent: false).
    static func flag(_ value: JSONValue?, path: String) throws(ServiceConfigurationError) -> Bool {
        guard let value, !value.isNull else { return false }
        guard let flag = value.boolValue else { throw ServiceConfigurationError(path, "must be true or false") }
        return flag
    }

    private static func string(_ object: JSONObject, _ key: String, _ path: String) throws(ServiceConfigurationError)
        -> String?
    {
        guard let value = object[key], !value.isNull else { return nil }
        guard let text = value.stringValue, !text.isEmpty else {
            throw ServiceConfigurationError("\(path).\(key)", "must be a non-empty string")
        }
        return text
    }

    /// A positive number of seconds (fractions allowed, at most a day).
    private static func seconds(_ object: JSONObject, _ key: String, _ path: String) throws(ServiceConfigurationError)
        -> Duration?
    {
        guard let value = object[key], !value.isNull else { return nil }
        guard let number = value.numberValue.flatMap({ Double($0.literal) }), number > 0, number <= 86_400 else {
            throw ServiceConfigurationError("\(path).\(key)", "must be a positive number of seconds (at most 86400)")
        }
        return .milliseconds(Int64((number * 1000).rounded(.up)))
    }
}
