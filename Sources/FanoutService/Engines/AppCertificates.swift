import Fanout
import FanoutObservability
import Foundation

/// The apps that authenticate with a push certificate, checked at start: the certificate is read (an unusable one
/// stops the start, naming the app, the file and the cause), an expired one or one that does not cover the app's
/// bundle id is refused, and each one's expiry is logged (a warning within 30 days) and set in `/metrics`.
enum AppCertificates {
    static func check(
        _ configuration: ServiceConfiguration, logger: FanoutLogger, metrics: FanoutMetrics,
        environment: [String: String] = ProcessInfo.processInfo.environment, now: Date = Date()
    ) throws(ServiceStartError) {
        let apps = configuration.workspaces.values.flatMap(\.apps.values).sorted { $0.bundleID < $1.bundleID }
        for app in apps where app.certificate != nil {
            let path = "workspaces.\(app.workspace).apps.\(app.bundleID)"
            let credentials: ProviderCredentials
            do {
                credentials = try app.credentials(environment: environment)
            } catch {
                throw ServiceStartError("\(error)")
            }
            let loaded: ProviderCertificate?
            do {
                loaded = try credentials.certificate()
            } catch {
                throw ServiceStartError("\(path): \(error.message)")
            }
            guard let certificate = loaded else { continue }
            let status = certificate.expiryStatus(now: Int64(now.timeIntervalSince1970))
            if status.expired { throw ServiceStartError("\(path): \(status.message)") }
            guard certificate.covers(topic: app.bundleID) else {
                throw ServiceStartError("\(path): \(certificate.refusal(topic: app.bundleID))")
            }
            logger.info(certificate.summary, fields: ["app": app.bundleID, "expires": certificate.expiryText])
            if status.warning { logger.warning(status.message, fields: ["app": app.bundleID]) }
            metrics.recordCertificate(certificate)
        }
    }
}
