package import FanoutTransport

// Why hiredis's async API on a libuv loop (a `LoopThread`), and not the synchronous API on a thread of its own:
//
// - Deadlines. Each command has its own timer on the loop (`LoopTimer`), so a command waiting behind a slow one, or
//   waiting for a connection, fails at its own deadline. A blocking `redisGetReply` on a dedicated thread can only
//   time out through the socket's SO_RCVTIMEO, one value for everything in flight, and a command queued behind a
//   blocked read would wait past its deadline unless a second mechanism watched the queue.
// - Pipelining across callers. Every command handed to the loop during one turn lands in hiredis's output buffer and
//   leaves in one write when the socket is writable; concurrent callers share round trips for free, as an explicit
//   `commands` batch does. The synchronous API sends one batch, then blocks until all of it is answered.
// - Loss and shutdown. A uv_poll_t watches the socket, so a server that goes away is noticed at once (EOF), not at the
//   next command; `shutdown()` frees the context on the loop, which fails every pending command in one place. A
//   blocked synchronous read would have to be interrupted from another thread (shutdown(2) on its fd).
// - It is the project's model: one thread per loop, C confined to it, other threads hand work in with `execute`.
//
// What it costs: hiredis 0.14's async API has no timeouts of its own (no `redisAsyncSetTimeout`), so the connect and
// command deadlines are our timers; and its connect resolves a host name with a blocking getaddrinfo, which is why a
// client gets a loop of its own by default (a shared loop is allowed, for callers that connect to an IP address).

/// How a `RedisClient` connects and retries.
package struct RedisConfiguration: Sendable {
    package var url: RedisURL
    /// The deadline of a command whose call gives none: from the call to its answer, waiting for a connection and
    /// LOADING/READONLY retries included.
    package var commandTimeout: Duration = .seconds(5)
    /// How long one connection attempt (TCP connect, AUTH, SELECT) may take before it is dropped and retried.
    package var connectTimeout: Duration = .seconds(2)
    /// Reconnection backoff: the first delay and the ceiling, doubling in between; each delay is drawn uniformly from
    /// [d/2, d] so that a fleet of clients does not reconnect in step. Reset once a connection is ready.
    package var reconnectBackoff: (initial: Duration, maximum: Duration) = (.milliseconds(50), .seconds(1))
    /// Backoff between retries of a command answered `LOADING` or `READONLY`, same shape, until its deadline.
    package var retryBackoff: (initial: Duration, maximum: Duration) = (.milliseconds(50), .milliseconds(500))

    package init(url: RedisURL) { self.url = url }
}

