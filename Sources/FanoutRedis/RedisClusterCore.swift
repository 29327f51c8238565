import FanoutTransport

/// One node of a cluster as the client sees it: its address and a single-server core (`RedisClientCore`: one
/// connection, reconnection, LOADING/READONLY retries, per-command deadlines) on the cluster client's loop.
final class RedisClusterNode {
    let address: RedisNodeAddress
    let core: RedisClientCore
    /// A seed of the URL: kept for reading the slot map even when it serves no slot (a replica).
    let isSeed: Bool
    /// Parts (and slot-map reads) submitted to `core` and not answered yet.
    var outstanding = 0
    /// No longer a primary in the slot map: shut down once `outstanding` is 0.
    var isRetired = false

    init(address: RedisNodeAddress, core: RedisClientCore, isSeed: Bool) {
        self.address = address
        self.core = core
        self.isSeed = isSeed
    }
}

/// A run of a call's batch that goes to one node as a whole: one command, or a transaction (`MULTI` through its
/// `EXEC` or `DISCARD`), which must run on one connection in one slot.
final class RedisClusterUnit {
    enum State {
        /// To be routed (first time, or after a redirection).
        case ready
        case inFlight
        /// Answered TRYAGAIN or CLUSTERDOWN: sent again after the request's backoff.
        case backingOff
        case done
    }

    let range: Range<Int>
    let route: RedisClusterRoute
    /// A keyed command followed by the `WAIT` (or `WAITAOF`) that waits for its write to reach the node's replicas:
    /// the two go to one node on one connection, and are redirected together.
    let hasTrailingWait: Bool
    var state = State.ready
    /// Where an `ASK` redirection sent it: the next attempt goes there, preceded by `ASKING`, once.
    var askTarget: RedisNodeAddress?
    /// MOVED and ASK redirections followed so far.
    var redirects = 0
    /// `.everyPrimary` units: copies still unanswered.
    var pendingCopies = 0

    init(range: Range<Int>, route: RedisClusterRoute, hasTrailingWait: Bool = false) {
        self.range = range
        self.route = route
        self.hasTrailingWait = hasTrailingWait
    }
}

/// One call on a cluster: its batch cut into units, the replies in the batch's order, and its deadline.
final class RedisClusterRequest {
    let id: Int
    let batch: [[RedisArgument]]
    let units: [RedisClusterUnit]
    var replies: [RedisValue?]
    var unitsLeft: Int
    var partsInFlight = 0
    /// In the loop's clock (`nowMilliseconds`).
    let deadline: UInt64
    let timeoutMilliseconds: UInt64
    var deadlineTimer: LoopTimer?
    var retryTimer: LoopTimer?
    var isBackoffArmed = false
    var retries = 0
    var lastTransientReply: String?
    /// Why some unit could not be sent yet (no slot map, no connection to its node), for the deadline's message.
    var holdReason: String?
    private(set) var isFinished = false
    private let completion: (Result<[RedisValue], RedisError>) -> Void

    init(
        id: Int, batch: [[RedisArgument]], units: [RedisClusterUnit], deadline: UInt64, timeoutMilliseconds: UInt64,
        completion: @escaping (Result<[RedisValue], RedisError>) -> Void
    ) {
        self.id = id
        self.batch = batch
        self.units = units
        replies = Array(repeating: nil, count: batch.count)
        unitsLeft = units.count
        self.deadline = deadline
        self.timeoutMilliseconds = timeoutMilliseconds
        self.completion = completion
    }

    var name: String {
        batch.count == 1 ? RedisClusterRoute.upper(batch[0][0].bytes) : "a batch of \(batch.count) commands"
    }

    func finish(_ result: Result<[RedisValue], RedisError>) {
        guard !isFinished else { return }
        isFinished = true
        deadlineTimer?.close()
        retryTimer?.close()
        deadlineTimer = nil
        retryTimer = nil
        completion(result)
    }
}

