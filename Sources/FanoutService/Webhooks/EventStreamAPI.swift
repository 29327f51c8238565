import Foundation

/// `GET /v1/events` (server key): the caller's workspace's events, the same the webhooks get, as Server-Sent Events
/// (`text/event-stream`): each one `id: <sequence>`, `event: <type>`, `data: <the webhook body>`.
///
/// Each answer holds the events after `Last-Event-ID` (the header an `EventSource` sends when it reconnects, or the
/// `last_event_id` query parameter), waiting up to `wait` seconds (default 20, at most 25) for the first, at most
/// 1,000 of them; then it ends and says `retry: 1000`, and the client reconnects with the last id it saw. An answer
/// with no event still carries an `id:` line (the newest sequence), so the next request starts there. Without a
/// `Last-Event-ID` the stream starts from now. The sequence is the outbox's, shared by every workspace; a client
/// only ever sees its own workspace's events.
struct EventStreamAPI {
    let core: ServiceCore
    let events: ServiceEvents?

    static let maxEvents = 1_000

    func handle(_ request: APIRequest) async -> APIResponse {
        do throws(APIError) {
            guard request.method == "GET" else { throw APIError(405, "use GET for /v1/events") }
            let caller = try core.authenticate(key: NativeAPI.bearer(request), needs: .server)
            let (headers, refused) = await core.admit(caller, budget: .api)
            guard refused == nil else {
                var response = NativeAPI.error(APIError(429, "rate limited: this workspace's request budget is spent"))
                response.headers += headers
                return response
            }
            guard let events, events.recording.contains(caller.workspace) else {
                throw APIError(
                    404, "this workspace keeps no events: give it webhooks or \"event_stream\": true in the config")
            }
            var after: Int64?
            if let text = request.header("last-event-id") ?? request.query["last_event_id"] {
                guard let value = Int64(text.trimmingCharacters(in: .whitespaces)), value >= 0 else {
                    throw APIError(400, field: "last_event_id", "Last-Event-ID must be an id this stream sent")
                }
                after = value
            }
            var wait = 20.0
            if let text = request.query["wait"] {
                guard let value = Double(text), value >= 0, value <= 25 else {
                    throw APIError(400, field: "wait", "wait must be a number of seconds from 0 to 25")
                }
                wait = value
            }
            let found = try await read(
                workspace: caller.workspace, after: after, wait: .milliseconds(Int64(wait * 1000)))
            var body = Array("retry: 1000\n\n".utf8)
            for (sequence, type, json) in found.events {
                body += Array("id: \(sequence)\nevent: \(type)\ndata: ".utf8)
                body += json
                body += Array("\n\n".utf8)
            }
            if found.events.isEmpty { body += Array("id: \(found.cursor)\n\n".utf8) }
            return APIResponse(
                status: 200,
                headers: [("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-store")]
                    + headers,
                body: body)
        } catch {
            return NativeAPI.error(error)
        }
    }

    /// The events after `after` (from the newest sequence when nil), polling the outbox until one comes or `wait`
    /// passes.
    private func read(workspace: String, after: Int64?, wait: Duration) async throws(APIError) -> (
        events: [(Int64, String, [UInt8])], cursor: Int64
    ) {
        guard let outbox = events?.outbox else { return ([], after ?? 0) }
        let deadline = ContinuousClock.now + wait
        do {
            let cursor = try after ?? outbox.lastSequence()
            while true {
                let rows = try outbox.events(workspace: workspace, after: cursor, limit: Self.maxEvents)
                if !rows.isEmpty || ContinuousClock.now >= deadline || Task.isCancelled {
                    return (rows, cursor)
                }
                try? await Task.sleep(for: .milliseconds(200))
            }
        } catch {
            throw APIError(503, "the event outbox cannot be read now")
        }
    }
}
