import CHiredis
import CLibUV
import FanoutTransport

/// One hiredis async context (`redisAsyncContext`) on a loop: connect, AUTH and SELECT, then commands in order, each
/// answered through one reply callback. Confined to its loop.
///
/// The socket is watched by a `uv_poll_t` of ours behind hiredis's event hooks (`ev.addRead` ... `ev.cleanup`), not
/// by hiredis 0.14's adapters/libuv.h: that adapter drops a poll callback whose status is an error
/// (`if (status != 0) return;`), and libuv reports a refused non-blocking connect, or a socket error, exactly that
/// way (POLLERR → UV_EBADF, with the watcher stopped). hiredis then never learns of the failure: a connect to a port
/// nothing listens on hangs until our connect timer, and a reset connection until a command's deadline. hiredis 1.x
/// fixed its adapter by handing the events it asked for to hiredis on an error, which reads the socket's error; the
/// hooks below do the same.
///
/// Ownership of the C pointers:
/// - `context` is created by `redisAsyncConnect`. hiredis frees it itself after a failed connect (right after our
///   connect callback returns `REDIS_ERR`) and after a lost connection (right after our disconnect callback);
///   otherwise `close()` frees it with `redisAsyncFree`, which first calls every pending reply callback with a NULL
///   reply. In every case `contextDidEnd` clears `context` exactly once, before the memory goes away, so nothing
///   here touches a freed context.
/// - `context.data` holds an *unretained* pointer to self: the client keeps this object (its `connection`) until
///   `contextDidEnd` has told it the context is gone, so the pointer is valid in every callback.
/// - `poll` (a `uv_poll_t` on the context's socket) is allocated in `connect` and closed by hiredis's `ev.cleanup`
///   hook, which hiredis calls exactly once, while freeing the context and before it closes the socket; the handle's
///   memory is freed in its close callback (libuv may touch it until then). `ev.data` is the same unretained pointer
///   to self as `context.data`.
/// - Replies: in the async API hiredis owns every `redisReply` and frees it with `freeReplyObject` itself right after
///   the reply callback returns (async.c `redisProcessCallbacks`). The callback copies the reply into a `RedisValue`
///   and never frees it, so each reply is freed exactly once, by hiredis.
/// - Command arguments are copied by hiredis into its output buffer before `redisAsyncCommandArgv` returns.
///
/// Re-entrancy: `redisAsyncFree` called inside a reply callback only marks the context; hiredis frees it once the
/// callback returns (REDIS_IN_CALLBACK), and `close()` relies on that. It is never called inside the connect
/// callback (hiredis would go on using the context), which only sends the handshake.
final class RedisConnection {
    /// Who is waiting for the next reply, in the order the commands were written.
    enum Waiter {
        /// A step of the handshake (AUTH or SELECT), named for messages.
        case handshake(String)
        /// Command `index` of a request's batch.
        case command(RedisRequest, Int)
    }

    enum State {
        case connecting
        case handshaking(remaining: Int)
        case ready
        case closing
        case ended
    }

    private let loop: LoopThread
    private let url: RedisURL
    private unowned let owner: RedisClientCore
    /// Valid until `contextDidEnd` (see the type's comment); nil before `connect` and after.
    private var context: UnsafeMutablePointer<redisAsyncContext>?
    /// The socket's watcher (see the type's comment); nil before `connect` and once hiredis's cleanup has closed it.
    private var poll: UnsafeMutablePointer<uv_poll_t>?
    /// The events hiredis wants (UV_READABLE | UV_WRITABLE).
    private var wantedEvents: Int32 = 0
    private var waiters = FIFOQueue<Waiter>()
    private(set) var state = State.connecting
    /// Why we closed the connection ourselves (a deadline, a refused AUTH, shutdown): what `contextDidEnd` reports.
    private var closeReason: RedisError?

    init(loop: LoopThread, url: RedisURL, owner: RedisClientCore) {
        self.loop = loop
        self.url = url
        self.owner = owner
    }

    deinit {
        assert(context == nil && poll == nil, "RedisConnection dropped with its hiredis context or poll handle open")
    }

    var isReady: Bool {
        if case .ready = state { return true }
        return false
    }

