import Foundation

/// Opens a `CONNECT` tunnel through an HTTP proxy on a socket connected to it: writes the request, reads the answer's
/// head (at most `maximumHeadBytes`, within a deadline), and hands the socket on once the proxy answers 2xx, with
/// nothing read past the head (the server speaks only after our TLS ClientHello). Any other answer, a close or
/// silence fails with the proxy named (`HTTPProxy.description`: never its password). Confined to its loop; reports
/// exactly once.
final class ProxyTunnel: TCPSocketDelegate {
    typealias Completion = (Result<TCPSocket, TransportError>) -> Void

    /// A proxy's answer head is a few hundred bytes; past this it is not a proxy we can talk to.
    static let maximumHeadBytes = 16 * 1024

    private let proxy: HTTPProxy
    private let target: String
    private var socket: TCPSocket?
    private var completion: Completion?
    private var timer: LoopTimer?
    private var head: [UInt8] = []

    /// Tunnels `socket` (connected to `proxy`) to `host:port`; `completion` runs on the loop thread exactly once.
    static func open(
        socket: TCPSocket, proxy: HTTPProxy, host: String, port: Int, timeoutMilliseconds: UInt64,
        completion: @escaping Completion
    ) {
        let tunnel = ProxyTunnel(proxy: proxy, target: "\(host):\(port)", socket: socket, completion: completion)
        // The socket holds the tunnel as its delegate, and the timer's closure holds it, until it finishes.
        socket.delegate = tunnel
        let timer = LoopTimer(loop: socket.loop)
        tunnel.timer = timer
        timer.schedule(milliseconds: timeoutMilliseconds) { [tunnel] in
            tunnel.fail(
                .connectTimeout,
                "proxy \(proxy) did not answer CONNECT to \(host):\(port) within \(timeoutMilliseconds) ms")
        }
        let request = proxy.connectRequest(toHost: host, port: port)
        request.withUnsafeBytes { socket.write(borrowing: $0) }
        socket.startReading()
    }

    private init(proxy: HTTPProxy, target: String, socket: TCPSocket, completion: @escaping Completion) {
        self.proxy = proxy
        self.target = target
        self.socket = socket
        self.completion = completion
    }

    func tcpSocket(_ socket: TCPSocket, didRead bytes: UnsafeRawBufferPointer) {
        guard completion != nil else { return }
        head.append(contentsOf: bytes)
        guard let end = Self.endOfHead(in: head) else {
            if head.count > Self.maximumHeadBytes {
                fail(.proxyRefused, "proxy \(proxy) sent an answer head over \(Self.maximumHeadBytes) bytes")
            }
            return
        }
        let statusLine = String(decoding: head.prefix { $0 != 13 && $0 != 10 }, as: UTF8.self)
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
            return fail(.proxyRefused, "proxy \(proxy) answered CONNECT with no HTTP status line")
        }
        guard (200..<300).contains(status) else {
            let reason = parts.count > 2 ? " \(parts[2].prefix(100))" : ""
            // 407 is the standard answer to missing or wrong credentials; some proxies (tinyproxy) answer 401.
            let credentials = status == 407 || status == 401
            let kind: TransportError.Kind = credentials || status == 403 ? .proxyAuthentication : .proxyRefused
            let hint =
                credentials
                ? (proxy.user == nil ? " (it wants a user and password)" : " (check the user and password)") : ""
            return fail(kind, "proxy \(proxy) refused CONNECT to \(target): \(status)\(reason)\(hint)")
        }
        guard end == head.count else {
            return fail(.proxyRefused, "proxy \(proxy) sent data past its CONNECT answer before TLS began")
        }
        socket.stopReading()
        finish(.success(socket))
    }

    func tcpSocket(_ socket: TCPSocket, didCloseWith error: TransportError?) {
        self.socket = nil
        fail(
            .proxyRefused,
            "proxy \(proxy) closed the connection before answering CONNECT to \(target)"
                + (error.map { " (\($0.message))" } ?? ""))
    }

    func tcpSocketDidDrainWrites(_ socket: TCPSocket) {}

    /// The index just past the head's blank line, if it has arrived.
    private static func endOfHead(in bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for index in 3..<bytes.count
        where bytes[index] == 10 && bytes[index - 1] == 13 && bytes[index - 2] == 10 && bytes[index - 3] == 13 {
            return index + 1
        }
        return nil
    }

    private func fail(_ kind: TransportError.Kind, _ message: String) {
        socket?.close()
        socket = nil
        finish(.failure(TransportError(kind, message)))
    }

    private func finish(_ result: Result<TCPSocket, TransportError>) {
        guard let completion else { return }
        self.completion = nil
        timer?.close()
        timer = nil
        if case .success(let socket) = result { socket.delegate = nil }
        self.socket = nil
        completion(result)
    }
}
