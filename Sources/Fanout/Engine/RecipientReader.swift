import FanoutCore
import FanoutRegistry

/// Reads a job's recipients one token at a time, in recipient order: inline, from a tokens file, or
/// from the registry a page at a time, so a million-token activity never sits in memory.
struct RecipientReader {
    // Exactly one of the four is set. Separate optionals rather than an enum with payloads, so that each
    // token advances its source in place (`inline!.next()`), with no copy of it in and out per token.
    private var inline: IndexingIterator<[String]>?
    private var file: TokenFileReader?
    private var pager: RegistryPager?
    private var sequence: (any TokenIterator)?
    /// How many tokens `sequence` has yielded, for a failure's message.
    private var sequenceYielded = 0
    /// Why reading stopped before the end, when it did: `next()` then returns nil as at the end.
    private(set) var failure: FanoutError?
    /// How many tokens there are at most, when that is known before reading (inline tokens, a channel): a job's
    /// batch is sized to it, so a one-token `send` does not reserve a full batch of 256 entries.
    private(set) var knownCount: Int?

    /// - Parameter now: the registry's moment for the whole job (Unix ms), so pages agree on expiry.
    /// - Throws: a tokens file that cannot be opened. (A registry job without a registry was refused when the job
    ///   was prepared.)
    init(_ recipients: Recipients, registry: (any RegistryStore)?, now: Int64) throws(FanoutError) {
        func pager(_ query: RegistryPager.Query) -> RegistryPager {
            guard let registry else {
                preconditionFailure("FanoutEngine.checkRegistry(knows:) refuses registry jobs without a registry")
            }
            return RegistryPager(store: registry, query: query, now: now)
        }
        switch recipients {
        case .tokens(let tokens):
            inline = tokens.makeIterator()
            knownCount = tokens.count
        case .file(let path):
            file = try TokenFileReader(path: path)
        case .sequence(let tokens):
            sequence = tokens.iterator()
        case .activity(let app, let id):
            self.pager = pager(.activity(app: app, id: id))
        case .pushToStart(let app, let attributesType, let selection, _):
            self.pager = pager(.pushToStart(app: app, attributesType: attributesType, selection: selection))
        case .devices(let app, let selection):
            self.pager = pager(.devices(app: app, selection: selection))
        case .channel(_, let id, _):
            inline = [id].makeIterator()
            knownCount = 1
        }
    }

    /// The next token, or nil at the end (or after a failure: see `failure`).
    mutating func next() async -> RecipientToken? {
        if inline != nil { return inline!.next().map(RecipientToken.init) }
        if file != nil {
            let token = file!.nextToken()
            if token == nil { failure = file!.failure }
            return token
        }
        if let sequence {
            do {
                guard let token = try await sequence.next() else { return nil }
                sequenceYielded += 1
                return RecipientToken(token)
            } catch {
                failure = FanoutError(.invalidNotification, "recipients sequence failed: \(error)")
                return nil
            }
        }
        do {
            return try await pager!.next().map(RecipientToken.init)
        } catch {
            failure = FanoutError(.connection, "registry: \(error.description)")
            return nil
        }
    }

    /// Where reading stopped, for a failure's message.
    var position: String {
        if let file { return " (after line \(file.lineNumber))" }
        if let pager { return " (after \(pager.delivered) recipients)" }
        if sequence != nil { return " (after \(sequenceYielded) recipients)" }
        return ""
    }
}

/// One registry query read page by page behind the store's cursor, with one `now` for the whole read (the engine's
/// registry-addressed jobs, and `fanout enqueue`'s).
package struct RegistryPager: Sendable {
    package enum Query: Sendable {
        case activity(app: String, id: String)
        case pushToStart(app: String, attributesType: String?, selection: RecipientSelection)
        case devices(app: String, selection: RecipientSelection)

        /// The app the query reads.
        package var app: String {
            switch self {
            case .activity(let app, _), .pushToStart(let app, _, _), .devices(let app, _): app
            }
        }
    }

    let store: any RegistryStore
    package let query: Query
    package let now: Int64
    private var cursor: RegistryCursor?
    private var page: [String] = []
    private var index = 0
    private var exhausted = false
    private(set) var delivered = 0
    /// The page after the current one, read while the current one is used: a store on Redis takes milliseconds per
    /// page (a round trip and a script), which a reader that waited for it would add to the send, page after page. A read ahead that failed is read again when the page is needed.
    private var readAhead: Task<Result<(tokens: [String], next: RegistryCursor?), RegistryError>, Never>?

    package init(store: any RegistryStore, query: Query, now: Int64) {
        self.store = store
        self.query = query
        self.now = now
    }

    /// The next token, or nil after the last.
    mutating func next() async throws(RegistryError) -> String? {
        while index == page.count {
            guard !exhausted else { return nil }
            try await loadPage()
        }
        defer {
            index += 1
            delivered += 1
        }
        return page[index]
    }

    /// The next page's tokens (what `next()` has not returned of the current one, if any), or nil after the last.
    package mutating func nextPage() async throws(RegistryError) -> [String]? {
        while index == page.count {
            guard !exhausted else { return nil }
            try await loadPage()
        }
        defer {
            delivered += page.count - index
            index = page.count
        }
        return Array(page[index...])
    }

    private mutating func loadPage() async throws(RegistryError) {
        let loaded: (tokens: [String], next: RegistryCursor?)
        if let readAhead, case .success(let page) = await readAhead.value {
            self.readAhead = nil
            loaded = page
        } else {
            // No page read ahead, or its read failed (in flight when a connection dropped, say): read it now, so a
            // failure is one of the page as it is needed.
            readAhead = nil
            loaded = try await Self.read(store: store, query: query, after: cursor, now: now)
        }
        page = loaded.tokens
        cursor = loaded.next
        index = 0
        exhausted = cursor == nil
        if let next = cursor {
            let (store, query, now) = (store, query, now)
            readAhead = Task {
                do throws(RegistryError) {
                    return .success(try await Self.read(store: store, query: query, after: next, now: now))
                } catch {
                    return .failure(error)
                }
            }
        }
    }

    /// One page of `query` after `cursor`: its tokens, and the cursor of the next (nil after the last).
    private static func read(store: any RegistryStore, query: Query, after cursor: RegistryCursor?, now: Int64)
        async throws(RegistryError) -> (tokens: [String], next: RegistryCursor?)
    {
        switch query {
        case .activity(let app, let id):
            let result = try await store.liveUpdateTokens(
                app: app, activityID: id, after: cursor, limit: store.preferredPageSize, now: now)
            return (result.items.map(\.token), result.next)
        case .pushToStart(let app, let attributesType, let selection):
            let result = try await store.pushToStartTokens(
                app: app, attributesType: attributesType, selection: selection, after: cursor,
                limit: store.preferredPageSize)
            return (result.items.map(\.token), result.next)
        case .devices(let app, let selection):
            let result = try await store.devices(
                app: app, selection: selection, after: cursor, limit: store.preferredPageSize)
            return (result.items.compactMap(\.pushToken), result.next)
        }
    }
}

extension JSONObject {
    /// Sets `value` at a path of keys, making objects on the way (and replacing non-objects there).
    mutating func set(_ value: JSONValue, at path: ArraySlice<String>) {
        guard let key = path.first else { return }
        if path.count == 1 {
            self[key] = value
            return
        }
        var child = self[key]?.objectValue ?? JSONObject()
        child.set(value, at: path.dropFirst())
        self[key] = .object(child)
    }
}
