import CLibUV
import FanoutCore
package import FanoutTransport
import Foundation

/// An HTTP/2 server, over TLS or in cleartext (h2c with prior knowledge), on N loop threads (mock-apns, tests). Each loop listens on the same
/// port (SO_REUSEPORT), and accepted connections are dealt to the loops in turn, as nghttpd's acceptor does: the
/// kernel's SO_REUSEPORT hash puts them on loops at random, so with a few connections one loop often got most of them
/// and capped the rate at one core's while the other loop idled. A connection is moved by handing its descriptor
/// to the other loop before anything was read from it. Each loop owns its connections, so loops share nothing but
/// the handler's own shared state.
package final class HTTP2Server: @unchecked Sendable {
    // @unchecked Sendable: `perLoop[i]` is touched only on `loops[i]`; the rest is immutable or locked.

    package let loops: [LoopThread]
    /// The port bound (the real one when 0 was asked).
    package let port: Int
    package let host: String
    private let perLoop: [LoopState]

    /// What one loop owns: its listener, its handler and the connections it serves (until they close).
    private final class LoopState {
        var listener: TCPListener?
        var handler: HTTP2ServerHandler?
        var connections: [ObjectIdentifier: HTTP2ServerConnection] = [:]
    }

    /// The loops that serve connections so far (filled as they start), and whose turn the next connection is.
    private struct Dealer {
        var loops: [(loop: LoopThread, state: UncheckedSendableBox<LoopState>)] = []
        var next = 0
    }

    /// Binds `host:port` on `threads` loops and starts accepting.
    /// - Parameter tls: nil serves HTTP/2 in cleartext (the client sends the preface at once: prior knowledge).
    /// - Parameter makeHandler: called once per loop, on that loop, to make the handler of its connections.
    package init(
        host: String, port: Int, threads: Int, tls: TLSServerContext?, initialMaxStreams: UInt32,
        makeHandler: @escaping @Sendable (LoopThread) -> HTTP2ServerHandler
    ) throws(TransportError) {
        precondition(threads >= 1)
        self.host = host
        var loops: [LoopThread] = []
        var states: [LoopState] = []
        var boundPort = port
        let dealer = FanoutMutex(Dealer())
        for index in 0..<threads {
            let loop = LoopThread(name: "server-loop-\(index)")
            let state = LoopState()
            loops.append(loop)
            states.append(state)
            let portToBind = boundPort
            let result = loop.runAndWait { () -> Result<Int, TransportError> in
                let handler = makeHandler(loop)
                state.handler = handler
                do {
                    let listener = try TCPListener(loop: loop, host: host, port: portToBind) { socket in
                        let target = dealer.withLock { dealer -> (LoopThread, UncheckedSendableBox<LoopState>)? in
                            guard !dealer.loops.isEmpty else { return nil }
                            defer { dealer.next = (dealer.next + 1) % dealer.loops.count }
                            return dealer.loops[dealer.next]
                        }
                        guard let (targetLoop, targetState) = target, targetLoop !== loop,
                            let descriptor = Self.duplicateDescriptor(of: socket)
                        else {
                            Self.serve(socket, state: state, tls: tls, initialMaxStreams: initialMaxStreams)
                            return
                        }
                        socket.close()
                        do {
                            try targetLoop.execute {
                                let moved = TCPSocket(loop: targetLoop)
                                guard uv_tcp_open(moved.handle, uv_os_sock_t(descriptor)) == 0 else {
                                    Glibc.close(descriptor)
                                    moved.close()
                                    return
                                }
                                moved.setNoDelay()
                                Self.serve(
                                    moved, state: targetState.value, tls: tls, initialMaxStreams: initialMaxStreams)
                            }
                        } catch {
                            Glibc.close(descriptor)  // the loop is stopping
                        }
                    }
                    state.listener = listener
                    return .success(listener.port)
                } catch let error as TransportError {
                    return .failure(error)
                } catch {
                    return .failure(TransportError(.connectFailed, "\(error)"))
                }
            }
            switch result {
            case .success(let port):
                boundPort = port
                dealer.withLock { $0.loops.append((loop, UncheckedSendableBox(state))) }
            case .failure(let error):
                for (loop, state) in zip(loops, states) { Self.stop(loop: loop, state: state) }
                throw error
            }
        }
        self.port = boundPort
        self.loops = loops
        self.perLoop = states
    }

    /// Serves an accepted socket on its loop (the one `state` belongs to).
    private static func serve(
        _ socket: TCPSocket, state: LoopState, tls: TLSServerContext?, initialMaxStreams: UInt32
    ) {
        do {
            let connection = try HTTP2ServerConnection(
                socket: socket, tlsContext: tls, handler: state.handler!, initialMaxStreams: initialMaxStreams)
            let key = ObjectIdentifier(connection)
            state.connections[key] = connection
            connection.onClose = { state.connections[key] = nil }
        } catch {
            socket.close()
        }
    }

    /// A second descriptor for an accepted socket's connection, to open on another loop once this socket is closed.
    /// The caller owns it: `uv_tcp_open` on the target loop hands it to that `TCPSocket` (closed with it), and every
    /// path that does not get there closes it.
    private static func duplicateDescriptor(of socket: TCPSocket) -> Int32? {
        var descriptor = uv_os_fd_t()
        guard uv_fileno(socket.genericHandle, &descriptor) == 0 else { return nil }
        let duplicate = dup(descriptor)
        return duplicate >= 0 ? duplicate : nil
    }

    /// Stops listening, drops every connection and stops the loops. Blocks until they exit.
    package func shutdown() {
        for (loop, state) in zip(loops, perLoop) { Self.stop(loop: loop, state: state) }
    }

    private static func stop(loop: LoopThread, state: LoopState) {
        let box = UncheckedSendableBox(state)
        try? loop.execute {  // only shutdown stops these loops, once
            box.value.listener?.close()
            box.value.listener = nil
            for connection in Array(box.value.connections.values) { connection.drop() }
        }
        loop.shutdown()
    }
}