/// The cluster client's state machine, confined to its loop: the slot map, one `RedisClusterNode` per primary (and
/// per seed), and the calls being routed.
///
/// - **Slot map.** Read with `CLUSTER SLOTS` from a connected node: at start (from the seeds), after a `MOVED`, after
///   a `CLUSTERDOWN`, when a primary's connection is lost, and every `mapRefreshMilliseconds` while a call waits for
///   a node (a failover: the map changes when the replica is promoted). One read at a time.
/// - **Routing.** A call's batch is cut into units (a command, or a `MULTI` ... `EXEC` transaction, which must stay in
///   one slot, else the call is refused with `.crossSlot` before anything is sent). Units are grouped per node into
///   one pipelined part each, in the batch's order; the replies go back to their positions. A unit whose node has no
///   ready connection waits (up to the call's deadline) for the node or for a new map, and is not handed to the
///   node's core, so a failover re-routes it.
/// - **Redirections.** `MOVED slot node`: the map's slot is updated, a full re-read is scheduled, and the unit is sent
///   again to the new node (at most `maximumRedirects` times). `ASK slot node`: the unit is sent once to that node
///   behind `ASKING` (on the same connection, adjacent: a part is written in one go). `TRYAGAIN` and `CLUSTERDOWN`:
///   sent again after a backoff (`retryBackoff`) until the deadline. A transaction is redirected as a whole when its
///   `EXEC` was refused (nothing of it ran).
/// - **Failures** of a part (its connection lost, its deadline) fail the call as they do on one server: in-flight
///   commands may have run and are not re-sent.
final class RedisClusterCore: @unchecked Sendable {
    static let maximumRedirects = 16
    static let mapRefreshMilliseconds: UInt64 = 100

    private let loop: LoopThread
    private let configuration: RedisConfiguration
    private var url: RedisURL { configuration.url }
    private var nodes: [RedisNodeAddress: RedisClusterNode] = [:]
    /// The primary serving each slot (`RedisClusterSlot.count` entries once a map is read; empty before).
    private var slots: [RedisClusterNode?] = []
    /// The distinct primaries of the map, in its order.
    private var primaries: [RedisClusterNode] = []
    private var live: [Int: RedisClusterRequest] = [:]
    /// Requests with a unit that could not be routed yet: routed again when a node connects or the map changes.
    private var held: [Int: RedisClusterRequest] = [:]
    private var nextID = 0
    private var roundRobin = 0
    private var isShutdown = false
    private var stopActionID = 0
    private var refreshTimer: LoopTimer?
    private var isRefreshing = false
    private var isRefreshScheduled = false
    /// A refresh was asked for while one was running, or while no node was connected.
    private var isRefreshWanted = false
    private var lastRefreshStart: UInt64 = 0
    /// Why the last slot-map read failed, for the messages of calls that could not be routed.
    private var lastMapError: String?
    /// Nodes shut down since the last map was applied (see `retireIfIdle`).
    private var retiredNodes: [RedisClusterNode] = []

    init(loop: LoopThread, configuration: RedisConfiguration) {
        self.loop = loop
        self.configuration = configuration
    }

    func start() {
        loop.assertInLoop()
        stopActionID = loop.addStopAction { [self] in shutdown() }
        refreshTimer = LoopTimer(loop: loop)
        for seed in url.seeds { _ = node(seed, isSeed: true) }
    }

    // MARK: Calls

    func submit(
        _ batch: [[RedisArgument]], timeoutMilliseconds: UInt64,
        completion: @escaping (Result<[RedisValue], RedisError>) -> Void
    ) {
        loop.assertInLoop()
        guard !isShutdown else {
            completion(.failure(RedisError(.shutdown, "the Redis client has shut down")))
            return
        }
        let units: [RedisClusterUnit]
        do {
            units = try Self.units(of: batch)
        } catch {
            completion(.failure(error))
            return
        }
        nextID += 1
        let request = RedisClusterRequest(
            id: nextID, batch: batch, units: units, deadline: loop.nowMilliseconds + timeoutMilliseconds,
            timeoutMilliseconds: timeoutMilliseconds, completion: completion)
        live[request.id] = request
        let timer = LoopTimer(loop: loop)
        request.deadlineTimer = timer
        timer.schedule(milliseconds: timeoutMilliseconds) { [unowned self, unowned request] in
            deadlinePassed(request)
        }
        route(request)
    }

