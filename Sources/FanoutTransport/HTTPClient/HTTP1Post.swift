import CFanoutShims
import COpenSSL
import FanoutHTTP1
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// HTTP/1.1 `POST`s that block the calling thread until the answer arrives or `timeout` passes: `fanout serve`'s
/// webhook deliveries, which run on threads of their own and only need the status. `http://` and `https://` (TLS 1.2
/// or later, the server's certificate verified against the system's CAs, or a given CA file, and the URL's host).
package enum HTTP1Post {
    /// An `http` or `https` URL split into what the request needs.
    package struct Target: Sendable, Equatable {
        package var secure: Bool
        package var host: String
        package var port: Int
        /// Path and query, `/` when the URL has none.
        package var pathAndQuery: String

        /// Parses `http[s]://host[:port][/path][?query]`; nil for anything else (user info is refused: a secret in a
        /// URL would end up in logs).
        package init?(url: String) {
            guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
                scheme == "http" || scheme == "https", let host = components.host, !host.isEmpty,
                components.user == nil, components.password == nil
            else { return nil }
            secure = scheme == "https"
            self.host = host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host
            port = components.port ?? (secure ? 443 : 80)
            guard (1...65535).contains(port) else { return nil }
            var path = components.percentEncodedPath
            if path.isEmpty { path = "/" }
            if let query = components.percentEncodedQuery { path += "?" + query }
            pathAndQuery = path
        }

        /// `scheme://host:port` (never the path, which may carry a receiver's own token).
        package var origin: String {
            let authority = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
            return (secure ? "https://" : "http://") + authority
        }
    }

    /// Why a POST got no status.
    package struct Failure: Error, CustomStringConvertible, Sendable {
        package enum Kind: String, Sendable { case connect, tls, timeout, protocolError = "protocol" }
        package var kind: Kind
        package var description: String
    }

    /// Sends `body` on a connection of its own and returns the answer's status code.
    /// - Parameter caFile: PEM CAs to verify an `https` server with, instead of the system's.
    package static func post(
        _ target: Target, headers: [(String, String)], body: [UInt8], timeout: Duration, caFile: String? = nil
    ) throws(Failure) -> Int {
        let client = Client(target: target, caFile: caFile)
        defer { client.close() }
        return try client.post(headers: headers, body: body, timeout: timeout)
    }

    /// POSTs to one target on a kept-alive connection, one request at a time, from one thread at a time (a webhook
    /// deliverer's). The connection is reused while the server keeps it (its answers framed by `Content-Length` or
    /// chunked, no `Connection: close`); a kept connection the server closed meanwhile is replaced once, when
    /// nothing of the answer came back on it.
    package final class Client {
        package let target: Target
        private let caFile: String?
        /// The connected socket (owned: closed in `close()`), -1 when there is none.
        private var fd: Int32 = -1
        private var tls: TLSConnection?

        package init(target: Target, caFile: String? = nil) {
            self.target = target
            self.caFile = caFile
        }

        deinit { close() }

        /// Closes the connection (the next `post` opens another).
        package func close() {
            tls?.close()
            tls = nil
            if fd >= 0 { Glibc.close(fd) }
            fd = -1
        }

        /// Sends `body` and returns the answer's status code, within `timeout` (a replaced connection included).
        package func post(headers: [(String, String)], body: [UInt8], timeout: Duration) throws(Failure) -> Int {
            let deadline = ContinuousClock.now + timeout
            var head = "POST \(target.pathAndQuery) HTTP/1.1\r\nHost: \(HTTP1Post.hostHeader(target))\r\n"
            for (name, value) in headers { head += "\(name): \(value)\r\n" }
            head += "Content-Length: \(body.count)\r\n\r\n"
            let request = Array(head.utf8) + body
            let reused = fd >= 0
            var answered = false
            do {
                return try exchange(request, deadline: deadline, answered: &answered)
            } catch {
                close()
                guard reused, !answered, error.kind != .timeout else { throw error }
                // The server closed the kept connection while it was idle: once more on a new one.
                var again = false
                do {
                    return try exchange(request, deadline: deadline, answered: &again)
                } catch {
                    close()
                    throw error
                }
            }
        }

        private func exchange(_ request: [UInt8], deadline: ContinuousClock.Instant, answered: inout Bool)
            throws(Failure) -> Int
        {
            if fd < 0 {
                fd = try HTTP1Post.connect(target, deadline: deadline)
                if target.secure {
                    tls = try TLSConnection(fd: fd, host: target.host, caFile: caFile, deadline: deadline)
                }
            }
            try write(request, deadline: deadline)
            var received: [UInt8] = []
            let (status, keep) = try readAnswer(into: &received, deadline: deadline, answered: &answered)
            if !keep { close() }
            return status
        }

        private func write(_ bytes: [UInt8], deadline: ContinuousClock.Instant) throws(Failure) {
            if let tls { return try tls.write(bytes, deadline: deadline) }
            try HTTP1Post.writeAll(fd, bytes, deadline: deadline)
        }

        private func read(into buffer: inout [UInt8], deadline: ContinuousClock.Instant) throws(Failure) -> Int {
            if let tls { return try tls.read(into: &buffer, deadline: deadline) }
            return try HTTP1Post.readSome(fd, into: &buffer, deadline: deadline)
        }

        /// Reads the answer's head and, when it is framed, its body (discarded): the status, and whether the
        /// connection can carry the next request.
        private func readAnswer(into received: inout [UInt8], deadline: ContinuousClock.Instant, answered: inout Bool)
            throws(Failure) -> (status: Int, keep: Bool)
        {
            while true {
                guard let end = HTTP1Post.headEnd(received) else {
                    guard received.count < 64 * 1024 else {
                        throw Failure(kind: .protocolError, description: "the answer's head is over 64 KiB")
                    }
                    if try read(into: &received, deadline: deadline) == 0 {
                        throw Failure(kind: .protocolError, description: "the connection closed before an answer")
                    }
                    answered = true
                    continue
                }
                let lines = String(decoding: received[..<end], as: UTF8.self).components(separatedBy: "\r\n")
                let parts = lines[0].split(separator: " ", maxSplits: 2)
                guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]),
                    (100...599).contains(status)
                else { throw Failure(kind: .protocolError, description: "the answer is not HTTP/1.x") }
                received.removeFirst(end + 4)
                // 1xx (100 Continue): the final answer follows.
                if status < 200 { continue }
                var fields: [String: String] = [:]
                for line in lines.dropFirst() {
                    guard let colon = line.firstIndex(of: ":") else { continue }
                    fields[line[..<colon].lowercased()] = line[line.index(after: colon)...]
                        .trimmingCharacters(in: .whitespaces).lowercased()
                }
                var keep = parts[0] == "HTTP/1.1" && !(fields["connection"] ?? "").contains("close")
                if status == 204 || status == 304 {
                    // No body.
                } else if (fields["transfer-encoding"] ?? "").contains("chunked") {
                    keep = try skipChunked(received, deadline: deadline) && keep
                } else if let length = fields["content-length"].flatMap(Int.init), length >= 0 {
                    keep = try skip(length, after: received, deadline: deadline) && keep
                } else {
                    keep = false  // a body that ends with the connection
                }
                return (status, keep)
            }
        }

        /// Reads and drops a body of `length` bytes (`already` holds its start); false, reading nothing more, when
        /// it is over 64 KiB (the connection is closed instead).
        private func skip(_ length: Int, after already: [UInt8], deadline: ContinuousClock.Instant) throws(Failure)
            -> Bool
        {
            guard length <= 64 * 1024 else { return false }
            var buffer = already
            while buffer.count < length {
                if try read(into: &buffer, deadline: deadline) == 0 { return false }
            }
            return buffer.count == length
        }

        /// Reads and drops a chunked body (`already` holds its start); false when it is over 64 KiB or malformed.
        private func skipChunked(_ already: [UInt8], deadline: ContinuousClock.Instant) throws(Failure) -> Bool {
            var decoder = HTTP1ChunkedDecoder(maxBodyBytes: 64 * 1024)
            var input = already
            var body: [UInt8] = []
            while true {
                let (consumed, outcome) = input.withUnsafeBytes { decoder.decode($0, into: &body) }
                switch outcome {
                case .done: return consumed == input.count
                case .tooLarge, .malformed: return false
                case .needMore:
                    input.removeAll(keepingCapacity: true)
                    body.removeAll(keepingCapacity: true)
                    if try read(into: &input, deadline: deadline) == 0 { return false }
                }
            }
        }
    }

    fileprivate static func hostHeader(_ target: Target) -> String {
        let host = target.host.contains(":") ? "[\(target.host)]" : target.host
        return target.port == (target.secure ? 443 : 80) ? host : "\(host):\(target.port)"
    }

    fileprivate static func headEnd(_ bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for index in 0...(bytes.count - 4)
        where bytes[index] == 13 && bytes[index + 1] == 10 && bytes[index + 2] == 13 && bytes[index + 3] == 10 {
            return index
        }
        return nil
    }

    /// Milliseconds left before `deadline` for `poll`, or a timeout failure.
    fileprivate static func remaining(_ deadline: ContinuousClock.Instant) throws(Failure) -> Int32 {
        let left = deadline - ContinuousClock.now
        guard left > .zero else { throw Failure(kind: .timeout, description: "no answer in time") }
        let (seconds, attoseconds) = left.components
        return Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
    }

    /// Waits until `fd` is readable (`POLLIN`) or writable (`POLLOUT`).
    fileprivate static func wait(_ fd: Int32, _ events: Int16, deadline: ContinuousClock.Instant) throws(Failure) {
        while true {
            var entry = pollfd(fd: fd, events: events, revents: 0)
            let ready = poll(&entry, 1, try remaining(deadline))
            if ready > 0 { return }
            if ready < 0 && errno != EINTR {
                throw Failure(kind: .connect, description: "poll failed: errno \(errno)")
            }
        }
    }

    /// A connected non-blocking socket (each address in turn until one answers).
    fileprivate static func connect(_ target: Target, deadline: ContinuousClock.Instant) throws(Failure) -> Int32 {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_family = AF_UNSPEC
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(target.host, String(target.port), &hints, &list)
        guard status == 0, let first = list else {
            throw Failure(kind: .connect, description: "cannot resolve \(target.host)")
        }
        // `list` is getaddrinfo's, freed here once the loop is done with it.
        defer { freeaddrinfo(first) }
        var lastError = "no address"
        var entry: UnsafeMutablePointer<addrinfo>? = first
        while let address = entry {
            entry = address.pointee.ai_next
            let fd = socket(address.pointee.ai_family, address.pointee.ai_socktype, address.pointee.ai_protocol)
            guard fd >= 0 else { continue }
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            var one: Int32 = 1
            _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            if Glibc.connect(fd, address.pointee.ai_addr, address.pointee.ai_addrlen) == 0 { return fd }
            guard errno == EINPROGRESS else {
                lastError = "errno \(errno)"
                close(fd)
                continue
            }
            do {
                try wait(fd, Int16(POLLOUT), deadline: deadline)
            } catch {
                close(fd)
                throw error
            }
            var socketError: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            _ = getsockopt(fd, SOL_SOCKET, SO_ERROR, &socketError, &length)
            if socketError == 0 { return fd }
            lastError = String(cString: strerror(socketError))
            close(fd)
        }
        throw Failure(kind: .connect, description: "cannot connect to \(target.origin): \(lastError)")
    }

    fileprivate static func writeAll(_ fd: Int32, _ bytes: [UInt8], deadline: ContinuousClock.Instant) throws(Failure) {
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeBytes {
                send(fd, $0.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
            }
            if written > 0 {
                offset += written
            } else if written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                try wait(fd, Int16(POLLOUT), deadline: deadline)
            } else {
                throw Failure(kind: .connect, description: "the connection closed while sending: errno \(errno)")
            }
        }
    }

    /// Appends what is there to read (waiting for some); 0 at the end of the stream.
    fileprivate static func readSome(_ fd: Int32, into buffer: inout [UInt8], deadline: ContinuousClock.Instant)
        throws(Failure) -> Int
    {
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, 4096, 0) }
            if count >= 0 {
                buffer.append(contentsOf: chunk[..<count])
                return count
            }
            guard errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR else {
                throw Failure(kind: .connect, description: "the connection failed: errno \(errno)")
            }
            try wait(fd, Int16(POLLIN), deadline: deadline)
        }
    }

    /// A client TLS session on a connected non-blocking socket.
    fileprivate final class TLSConnection {
        /// Owned: freed in `close()` (the session holds its own reference to the context, so the context is freed
        /// right after `SSL_new`).
        private var ssl: OpaquePointer?
        private let fd: Int32

        init(fd: Int32, host: String, caFile: String?, deadline: ContinuousClock.Instant) throws(Failure) {
            self.fd = fd
            guard let context = SSL_CTX_new(TLS_client_method()) else {
                throw Failure(kind: .tls, description: "cannot make a TLS context")
            }
            defer { SSL_CTX_free(context) }
            _ = CFanoutShims_SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION)
            if let caFile {
                guard SSL_CTX_load_verify_locations(context, caFile, nil) == 1 else {
                    throw Failure(kind: .tls, description: "cannot load the CA file \(caFile)")
                }
            } else {
                SSL_CTX_set_default_verify_paths(context)
            }
            SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
            guard let ssl = SSL_new(context) else {
                throw Failure(kind: .tls, description: "cannot make a TLS session")
            }
            self.ssl = ssl
            _ = CFanoutShims_SSL_set_tlsext_host_name(ssl, host)
            SSL_set1_host(ssl, host)
            SSL_set_fd(ssl, fd)
            while true {
                let result = SSL_connect(ssl)
                if result == 1 { break }
                try step(result, deadline: deadline, what: "TLS handshake with \(host)")
            }
        }

        /// Waits for what OpenSSL asks for, or throws its error.
        private func step(_ result: Int32, deadline: ContinuousClock.Instant, what: String) throws(Failure) {
            switch SSL_get_error(ssl, result) {
            case SSL_ERROR_WANT_READ: try HTTP1Post.wait(fd, Int16(POLLIN), deadline: deadline)
            case SSL_ERROR_WANT_WRITE: try HTTP1Post.wait(fd, Int16(POLLOUT), deadline: deadline)
            default:
                let verify = SSL_get_verify_result(ssl)
                let detail =
                    verify != X509_V_OK
                    ? String(cString: X509_verify_cert_error_string(verify)) : "error \(ERR_get_error())"
                ERR_clear_error()
                throw Failure(kind: .tls, description: "\(what) failed: \(detail)")
            }
        }

        func write(_ bytes: [UInt8], deadline: ContinuousClock.Instant) throws(Failure) {
            var offset = 0
            while offset < bytes.count {
                let written = bytes.withUnsafeBytes {
                    SSL_write(ssl, $0.baseAddress! + offset, Int32(bytes.count - offset))
                }
                if written > 0 {
                    offset += Int(written)
                } else {
                    try step(written, deadline: deadline, what: "sending")
                }
            }
        }

        func read(into buffer: inout [UInt8], deadline: ContinuousClock.Instant) throws(Failure) -> Int {
            var chunk = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = chunk.withUnsafeMutableBytes { SSL_read(ssl, $0.baseAddress!, 4096) }
                if count > 0 {
                    buffer.append(contentsOf: chunk[..<Int(count)])
                    return Int(count)
                }
                if SSL_get_error(ssl, count) == SSL_ERROR_ZERO_RETURN { return 0 }
                try step(count, deadline: deadline, what: "reading the answer")
            }
        }

        func close() {
            if let ssl { SSL_free(ssl) }
            ssl = nil
        }
    }
}
