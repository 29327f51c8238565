import FanoutTransport
import Foundation

/// An HTTP proxy that every connection to Apple goes through (APNs and channel management), as many company networks
/// require: each connection asks the proxy for a tunnel (`CONNECT host:443`), then runs TLS to Apple inside it, end to
/// end, with verification as without a proxy. Basic authentication is sent when the proxy has a user.
///
/// Its password never leaves it: `description` and every error name the proxy as `http://user@host:port`.
public struct APNsProxy: Sendable, Equatable, CustomStringConvertible {
    let proxy: HTTPProxy

    /// `http://[user[:password]@]host[:port]` (the port defaults to 80), or `host:port`. User and password may be
    /// percent-encoded.
    /// - Throws: `.configuration`, saying what is wrong with the URL (never repeating the password).
    public init(url: String) throws(FanoutError) {
        do {
            proxy = try HTTPProxy.parse(url)
        } catch {
            throw FanoutError(.configuration, error.message)
        }
    }

    public init(host: String, port: Int, user: String? = nil, password: String? = nil) {
        proxy = HTTPProxy(host: host, port: port, user: user, password: password)
    }

    /// The proxy the environment gives for connections to `host`: `HTTPS_PROXY` (or `https_proxy`), unless
    /// `NO_PROXY` (or `no_proxy`) names the host (a host name matches its subdomains; `*` matches all). Nil when none
    /// applies, as curl reads them. The `fanout` commands use it unless `--proxy` says otherwise.
    /// - Parameters:
    ///   - host: the host to be reached (`configuration.endpoint.host`).
    ///   - environment: the variables to read; nil: the process's.
    /// - Throws: `.configuration` for an `HTTPS_PROXY` that is not a proxy URL.
    public static func fromEnvironment(
        for host: String, environment: [String: String]? = nil
    ) throws(FanoutError) -> APNsProxy? {
        do {
            return try HTTPProxy.fromEnvironment(
                for: host, environment: environment ?? ProcessInfo.processInfo.environment
            ).map(APNsProxy.init(proxy:))
        } catch {
            throw FanoutError(.configuration, error.message)
        }
    }

    private init(proxy: HTTPProxy) { self.proxy = proxy }

    /// `http://[user@]host:port`, never the password.
    public var description: String { proxy.description }
}