/// A Redis client on hiredis's async API: one connection, kept open and re-opened.
///
/// - **Commands** go out in call order on one connection; `commands` sends a batch in one round trip and returns the
///   replies in order. Arguments are binary-safe.
/// - **Server errors.** `command` throws an error reply as `RedisError.server(message)`; `commands` keeps error
///   replies in place as `.error(message)` values, so one failing command does not hide the others' results.
/// - **Deadlines.** Every call has one (`timeout`, or the configuration's `commandTimeout`), counted from the call.
///   A command not answered in time fails with `.timeout` and the connection it was sent on is dropped and re-opened
///   (a late answer would otherwise be read as the next command's); other commands in flight on it fail with
///   `.connectionLost` (they may have run).
/// - **Disconnected.** Commands issued while there is no connection *wait* for one, up to their deadline (then
///   `.unavailable`, with the last connection error): a Redis restart makes callers pause, not fail. The exception
///   is a refused AUTH or SELECT, which fails the waiting commands at once with `.authenticationFailed`.
/// - **Reconnection** starts as soon as a connection is lost or an attempt fails, with bounded, jittered backoff,
///   whether or not commands are waiting.
/// - **Connection loss** fails the commands in flight with `.connectionLost`: they may have run, so they are not
///   re-sent; the caller decides (most of the fleet's commands are idempotent or scripted).
/// - **LOADING / READONLY** answers (Redis loading its dataset after a restart; a replica after a failover) are
///   retried with backoff until the deadline, then fail with `.timeout` naming the last answer. In a batch only the
///   commands so answered are re-sent (LOADING means they did not run).
/// - **Shutdown.** `shutdown()` fails every pending command with `.shutdown` and closes the connection; later calls
///   fail with `.shutdown` at once.
/// - **Task cancellation** does not interrupt a command (not yet): its deadline bounds how long a call can take.
/// - **Redis Cluster** (a `redis+cluster://` URL, see `RedisURL`): the same calls, routed by `RedisClusterCore`. The
///   slot map comes from `CLUSTER SLOTS`; each primary gets one connection (a core as above, so deadlines,
///   reconnection and LOADING/READONLY retries are per node); each command goes to the primary of its first key's
///   slot (`RedisClusterRoute`, `RedisClusterSlot`), keyless ones to any primary (but a `WAIT` right after a keyed
///   command in a batch goes with it, to its node), `SCRIPT LOAD`/`FLUSH`, `FLUSHALL` and
///   `FLUSHDB` to every primary. A batch is split per node and its replies put back in order; a `MULTI` ... `EXEC`
///   transaction goes whole to one node and must stay in one slot (else `.crossSlot`, nothing sent). `MOVED`
///   updates the map and re-sends, `ASK` re-sends once behind `ASKING`, `TRYAGAIN` and `CLUSTERDOWN` are retried with
///   backoff, all within the call's deadline; a command whose node has no connection waits for it or for a new map
///   (a failover), also within the deadline. A command in flight on a connection that breaks fails with
///   `.connectionLost`, as on one server.
package final class RedisClient: Sendable {
    package let configuration: RedisConfiguration
    private let loop: LoopThread
    private let ownsLoop: Bool
    private let backend: Backend

    /// One server, or a cluster (`redis+cluster://`): the same calls, routed by the cluster core.
    private enum Backend: Sendable {
        case server(RedisClientCore)
        case cluster(RedisClusterCore)
    }

    /// Starts connecting at once (on `loop`, or on a loop thread of its own when nil).
    package init(configuration: RedisConfiguration, loop: LoopThread? = nil) {
        self.configuration = configuration
        self.loop = loop ?? LoopThread(name: "fanout-redis")
        ownsLoop = loop == nil
        if configuration.url.isCluster {
            let core = RedisClusterCore(loop: self.loop, configuration: configuration)
            backend = .cluster(core)
            try? self.loop.execute { core.start() }
        } else {
            let core = RedisClientCore(loop: self.loop, configuration: configuration)
            backend = .server(core)
            try? self.loop.execute { core.start() }
        }
    }

    /// A client for `url` (see `RedisURL`) with the default timeouts.
    package convenience init(url: String) throws(RedisError) {
        self.init(configuration: RedisConfiguration(url: try RedisURL(parsing: url)))
    }

    deinit {
        // Dropped without shutdown(): the loop's stop action closes the connection and fails what is pending.
        if ownsLoop { loop.requestStop() }
    }

    /// Sends one command and returns its reply.
    ///
    /// - Throws: `RedisError` — `.server` for an error reply, `.timeout`, `.unavailable`, `.connectionLost`,
    ///   `.authenticationFailed`, `.shutdown`.
    package func command(
        _ arguments: [RedisArgument], timeout: Duration? = nil
    ) async throws(RedisError) -> RedisValue {
        let replies = try await commands([arguments], timeout: timeout)
        if case .error(let message) = replies[0] { throw RedisError.server(message) }
        return replies[0]
    }

    /// Sends `batch` pipelined (one write, one round trip) and returns one reply per command, in order; error replies
    /// stay in place as `.error` values. The deadline covers the whole batch.
    package func commands(
        _ batch: [[RedisArgument]], timeout: Duration? = nil
    ) async throws(RedisError) -> [RedisValue] {
        if batch.isEmpty { return [] }
        precondition(batch.allSatisfy { !$0.isEmpty }, "a Redis command needs at least its name")
        let milliseconds = Self.milliseconds(timeout ?? configuration.commandTimeout)
        let backend = self.backend
        // The replies are made on the loop thread and read here after the await (HandOffFence says why the fence).
        let fence = HandOffFence()
        let result: Result<[RedisValue], RedisError> = await withCheckedContinuation { continuation in
            do {
                try loop.execute {
                    let done: (Result<[RedisValue], RedisError>) -> Void = { replies in
                        fence.release()
                        continuation.resume(returning: replies)
                    }
                    switch backend {
                    case .server(let core): core.submit(batch, timeoutMilliseconds: milliseconds, completion: done)
                    case .cluster(let core): core.submit(batch, timeoutMilliseconds: milliseconds, completion: done)
                    }
                }
            } catch {
                continuation.resume(returning: .failure(RedisError(.shutdown, "the Redis client has shut down")))
            }
        }
        fence.acquire()
        return try result.get()
    }

    /// Fails every pending command with `.shutdown`, closes the connection and stops reconnecting; then stops the
    /// client's own loop thread. Idempotent.
    package func shutdown() async {
        let backend = self.backend
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            do {
                try loop.execute {
                    switch backend {
                    case .server(let core): core.shutdown()
                    case .cluster(let core): core.shutdown()
                    }
                    continuation.resume()
                }
            } catch {
                continuation.resume()  // the loop has stopped: its stop action already shut the core down
            }
        }
        if ownsLoop { loop.shutdown() }
    }

    /// A duration in whole milliseconds, as Redis's arguments take it (`BLOCK`, `WAIT`, `XAUTOCLAIM`'s idle time).
    package static func milliseconds(_ duration: Duration) -> UInt64 {
        let (seconds, attoseconds) = duration.components
        return UInt64(max(0, seconds)) * 1000 + UInt64(max(0, attoseconds) / 1_000_000_000_000_000)
    }
}