    /// Cuts `batch` into units: each command alone, except `MULTI` ... `EXEC` (or `DISCARD`), kept whole, and a `WAIT`
    /// or `WAITAOF` right after a keyed command, kept with it: WAIT counts the replicas that acknowledged the writes of
    /// the connection it is sent on, so it must follow the write on its node's connection (sent to any node, as a
    /// keyless command alone is, it would say nothing about that write).
    /// - Throws: `.crossSlot` for a transaction whose keys are in more than one slot; `.unsupported` for a `MULTI`
    ///   without its `EXEC` or `DISCARD` in the same batch.
    static func units(of batch: [[RedisArgument]]) throws(RedisError) -> [RedisClusterUnit] {
        var units: [RedisClusterUnit] = []
        units.reserveCapacity(batch.count)
        var index = 0
        while index < batch.count {
            let name = RedisClusterRoute.upper(batch[index][0].bytes)
            if name == "WAIT" || name == "WAITAOF", let last = units.last, last.range == index - 1..<index,
                !last.hasTrailingWait, case .slot = last.route
            {
                units[units.count - 1] = RedisClusterUnit(
                    range: last.range.lowerBound..<index + 1, route: last.route, hasTrailingWait: true)
                index += 1
                continue
            }
            guard name == "MULTI" else {
                units.append(RedisClusterUnit(range: index..<index + 1, route: RedisClusterRoute(batch[index])))
                index += 1
                continue
            }
            guard
                let end = batch[(index + 1)...].firstIndex(where: {
                    let name = RedisClusterRoute.upper($0[0].bytes)
                    return name == "EXEC" || name == "DISCARD"
                })
            else {
                throw RedisError(
                    .unsupported,
                    "on a Redis Cluster a batch with MULTI must hold its EXEC (or DISCARD): a transaction is sent to "
                        + "its slot's node as a whole")
            }
            var slot: Int?
            for command in batch[(index + 1)..<end] {
                guard case .slot(let other) = RedisClusterRoute(command) else { continue }
                if let slot, slot != other {
                    throw RedisError(
                        .crossSlot,
                        "CROSSSLOT: a transaction (MULTI ... EXEC) touches keys in slots \(slot) and \(other); on a "
                            + "Redis Cluster a transaction runs in one slot (put its keys under one {hash tag})")
                }
                slot = other
            }
            units.append(RedisClusterUnit(range: index..<end + 1, route: slot.map { .slot($0) } ?? .anyNode))
            index = end + 1
        }
        return units
    }

