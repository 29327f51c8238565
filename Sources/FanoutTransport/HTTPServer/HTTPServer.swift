import FanoutCore
import Foundation
import Synchronization

/// The production HTTP server (`fanout serve`, the metrics endpoint), on its own loop threads: HTTP/1.1 with
/// keep-alive, and HTTP/2 over the one nghttp2 binding (`HTTP2Session`'s server role, through
/// `HTTP2ServerConnection`). With TLS it offers ALPN `h2` and `http/1.1`; without, a client that opens with the
/// HTTP/2 preface speaks HTTP/2 (prior knowledge), any other HTTP/1.1.
///
/// Each loop listens on the same port (SO_REUSEPORT) and owns the connections it accepts; the loops share only
/// the connection count. Every wait is bounded by `HTTPServerLimits`.
package final class HTTPServer: Sendable {
    /// Called on a loop thread with each complete request; must not block. Answer through the responder, now or
    /// later, from any thread.
    package typealias Handler = @Sendable (HTTPRequest, HTTPResponder) -> Void

    /// The port bound (the real one when 0 was asked).
    package let port: Int
    private let loops: [LoopThread]
    /// `perLoop[i]` is touched only on `loops[i]`.
    private let perLoop: [UncheckedSendableBox<HTTPServerLoopState>]
    private let counter: HTTPConnectionCounter
    private let stopped = FanoutMutex(false)

    /// Binds `host:port` (a numeric IPv4 or IPv6 address; port 0 picks a free one) on `threads` loops and starts
    /// serving.
    package init(
        host: String, port: Int, threads: Int, tls: TLSServerContext?, limits: HTTPServerLimits,
        handler: @escaping Handler
    ) throws(TransportError) {
        precondition(threads >= 1 && limits.maxConnections >= 1)
        let counter = HTTPConnectionCounter()
        var loops: [LoopThread] = []
        var states: [UncheckedSendableBox<HTTPServerLoopState>] = []
        var boundPort = port
        for index in 0..<threads {
            let loop = LoopThread(name: "http-\(index)")
            let state = HTTPServerLoopState(tls: tls, limits: limits, handler: handler, counter: counter)
            loops.append(loop)
            states.append(UncheckedSendableBox(state))
            let portToBind = boundPort
            let result = loop.runAndWait { () -> Result<Int, TransportError> in
                do throws(TransportError) {
                    let listener = try TCPListener(loop: loop, host: host, port: portToBind) { socket in
                        state.accept(socket)
                    }
                    state.listener = listener
                    return .success(listener.port)
                } catch {
                    return .failure(error)
                }
            }
            switch result {
            case .success(let bound):
                boundPort = bound
            case .failure(let error):
                for (loop, state) in zip(loops, states) { Self.stop(loop: loop, state: state) }
                throw error
            }
        }
        self.port = boundPort
        self.loops = loops
        self.perLoop = states
        self.counter = counter
    }

    deinit {
        if !loops.contains(where: { $0.inLoop }) { shutdown() }
    }

    /// Connections open now, across all loops (rejected ones not counted).
    package var openConnections: Int { counter.value.load(ordering: .relaxed) }

    /// Closes the listeners. Idle keep-alive connections close; requests in progress still get their answers,
    /// then their connections close (HTTP/2: GOAWAY).
    package func stopAccepting() {
        for (loop, state) in zip(loops, perLoop) {
            try? loop.execute { state.value.stopAccepting() }
        }
    }

    /// Drops everything and stops the loop threads. Blocks until they exit. Idempotent.
    package func shutdown() {
        let wasStopped = stopped.withLock { stopped in
            defer { stopped = true }
            return stopped
        }
        guard !wasStopped else { return }
        for (loop, state) in zip(loops, perLoop) { Self.stop(loop: loop, state: state) }
    }

    private static func stop(loop: LoopThread, state: UncheckedSendableBox<HTTPServerLoopState>) {
        try? loop.execute { state.value.closeAll() }
        loop.shutdown()
    }
}

/// The open-connection count shared by the loops, and the end of a burst of connections: once the count has fallen
/// by `burst` or more from its peak, to at most half of it, the connections' freed memory is given back to the
/// kernel (`HeapTrimmer`), which glibc would otherwise keep.
final class HTTPConnectionCounter: Sendable {
    let value = Atomic<Int>(0)
    /// The most connections open at once since the last trim was asked for.
    let peak = Atomic<Int>(0)
    /// How many connections must have closed since the peak for a burst to count: fewer leave little to give back.
    static let burst = 256

