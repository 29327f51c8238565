import Fanout
import FanoutCore
import FanoutObservability
import Foundation

/// `GET /v1/status`: what the status page shows for the caller's workspace: its newest dispatches with their
/// counts and rates, the budget left, open APNs connections (server-wide: engines are per APNs team), and how many of its dispatches are sending now.
enum StatusReport {
    static func make(_ core: ServiceCore, workspace: String) async -> JSONValue {
        // Behind a load balancer, every instance's (as published to Redis); else this instance's own.
        var dispatches = (try? await core.sharedDispatches?.recent(workspace: workspace, limit: 50)) ?? []
        if core.sharedDispatches == nil || dispatches.isEmpty {
            dispatches = (try? core.store.recent(workspace: workspace, limit: 50)) ?? []
        }
        let rule = core.configuration.workspaces[workspace]?.rateLimit
        let budget: JSONValue = [
            "limit_per_hour": .integer(Int64(rule?.requestsPerHour ?? 0)),
            "remaining": .integer(Int64(await core.remainingBudget(workspace: workspace) ?? 0)),
        ]
        var report: JSONValue = [
            "workspace": .string(workspace),
            "uptime_s": .integer(Int64(Date().timeIntervalSince(core.started))),
            "apns_connections": .integer(Int64(core.metrics.openConnections.value)),
            "in_flight": .integer(Int64(core.metrics.inFlight.value)),
            "running_dispatches": .integer(Int64(dispatches.count { $0.state == .running })),
            "budget": budget,
            "dispatches": .array(
                dispatches.map { record in
                    // A running dispatch whose audience size was known at its start gets `expected` (progress).
                    guard record.state == .running, let total = core.dispatcher.expectedResults(of: record.id) else {
                        return record.json
                    }
                    return record.json.setting(.integer(Int64(total)), at: ["expected"])
                }),
        ]
        if let events = core.events, events.recording.contains(workspace) {
            report = report.setting(events.status(workspace: workspace), at: ["webhooks"])
        }
        return report
    }
}