    /// Sends every `ready` unit of `request` whose node is connected, one pipelined part per node; the others wait
    /// (the request is `held`).
    private func route(_ request: RedisClusterRequest) {
        guard !request.isFinished else { return }
        var parts: [(node: RedisClusterNode, entries: [(unit: RedisClusterUnit, asking: Bool)])] = []
        var partOf: [ObjectIdentifier: Int] = [:]
        func add(_ unit: RedisClusterUnit, to node: RedisClusterNode, asking: Bool) {
            let key = ObjectIdentifier(node)
            if let index = partOf[key] {
                parts[index].entries.append((unit, asking))
            } else {
                partOf[key] = parts.count
                parts.append((node, [(unit, asking)]))
            }
        }
        var holding = false
        for unit in request.units where unit.state == .ready {
            if let target = unit.askTarget {
                let node = node(target, isSeed: false)
                if node.core.isConnected {
                    add(unit, to: node, asking: true)
                } else {
                    holding = true
                    request.holdReason = "no connection to \(target) (asked by an ASK redirection)"
                }
                continue
            }
            switch unit.route {
            case .slot(let slot):
                guard !slots.isEmpty else {
                    holding = true
                    request.holdReason = "no slot map yet" + (lastMapError.map { " (\($0))" } ?? "")
                    continue
                }
                guard let node = slots[slot] else {
                    holding = true
                    request.holdReason = "slot \(slot) is served by no node"
                    continue
                }
                guard node.core.isConnected else {
                    holding = true
                    request.holdReason =
                        "no connection to \(node.address), which serves slot \(slot)"
                        + (node.core.lastError.map { " (\($0.message))" } ?? "")
                    continue
                }
                add(unit, to: node, asking: false)
            case .anyNode:
                guard let node = anyConnectedNode() else {
                    holding = true
                    request.holdReason = "no node of the cluster is connected"
                    continue
                }
                add(unit, to: node, asking: false)
            case .everyPrimary:
                guard !primaries.isEmpty else {
                    holding = true
                    request.holdReason = "no slot map yet" + (lastMapError.map { " (\($0))" } ?? "")
                    continue
                }
                if let absent = primaries.first(where: { !$0.core.isConnected }) {
                    holding = true
                    request.holdReason = "no connection to the primary \(absent.address)"
                    continue
                }
                unit.pendingCopies = primaries.count
                for node in primaries { add(unit, to: node, asking: false) }
            }
        }
        if holding {
            held[request.id] = request
        } else {
            held[request.id] = nil
        }
        // Every unit is marked in flight before any part is submitted: a part failing at once ends the request,
        // and no re-entrant `route` may send a unit twice.
        for part in parts {
            for entry in part.entries { entry.unit.state = .inFlight }
        }
        let now = loop.nowMilliseconds
        let left = request.deadline > now ? request.deadline - now : 1
        for part in parts {
            if request.isFinished { return }
            var commands: [[RedisArgument]] = []
            for entry in part.entries {
                if entry.asking { commands.append(["ASKING"]) }
                commands += request.batch[entry.unit.range]
            }
            let node = part.node
            let entries = part.entries
            node.outstanding += 1
            request.partsInFlight += 1
            node.core.submit(commands, timeoutMilliseconds: left) { [unowned self] result in
                partEnded(request, node: node, entries: entries, result)
            }
        }
        if holding, !isRefreshScheduled, !isRefreshing { requestRefresh() }
    }

    private func partEnded(
        _ request: RedisClusterRequest, node: RedisClusterNode, entries: [(unit: RedisClusterUnit, asking: Bool)],
        _ result: Result<[RedisValue], RedisError>
    ) {
        node.outstanding -= 1
        request.partsInFlight -= 1
        retireIfIdle(node)
        guard !request.isFinished else { return }
        let values: [RedisValue]
        switch result {
        case .failure(let error):
            // Lost or timed out: the part may have run, so the call fails as it would on one server. A lost
            // connection may be a failover: read the map again.
            if error.kind == .connectionLost || error.kind == .unavailable { requestRefresh() }
            finish(request, .failure(error))
            return
        case .success(let replies):
            values = replies
        }
        var cursor = 0
        for (unit, asking) in entries {
            if asking { cursor += 1 }  // ASKING's +OK
            let end = min(values.count, cursor + unit.range.count)
            let replies = Array(values[cursor..<end])
            cursor = end
            handle(unit, replies, from: node, in: request)
        }
        advance(request)
    }