    /// Starts a non-blocking connect. Any failure, now or later, ends in exactly one `owner.connectionDidEnd`.
    ///
    /// hiredis resolves a host name with a blocking getaddrinfo here; the client runs on a loop of its own by
    /// default, so a slow resolver stalls only the Redis client. An IP address in the URL costs nothing.
    func connect() {
        loop.assertInLoop()
        guard let created = redisAsyncConnect(url.host, Int32(url.port)) else {
            end(RedisError(.unavailable, "cannot connect to \(url.endpoint): hiredis could not allocate a context"))
            return
        }
        if created.pointee.err != 0 {
            // Failed before any event was attached and without a connected flag: freed at once, no callback.
            let message = Self.errorText(UnsafePointer(created))
            redisAsyncFree(created)
            end(RedisError(.unavailable, "cannot connect to \(url.endpoint): \(message)"))
            return
        }
        // The event hooks must be in place before the connect callback is set: setting it asks for a write event.
        let handle = UnsafeMutablePointer<uv_poll_t>.allocate(capacity: 1)
        let rc = uv_poll_init(loop.loop, handle, created.pointee.c.fd)
        guard rc == 0 else {
            handle.deallocate()  // never initialized: nothing for libuv to close
            redisAsyncFree(created)
            end(
                RedisError(
                    .unavailable, "cannot watch the socket to \(url.endpoint): \(String(cString: uv_strerror(rc)))"))
            return
        }
        let selfPointer = Unmanaged.passUnretained(self).toOpaque()
        handle.pointee.data = selfPointer
        poll = handle
        context = created
        created.pointee.data = selfPointer
        created.pointee.ev.data = selfPointer
        created.pointee.ev.addRead = redisAddReadHook
        created.pointee.ev.delRead = redisDeleteReadHook
        created.pointee.ev.addWrite = redisAddWriteHook
        created.pointee.ev.delWrite = redisDeleteWriteHook
        created.pointee.ev.cleanup = redisCleanupHook
        redisAsyncSetConnectCallback(created, redisConnectCallback)
        redisAsyncSetDisconnectCallback(created, redisDisconnectCallback)
    }

    /// Writes one command (hiredis buffers it; our poll flushes it when the socket is writable, so
    /// everything sent in one loop turn leaves in as few writes as the socket allows). False when the connection
    /// cannot take it (closing, or hiredis refused it).
    func send(_ arguments: [RedisArgument], for waiter: Waiter) -> Bool {
        guard let context else { return false }
        switch state {
        case .closing, .ended, .connecting: return false
        case .handshaking, .ready: break
        }
        var lengths = arguments.map(\.bytes.count)
        // One buffer holds every argument, so every pointer below comes from one scope; the extra byte keeps its
        // base address non-nil when all arguments are empty.
        var flat: [UInt8] = []
        flat.reserveCapacity(lengths.reduce(1, +))
        for argument in arguments { flat += argument.bytes }
        flat.append(0)
        let status = flat.withUnsafeBytes { buffer -> Int32 in
            var pointers: [UnsafePointer<CChar>?] = []
            pointers.reserveCapacity(arguments.count)
            var offset = 0
            for length in lengths {
                pointers.append((buffer.baseAddress! + offset).assumingMemoryBound(to: CChar.self))
                offset += length
            }
            return redisAsyncCommandArgv(context, redisReplyCallback, nil, Int32(arguments.count), &pointers, &lengths)
        }
        guard status == REDIS_OK else { return false }
        waiters.append(waiter)
        return true
    }

    /// Drops the connection: pending commands get NULL replies (their requests fail), then `owner.connectionDidEnd`
    /// reports `reason`. Idempotent.
    func close(reason: RedisError) {
        loop.assertInLoop()
        guard let context else { return }
        switch state {
        case .closing, .ended: return
        case .connecting, .handshaking, .ready: break
        }
        state = .closing
        closeReason = reason
        let connected = context.pointee.c.flags & REDIS_CONNECTED != 0
        // Frees now, or (inside a reply callback) once the callback returns. When connected, hiredis calls our
        // disconnect callback on the way, which ends us; when not yet connected, it calls nothing, and the context
        // is already gone when this returns.
        redisAsyncFree(context)
        if !connected { contextDidEnd(status: REDIS_OK, errorText: nil) }
    }

    // MARK: Socket events (hiredis's ev hooks on our uv_poll_t)

