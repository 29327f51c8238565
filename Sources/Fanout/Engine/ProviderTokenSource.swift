package import FanoutTransport

/// Where an engine's loops take the provider token (JWT) they send with every request.
///
/// The default is the engine's own `ProviderTokenCache`, minted from `FanoutEngineConfiguration.credentials`. A fleet
/// of workers sharing one team gives every engine a source that reads one token kept in Redis instead
/// (`FleetProviderToken` in FanoutFleet), so that the team gets one new token per refresh, not one per process.
///
/// Both methods are called on loop threads: they must answer from memory and never wait for I/O.
package protocol ProviderTokenSource: Sendable {
    /// The token to send now. Throwing fails the waiting notifications with `ProviderTokenUnavailable`.
    func currentToken() throws -> String

    /// APNs rejected the current token (`ExpiredProviderToken`, `InvalidProviderToken`): ask for a new one. Returns at
    /// once; the source decides whether a new token is minted (APNs allows one per 20 minutes per team).
    func refreshAfterRejection()
}

extension ProviderTokenCache: ProviderTokenSource {
    /// Mints at once unless the current token is younger than `minimumInterval` (then it stays).
    package func refreshAfterRejection() {
        _ = try? forceRefresh()
    }
}
