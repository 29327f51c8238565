import Fanout
package import FanoutTransport

/// Serves a registry at `GET /metrics` in the Prometheus text format (`--metrics-listen HOST:PORT`), on its own
/// loop thread of the transport's `HTTPServer`. Other paths get 404, other methods 405. A scrape comes every few
/// seconds at most, so each answer closes its connection (`Connection: close`) rather than keeping it open.
package final class MetricsEndpoint: Sendable {
    /// The Prometheus text format's media type.
    package static let contentType = "text/plain; version=0.0.4; charset=utf-8"

    package let host: String
    /// The port bound (the real one when 0 was asked).
    package let port: Int
    private let server: HTTPServer

    /// Binds `host:port` (a numeric IP address, or `localhost`; port 0 picks a free one) and starts serving.
    package init(registry: MetricsRegistry, host: String, port: Int) throws(TransportError) {
        let host = host == "localhost" ? "127.0.0.1" : host
        self.host = host
        var limits = HTTPServerLimits()
        limits.maxHeadBytes = 8192
        limits.maxBodyBytes = 64 * 1024
        limits.headerTimeout = .seconds(5)
        limits.maxConnections = 64
        server = try HTTPServer(host: host, port: port, threads: 1, tls: nil, limits: limits) { request, responder in
            let (status, contentType, body) = Self.respond(
                registry: registry, method: request.method, target: request.target)
            responder.respond(
                HTTPResponse(
                    status: status, headers: [("content-type", contentType), ("connection", "close")], body: body))
        }
        self.port = server.port
    }

    /// Binds `HOST:PORT` as given to `--metrics-listen` (`[::1]:9100` for IPv6).
    package convenience init(registry: MetricsRegistry, listen: String) throws(TransportError) {
        guard let (host, port) = Self.parseListenAddress(listen) else {
            throw TransportError(.connectFailed, "--metrics-listen: expected HOST:PORT, got \"\(listen)\"")
        }
        try self.init(registry: registry, host: host, port: port)
    }

    /// `HOST:PORT` or `[IPV6]:PORT` split, with the port in 0...65535; nil otherwise.
    package static func parseListenAddress(_ text: String) -> (host: String, port: Int)? {
        guard let colon = text.lastIndex(of: ":") else { return nil }
        var host = String(text[..<colon])
        guard let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port) else { return nil }
        if host.hasPrefix("[") && host.hasSuffix("]") {
            host = String(host.dropFirst().dropLast())
        } else if host.contains(":") {
            return nil  // IPv6 needs brackets
        }
        guard !host.isEmpty else { return nil }
        return (host, port)
    }

    /// Stops serving. Blocks until the loop thread exits. Idempotent.
    package func shutdown() {
        server.shutdown()
    }

    static func respond(registry: MetricsRegistry, method: String, target: String) -> (Int, String, [UInt8]) {
        let path = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        guard path == "/metrics" else { return (404, "text/plain; charset=utf-8", Array("not found\n".utf8)) }
        guard method == "GET" || method == "HEAD" else {
            return (405, "text/plain; charset=utf-8", Array("method not allowed\n".utf8))
        }
        return (200, contentType, Array(registry.exposition().utf8))
    }
}
