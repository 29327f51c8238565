import CLibUV
import Foundation

/// Resolves a host name (`uv_getaddrinfo`) and connects a TCP socket to the first address that
/// answers, within a deadline. Confined to its loop; reports exactly once.
final class TCPConnector {
    typealias Completion = (Result<TCPSocket, TransportError>) -> Void

    private let loop: LoopThread
    private let host: String
    private let port: Int
    private var completion: Completion?
    private var timer: LoopTimer?
    private var socket: TCPSocket?
    private var addresses: [sockaddr_storage] = []
    private var nextAddress = 0
    private var lastError = ""

    /// Starts connecting to `host:port`; `completion` runs on the loop thread exactly once.
    static func connect(
        loop: LoopThread, host: String, port: Int, timeoutMilliseconds: UInt64, completion: @escaping Completion
    ) {
        let connector = TCPConnector(loop: loop, host: host, port: port, completion: completion)
        connector.start(timeoutMilliseconds: timeoutMilliseconds)
    }

    private init(loop: LoopThread, host: String, port: Int, completion: @escaping Completion) {
        self.loop = loop
        self.host = host
        self.port = port
        self.completion = completion
    }

    private func start(timeoutMilliseconds: UInt64) {
        loop.assertInLoop()
        let timer = LoopTimer(loop: loop)
        self.timer = timer
        // The timer's closure keeps the connector alive until it finishes.
        timer.schedule(milliseconds: timeoutMilliseconds) { [self] in
            finish(
                .failure(
                    TransportError(
                        .connectTimeout, "connect to \(host):\(port) timed out after \(timeoutMilliseconds) ms")))
        }
        let request = UnsafeMutablePointer<uv_getaddrinfo_t>.allocate(capacity: 1)
        // The request holds a +1 on self until the resolve callback, which frees the request.
        request.pointee.data = Unmanaged.passRetained(self).toOpaque()
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        let rc = uv_getaddrinfo(loop.loop, request, tcpResolveCallback, host, String(port), &hints)
        if rc != 0 {
            Unmanaged<TCPConnector>.fromOpaque(request.pointee.data).release()
            request.deallocate()
            finish(.failure(TransportError(.resolveFailed, "cannot resolve \(host): \(uvErrorName(rc))")))
        }
    }

    fileprivate func didResolve(status: Int32, result: UnsafeMutablePointer<addrinfo>?) {
        defer { if let result { uv_freeaddrinfo(result) } }
        guard completion != nil else { return }
        guard status == 0, result != nil else {
            finish(.failure(TransportError(.resolveFailed, "cannot resolve \(host): \(uvErrorName(status))")))
            return
        }
        var entry = result
        while let current = entry {
            if let address = current.pointee.ai_addr {
                var storage = sockaddr_storage()
                withUnsafeMutableBytes(of: &storage) { target in
                    target.copyMemory(
                        from: UnsafeRawBufferPointer(start: address, count: Int(current.pointee.ai_addrlen)))
                }
                addresses.append(storage)
            }
            entry = current.pointee.ai_next
        }
        tryNextAddress()
    }

    private func tryNextAddress() {
        guard completion != nil else { return }
        guard nextAddress < addresses.count else {
            finish(.failure(TransportError(.connectFailed, "cannot connect to \(host):\(port): \(lastError)")))
            return
        }
        var address = addresses[nextAddress]
        nextAddress += 1
        let socket = TCPSocket(loop: loop)
        self.socket = socket
        let request = UnsafeMutablePointer<uv_connect_t>.allocate(capacity: 1)
        // The request holds a +1 on self until the connect callback, which frees the request.
        request.pointee.data = Unmanaged.passRetained(self).toOpaque()
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                uv_tcp_connect(request, socket.handle, $0, tcpConnectCallback)
            }
        }
        if rc != 0 {
            Unmanaged<TCPConnector>.fromOpaque(request.pointee.data).release()
            request.deallocate()
            socket.close()
            self.socket = nil
            lastError = uvErrorName(rc)
            tryNextAddress()
        }
    }

    fileprivate func didConnect(status: Int32) {
        guard let socket, completion != nil else { return }
        if status == 0 {
            self.socket = nil
            socket.setNoDelay()
            finish(.success(socket))
        } else {
            socket.close()
            self.socket = nil
            lastError = uvErrorName(status)
            tryNextAddress()
        }
    }

    private func finish(_ result: Result<TCPSocket, TransportError>) {
        guard let completion else {
            if case .success(let socket) = result { socket.close() }
            return
        }
        self.completion = nil
        timer?.close()
        timer = nil
        if case .failure = result, let socket {
            socket.close()
            self.socket = nil
        }
        completion(result)
    }
}

private func tcpResolveCallback(
    _ request: UnsafeMutablePointer<uv_getaddrinfo_t>?, _ status: Int32, _ result: UnsafeMutablePointer<addrinfo>?
) {
    guard let request, let data = request.pointee.data else { preconditionFailure("resolve without owner") }
    let connector = Unmanaged<TCPConnector>.fromOpaque(data).takeRetainedValue()
    request.deallocate()
    connector.didResolve(status: status, result: result)
}

private func tcpConnectCallback(_ request: UnsafeMutablePointer<uv_connect_t>?, _ status: Int32) {
    guard let request, let data = request.pointee.data else { preconditionFailure("connect without owner") }
    let connector = Unmanaged<TCPConnector>.fromOpaque(data).takeRetainedValue()
    request.deallocate()
    connector.didConnect(status: status)
}
