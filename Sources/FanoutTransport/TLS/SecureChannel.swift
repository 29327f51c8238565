import Foundation

/// What a secure channel tells the protocol on top of it (HTTP/2). All calls on the loop thread.
package protocol SecureChannelDelegate: AnyObject {
    /// The handshake finished (for a client: the certificate verified and h2 negotiated).
    func channelDidBecomeReady(_ channel: SecureChannel)
    /// Decrypted bytes arrived; valid only during the call.
    func channel(_ channel: SecureChannel, didRead plaintext: UnsafeRawBufferPointer)
    /// The channel closed: `error` says why (nil for a close we asked for). Called exactly once.
    func channel(_ channel: SecureChannel, didCloseWith error: TransportError?)
    /// Flush time: write pending protocol output with `channel.write(_:)`. Called at most once per
    /// loop turn, and only while the socket's queue is under the high-water mark.
    func channelProduceOutput(_ channel: SecureChannel)
}

/// TCP plus TLS on one loop: ciphertext flows between the socket and the TLS engine, plaintext
/// between the engine and the delegate. Without a TLS engine (plaintext mode: HTTP/1.1 and h2c on
/// `HTTPServer`) bytes pass straight between the socket and the delegate, through the same staging.
/// Output is coalesced: the delegate writes into a 16 KiB plaintext staging buffer (one TLS record
/// per 16 KiB, not per frame), and the ciphertext of a loop turn leaves in one write, or in writes
/// of `ciphertextWriteThreshold` when there is more (plaintext mode likewise). Past `highWaterMark` bytes queued on
/// the socket it stops asking for output until the socket drains (h2load's back-off).
///
/// A server's channel also bounds what a peer that does not read can cost (`limitOutput`): it stops reading while
/// the socket's queue is past the high-water mark, and closes when its pending output has made no progress for a
/// write timeout.
package final class SecureChannel: LoopFlushable, TCPSocketDelegate {
    package let loop: LoopThread
    private let socket: TCPSocket
    /// Nil in plaintext mode.
    private let tls: TLSEngine?
    /// Strong (no side table on the hot path); cleared when the channel closes, which breaks the
    /// cycle with the connection that owns this channel.
    @exclusivity(unchecked) package var delegate: SecureChannelDelegate?
    @exclusivity(unchecked) private var handshakeTimer: LoopTimer?
    @exclusivity(unchecked) private(set) var isReady = false
    @exclusivity(unchecked) private(set) var isClosed = false
    @exclusivity(unchecked) private var closeAfterFlush = false
    /// Half-close once what is pending has been written (`shutdownWhenFlushed`).
    @exclusivity(unchecked) private var shutdownAfterFlush = false
    @exclusivity(unchecked) private var shutdownSent = false
    /// Plaintext mode: output waiting for the next flush, which hands it to the socket in one write.
    @exclusivity(unchecked) private var plainOutput: [UInt8] = []

    /// Owned: freed in deinit. Plaintext staged for one SSL_write.
    private let staging: UnsafeMutableRawBufferPointer
    @exclusivity(unchecked) private var stagedCount = 0
    /// Plaintext TLS could not take yet (SSL_write wants to read first, as in a renegotiation), in
    /// order. While it holds anything, later output queues behind it and no more is asked of the
    /// delegate; it is handed to TLS again after each read and each flush.
    @exclusivity(unchecked) private var backlog: [UInt8] = []
    /// Owned: freed in deinit. Plaintext read from TLS.
    private let plaintextBuffer: UnsafeMutableRawBufferPointer

    /// `limitOutput` was called: reading pauses while the socket's queue is past the high-water mark.
    @exclusivity(unchecked) private var outputLimited = false
    @exclusivity(unchecked) private var readingPaused = false
    /// `limitOutput`'s write timeout (0: none), and its timer, made when output first waits.
    @exclusivity(unchecked) private var writeTimeoutMilliseconds: UInt64 = 0
    @exclusivity(unchecked) private var writeTimer: LoopTimer?
    /// The write timer runs: output is pending. `writtenAtLastLook` is the socket's `bytesWritten` when it was started
    /// or last fired.
    @exclusivity(unchecked) private var writeTimerRunning = false
    @exclusivity(unchecked) private var writtenAtLastLook = 0
    /// The protocol above holds output it cannot write yet (HTTP/2: answers waiting for the peer's flow-control
    /// credit): pending output for the write timeout, as the socket's queue is. Looked at after each flush.
    @exclusivity(unchecked) package var holdsOutput = false

    package static let stagingSize = 16 * 1024
    /// Bytes queued on the socket past which no more output is produced until it drains.
    package static let highWaterMark = 64 * 1024
    /// Ciphertext held by TLS past which it goes to the socket at once, in the middle of a flush, not at its end. A
    /// turn that answers a few hundred streams produces a third of a megabyte: handed over in pieces of this size, TLS's
    /// output buffer stays small enough to stay in cache and the peer starts on the first requests while the rest is
    /// encrypted (`fanout-bench --scenario throughput-1c`: about 8% less CPU per notification). Once the socket takes
    /// less than it is given, its queue passes `highWaterMark`, `canWrite` turns false and the delegate stops
    /// producing until the socket drains.
    package static let ciphertextWriteThreshold = 64 * 1024

    /// A TLS channel (`tls` non-nil) that is ready once the handshake is done, or a plaintext one (`tls` nil),
    /// ready as soon as it starts.
    package init(socket: TCPSocket, tls: TLSEngine?, handshakeTimeoutMilliseconds: UInt64) {
        self.loop = socket.loop
        self.socket = socket
        self.tls = tls
        staging = .allocate(byteCount: Self.stagingSize, alignment: 16)
        plaintextBuffer = .allocate(byteCount: tls == nil ? 16 : 64 * 1024, alignment: 16)
        super.init()
        socket.delegate = self
        guard tls != nil else { return }
        let timer = LoopTimer(loop: loop)
        handshakeTimer = timer
        // Strong capture (no weak side table on self): the cycle ends when the timer closes, at the
        // end of the handshake or at close.
        timer.schedule(milliseconds: handshakeTimeoutMilliseconds) { [self] in
            close(
                error: TransportError(
                    .tlsHandshakeTimeout, "TLS handshake timed out after \(handshakeTimeoutMilliseconds) ms"))
        }
    }

    deinit {
        staging.deallocate()
        plaintextBuffer.deallocate()
    }

    /// Starts the handshake (the client speaks first; a server waits for the ClientHello).
    package func start() {
        socket.startReading()
        guard tls != nil else {
            isReady = true
            scheduleFlush()
            delegate?.channelDidBecomeReady(self)
            return
        }
        advanceHandshake()
    }

    /// Whether the channel runs TLS.
    package var isSecure: Bool { tls != nil }

    /// The certificate the peer presented, once the handshake is done; nil without one (or without TLS).
    package var peerCertificate: CertificateDetails? { isReady ? tls?.peerCertificate() : nil }

    /// Bounds what a peer that does not read can cost, as a server must (nginx's `send_timeout`; nghttpd's write
    /// timeout): from here on, reading stops while `highWaterMark` bytes or more are queued on the socket, so the peer's
    /// next requests wait in the kernel and TCP holds them back (the protocol above stops producing output too, as
    /// `canWrite` is false), and resumes once the queue is under it again. With `writeTimeoutMilliseconds` above 0,
    /// output pending (queued on the socket, held by TLS, or `holdsOutput`) that sees none of itself leave for that
    /// long closes the channel with `.writeTimeout`. Progress is looked at when the timeout passes, so a stalled peer
    /// is closed between one and two timeouts after the last byte it took. Call once, before `start`.
    package func limitOutput(writeTimeoutMilliseconds: UInt64) {
        outputLimited = true
        self.writeTimeoutMilliseconds = writeTimeoutMilliseconds
    }

    /// Output waits for the socket (or, over TLS, for the peer's next bytes).
    package var hasPendingOutput: Bool { socket.queuedWriteBytes > 0 || !backlog.isEmpty }

    /// The ALPN protocol the TLS handshake chose (nil in plaintext mode, before the handshake, or when the
    /// client offered none).
    package var negotiatedProtocol: String? { isReady ? tls?.negotiatedProtocol() : nil }

    /// Appends protocol output. Call from `channelProduceOutput` or any time; it leaves at the next
    /// flush. If TLS fails to encrypt it, the channel closes with a `.tlsWriteFailed` error (the
    /// delegate hears of it before this returns); writes to a closed channel are dropped.
    package func write(_ bytes: UnsafeRawBufferPointer) {
        guard !isClosed else { return }
        guard tls != nil else {
            // Plaintext: straight into the flush's output; staging only groups bytes into TLS records. Past the
            // threshold it leaves at once, as ciphertext does, so that `canWrite` sees what the socket does not take.
            plainOutput.append(contentsOf: bytes)
            if plainOutput.count >= Self.ciphertextWriteThreshold { writePlainOutput() }
            return
        }
        var remaining = bytes
        while remaining.count > 0 && !isClosed {
            if stagedCount == 0 && remaining.count >= Self.stagingSize {
                // Large chunk: encrypt straight from the caller's memory.
                encrypt(remaining)
                return
            }
            let room = Self.stagingSize - stagedCount
            let take = min(room, remaining.count)
            (staging.baseAddress! + stagedCount).copyMemory(from: remaining.baseAddress!, byteCount: take)
            stagedCount += take
            remaining = UnsafeRawBufferPointer(rebasing: remaining[take...])
            if stagedCount == Self.stagingSize { encryptStaged() }
        }
    }

    private func encryptStaged() {
        guard stagedCount > 0 else { return }
        let count = stagedCount
        stagedCount = 0
        encrypt(UnsafeRawBufferPointer(rebasing: staging[0..<count]))
    }

    /// Hands plaintext to TLS, behind the backlog if there is one. A failed write closes the channel.
    private func encrypt(_ plaintext: UnsafeRawBufferPointer) {
        guard let tls else {
            plainOutput.append(contentsOf: plaintext)
            return
        }
        guard backlog.isEmpty else {
            backlog.append(contentsOf: plaintext)
            return
        }
        switch tls.writePlaintext(plaintext) {
        case .written:
            if tls.pendingCiphertext >= Self.ciphertextWriteThreshold {
                tls.withCiphertext { socket.write(borrowing: $0) }
            }
        case .retryLater: backlog.append(contentsOf: plaintext)
        case .failed(let error): close(error: error)
        }
    }

    /// Hands the backlog to TLS again (the same bytes first, as OpenSSL wants for a retried write).
    private func retryBacklog() {
        guard !backlog.isEmpty, !isClosed, let tls else { return }
        switch backlog.withUnsafeBytes({ tls.writePlaintext($0) }) {
        case .written: backlog = []
        case .retryLater: break
        case .failed(let error): close(error: error)
        }
    }

    /// Ciphertext encrypted and not yet handed to the socket (for tests).
    package var heldCiphertextBytes: Int { tls?.pendingCiphertext ?? 0 }

    /// Asks for a flush at the end of this loop turn.
    package func scheduleFlush() {
        guard !isClosed else { return }
        loop.scheduleFlush(self)
    }

    /// Whether more output can be taken now: TLS is not holding a backlog and the socket's queue is
    /// under the high-water mark.
    package var canWrite: Bool { !isClosed && backlog.isEmpty && socket.queuedWriteBytes < Self.highWaterMark }

    override func flushNow() {
        guard !isClosed else { return }
        retryBacklog()
        if isReady && canWrite { delegate?.channelProduceOutput(self) }
        encryptStaged()
        guard !isClosed else { return }
        if shutdownAfterFlush && !shutdownSent { tls?.shutdown() }  // close_notify goes out with the rest
        if let tls {
            // From the TLS engine's reused buffer: a copy is made only of what the socket does not take now.
            tls.withCiphertext { socket.write(borrowing: $0) }
        } else {
            writePlainOutput()
        }
        if shutdownAfterFlush && !shutdownSent && !socket.isClosed {
            // libuv sends the FIN after the writes queued before it.
            shutdownSent = true
            socket.shutdownWrites()
        }
        if closeAfterFlush && socket.queuedWriteBytes == 0 { close(error: nil) }
        if outputLimited { watchOutput() }
    }

    /// Plaintext mode: hands the output gathered so far to the socket.
    private func writePlainOutput() {
        guard !plainOutput.isEmpty else { return }
        plainOutput.withUnsafeBytes { socket.write(borrowing: $0) }
        plainOutput.removeAll(keepingCapacity: true)
    }

    /// `limitOutput`: pauses or resumes reading as the socket's queue crosses the high-water mark, and starts or
    /// stops the write timer as output begins or stops waiting. Called after each flush (where output starts to wait,
    /// and `holdsOutput` changes with the protocol's frames) and each drained write (where it stops).
    private func watchOutput() {
        guard !isClosed else { return }
        let backlogged = socket.queuedWriteBytes >= Self.highWaterMark
        if backlogged != readingPaused {
            readingPaused = backlogged
            if backlogged {
                socket.stopReading()
            } else {
                socket.startReading()  // may fail, and close the channel
                if isClosed { return }
            }
        }
        guard writeTimeoutMilliseconds > 0 else { return }
        let pending = hasPendingOutput || holdsOutput
        if pending && !writeTimerRunning {
            writeTimerRunning = true
            writtenAtLastLook = socket.bytesWritten
            if let writeTimer {
                writeTimer.restart(milliseconds: writeTimeoutMilliseconds)
            } else {
                let timer = LoopTimer(loop: loop)
                writeTimer = timer
                // Strong capture: the cycle ends when the timer closes, with the channel.
                timer.schedule(milliseconds: writeTimeoutMilliseconds) { [self] in writeTimerFired() }
            }
        } else if !pending && writeTimerRunning {
            writeTimerRunning = false
            writeTimer?.stop()
        }
    }

    /// A write timeout passed with output pending: closes the channel unless some of it left meanwhile.
    private func writeTimerFired() {
        guard !isClosed else { return }
        guard hasPendingOutput || holdsOutput else {
            writeTimerRunning = false
            return
        }
        let written = socket.bytesWritten
        guard written == writtenAtLastLook else {
            writtenAtLastLook = written
            writeTimer?.restart(milliseconds: writeTimeoutMilliseconds)
            return
        }
        close(
            error: TransportError(
                .writeTimeout, "the peer took none of the pending output for \(writeTimeoutMilliseconds) ms"))
    }

    /// Sends what is pending, then closes (once the socket has written it all). Idempotent: a
    /// second call must not schedule another flush, or a flush that calls it would spin.
    package func closeWhenFlushed() {
        guard !closeAfterFlush else { return }
        closeAfterFlush = true
        scheduleFlush()
    }

    /// Sends what is pending, then half-closes (TLS close_notify, TCP FIN) and goes on reading until the peer
    /// closes: closing with unread input could reset the connection and lose the last answer. The owner bounds
    /// the wait with a timer of its own.
    package func shutdownWhenFlushed() {
        guard !shutdownAfterFlush else { return }
        shutdownAfterFlush = true
        scheduleFlush()
    }

    /// Closes now. Idempotent; the delegate hears of it once.
    package func close(error: TransportError?) {
        guard !isClosed else { return }
        isClosed = true
        handshakeTimer?.close()
        handshakeTimer = nil
        writeTimer?.close()
        writeTimer = nil
        socket.close()
        let delegate = self.delegate
        self.delegate = nil
        delegate?.channel(self, didCloseWith: error)
    }

    private func advanceHandshake() {
        guard let tls else { return }
        switch tls.advanceHandshake() {
        case .inProgress:
            scheduleFlush()
        case .done:
            handshakeTimer?.close()
            handshakeTimer = nil
            isReady = true
            scheduleFlush()
            delegate?.channelDidBecomeReady(self)
        case .failed(let error):
            // Send the alert OpenSSL queued, best effort, then report.
            tls.withCiphertext { socket.write(borrowing: $0) }
            close(error: error)
        }
    }

    // MARK: TCPSocketDelegate

    package func tcpSocket(_ socket: TCPSocket, didRead bytes: UnsafeRawBufferPointer) {
        guard let tls else {
            delegate?.channel(self, didRead: bytes)
            flushAfterRead(bytes.count)
            return
        }
        tls.feed(bytes)
        if !tls.handshakeDone {
            advanceHandshake()
            if !tls.handshakeDone || isClosed { return }
        }
        while !isClosed {
            guard let count = tls.readPlaintext(into: plaintextBuffer) else {
                close(
                    error: tls.readFailure.map { TransportError(.tlsAlert, $0) }
                        ?? TransportError(.connectionClosed, "TLS session closed by peer"))
                return
            }
            if count == 0 { break }
            delegate?.channel(self, didRead: UnsafeRawBufferPointer(rebasing: plaintextBuffer[0..<count]))
        }
        // What TLS read may be what a held-back write was waiting for.
        retryBacklog()
        // Reading may have produced TLS output (key updates, alerts) or protocol output.
        flushAfterRead(bytes.count)
    }

    /// After a read: a full read buffer means more input is waiting, and libuv goes on reading (up to 32
    /// buffers) before the loop turn ends. Holding the output until then would make the two ends take turns,
    /// each idle while the other works through a whole window of streams; so what this buffer led to (the
    /// answers to it, or the engine's next requests, which it queues for the end of the turn) leaves now, and the
    /// peer starts on it while this side reads on.
    private func flushAfterRead(_ count: Int) {
        scheduleFlush()
        if count >= TCPSocket.readBufferSize && !isClosed { loop.flushScheduledNow() }
    }

    package func tcpSocket(_ socket: TCPSocket, didCloseWith error: TransportError?) {
        guard !isClosed else { return }
        if !isReady, let error {
            close(error: TransportError(error.kind, "connection closed during TLS handshake: \(error.message)"))
        } else {
            close(error: error)
        }
    }

    package func tcpSocketDidDrainWrites(_ socket: TCPSocket) {
        if closeAfterFlush && socket.queuedWriteBytes == 0 {
            close(error: nil)
        } else if canWrite {
            scheduleFlush()
        }
        // Reading resumes now, not at the flush: a TLS backlog that keeps `canWrite` false may need the peer's bytes.
        if outputLimited { watchOutput() }
    }
}
