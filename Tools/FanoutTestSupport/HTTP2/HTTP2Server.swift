import FanoutTransport
import Foundation

/// An HTTP/2-over-TLS server on N loop threads (mock-apns, tests). Each loop listens on the same
/// port (SO_REUSEPORT) and owns the connections it accepts, so loops share nothing but the
/// handler's own shared state.
package final class HTTP2Server: @unchecked Sendable {
    // @unchecked Sendable: `perLoop[i]` is touched only on `loops[i]`; the rest is immutable.

    package let loops: [LoopThread]
    /// The port bound (the real one when 0 was asked).
    package let port: Int
    package let host: String
    private let perLoop: [LoopState]

    /// What one loop owns: its listener and the connections it accepted (until they close).
    private final class LoopState {
        var listener: TCPListener?
        var connections: [ObjectIdentifier: HTTP2ServerConnection] = [:]
    }

    /// Binds `host:port` on `threads` loops and starts accepting.
    /// - Parameter makeHandler: called once per loop, on that loop, to make the handler of its connections.
    package init(
        host: String, port: Int, threads: Int, tls: TLSServerContext, initialMaxStreams: UInt32,
        makeHandler: @escaping @Sendable (LoopThread) -> HTTP2ServerHandler
    ) throws(TransportError) {
        precondition(threads >= 1)
        self.host = host
        var loops: [LoopThread] = []
        var states: [LoopState] = []
        var boundPort = port
        for index in 0..<threads {
            let loop = LoopThread(name: "server-loop-\(index)")
            let state = LoopState()
            loops.append(loop)
            states.append(state)
            let portToBind = boundPort
            let result = loop.runAndWait { () -> Result<Int, TransportError> in
                let handler = makeHandler(loop)
                do {
                    let listener = try TCPListener(loop: loop, host: host, port: portToBind) { socket in
                        do {
                            let connection = try HTTP2ServerConnection(
                                socket: socket, tlsContext: tls, handler: handler, initialMaxStreams: initialMaxStreams)
                            let key = ObjectIdentifier(connection)
                            state.connections[key] = connection
                            connection.onClose = { state.connections[key] = nil }
                        } catch {
                            socket.close()
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
            case .failure(let error):
                for (loop, state) in zip(loops, states) { Self.stop(loop: loop, state: state) }
                throw error
            }
        }
        self.port = boundPort
        self.loops = loops
        self.perLoop = states
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
