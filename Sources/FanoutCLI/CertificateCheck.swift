import CommandLineSupport
import Fanout
import FanoutObservability
import Foundation

/// What the commands do with a provider certificate before they send: read it (an unusable one is a usage error,
/// exit 2), refuse it when expired or when it does not cover a topic known in advance, and say when it expires.
enum CertificateCheck {
    /// Reads the certificate of `credentials` (nil for a signing key) and checks it against `topics`.
    /// - Returns: the certificate and the lines to log: the expiry (info), and a warning within
    ///   `ProviderCertificate.expiryWarningDays` of it.
    static func check(_ credentials: ProviderCredentials?, topics: [String] = [], now: Date = Date())
        throws(UsageError) -> (certificate: ProviderCertificate, info: String, warning: String?)?
    {
        guard let credentials, credentials.usesCertificate else { return nil }
        let certificate: ProviderCertificate
        do {
            guard let loaded = try credentials.certificate() else { return nil }
            certificate = loaded
        } catch {
            throw UsageError(error.message)
        }
        let status = certificate.expiryStatus(now: Int64(now.timeIntervalSince1970))
        if status.expired { throw UsageError(status.message) }
        for topic in topics where !certificate.covers(topic: topic) {
            throw UsageError(certificate.refusal(topic: topic))
        }
        return (certificate, certificate.summary, status.warning ? status.message : nil)
    }

    /// `check`, with the lines written to `logger` and the expiry set in `/metrics` when there is one.
    static func checkAndLog(
        _ credentials: ProviderCredentials?, topics: [String] = [], logger: FanoutLogger, metrics: FanoutMetrics?
    ) throws(UsageError) {
        guard let checked = try check(credentials, topics: topics) else { return }
        logger.info(checked.info, fields: ["expires": checked.certificate.expiryText])
        if let warning = checked.warning { logger.warning(warning) }
        metrics?.recordCertificate(checked.certificate)
    }
}
