import FanoutCore

/// Sends each request to its API by path: `/v1/` native, `/json/1.3/` Pushwoosh, `/messages/live_activity/` Braze,
/// and the service's own `/healthz`, `/metrics` and `/` (the status page).
package struct ServiceRouter: Sendable {
    let core: ServiceCore
    /// The recorded events, for `GET /v1/events` (nil when no workspace keeps them).
    let events: ServiceEvents?

    package init(core: ServiceCore) {
        self.core = core
        events = nil
    }

    init(core: ServiceCore, events: ServiceEvents?) {
        self.core = core
        self.events = events
    }

    package func handle(_ request: APIRequest) async -> APIResponse {
        var response = await route(request)
        // Every API's 503 (a store it cannot read or write now; nothing was done) says when to come back, so a client
        // retries rather than gives up.
        if response.status == 503 { response.headers.append(("retry-after", "1")) }
        return response
    }

    /// The HTTP server's own answers (a body over the limit, a timeout, a malformed head, too many connections),
    /// given before any API has the request, so in one JSON shape that every API's clients read: native and Braze
    /// clients read `error`, the Pushwoosh SDK `status_code` and `status_message`. Without a `status_code` the SDK
    /// resets its base URL to Pushwoosh's own (docs/reference/braze-pushwoosh.md, "Pushwoosh iOS SDK"): one 413 would
    /// move an app off Fanout.
    package static func serverAnswer(status: Int, message: String) -> APIResponse {
        var response = APIResponse.json(
            status,
            [
                "error": .string(message), "status_code": .integer(Int64(status)), "status_message": .string(message),
                "response": .null,
            ])
        if status == 503 { response.headers.append(("retry-after", "1")) }
        return response
    }

    private func route(_ request: APIRequest) async -> APIResponse {
        guard let segments = request.segments else {
            return NativeAPI.error(APIError(400, "the path is not valid percent-encoded UTF-8"))
        }
        switch segments.first {
        case "v1" where segments == ["v1", "events"]:
            return await EventStreamAPI(core: core, events: events).handle(request)
        case "v1":
            return await NativeAPI(core: core).handle(request, segments: segments)
        case "json" where segments.count == 3 && segments[1] == "1.3":
            return await PushwooshAPI(core: core).handle(request, method: segments[2])
        case "json":
            // Still Pushwoosh-shaped (with status_code), or the SDK would reset its base URL.
            return PushwooshAPI.answer(http: 404, code: 404, message: "no such method: \(request.path)")
        case "messages" where segments.count == 3 && segments[1] == "live_activity":
            return await BrazeAPI(core: core).handle(request, endpoint: segments[2])
        case "healthz" where segments.count == 1:
            return .json(200, ["status": "ok"])
        case "metrics" where segments.count == 1:
            return APIResponse(
                status: 200, headers: [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                body: Array(core.metrics.registry.exposition().utf8))
        case nil where request.method == "GET" || request.method == "HEAD":
            return StatusPage.response
        default:
            return NativeAPI.error(APIError(404, "no such endpoint: \(request.method) \(request.path)"))
        }
    }
}