/// One call in progress: a batch of commands, their replies, and where it stands. Loop thread only.
final class RedisRequest {
    enum Phase {
        /// Waiting for a ready connection.
        case waiting
        /// Sent; `outstanding` replies to come on `connection`.
        case inFlight
        /// Some commands were answered LOADING/READONLY; waiting out the backoff before re-sending them.
        case backingOff
        case finished
    }

    let id: Int
    let batch: [[RedisArgument]]
    var replies: [RedisValue?]
    /// The commands (indices into `batch`) to send next time.
    var toSend: [Int]
    var outstanding = 0
    /// Commands answered LOADING/READONLY in the current round.
    var transient: [Int] = []
    var lastTransientReply: String?
    var retries = 0
    var phase = Phase.waiting
    weak var connection: RedisConnection?
    let timeoutMilliseconds: UInt64
    /// The deadline timer and, once needed, the retry timer; both closed when the request finishes.
    var deadlineTimer: LoopTimer?
    var retryTimer: LoopTimer?
    private let completion: (Result<[RedisValue], RedisError>) -> Void

    init(
        id: Int, batch: [[RedisArgument]], timeoutMilliseconds: UInt64,
        completion: @escaping (Result<[RedisValue], RedisError>) -> Void
    ) {
        self.id = id
        self.batch = batch
        replies = Array(repeating: nil, count: batch.count)
        toSend = Array(batch.indices)
        self.timeoutMilliseconds = timeoutMilliseconds
        self.completion = completion
    }

    var isFinished: Bool {
        if case .finished = phase { return true }
        return false
    }

    /// The command's name for messages (its first word, never its arguments), or the batch's size.
    var name: String {
        batch.count == 1
            ? String(decoding: batch[0][0].bytes.prefix(32), as: UTF8.self).uppercased()
            : "a batch of \(batch.count) commands"
    }

    func finish(_ result: Result<[RedisValue], RedisError>) {
        guard !isFinished else { return }
        phase = .finished
        deadlineTimer?.close()
        retryTimer?.close()
        deadlineTimer = nil
        retryTimer = nil
        completion(result)
    }
}

