import FanoutTestSupport
import Foundation
import XCTest

@testable import FanoutTransport

final class JWTProviderTokenCacheTests: XCTestCase {
    private let keyID = "ABC123DEFG"
    private let teamID = "DEF123GHIJ"
    private let start: Int64 = 1_700_000_000

    private func issuedAt(of token: String, key: ES256PrivateKey) -> Int64? {
        let verifier = ProviderTokenVerifier(publicKey: key.publicKey, maxAge: Int64.max / 4)
        if case .valid(let claims) = verifier.verify(token, now: start) { return claims.issuedAt }
        return nil
    }

    func testMintsOnceAndReusesWithinRefreshAfter() throws {
        let key = try ES256PrivateKey.generate()
        let cache = try ProviderTokenCache(key: key, keyID: keyID, teamID: teamID)
        XCTAssertEqual(cache.mintCount, 0)
        XCTAssertNil(cache.issuedAt)
        let first = try cache.currentToken(now: start)
        XCTAssertEqual(cache.mintCount, 1)
        XCTAssertEqual(cache.issuedAt, start)
        XCTAssertEqual(issuedAt(of: first, key: key), start)
        for offset: Int64 in [0, 1, 600, 1200, 2999] {
            XCTAssertEqual(try cache.currentToken(now: start + offset), first)
        }
        XCTAssertEqual(cache.mintCount, 1)
    }

    func testRemintsAfterRefreshAfter() throws {
        let key = try ES256PrivateKey.generate()
        let cache = try ProviderTokenCache(key: key, keyID: keyID, teamID: teamID)
        let first = try cache.currentToken(now: start)
        let second = try cache.currentToken(now: start + 3000)
        XCTAssertNotEqual(first, second)
        XCTAssertEqual(cache.mintCount, 2)
        XCTAssertEqual(issuedAt(of: second, key: key), start + 3000)
        XCTAssertEqual(try cache.currentToken(now: start + 3001), second)
        XCTAssertEqual(cache.mintCount, 2)
    }

    func testForceRefreshHonoursMinimumInterval() throws {
        let key = try ES256PrivateKey.generate()
        let cache = try ProviderTokenCache(key: key, keyID: keyID, teamID: teamID)
        // With no token yet, forceRefresh mints.
        let first = try cache.forceRefresh(now: start)
        XCTAssertEqual(cache.mintCount, 1)
        // Too soon: the cached token comes back and nothing is minted.
        XCTAssertEqual(try cache.forceRefresh(now: start + 1), first)
        XCTAssertEqual(try cache.forceRefresh(now: start + 1199), first)
        XCTAssertEqual(cache.mintCount, 1)
        // After the minimum interval it re-mints.
        let second = try cache.forceRefresh(now: start + 1200)
        XCTAssertNotEqual(second, first)
        XCTAssertEqual(cache.mintCount, 2)
        XCTAssertEqual(try cache.currentToken(now: start + 1300), second)
        XCTAssertEqual(cache.mintCount, 2)
    }

    func testShortIntervalsForTests() throws {
        let key = try ES256PrivateKey.generate()
        let cache = try ProviderTokenCache(
            key: key, keyID: keyID, teamID: teamID, refreshAfter: 10, minimumInterval: 5)
        XCTAssertEqual(cache.refreshAfter, 10)
        XCTAssertEqual(cache.minimumInterval, 5)
        let a = try cache.currentToken(now: 100)
        XCTAssertEqual(try cache.currentToken(now: 109), a)
        let b = try cache.currentToken(now: 110)
        XCTAssertNotEqual(a, b)
        XCTAssertEqual(try cache.forceRefresh(now: 114), b)
        let c = try cache.forceRefresh(now: 115)
        XCTAssertNotEqual(b, c)
        XCTAssertEqual(cache.mintCount, 3)

        let eager = try ProviderTokenCache(key: key, keyID: keyID, teamID: teamID, refreshAfter: 1, minimumInterval: 0)
        _ = try eager.forceRefresh(now: 0)
        _ = try eager.forceRefresh(now: 0)
        XCTAssertEqual(eager.mintCount, 2)
    }

