import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// One keep-alive HTTP/1.1 connection to a loopback server, blocking, for the serve scenario's requests whose
/// latency is measured: no client library, no thread hops, so what is timed is the server's answer. Send and
/// receive time out after `timeoutSeconds`, so a stuck server fails the run instead of hanging it. Responses must
/// carry `content-length` (fanout serve always sends it). The socket is opened at the first request, and opened
/// again when the server closed it in between (fanout serve closes a connection that sends no request for 10 s
/// after opening, or none for 75 s after the last).
final class BenchHTTPConnection {
    let port: Int
    let timeoutSeconds: Int
    private var descriptor: Int32 = -1
    private var buffer: [UInt8] = []

    init(port: Int, timeoutSeconds: Int = 30) {
        self.port = port
        self.timeoutSeconds = timeoutSeconds
    }

    deinit { close() }

    /// Closes the socket; idempotent.
    func close() {
        if descriptor >= 0 { _ = Glibc.close(descriptor) }
        descriptor = -1
        buffer.removeAll()
    }

    private func open() throws {
        let socketDescriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard socketDescriptor >= 0 else { throw BenchError("socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(socketDescriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            let error = errno
            _ = Glibc.close(socketDescriptor)
            throw BenchError("connect to 127.0.0.1:\(port): errno \(error)")
        }
        var one: Int32 = 1
        setsockopt(socketDescriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(socketDescriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(socketDescriptor, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        descriptor = socketDescriptor
    }

    /// One request and its whole response: status and body.
    func request(_ method: String, _ path: String, bearer: String? = nil, json: String? = nil) throws -> (
        status: Int, body: [UInt8]
    ) {
        if descriptor >= 0 && closedByPeer() { close() }
        if descriptor < 0 { try open() }
        var head = "\(method) \(path) HTTP/1.1\r\nhost: 127.0.0.1:\(port)\r\n"
        if let bearer { head += "authorization: Bearer \(bearer)\r\n" }
        let body = Array((json ?? "").utf8)
        if json != nil { head += "content-type: application/json\r\n" }
        head += "content-length: \(body.count)\r\n\r\n"
        do {
            try write(Array(head.utf8) + body)
            return try readResponse()
        } catch {
            close()
            throw error
        }
    }

    /// A request whose JSON response body is decoded into an object.
    func requestObject(_ method: String, _ path: String, bearer: String? = nil, json: String? = nil) throws -> (
        status: Int, object: [String: Any]
    ) {
        let (status, body) = try request(method, path, bearer: bearer, json: json)
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
            throw BenchError(
                "\(method) \(path): \(status), not a JSON object: \(String(decoding: body, as: UTF8.self))")
        }
        return (status, object)
    }

    /// Whether the idle socket is readable: between requests that can only be the server's close (or a stray byte,
    /// which would spoil the next response as well).
    private func closedByPeer() -> Bool {
        var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        return poll(&entry, 1, 0) > 0
    }

    private func write(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes {
                send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            guard sent > 0 else { throw BenchError("send to 127.0.0.1:\(port): errno \(errno)") }
            offset += sent
        }
    }

    /// Reads more bytes into `buffer`; throws on end of stream, error or time-out.
    private func fill() throws {
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        let received = chunk.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
        guard received > 0 else {
            throw BenchError(
                received == 0
                    ? "127.0.0.1:\(port) closed the connection"
                    : "receive from 127.0.0.1:\(port): errno \(errno) (time-out after \(timeoutSeconds) s?)")
        }
        buffer.append(contentsOf: chunk[0..<received])
    }

    private func readResponse() throws -> (status: Int, body: [UInt8]) {
        let separator = Array("\r\n\r\n".utf8)
        var headEnd: Int?
        while headEnd == nil {
            headEnd = buffer.firstRange(of: separator)?.upperBound
            if headEnd == nil { try fill() }
        }
        let headText = String(decoding: buffer[0..<headEnd!], as: UTF8.self)
        let lines = headText.split(separator: "\r\n")
        guard let statusLine = lines.first, statusLine.hasPrefix("HTTP/1."),
            let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "")
        else { throw BenchError("not an HTTP/1.1 response: \(headText.prefix(200))") }
        var length = 0
        var closes = false
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            let name = line[..<colon].lowercased()
            let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            if name == "content-length" { length = Int(value) ?? 0 }
            if name == "connection" && value.lowercased() == "close" { closes = true }
            if name == "transfer-encoding" { throw BenchError("chunked responses are not supported here") }
        }
        while buffer.count < headEnd! + length { try fill() }
        let body = Array(buffer[headEnd!..<(headEnd! + length)])
        buffer.removeFirst(headEnd! + length)
        if closes { close() }
        return (status, body)
    }
}