    fileprivate func want(_ event: uv_poll_event, _ wanted: Bool) {
        guard let poll else { return }
        let bit = Int32(event.rawValue)
        wantedEvents = wanted ? wantedEvents | bit : wantedEvents & ~bit
        if wantedEvents != 0 {
            uv_poll_start(poll, wantedEvents, redisPollCallback)
        } else {
            uv_poll_stop(poll)
        }
    }

    fileprivate func socketReady(status: Int32, events: Int32) {
        // On an error libuv has stopped the watcher and gives no events: hand hiredis what it was waiting for, so
        // that its read or write meets the socket's error and it reports it (a refused connect, a reset).
        let ready = status < 0 ? wantedEvents : events
        if ready & Int32(UV_READABLE.rawValue) != 0, let context { redisAsyncHandleRead(context) }
        // The read may have freed the context (EOF): `context` is nil then.
        if ready & Int32(UV_WRITABLE.rawValue) != 0, let context { redisAsyncHandleWrite(context) }
        if status < 0, let poll, wantedEvents != 0, context != nil {
            uv_poll_start(poll, wantedEvents, redisPollCallback)  // still alive: watch again
        }
    }

    /// hiredis's `ev.cleanup`: the context is being freed and its socket is about to be closed.
    fileprivate func cleanUpSocket() {
        guard let poll else { return }
        self.poll = nil
        wantedEvents = 0
        uv_close(UnsafeMutableRawPointer(poll).assumingMemoryBound(to: uv_handle_t.self)) { handle in
            handle?.deallocate()
        }
    }

    // MARK: hiredis events

    fileprivate func didConnect(status: Int32, errorText: String) {
        guard status == REDIS_OK else {
            // hiredis frees the context right after this returns.
            contextDidEnd(status: status, errorText: errorText)
            return
        }
        // The handshake goes out first; commands are sent only once every step has answered OK.
        state = .handshaking(remaining: 0)
        var steps = 0
        if let password = url.password {
            let auth: [RedisArgument] =
                if let user = url.user { ["AUTH", RedisArgument(user), RedisArgument(password)] } else {
                    ["AUTH", RedisArgument(password)]
                }
            if send(auth, for: .handshake("AUTH")) { steps += 1 }
        }
        if url.database != 0 {
            if send(["SELECT", RedisArgument(url.database)], for: .handshake("SELECT")) { steps += 1 }
        }
        if steps == 0 {
            state = .ready
            owner.connectionIsReady(self)
        } else {
            state = .handshaking(remaining: steps)
        }
    }

    fileprivate func didReceive(_ reply: UnsafeMutablePointer<redisReply>?) {
        guard let waiter = waiters.popFirst() else { preconditionFailure("a Redis reply with no command waiting") }
        // NULL: the context is being freed (lost connection, or `close`); the request fails through `contextDidEnd`
        // or through the owner's handling of a lost reply.
        let value = reply.map { RedisValue(reply: $0) }
        switch waiter {
        case .command(let request, let index):
            owner.connection(self, didReceive: value, request: request, index: index)
        case .handshake(let step):
            guard let value else { return }
            if case .error(let message) = value {
                close(
                    reason: RedisError(
                        .authenticationFailed, "\(step) refused by the Redis server at \(url.endpoint): \(message)"))
                return
            }
            if case .handshaking(let remaining) = state {
                if remaining > 1 {
                    state = .handshaking(remaining: remaining - 1)
                } else {
                    state = .ready
                    owner.connectionIsReady(self)
                }
            }
        }
    }

    fileprivate func contextDidEnd(status: Int32, errorText: String?) {
        guard !isEnded else { return }
        context = nil
        let error =
            closeReason
            ?? RedisError(
                wasConnected ? .connectionLost : .unavailable,
                wasConnected
                    ? "connection to the Redis server at \(url.endpoint) lost: \(errorText ?? "closed")"
                    : "cannot connect to the Redis server at \(url.endpoint): \(errorText ?? "failed")")
        end(error)
    }

    private var isEnded: Bool {
        if case .ended = state { return true }
        return false
    }

    private var wasConnected: Bool {
        switch state {
        case .connecting: false
        default: true
        }
    }

    private func end(_ error: RedisError) {
        if isEnded { return }
        state = .ended
        context = nil
        owner.connectionDidEnd(self, error: error)
    }

    /// hiredis's message for the context's error. `errstr` points into the context's own `c.errstr`, so it is read
    /// before the context is freed.
    fileprivate static func errorText(_ context: UnsafePointer<redisAsyncContext>) -> String {
        guard let text = context.pointee.errstr else { return "error \(context.pointee.err)" }
        return String(cString: text)
    }
}