/// The client's state machine, confined to its loop: the connection, the commands waiting for one, reconnection.
/// `@unchecked Sendable` only so that `RedisClient` can hand it to `execute`; it is touched on the loop thread only.
final class RedisClientCore: @unchecked Sendable {
    private let loop: LoopThread
    private let configuration: RedisConfiguration
    /// The server connected to: the URL's, or with Sentinel the primary the sentinels named last.
    private var url: RedisURL { primaryURL ?? configuration.url }
    /// With `redis+sentinel://`: the primary's URL as the sentinels last named it.
    private var primaryURL: RedisURL?
    /// With `redis+sentinel://`: a plain client per sentinel (started with this one, on its loop, shut down with it).
    private var sentinels: [RedisClientCore] = []
    /// A sentinel is being asked for the primary: no connection is opened meanwhile.
    private var resolving = false
    /// The current connection (connecting, handshaking or ready); it stays here until it reports its end.
    private var connection: RedisConnection?
    private var waiting = FIFOQueue<RedisRequest>()
    /// Every unfinished request, for shutdown.
    private var live: [Int: RedisRequest] = [:]
    private var nextID = 0
    private var reconnectTimer: LoopTimer?
    private var connectTimer: LoopTimer?
    private var reconnectAttempt = 0
    private var lastConnectionError: RedisError?
    private var isShutdown = false
    private var stopActionID = 0
    /// Told when the connection becomes ready (nil) or ends (why): how the cluster client, which has one core per
    /// node, learns that a node can take commands or was lost. Nil for a plain client.
    var connectionObserver: ((RedisError?) -> Void)?

    /// Why the last connection ended or failed; nil once one is ready.
    var lastError: RedisError? { lastConnectionError }

    /// True while a connection is ready: a command submitted now is written at once.
    var isConnected: Bool { connection?.isReady ?? false }

    init(loop: LoopThread, configuration: RedisConfiguration) {
        self.loop = loop
        self.configuration = configuration
    }

    func start() {
        loop.assertInLoop()
        // A loop that stops under us (a shared loop's shutdown) shuts the client down first.
        stopActionID = loop.addStopAction { [self] in shutdown() }
        reconnectTimer = LoopTimer(loop: loop)
        connectTimer = LoopTimer(loop: loop)
        if configuration.url.isSentinel {
            for address in configuration.url.seeds {
                var sentinel = RedisConfiguration(url: RedisURL(host: address.host, port: address.port))
                sentinel.connectTimeout = .seconds(1)
                sentinel.reconnectBackoff = configuration.reconnectBackoff
                let core = RedisClientCore(loop: loop, configuration: sentinel)
                core.start()
                sentinels.append(core)
            }
        }
        startConnecting()
    }

    // MARK: Commands

    func submit(
        _ batch: [[RedisArgument]], timeoutMilliseconds: UInt64,
        completion: @escaping (Result<[RedisValue], RedisError>) -> Void
    ) {
        loop.assertInLoop()
        guard !isShutdown else {
            completion(.failure(RedisError(.shutdown, "the Redis client has shut down")))
            return
        }
        nextID += 1
        let request = RedisRequest(
            id: nextID, batch: batch, timeoutMilliseconds: timeoutMilliseconds, completion: completion)
        live[request.id] = request
        let timer = LoopTimer(loop: loop)
        request.deadlineTimer = timer
        timer.schedule(milliseconds: timeoutMilliseconds) { [unowned self, unowned request] in
            deadlinePassed(request)
        }
        enqueue(request)
    }

    /// Sends `request` now when the connection is ready, or queues it for the next ready connection.
    private func enqueue(_ request: RedisRequest) {
        request.phase = .waiting
        if let connection, connection.isReady {
            dispatch(request, on: connection)
        } else {
            waiting.append(request)
        }
    }

    private func dispatch(_ request: RedisRequest, on connection: RedisConnection) {
        request.phase = .inFlight
        request.connection = connection
        request.outstanding = request.toSend.count
        for index in request.toSend where !connection.send(request.batch[index], for: .command(request, index)) {
            // Only a context hiredis considers closing refuses a command: drop it and start again.
            finish(request, .failure(RedisError(.clientError, "hiredis refused \(request.name) on \(url.endpoint)")))
            connection.close(reason: RedisError(.clientError, "hiredis refused a command on \(url.endpoint)"))
            return
        }
        request.toSend = []
    }

