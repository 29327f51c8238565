// The README's library example, verbatim between the markers. This file imports `Fanout` alone, so the
// example compiling here shows that a gateway needs no other import.
import Fanout

// README-EXAMPLE-BEGIN
/// Sends one alert to one device; the call gives up after 5 s (`failed`, reason `DeadlineExceeded`).
func sendGoalAlert(engine: FanoutEngine, deviceToken: String) async throws -> NotificationResult {
    let alert = try PushNotification.alert(
        AlertPayload(title: "Goal!", body: "2-1"), to: deviceToken, app: "com.acme.app")
    return try await engine.send(alert, timeout: .seconds(5))
}

/// Sends a score update to every Live Activity token in a file, and drops the tokens APNs says are gone.
func sendScoreUpdate(
    engine: FanoutEngine, tokensFile: String, home: Int, away: Int, at timestamp: Int64
) async throws -> JobSummary {
    let job = FanoutJob.liveActivity(
        id: "match-7-update-12",
        bundleID: "com.acme.app",
        content: LiveActivityContent(
            event: .update,
            timestamp: timestamp,
            contentState: try RawJSON(validating: #"{"home":\#(home),"away":\#(away)}"#),
            alert: LiveActivityAlert(title: "Goal!", body: .plain("\(home)-\(away)"))),
        priority: 10,
        recipients: .file(path: tokensFile))
    return try await engine.run(job) { result in
        if result.outcome == .unregistered, let token = result.token {
            print("forget token", token)  // e.g. delete it from your token store
        }
    }
}
// README-EXAMPLE-END
