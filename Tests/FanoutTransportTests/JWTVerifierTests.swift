import FanoutTestSupport
import Foundation
import XCTest

@testable import FanoutTransport

final class JWTVerifierTests: XCTestCase {
    private let keyID = "ABC123DEFG"
    private let teamID = "DEF123GHIJ"
    private let now: Int64 = 1_700_000_000

    private func makeVerifier(_ key: ES256PrivateKey, maxAge: Int64 = 3600) -> ProviderTokenVerifier {
        ProviderTokenVerifier(publicKey: key.publicKey, expectedKeyID: keyID, expectedTeamID: teamID, maxAge: maxAge)
    }

    /// A token with arbitrary header/claims JSON, signed properly with `key` (to test the checks after the
    /// signature).
    private func handMadeToken(key: ES256PrivateKey, header: String, claims: String) throws -> String {
        let input =
            CryptoTestSupport.base64URLEncode(Array(header.utf8)) + "."
            + CryptoTestSupport.base64URLEncode(Array(claims.utf8))
        return input + "." + CryptoTestSupport.base64URLEncode(try key.signature(for: Array(input.utf8)))
    }

    private func assertInvalid(
        _ result: ProviderTokenVerifier.Result, mentioning word: String, token: String,
        file: StaticString = #filePath, line: UInt = #line
    ) {
        guard case .invalid(let reason) = result else {
            return XCTFail("expected .invalid, got \(result)", file: file, line: line)
        }
        XCTAssertEqual(result.apnsReason, "InvalidProviderToken", file: file, line: line)
        XCTAssertTrue(reason.contains(word), "reason \"\(reason)\" should mention \(word)", file: file, line: line)
        for part in token.split(separator: ".") where part.count >= 8 {
            XCTAssertFalse(reason.contains(part), "reason leaks token text", file: file, line: line)
        }
    }

