import Foundation

/// An HTTP proxy that connections to Apple go through with `CONNECT` (`ProxyTunnel`): TLS to the server runs end to
/// end inside the tunnel, so the proxy sees only the host and port.
///
/// Its password is kept for the `Proxy-Authorization` header alone: `description` names the proxy and the user,
/// never the password, and every error that names the proxy uses `description`.
package struct HTTPProxy: Sendable, Equatable, CustomStringConvertible {
    package var host: String
    package var port: Int
    /// Basic authentication (RFC 7617), when the proxy wants it.
    package var user: String?
    package var password: String?

    package init(host: String, port: Int, user: String? = nil, password: String? = nil) {
        self.host = host
        self.port = port
        self.user = user
        self.password = password
    }

    /// `http://host:port`, with `user@` when there is a user; never the password.
    package var description: String {
        let authority = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        return "http://" + (user.map { "\(Self.percentEncoded($0))@" } ?? "") + authority
    }

    /// The `CONNECT` request for `host:port`, with `Proxy-Authorization` when the proxy has a user.
    func connectRequest(toHost target: String, port targetPort: Int) -> [UInt8] {
        let authority = target.contains(":") ? "[\(target)]:\(targetPort)" : "\(target):\(targetPort)"
        var request = "CONNECT \(authority) HTTP/1.1\r\nHost: \(authority)\r\n"
        if let user {
            let credentials = Data("\(user):\(password ?? "")".utf8).base64EncodedString()
            request += "Proxy-Authorization: Basic \(credentials)\r\n"
        }
        return Array((request + "\r\n").utf8)
    }

    /// Parses `http://[user[:password]@]host[:port][/]` (the port defaults to 80, as for any `http` URL; user and
    /// password are percent-decoded). The error says what is wrong and never repeats the password.
    package static func parse(_ text: String) throws(ProxyURLError) -> HTTPProxy {
        var rest = Substring(text.trimmingCharacters(in: .whitespaces))
        guard let scheme = rest.range(of: "://") else {
            // `host:port` alone, as curl takes it.
            return try parseAuthority(rest, in: text)
        }
        guard rest[..<scheme.lowerBound].lowercased() == "http" else {
            throw ProxyURLError(
                "proxy \(redacted(text)): only http:// proxies are supported (CONNECT); "
                    + "the scheme is \(rest[..<scheme.lowerBound])")
        }
        rest = rest[scheme.upperBound...]
        if let slash = rest.firstIndex(of: "/") {
            guard rest[slash...].allSatisfy({ $0 == "/" }) else {
                throw ProxyURLError("proxy \(redacted(text)): a proxy URL has no path")
            }
            rest = rest[..<slash]
        }
        return try parseAuthority(rest, in: text)
    }

    private static func parseAuthority(_ authority: Substring, in text: String) throws(ProxyURLError) -> HTTPProxy {
        var hostPort = authority
        var user: String?
        var password: String?
        if let at = authority.lastIndex(of: "@") {
            let userInfo = authority[..<at]
            hostPort = authority[authority.index(after: at)...]
            if let colon = userInfo.firstIndex(of: ":") {
                user = String(userInfo[..<colon]).removingPercentEncoding
                password = String(userInfo[userInfo.index(after: colon)...]).removingPercentEncoding
            } else {
                user = String(userInfo).removingPercentEncoding
            }
            guard user?.isEmpty == false else { throw ProxyURLError("proxy \(redacted(text)): the user is empty") }
        }
        var host: Substring
        var portText: Substring?
        if hostPort.hasPrefix("[") {
            guard let close = hostPort.firstIndex(of: "]") else {
                throw ProxyURLError("proxy \(redacted(text)): an IPv6 address needs its closing ]")
            }
            host = hostPort[hostPort.index(after: hostPort.startIndex)..<close]
            let after = hostPort[hostPort.index(after: close)...]
            if after.hasPrefix(":") {
                portText = after.dropFirst()
            } else if !after.isEmpty {
                throw ProxyURLError("proxy \(redacted(text)): unexpected text after the host")
            }
        } else if let colon = hostPort.lastIndex(of: ":") {
            host = hostPort[..<colon]
            portText = hostPort[hostPort.index(after: colon)...]
        } else {
            host = hostPort
        }
        guard !host.isEmpty else { throw ProxyURLError("proxy \(redacted(text)): the host is empty") }
        var port = 80
        if let portText {
            guard let value = Int(portText), (1...65535).contains(value) else {
                throw ProxyURLError("proxy \(redacted(text)): the port must be 1 to 65535")
            }
            port = value
        }
        return HTTPProxy(host: String(host), port: port, user: user, password: password)
    }

    /// `text` with the password of its user info replaced by `***`.
    package static func redacted(_ text: String) -> String {
        guard let at = text.lastIndex(of: "@") else { return text }
        let start = text.range(of: "://")?.upperBound ?? text.startIndex
        guard start < at, let colon = text[start..<at].firstIndex(of: ":") else { return text }
        return String(text[..<text.index(after: colon)]) + "***" + String(text[at...])
    }

    private static func percentEncoded(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: .urlUserAllowed) ?? text
    }

    /// Whether `host` is to be reached without the proxy according to a `NO_PROXY` list: comma-separated host names
    /// (a name matches itself and its subdomains; a leading `.` or `*.` is allowed), IP addresses, or `*` for all,
    /// as curl reads it. A port in an entry is ignored.
    package static func bypasses(host: String, noProxy: String?) -> Bool {
        guard let noProxy else { return false }
        let name = host.lowercased()
        for rawEntry in noProxy.split(separator: ",") {
            var entry = rawEntry.trimmingCharacters(in: .whitespaces).lowercased()
            if entry == "*" { return true }
            if entry.hasPrefix("*.") { entry.removeFirst(2) } else if entry.hasPrefix(".") { entry.removeFirst() }
            if let colon = entry.lastIndex(of: ":"), !entry.contains("]"), entry.filter({ $0 == ":" }).count == 1 {
                entry = String(entry[..<colon])
            }
            entry = entry.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
            guard !entry.isEmpty else { continue }
            if name == entry || name.hasSuffix("." + entry) { return true }
        }
        return false
    }

    /// The proxy the environment gives for HTTPS connections to `host`: `HTTPS_PROXY` (or `https_proxy`), unless
    /// `NO_PROXY` (or `no_proxy`) names the host. Nil when none applies.
    package static func fromEnvironment(
        for host: String, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(ProxyURLError) -> HTTPProxy? {
        guard let text = environment["HTTPS_PROXY"] ?? environment["https_proxy"], !text.isEmpty else { return nil }
        if bypasses(host: host, noProxy: environment["NO_PROXY"] ?? environment["no_proxy"]) { return nil }
        do {
            return try parse(text)
        } catch {
            throw ProxyURLError("HTTPS_PROXY: \(error.message)")
        }
    }
}

/// A proxy URL that cannot be used, with what is wrong (and never its password).
package struct ProxyURLError: Error, Sendable, CustomStringConvertible {
    package let message: String
    init(_ message: String) { self.message = message }
    package var description: String { message }
}