    /// Files the replies of one unit, or sets it up to be sent again after a redirection.
    private func handle(
        _ unit: RedisClusterUnit, _ replies: [RedisValue], from node: RedisClusterNode, in request: RedisClusterRequest
    ) {
        if case .everyPrimary = unit.route {
            // The first error among the nodes' replies, else the first node's reply.
            for (offset, reply) in replies.enumerated() {
                let index = unit.range.lowerBound + offset
                if case .error = reply {
                    if case .error = request.replies[index] { continue }
                    request.replies[index] = reply
                } else if request.replies[index] == nil {
                    request.replies[index] = reply
                }
            }
            unit.pendingCopies -= 1
            if unit.pendingCopies == 0 { done(unit, in: request) }
            return
        }
        // A transaction's commands are answered QUEUED or refused; one refused with a redirection makes EXEC fail
        // (EXECABORT): nothing ran, so the whole transaction can go again.
        let isTransaction = unit.range.count > 1 && !unit.hasTrailingWait
        var redirection: RedisClusterRedirection?
        if !isTransaction || replies.last.map({ if case .error = $0 { true } else { false } }) == true {
            for reply in replies {
                if case .error(let message) = reply, let found = RedisClusterRedirection(message, from: node.address) {
                    redirection = found
                    break
                }
            }
        }
        guard let redirection, unit.redirects < Self.maximumRedirects else {
            for (offset, reply) in replies.enumerated() { request.replies[unit.range.lowerBound + offset] = reply }
            done(unit, in: request)
            return
        }
        switch redirection {
        case .moved(let slot, let address):
            unit.redirects += 1
            unit.askTarget = nil
            let target = self.node(address, isSeed: false)
            if !slots.isEmpty, slot >= 0, slot < slots.count {
                slots[slot] = target
                if !primaries.contains(where: { $0 === target }) { primaries.append(target) }
            }
            requestRefresh()
            unit.state = .ready
        case .ask(_, let address):
            unit.redirects += 1
            unit.askTarget = address
            unit.state = .ready
        case .tryAgain(let message), .clusterDown(let message):
            unit.askTarget = nil
            request.lastTransientReply = message
            if case .clusterDown = redirection { requestRefresh() }
            unit.state = .backingOff
        }
    }

    private func done(_ unit: RedisClusterUnit, in request: RedisClusterRequest) {
        unit.state = .done
        request.unitsLeft -= 1
    }

    /// After replies: finishes the request, routes its redirected units, or arms its backoff.
    private func advance(_ request: RedisClusterRequest) {
        guard !request.isFinished else { return }
        if request.unitsLeft == 0 {
            finish(request, .success(request.replies.map { $0 ?? .null }))
            return
        }
        if request.units.contains(where: { $0.state == .ready }) { route(request) }
        if !request.isBackoffArmed, request.units.contains(where: { $0.state == .backingOff }) {
            request.isBackoffArmed = true
            let delay = RedisClientCore.backoff(attempt: request.retries, configuration.retryBackoff)
            request.retries += 1
            let timer = request.retryTimer ?? LoopTimer(loop: loop)
            request.retryTimer = timer
            timer.schedule(milliseconds: delay) { [unowned self, unowned request] in
                request.isBackoffArmed = false
                for unit in request.units where unit.state == .backingOff { unit.state = .ready }
                route(request)
            }
        }
    }

    private func deadlinePassed(_ request: RedisClusterRequest) {
        guard !request.isFinished else { return }
        let after = "within \(request.timeoutMilliseconds) ms"
        let error: RedisError
        if request.partsInFlight > 0 {
            // The node's own deadline (the same instant) drops the connection the part was sent on.
            error = RedisError(.timeout, "\(request.name) not answered by the cluster \(after)")
        } else if request.units.contains(where: { $0.state == .backingOff }) {
            error = RedisError(
                .timeout,
                "\(request.name) not done \(after): the cluster kept answering \(request.lastTransientReply ?? "")")
        } else {
            error = RedisError(
                .unavailable,
                "\(request.name) not sent \(after): \(request.holdReason ?? "no node of the cluster is ready")")
        }
        finish(request, .failure(error))
    }

    private func finish(_ request: RedisClusterRequest, _ result: Result<[RedisValue], RedisError>) {
        live[request.id] = nil
        held[request.id] = nil
        request.finish(result)
    }

    /// Routes every held request again (a node connected, or the map changed).
    private func rerouteHeld() {
        guard !held.isEmpty else { return }
        for request in held.values.sorted(by: { $0.id < $1.id }) { route(request) }
    }

    // MARK: Nodes