    func testValidatesIntervals() throws {
        let signer = try ProviderTokenSigner(key: try ES256PrivateKey.generate(), keyID: keyID, teamID: teamID)
        for (refreshAfter, minimumInterval): (Int64, Int64) in [
            (3600, 1200), (0, 0), (-5, 0), (3000, 3001), (3000, -1),
        ] {
            XCTAssertThrowsError(
                try ProviderTokenCache(signer: signer, refreshAfter: refreshAfter, minimumInterval: minimumInterval)
            ) { error in
                XCTAssertEqual((error as! CryptoError).kind, .invalidArgument)
            }
        }
        XCTAssertNoThrow(try ProviderTokenCache(signer: signer, refreshAfter: 3599, minimumInterval: 3599))
    }

    func testConcurrentCallersShareOneMint() throws {
        let key = try ES256PrivateKey.generate()
        let cache = try ProviderTokenCache(key: key, keyID: keyID, teamID: teamID)
        let tokens = LockedArray<String>()
        let start = self.start
        DispatchQueue.concurrentPerform(iterations: 200) { index in
            if let token = try? cache.currentToken(now: start + Int64(index % 10)) { tokens.append(token) }
        }
        XCTAssertEqual(tokens.values.count, 200)
        XCTAssertEqual(Set(tokens.values).count, 1)
        XCTAssertEqual(cache.mintCount, 1)
    }

    /// One cache per key in a process: every client signing with the key sends its one token. Another key under the
    /// same ids gets its own (its tokens verify only with it), and a key no client holds any more is forgotten.
    func testClientsOfOneKeyShareOneCache() throws {
        let key = try ES256PrivateKey.generate()
        let first = try ProviderTokenCache.shared(signer: ProviderTokenSigner(key: key, keyID: keyID, teamID: teamID))
        let token = try first.currentToken(now: start)
        // The same key loaded again (a second engine, the channel client), with another schedule asked for.
        let reloaded = try ES256PrivateKey(pem: key.pemPKCS8())
        let second = try ProviderTokenCache.shared(
            signer: ProviderTokenSigner(key: reloaded, keyID: keyID, teamID: teamID), refreshAfter: 100,
            minimumInterval: 10)
        XCTAssertTrue(first === second)
        XCTAssertEqual(second.refreshAfter, 3000, "the first cache's schedule")
        XCTAssertEqual(try second.currentToken(now: start + 1), token)
        XCTAssertEqual(first.mintCount, 1)

        let otherKey = try ProviderTokenCache.shared(
            signer: ProviderTokenSigner(key: try ES256PrivateKey.generate(), keyID: keyID, teamID: teamID))
        XCTAssertFalse(otherKey === first)
        let otherTeam = try ProviderTokenCache.shared(
            signer: ProviderTokenSigner(key: key, keyID: keyID, teamID: "ZZZ123ZZZZ"))
        XCTAssertFalse(otherTeam === first)

        weak var released: ProviderTokenCache?
        do {
            let alone = try ProviderTokenCache.shared(
                signer: ProviderTokenSigner(key: try ES256PrivateKey.generate(), keyID: keyID, teamID: teamID))
            _ = try alone.currentToken(now: start)
            released = alone
        }
        XCTAssertNil(released, "the registry keeps no cache alive")
    }

    func testWallClockConvenience() throws {
        let key = try ES256PrivateKey.generate()
        let cache = try ProviderTokenCache(key: key, keyID: keyID, teamID: teamID)
        let token = try cache.currentToken()
        let wall = Int64(Date().timeIntervalSince1970)
        let issued = try XCTUnwrap(cache.issuedAt)
        XCTAssertLessThanOrEqual(abs(wall - issued), 5)
        XCTAssertEqual(try cache.forceRefresh(), token)
        let verifier = ProviderTokenVerifier(publicKey: key.publicKey, expectedKeyID: keyID, expectedTeamID: teamID)
        XCTAssertTrue(verifier.verify(token, now: ProviderTokenCache.wallClock()).isValid)
    }
}
