/// Recipients a caller streams from its own source (a database cursor, a paginated API) as an `AsyncSequence` of
/// hex tokens: the engine pulls one token at a time while it sends, as it reads a tokens file, so memory stays bounded
/// however many tokens the sequence yields.
///
/// ```swift
/// let tokens = TokenSequence(database.liveActivityTokens(activityID: "match-42"))
/// let job = FanoutJob(id: "goal", headers: headers, payload: payload, recipients: .sequence(tokens))
/// let summary = try await engine.run(job) { result in record(result) }
/// ```
///
/// The sequence is iterated once per job run. If it throws, what it yielded before is sent and the rest of the job
/// is one `invalid` result naming the error, as for a tokens file that breaks mid-read.
public struct TokenSequence: Sendable {
    private let makeIterator: @Sendable () -> any TokenIterator

    /// Wraps a sequence of hex device tokens (64 hex digits each; anything else ends `unregistered`, BadDeviceToken).
    public init<Tokens: AsyncSequence & Sendable>(_ tokens: Tokens) where Tokens.Element == String {
        makeIterator = { IteratorBox(tokens.makeAsyncIterator()) }
    }

    /// A fresh iterator for one run of the job.
    func iterator() -> any TokenIterator { makeIterator() }
}

/// One pass over a `TokenSequence`, owned by the job's feeding task alone.
protocol TokenIterator: AnyObject {
    func next() async throws -> String?
}

/// Holds the caller's iterator (mutated in place by each `next()`), behind the class `TokenIterator` needs.
private final class IteratorBox<Base: AsyncIteratorProtocol>: TokenIterator where Base.Element == String {
    private var base: Base

    init(_ base: Base) { self.base = base }

    func next() async throws -> String? { try await base.next() }
}