    /// The node at `address`, created (and connecting) when new; a retired node taken back into service.
    private func node(_ address: RedisNodeAddress, isSeed: Bool) -> RedisClusterNode {
        if let existing = nodes[address] {
            existing.isRetired = false
            return existing
        }
        var nodeConfiguration = configuration
        nodeConfiguration.url = url.node(address)
        let core = RedisClientCore(loop: loop, configuration: nodeConfiguration)
        let node = RedisClusterNode(address: address, core: core, isSeed: isSeed)
        nodes[address] = node
        core.connectionObserver = { [unowned self, unowned node] error in connectionChanged(node, error: error) }
        core.start()
        return node
    }

    /// `error` nil: the node's connection is ready; otherwise it ended (or an attempt failed) for that reason.
    private func connectionChanged(_ node: RedisClusterNode, error: RedisError?) {
        guard !isShutdown else { return }
        guard let error else {
            if slots.isEmpty || isRefreshWanted { requestRefresh() }
            rerouteHeld()
            return
        }
        if error.kind == .authenticationFailed {
            // Every node takes the URL's credentials: a refused AUTH will not pass by waiting, as on one server.
            for request in held.values.sorted(by: { $0.id < $1.id }) { finish(request, .failure(error)) }
        } else if primaries.contains(where: { $0 === node }) {
            requestRefresh()  // a primary lost: perhaps a failover
        }
    }

    /// A connected primary (in turn), else any connected node (a seed before the first map).
    private func anyConnectedNode() -> RedisClusterNode? {
        if !primaries.isEmpty {
            for step in 0..<primaries.count {
                let node = primaries[(roundRobin + step) % primaries.count]
                if node.core.isConnected {
                    roundRobin = (roundRobin + step + 1) % primaries.count
                    return node
                }
            }
        }
        return nodes.values.first { $0.core.isConnected }
    }

    private func retireIfIdle(_ node: RedisClusterNode) {
        guard node.isRetired, node.outstanding == 0, !isShutdown, nodes[node.address] === node else { return }
        nodes[node.address] = nil
        node.core.connectionObserver = nil
        node.core.shutdown()
        // Kept until the next map is applied: called inside one of the node's own reply callbacks, the shutdown's
        // `redisAsyncFree` is deferred by hiredis until the callback returns, and then reaches the core through its
        // connection's unowned reference; the core must outlive that.
        retiredNodes.append(node)
    }

    // MARK: Slot map

    /// Reads the map now, or after `mapRefreshMilliseconds` since the last read began; one read at a time.
    private func requestRefresh() {
        guard !isShutdown else { return }
        if isRefreshing || isRefreshScheduled {
            if isRefreshing { isRefreshWanted = true }
            return
        }
        let now = loop.nowMilliseconds
        let since = now - min(now, lastRefreshStart)
        if !slots.isEmpty || lastRefreshStart != 0, since < Self.mapRefreshMilliseconds {
            isRefreshScheduled = true
            refreshTimer?.schedule(milliseconds: Self.mapRefreshMilliseconds - since) { [unowned self] in
                isRefreshScheduled = false
                startRefresh()
            }
            return
        }
        startRefresh()
    }

    private func startRefresh() {
        guard !isShutdown, !isRefreshing else { return }
        guard let node = anyConnectedNode() else {
            isRefreshWanted = true  // the next node to connect asks again
            return
        }
        isRefreshWanted = false
        isRefreshing = true
        lastRefreshStart = loop.nowMilliseconds
        node.outstanding += 1
        let limit = RedisClient.milliseconds(configuration.connectTimeout)
        node.core.submit([["CLUSTER", "SLOTS"]], timeoutMilliseconds: limit) { [unowned self] result in
            node.outstanding -= 1
            isRefreshing = false
            guard !isShutdown else { return }
            switch result {
            case .success(let replies):
                if case .error(let message) = replies[0] {
                    lastMapError = "CLUSTER SLOTS answered by \(node.address): \(message)"
                    isRefreshWanted = true
                } else if !apply(replies[0], from: node.address) {
                    lastMapError = "CLUSTER SLOTS answered by \(node.address) could not be read"
                    isRefreshWanted = true
                } else {
                    lastMapError = nil
                }
            case .failure(let error):
                lastMapError = "CLUSTER SLOTS to \(node.address): \(error.message)"
                isRefreshWanted = true
            }
            retireIfIdle(node)
            rerouteHeld()
            if isRefreshWanted || !held.isEmpty { requestRefresh() }
        }
    }