    /// Counts a connection opened: the new count.
    func opened() -> Int {
        let count = value.wrappingAdd(1, ordering: .relaxed).newValue
        var seen = peak.load(ordering: .relaxed)
        while count > seen {
            let (exchanged, original) = peak.compareExchange(
                expected: seen, desired: count, ordering: .relaxed)
            if exchanged { break }
            seen = original
        }
        return count
    }

    /// Counts a connection closed (or one `opened` and then refused), asking for a trim when a burst is over.
    func closed() {
        let count = value.wrappingSubtract(1, ordering: .relaxed).newValue
        let top = peak.load(ordering: .relaxed)
        guard top - count >= Self.burst, count <= top / 2 else { return }
        // One closing connection wins the exchange and asks; the next burst is measured from here.
        guard peak.compareExchange(expected: top, desired: count, ordering: .relaxed).exchanged else { return }
        HeapTrimmer.shared.trimSoon()
    }
}

/// What one loop of the server owns: its listener and its connections, until they close.
final class HTTPServerLoopState {
    let tls: TLSServerContext?
    let limits: HTTPServerLimits
    let handler: HTTPServer.Handler
    let counter: HTTPConnectionCounter
    var listener: TCPListener?
    var connections: [ObjectIdentifier: HTTPServerConnection] = [:]
    /// Connections refused past `maxConnections`, until their linger ends.
    var rejected: [ObjectIdentifier: HTTPRejectedConnection] = [:]

    init(
        tls: TLSServerContext?, limits: HTTPServerLimits, handler: @escaping HTTPServer.Handler,
        counter: HTTPConnectionCounter
    ) {
        self.tls = tls
        self.limits = limits
        self.handler = handler
        self.counter = counter
    }

    func accept(_ socket: TCPSocket) {
        let count = counter.opened()
        guard count <= limits.maxConnections else {
            counter.closed()
            reject(socket)
            return
        }
        let connection: HTTPServerConnection
        do {
            connection = try HTTPServerConnection(socket: socket, tls: tls, limits: limits, handler: handler)
        } catch {
            counter.closed()
            return
        }
        let key = ObjectIdentifier(connection)
        connections[key] = connection
        connection.onClose = { [self] in
            connections[key] = nil
            counter.closed()
        }
        connection.start()
    }

    private func reject(_ socket: TCPSocket) {
        guard tls == nil else {
            socket.close()
            return
        }
        let rejected = HTTPRejectedConnection(
            socket: socket, answer: limits.answer(503, "too many connections"),
            lingerMilliseconds: limits.lingerMilliseconds)
        let key = ObjectIdentifier(rejected)
        self.rejected[key] = rejected
        rejected.onClose = { [self] in self.rejected[key] = nil }
        rejected.start()
    }

    func stopAccepting() {
        listener?.close()
        listener = nil
        for connection in Array(connections.values) { connection.stopAccepting() }
    }

    func closeAll() {
        listener?.close()
        listener = nil
        for connection in Array(connections.values) { connection.close() }
        for connection in Array(rejected.values) { connection.close() }
    }
}

/// A plain-TCP connection past `maxConnections`: it gets `answer` (the server's own 503, `ownAnswer`'s wording)
/// with `Connection: close` at once, a half-close, and is closed when the peer closes or after a bounded linger,
/// whichever comes first. Its input is dropped.
final class HTTPRejectedConnection: TCPSocketDelegate {
    private let socket: TCPSocket
    private let timer: LoopTimer
    private let answer: HTTPResponse
    private let lingerMilliseconds: UInt64
    var onClose: (() -> Void)?

    init(socket: TCPSocket, answer: HTTPResponse, lingerMilliseconds: UInt64) {
        self.socket = socket
        self.answer = answer
        self.lingerMilliseconds = lingerMilliseconds
        timer = LoopTimer(loop: socket.loop)
    }

    func start() {
        socket.delegate = self
        socket.startReading()
        let bytes = Array(answer.http1Head(keepAlive: false).utf8) + (answer.hasBody ? answer.body : [])
        bytes.withUnsafeBytes { socket.write(borrowing: $0) }  // one write: head and body together
        socket.shutdownWrites()
        // Strong capture: the cycle ends when the timer closes.
        timer.schedule(milliseconds: lingerMilliseconds) { [self] in close() }
    }

    func close() {
        socket.close()
        finish()
    }

    private func finish() {
        timer.close()
        let onClose = self.onClose
        self.onClose = nil
        onClose?()
    }

    func tcpSocket(_ socket: TCPSocket, didRead bytes: UnsafeRawBufferPointer) {}

    func tcpSocket(_ socket: TCPSocket, didCloseWith error: TransportError?) {
        finish()
    }

    func tcpSocketDidDrainWrites(_ socket: TCPSocket) {}
}