    /// One reply (or nil: the connection went away with the command in flight).
    func connection(_ connection: RedisConnection, didReceive value: RedisValue?, request: RedisRequest, index: Int) {
        guard !request.isFinished else { return }  // timed out or shut down: the answer is dropped
        guard let value else {
            finish(
                request,
                .failure(
                    isShutdown
                        ? RedisError(.shutdown, "the Redis client shut down with \(request.name) in flight")
                        : RedisError(
                            .connectionLost,
                            "the connection to \(url.endpoint) was lost with \(request.name) in flight (it may have run)"
                        )))
            return
        }
        if case .error(let message) = value, Self.isTransient(message) {
            request.transient.append(index)
            request.lastTransientReply = message
            if configuration.url.isSentinel, message.hasPrefix("READONLY"), connection === self.connection {
                // A failover made this server a replica: the next connection asks the sentinels for the primary.
                connection.close(
                    reason: RedisError(
                        .connectionLost,
                        "\(url.endpoint) is a replica now (READONLY); asking the sentinels for the primary"))
            }
        } else {
            request.replies[index] = value
        }
        request.outstanding -= 1
        guard request.outstanding == 0 else { return }
        if request.transient.isEmpty {
            finish(request, .success(request.replies.map { $0 ?? .null }))
            return
        }
        // LOADING (dataset still loading) or READONLY (a replica): those commands did not run; send them again
        // after a backoff, until the deadline.
        request.toSend = request.transient
        request.transient = []
        request.phase = .backingOff
        let delay = Self.backoff(attempt: request.retries, configuration.retryBackoff)
        request.retries += 1
        let timer = request.retryTimer ?? LoopTimer(loop: loop)
        request.retryTimer = timer
        timer.schedule(milliseconds: delay) { [unowned self, unowned request] in
            guard case .backingOff = request.phase else { return }
            enqueue(request)
        }
    }

    static func isTransient(_ message: String) -> Bool {
        message.hasPrefix("LOADING") || message.hasPrefix("READONLY")
    }

    private func deadlinePassed(_ request: RedisRequest) {
        let after = "within \(request.timeoutMilliseconds) ms"
        switch request.phase {
        case .finished:
            return
        case .waiting:
            let reason = lastConnectionError.map { ": \($0.message)" } ?? " (still connecting)"
            finish(
                request,
                .failure(
                    RedisError(.unavailable, "no connection to the Redis server at \(url.endpoint) \(after)\(reason)")))
        case .backingOff:
            finish(
                request,
                .failure(
                    RedisError(
                        .timeout,
                        "\(request.name) not done \(after): the server kept answering \(request.lastTransientReply ?? "")"
                    )))
        case .inFlight:
            let error = RedisError(.timeout, "\(request.name) not answered by \(url.endpoint) \(after)")
            finish(request, .failure(error))
            // A late answer would be read as the next command's: drop the connection and open a new one.
            if let connection = request.connection, connection === self.connection {
                connection.close(reason: error)
            }
        }
    }

    private func finish(_ request: RedisRequest, _ result: Result<[RedisValue], RedisError>) {
        live[request.id] = nil
        request.finish(result)
    }

    // MARK: Connection

    private func startConnecting() {
        guard !isShutdown, connection == nil, !resolving else { return }
        if let master = configuration.url.sentinelMaster {
            resolving = true
            askSentinel(0, master: master)
            return
        }
        openConnection()
    }

