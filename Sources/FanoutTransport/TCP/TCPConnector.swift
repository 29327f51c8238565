import CLibUV
import Foundation

/// Resolves a host name (`uv_getaddrinfo`) and connects a TCP socket to the first address that
/// answers, within a deadline. Confined to its loop; reports exactly once.
///
/// With several addresses, each but the last gets a share of the deadline (`attemptMilliseconds`) before the next is
/// tried: an address that drops packets (a broken IPv6 route, often listed first) would otherwise use the whole
/// deadline, and every connection would fail although the next address answers.
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
    private var timeoutMilliseconds: UInt64 = 0
    /// Bounds the current attempt when more addresses are left; the whole deadline bounds the last.
    private var attemptTimer: LoopTimer?

    /// Starts connecting to `host:port`; `completion` runs on the loop thread exactly once.
    static func connect(
        loop: LoopThread, host: String, port: Int, timeoutMilliseconds: UInt64, completion: @escaping Completion
    ) {
        let connector = TCPConnector(loop: loop, host: host, port: port, completion: completion)
        connector.start(timeoutMilliseconds: timeoutMilliseconds)
    }

    /// Connects to the first of `addresses` (numeric IPv4 or IPv6, in order) that answers, as if `host` had resolved
    /// to them: for tests of what happens past a first address that never answers.
    static func connect(
        loop: LoopThread, addresses: [String], port: Int, timeoutMilliseconds: UInt64,
        completion: @escaping Completion
    ) {
        let connector = TCPConnector(loop: loop, host: addresses.first ?? "", port: port, completion: completion)
        connector.armDeadline(timeoutMilliseconds: timeoutMilliseconds)
        for text in addresses {
            var storage = sockaddr_storage()
            let parsed = withUnsafeMutableBytes(of: &storage) { raw -> Bool in
                if uv_ip4_addr(text, Int32(port), raw.baseAddress!.assumingMemoryBound(to: sockaddr_in.self)) == 0 {
                    return true
                }
                return uv_ip6_addr(text, Int32(port), raw.baseAddress!.assumingMemoryBound(to: sockaddr_in6.self)) == 0
            }
            if parsed { connector.addresses.append(storage) }
        }
        connector.tryNextAddress()
    }

    /// How long an attempt may take while other addresses are left: an even share of the deadline, but at least
    /// 2 s (a slow handshake across the world is not a dead address).
    private var attemptMilliseconds: UInt64 {
        max(2_000, timeoutMilliseconds / UInt64(max(addresses.count, 1)))
    }

    private init(loop: LoopThread, host: String, port: Int, completion: @escaping Completion) {
        self.loop = loop
        self.host = host
        self.port = port
        self.completion = completion
    }

    private func armDeadline(timeoutMilliseconds: UInt64) {
        loop.assertInLoop()
        self.timeoutMilliseconds = timeoutMilliseconds
        let timer = LoopTimer(loop: loop)
        self.timer = timer
        // The timer's closure keeps the connector alive until it finishes.
        timer.schedule(milliseconds: timeoutMilliseconds) { [self] in
            finish(
                .failure(
                    TransportError(
                        .connectTimeout, "connect to \(host):\(port) timed out after \(timeoutMilliseconds) ms")))
        }
    }

    private func start(timeoutMilliseconds: UInt64) {
        armDeadline(timeoutMilliseconds: timeoutMilliseconds)
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
            return
        }
        guard nextAddress < addresses.count else { return }  // the last address has what is left of the deadline
        let attemptTimer = self.attemptTimer ?? LoopTimer(loop: loop)
        self.attemptTimer = attemptTimer
        let milliseconds = attemptMilliseconds
        attemptTimer.schedule(milliseconds: milliseconds) { [self] in
            // Given up on: its connect callback comes (ECANCELED) for a socket that is no longer `socket`.
            guard completion != nil, let abandoned = self.socket else { return }
            abandoned.close()
            self.socket = nil
            lastError = "no answer within \(milliseconds) ms"
            tryNextAddress()
        }
    }

    fileprivate func didConnect(status: Int32, handle: UnsafeMutableRawPointer?) {
        guard let socket, completion != nil, handle == UnsafeMutableRawPointer(socket.handle) else { return }
        attemptTimer?.cancel()
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
        attemptTimer?.close()
        attemptTimer = nil
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
    // Which socket's attempt this was, compared by address only and never dereferenced: an abandoned attempt's handle
    // is closing (its `TCPSocket` frees it in the close callback, which libuv runs after this one).
    let handle = request.pointee.handle.map { UnsafeMutableRawPointer($0) }
    request.deallocate()
    connector.didConnect(status: status, handle: handle)
}