extension RedisValue {
    /// Copies a hiredis reply tree (which hiredis keeps owning and frees).
    init(reply: UnsafePointer<redisReply>) {
        let node = reply.pointee
        switch node.type {
        case REDIS_REPLY_STRING:
            self = .bytes(node.len == 0 ? [] : Array(UnsafeRawBufferPointer(start: node.str, count: node.len)))
        case REDIS_REPLY_INTEGER:
            self = .integer(Int64(node.integer))
        case REDIS_REPLY_NIL:
            self = .null
        case REDIS_REPLY_STATUS:
            self = .status(Self.text(node))
        case REDIS_REPLY_ERROR:
            self = .error(Self.text(node))
        case REDIS_REPLY_ARRAY:
            var elements: [RedisValue] = []
            elements.reserveCapacity(node.elements)
            for index in 0..<node.elements {
                guard let element = node.element[index] else { continue }
                elements.append(RedisValue(reply: element))
            }
            self = .array(elements)
        default:
            self = .error("unknown reply type \(node.type)")
        }
    }

    private static func text(_ node: redisReply) -> String {
        guard node.len > 0, let str = node.str else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: str, count: node.len), as: UTF8.self)
    }
}

// MARK: C callbacks: file-level thunks that recover the connection from `context.data` (or `ev.data`, or the poll
// handle's `data`: the same unretained pointer) and forward to it. `withExtendedLifetime` keeps the connection alive
// through a call that may end it (the client drops its reference when the context ends).

private func connection(_ data: UnsafeMutableRawPointer?) -> RedisConnection {
    guard let data else { preconditionFailure("hiredis event without owner") }
    return Unmanaged<RedisConnection>.fromOpaque(data).takeUnretainedValue()
}

private func redisAddReadHook(_ data: UnsafeMutableRawPointer?) { connection(data).want(UV_READABLE, true) }
private func redisDeleteReadHook(_ data: UnsafeMutableRawPointer?) { connection(data).want(UV_READABLE, false) }
private func redisAddWriteHook(_ data: UnsafeMutableRawPointer?) { connection(data).want(UV_WRITABLE, true) }
private func redisDeleteWriteHook(_ data: UnsafeMutableRawPointer?) { connection(data).want(UV_WRITABLE, false) }
private func redisCleanupHook(_ data: UnsafeMutableRawPointer?) { connection(data).cleanUpSocket() }

private func redisPollCallback(_ handle: UnsafeMutablePointer<uv_poll_t>?, _ status: Int32, _ events: Int32) {
    guard let handle else { preconditionFailure("poll callback without handle") }
    let owner = connection(handle.pointee.data)
    withExtendedLifetime(owner) { owner.socketReady(status: status, events: events) }
}

private func redisConnectCallback(_ context: UnsafePointer<redisAsyncContext>?, _ status: Int32) {
    guard let context, let data = context.pointee.data else { preconditionFailure("hiredis connect without owner") }
    let text = status == REDIS_OK ? "" : RedisConnection.errorText(context)
    let owner = Unmanaged<RedisConnection>.fromOpaque(data).takeUnretainedValue()
    withExtendedLifetime(owner) { owner.didConnect(status: status, errorText: text) }
}

private func redisDisconnectCallback(_ context: UnsafePointer<redisAsyncContext>?, _ status: Int32) {
    guard let context, let data = context.pointee.data else { preconditionFailure("hiredis disconnect without owner") }
    // hiredis frees the context right after this returns.
    let text = status == REDIS_OK ? nil : RedisConnection.errorText(context)
    let owner = Unmanaged<RedisConnection>.fromOpaque(data).takeUnretainedValue()
    withExtendedLifetime(owner) { owner.contextDidEnd(status: status, errorText: text) }
}

private func redisReplyCallback(
    _ context: UnsafeMutablePointer<redisAsyncContext>?, _ reply: UnsafeMutableRawPointer?,
    _ privateData: UnsafeMutableRawPointer?
) {
    guard let context, let data = context.pointee.data else { preconditionFailure("hiredis reply without owner") }
    let owner = Unmanaged<RedisConnection>.fromOpaque(data).takeUnretainedValue()
    withExtendedLifetime(owner) { owner.didReceive(reply?.assumingMemoryBound(to: redisReply.self)) }
}