    /// Replaces the map with `reply` (`CLUSTER SLOTS`: `[start, end, [host, port, id, ...], replicas...]` per range).
    /// False when it cannot be read.
    private func apply(_ reply: RedisValue, from answering: RedisNodeAddress) -> Bool {
        // Retired before this read began: their connections ended in an earlier loop turn.
        retiredNodes = []
        guard let ranges = reply.array, !ranges.isEmpty else { return false }
        var newSlots = [RedisClusterNode?](repeating: nil, count: RedisClusterSlot.count)
        var newPrimaries: [RedisClusterNode] = []
        for range in ranges {
            guard let fields = range.array, fields.count >= 3, let start = fields[0].integer,
                let end = fields[1].integer, let primary = fields[2].array, primary.count >= 2,
                let port = primary[1].integer, let host = primary[0].string
            else { return false }
            // An empty host (or "?") means the node answering's own host (the spec's "unknown endpoint").
            let address = RedisNodeAddress(
                host: host.isEmpty || host == "?" ? answering.host : host, port: Int(port))
            let node = node(address, isSeed: false)
            if !newPrimaries.contains(where: { $0 === node }) { newPrimaries.append(node) }
            let low = max(0, Int(start))
            let high = min(RedisClusterSlot.count - 1, Int(end))
            if low <= high { for slot in low...high { newSlots[slot] = node } }
        }
        slots = newSlots
        primaries = newPrimaries
        for node in nodes.values where !node.isSeed && !newPrimaries.contains(where: { $0 === node }) {
            node.isRetired = true
            retireIfIdle(node)
        }
        return true
    }

    // MARK: Shutdown

    func shutdown() {
        loop.assertInLoop()
        guard !isShutdown else { return }
        isShutdown = true
        loop.removeStopAction(stopActionID)
        refreshTimer?.close()
        for node in nodes.values {
            node.core.connectionObserver = nil
            node.core.shutdown()
        }
        let error = RedisError(.shutdown, "the Redis client shut down before the command was answered")
        for request in live.values.sorted(by: { $0.id < $1.id }) { finish(request, .failure(error)) }
        held = [:]
    }
}

/// A cluster's answer that says "not here" or "not now".
enum RedisClusterRedirection {
    case moved(slot: Int, RedisNodeAddress)
    case ask(slot: Int, RedisNodeAddress)
    case tryAgain(String)
    case clusterDown(String)

    /// Parses `MOVED 3999 127.0.0.1:6381` and `ASK 3999 127.0.0.1:6381` (an empty host: the answering node's),
    /// `TRYAGAIN ...` and `CLUSTERDOWN ...`; nil for any other error.
    init?(_ message: String, from answering: RedisNodeAddress) {
        if message.hasPrefix("TRYAGAIN") {
            self = .tryAgain(message)
            return
        }
        if message.hasPrefix("CLUSTERDOWN") {
            self = .clusterDown(message)
            return
        }
        let words = message.split(separator: " ")
        guard words.count == 3, words[0] == "MOVED" || words[0] == "ASK", let slot = Int(words[1]),
            let colon = words[2].lastIndex(of: ":"), let port = Int(words[2][words[2].index(after: colon)...])
        else { return nil }
        var host = String(words[2][..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        let address = RedisNodeAddress(host: host.isEmpty ? answering.host : host, port: port)
        self = words[0] == "MOVED" ? .moved(slot: slot, address) : .ask(slot: slot, address)
    }
}