    func testAcceptsGoodToken() throws {
        let key = try ES256PrivateKey.generate()
        let token = try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: now - 10)
        let result = makeVerifier(key).verify(token, now: now)
        XCTAssertEqual(result, .valid(ProviderTokenClaims(keyID: keyID, teamID: teamID, issuedAt: now - 10)))
        XCTAssertNil(result.apnsReason)
        // Without expectations any kid/iss is fine; a Substring works too.
        let open = ProviderTokenVerifier(publicKey: key.publicKey)
        XCTAssertTrue(open.verify(("bearer " + token).dropFirst(7), now: now).isValid)
    }

    func testAcceptsTokenFromKeyLoadedFromFiles() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let material = try TestTLSMaterial.createOrReuse(in: directory)
        let key = try ES256PrivateKey(pemFilePath: material.authKeyP8Path)
        let token = try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: now)
        for publicKeyPath in [material.authKeyPublicPEMPath, material.authKeyP8Path] {
            let verifier = ProviderTokenVerifier(publicKey: try ES256PublicKey(pemFilePath: publicKeyPath))
            XCTAssertTrue(verifier.verify(token, now: now).isValid)
        }
    }

    func testRejectsTamperedSignatureAndClaims() throws {
        let key = try ES256PrivateKey.generate()
        let verifier = makeVerifier(key)
        let token = try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: now)
        let parts = token.split(separator: ".").map(String.init)

        var signature = try XCTUnwrap(CryptoTestSupport.base64URLDecode(parts[2]))
        signature[5] ^= 0x40
        let badSignature = parts[0] + "." + parts[1] + "." + CryptoTestSupport.base64URLEncode(signature)
        assertInvalid(verifier.verify(badSignature, now: now), mentioning: "signature", token: badSignature)

        let otherClaims = CryptoTestSupport.base64URLEncode(Array(#"{"iss":"DEF123GHIJ","iat":1700000001}"#.utf8))
        let badClaims = parts[0] + "." + otherClaims + "." + parts[2]
        assertInvalid(verifier.verify(badClaims, now: now), mentioning: "signature", token: badClaims)

        let otherKey = try ES256PrivateKey.generate()
        let foreign = try makeProviderToken(key: otherKey, keyID: keyID, teamID: teamID, issuedAt: now)
        assertInvalid(verifier.verify(foreign, now: now), mentioning: "signature", token: foreign)

        let shortSignature = parts[0] + "." + parts[1] + "." + CryptoTestSupport.base64URLEncode(signature.prefix(40))
        assertInvalid(verifier.verify(shortSignature, now: now), mentioning: "64", token: shortSignature)
        XCTAssertEqual(verifier.cache.count, 0, "rejected tokens are not cached")
    }

    func testRejectsWrongKeyIDAndTeam() throws {
        let key = try ES256PrivateKey.generate()
        let verifier = makeVerifier(key)
        let wrongKid = try makeProviderToken(key: key, keyID: "ZZZ999ZZZZ", teamID: teamID, issuedAt: now)
        assertInvalid(verifier.verify(wrongKid, now: now), mentioning: "kid", token: wrongKid)
        let wrongTeam = try makeProviderToken(key: key, keyID: keyID, teamID: "ZZZ999ZZZZ", issuedAt: now)
        assertInvalid(verifier.verify(wrongTeam, now: now), mentioning: "iss", token: wrongTeam)
    }

    func testRejectsAlgorithmsOtherThanES256() throws {
        let key = try ES256PrivateKey.generate()
        let verifier = makeVerifier(key)
        let claims = #"{"iss":"DEF123GHIJ","iat":1700000000}"#
        for alg in ["HS256", "ES384", "none", "es256"] {
            let token = try handMadeToken(key: key, header: #"{"alg":"\#(alg)","kid":"ABC123DEFG"}"#, claims: claims)
            assertInvalid(verifier.verify(token, now: now), mentioning: "alg", token: token)
        }
        let noAlg = try handMadeToken(key: key, header: #"{"kid":"ABC123DEFG"}"#, claims: claims)
        assertInvalid(verifier.verify(noAlg, now: now), mentioning: "alg", token: noAlg)
        // "alg":"none" with an empty signature.
        let unsigned =
            CryptoTestSupport.base64URLEncode(Array(#"{"alg":"none","kid":"ABC123DEFG"}"#.utf8)) + "."
            + CryptoTestSupport.base64URLEncode(Array(claims.utf8)) + "."
        XCTAssertEqual(verifier.verify(unsigned, now: now).apnsReason, "InvalidProviderToken")
        // A well-signed token with extra header fields (typ) is still fine.
        let typ = try handMadeToken(
            key: key, header: #"{"alg":"ES256","kid":"ABC123DEFG","typ":"JWT"}"#, claims: claims)
        XCTAssertTrue(verifier.verify(typ, now: now).isValid)
    }

    func testRejectsBadClaimTypes() throws {
        let key = try ES256PrivateKey.generate()
        let verifier = makeVerifier(key)
        let header = #"{"alg":"ES256","kid":"ABC123DEFG"}"#
        for claims in [
            #"{"iss":"DEF123GHIJ","iat":"1700000000"}"#, #"{"iss":"DEF123GHIJ","iat":1700000000.5}"#,
            #"{"iss":"DEF123GHIJ","iat":true}"#, #"{"iss":"DEF123GHIJ"}"#,
        ] {
            let token = try handMadeToken(key: key, header: header, claims: claims)
            assertInvalid(verifier.verify(token, now: now), mentioning: "iat", token: token)
        }
        let noIss = try handMadeToken(key: key, header: header, claims: #"{"iat":1700000000}"#)
        assertInvalid(verifier.verify(noIss, now: now), mentioning: "iss", token: noIss)
        let noKid = try handMadeToken(key: key, header: #"{"alg":"ES256"}"#, claims: #"{"iss":"T","iat":1}"#)
        assertInvalid(verifier.verify(noKid, now: now), mentioning: "kid", token: noKid)
    }

    func testRejectsMalformedTokens() throws {
        let verifier = makeVerifier(try ES256PrivateKey.generate())
        let longToken = String(repeating: "a", count: ProviderTokenVerifier.maximumTokenLength + 1)
        for token in ["", "abc", "a.b", "a.b.c.d", "!!!.???.***", "e30.e30.", "W10.e30.AAAA", longToken] {
            XCTAssertEqual(verifier.verify(token, now: now).apnsReason, "InvalidProviderToken", token)
        }
    }

    func testExpiryAgainstMaxAge() throws {
        let key = try ES256PrivateKey.generate()
        let verifier = makeVerifier(key)
        let old = try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: now - 3601)
        let result = verifier.verify(old, now: now)
        XCTAssertEqual(result, .expired(ProviderTokenClaims(keyID: keyID, teamID: teamID, issuedAt: now - 3601)))
        XCTAssertEqual(result.apnsReason, "ExpiredProviderToken")
        let boundary = try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: now - 3600)
        XCTAssertTrue(verifier.verify(boundary, now: now).isValid)

        let strict = makeVerifier(key, maxAge: 60)
        XCTAssertEqual(strict.verify(boundary, now: now).apnsReason, "ExpiredProviderToken")

        let future = try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: now + 3601)
        assertInvalid(verifier.verify(future, now: now), mentioning: "future", token: future)
    }

    func testRepeatedTokenIsServedFromCacheButExpiryIsRechecked() throws {
        let key = try ES256PrivateKey.generate()
        let verifier = makeVerifier(key)
        let token = try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: now)
        for _ in 0..<100 { XCTAssertTrue(verifier.verify(token, now: now + 5).isValid) }
        XCTAssertEqual(verifier.cache.missCount, 1)
        XCTAssertEqual(verifier.cache.hitCount, 99)
        XCTAssertEqual(verifier.cache.count, 1)

        XCTAssertEqual(verifier.verify(token, now: now + 3601).apnsReason, "ExpiredProviderToken")
        XCTAssertEqual(verifier.cache.hitCount, 100)
        XCTAssertTrue(verifier.verify(token, now: now + 3600).isValid)

        // A copy of the verifier shares the cache.
        let copy = verifier
        XCTAssertTrue(copy.verify(token, now: now).isValid)
        XCTAssertEqual(verifier.cache.hitCount, 102)
    }

    func testCacheKeepsOnlyTheMostRecentTokens() throws {
        let key = try ES256PrivateKey.generate()
        let verifier = makeVerifier(key)
        let tokens = try (0..<20).map {
            try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: now - Int64($0))
        }
        for token in tokens { XCTAssertTrue(verifier.verify(token, now: now).isValid) }
        XCTAssertEqual(verifier.cache.count, 16)
        XCTAssertEqual(verifier.cache.missCount, 20)
        // The last 16 are cached; the first 4 were evicted.
        for token in tokens.suffix(16) { XCTAssertTrue(verifier.verify(token, now: now).isValid) }
        XCTAssertEqual(verifier.cache.missCount, 20)
        XCTAssertTrue(verifier.verify(tokens[0], now: now).isValid)
        XCTAssertEqual(verifier.cache.missCount, 21)
        XCTAssertEqual(verifier.cache.count, 16)
    }

    func testConcurrentVerification() throws {
        let key = try ES256PrivateKey.generate()
        let verifier = makeVerifier(key)
        let tokens = try (0..<4).map {
            try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: now - Int64($0))
        }
        let results = LockedArray<Bool>()
        let time = now
        DispatchQueue.concurrentPerform(iterations: 400) { index in
            results.append(verifier.verify(tokens[index % 4], now: time).isValid)
        }
        XCTAssertEqual(results.values.count, 400)
        XCTAssertTrue(results.values.allSatisfy { $0 })
        XCTAssertEqual(verifier.cache.hitCount + verifier.cache.missCount, 400)
        XCTAssertEqual(verifier.cache.count, 4)
    }
}