    /// Asks sentinel `index` (then the next, in the URL's order) for the primary's address, and connects to it. When
    /// none names one, that counts as a failed connection: retried after the reconnection backoff.
    private func askSentinel(_ index: Int, master: String) {
        guard !isShutdown else { return }
        guard index < sentinels.count else {
            resolving = false
            let error = RedisError(
                .unavailable,
                "no sentinel of \(configuration.url.description) named a primary for \(master): "
                    + (lastSentinelError ?? "none answered"))
            lastConnectionError = error
            let delay = Self.backoff(attempt: reconnectAttempt, configuration.reconnectBackoff)
            reconnectAttempt += 1
            reconnectTimer?.schedule(milliseconds: delay) { [unowned self] in startConnecting() }
            connectionObserver?(error)
            return
        }
        let limit = RedisClient.milliseconds(configuration.connectTimeout)
        sentinels[index].submit(
            [["SENTINEL", "get-master-addr-by-name", RedisArgument(master)]], timeoutMilliseconds: limit
        ) { [unowned self] result in
            guard !isShutdown else { return }
            if case .success(let replies) = result, let pair = replies.first?.array, pair.count == 2,
                let host = pair[0].string, let port = pair[1].string.flatMap(Int.init)
            {
                resolving = false
                primaryURL = configuration.url.primary(RedisNodeAddress(host: host, port: port))
                openConnection()
            } else {
                switch result {
                case .failure(let error): lastSentinelError = error.message
                case .success: lastSentinelError = "a sentinel does not know \(master)"
                }
                askSentinel(index + 1, master: master)
            }
        }
    }

    /// Why the last sentinel asked gave no primary.
    private var lastSentinelError: String?

    private func openConnection() {
        let connection = RedisConnection(loop: loop, url: url, owner: self)
        self.connection = connection
        let limit = RedisClient.milliseconds(configuration.connectTimeout)
        connectTimer?.schedule(milliseconds: limit) { [unowned self, weak connection] in
            guard let connection, connection === self.connection, !connection.isReady else { return }
            connection.close(
                reason: RedisError(
                    .unavailable, "connecting to the Redis server at \(url.endpoint) took over \(limit) ms"))
        }
        connection.connect()
    }

    func connectionIsReady(_ connection: RedisConnection) {
        guard connection === self.connection else { return }
        connectTimer?.cancel()
        reconnectAttempt = 0
        lastConnectionError = nil
        while let request = waiting.popFirst() {
            guard case .waiting = request.phase else { continue }  // finished while waiting
            guard connection === self.connection else {
                waiting.prepend(request)  // the connection dropped while we were sending: wait for the next one
                break
            }
            dispatch(request, on: connection)
        }
        if connection === self.connection { connectionObserver?(nil) }
    }

    func connectionDidEnd(_ connection: RedisConnection, error: RedisError) {
        guard connection === self.connection else { return }
        self.connection = nil
        connectTimer?.cancel()
        lastConnectionError = error
        if error.kind == .authenticationFailed {
            // A refused AUTH or SELECT will not pass by waiting: fail what waits now rather than at its deadline.
            while let request = waiting.popFirst() {
                if !request.isFinished { finish(request, .failure(error)) }
            }
        }
        guard !isShutdown else { return }
        let delay = Self.backoff(attempt: reconnectAttempt, configuration.reconnectBackoff)
        reconnectAttempt += 1
        reconnectTimer?.schedule(milliseconds: delay) { [unowned self] in startConnecting() }
        connectionObserver?(error)
    }

    /// The delay before attempt `attempt` (0-based): `initial * 2^attempt`, capped at `maximum`, drawn from [d/2, d].
    static func backoff(attempt: Int, _ bounds: (initial: Duration, maximum: Duration)) -> UInt64 {
        let initial = max(1, RedisClient.milliseconds(bounds.initial))
        let maximum = max(initial, RedisClient.milliseconds(bounds.maximum))
        let ceiling = min(maximum, initial << UInt64(min(attempt, 20)))
        return UInt64.random(in: (ceiling / 2)...ceiling)
    }

    // MARK: Shutdown

    func shutdown() {
        loop.assertInLoop()
        guard !isShutdown else { return }
        isShutdown = true
        loop.removeStopAction(stopActionID)
        for sentinel in sentinels { sentinel.shutdown() }
        reconnectTimer?.close()
        connectTimer?.close()
        // In-flight commands fail through their NULL replies (with `.shutdown`, since isShutdown is set).
        connection?.close(reason: RedisError(.shutdown, "the Redis client has shut down"))
        let error = RedisError(.shutdown, "the Redis client shut down before the command was answered")
        for request in live.values.sorted(by: { $0.id < $1.id }) { finish(request, .failure(error)) }
        waiting = FIFOQueue()
    }
}
