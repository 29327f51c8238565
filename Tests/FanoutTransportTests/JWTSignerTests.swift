import FanoutTestSupport
import Foundation
import XCTest

@testable import FanoutTransport

final class JWTSignerTests: XCTestCase {
    private let keyID = "ABC123DEFG"
    private let teamID = "DEF123GHIJ"

    func testTokenHasAPNsHeaderAndClaims() throws {
        let key = try ES256PrivateKey.generate()
        let token = try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: 1_700_000_000)
        XCTAssertFalse(token.contains("="))
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        XCTAssertEqual(parts.count, 3)
        let header = try XCTUnwrap(CryptoTestSupport.base64URLDecode(parts[0]))
        let claims = try XCTUnwrap(CryptoTestSupport.base64URLDecode(parts[1]))
        XCTAssertEqual(String(decoding: header, as: UTF8.self), #"{"alg":"ES256","kid":"ABC123DEFG"}"#)
        XCTAssertEqual(String(decoding: claims, as: UTF8.self), #"{"iss":"DEF123GHIJ","iat":1700000000}"#)
        XCTAssertEqual(CryptoTestSupport.base64URLDecode(parts[2])?.count, 64)
    }

    func testSignatureVerifiesWithOpenSSLCommandLine() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let key = try ES256PrivateKey.generate()
        let signer = try ProviderTokenSigner(key: key, keyID: keyID, teamID: teamID)
        let publicKeyPath = directory + "/pub.pem"
        try CryptoTestSupport.write(key.publicKey.pem(), to: publicKeyPath)

        for issuedAt: Int64 in [1_700_000_000, 1_700_003_000, 42] {
            let token = try signer.makeToken(issuedAt: issuedAt)
            let parts = token.split(separator: ".", omittingEmptySubsequences: false)
            let raw = try XCTUnwrap(CryptoTestSupport.base64URLDecode(parts[2]))
            XCTAssertEqual(raw.count, 64)
            let dataPath = directory + "/data-\(issuedAt).txt"
            let signaturePath = directory + "/sig-\(issuedAt).der"
            try CryptoTestSupport.write("\(parts[0]).\(parts[1])", to: dataPath)
            try CryptoTestSupport.write(CryptoTestSupport.derEncodeECDSASignature(raw), to: signaturePath)

            let run = try CryptoTestSupport.openssl([
                "dgst", "-sha256", "-verify", publicKeyPath, "-signature", signaturePath, dataPath,
            ])
            XCTAssertEqual(run.status, 0, run.output)
            XCTAssertTrue(run.stdout.contains("Verified OK"), run.output)

            // The same signature over different data must fail.
            try CryptoTestSupport.write("\(parts[0]).\(parts[1])x", to: dataPath)
            let tampered = try CryptoTestSupport.openssl([
                "dgst", "-sha256", "-verify", publicKeyPath, "-signature", signaturePath, dataPath,
            ])
            XCTAssertNotEqual(tampered.status, 0)
            XCTAssertFalse(tampered.stdout.contains("Verified OK"), tampered.output)
        }
    }

    func testOpenSSLSignatureOfTokenInputVerifiesWithFanout() throws {
        // The reverse direction: OpenSSL signs with the key Fanout wrote, Fanout's public key checks it.
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let key = try ES256PrivateKey.generate()
        let keyPath = directory + "/key.p8"
        let dataPath = directory + "/data.txt"
        let signaturePath = directory + "/sig.der"
        try CryptoTestSupport.write(key.pemPKCS8(), to: keyPath)
        try CryptoTestSupport.write("header.claims", to: dataPath)
        let run = try CryptoTestSupport.openssl(["dgst", "-sha256", "-sign", keyPath, "-out", signaturePath, dataPath])
        XCTAssertEqual(run.status, 0, run.output)
        let der = [UInt8](try Data(contentsOf: URL(fileURLWithPath: signaturePath)))
        let raw = try XCTUnwrap(ECDSASignature.rawFromDER(der))
        XCTAssertTrue(key.publicKey.isValidSignature(raw, for: Array("header.claims".utf8)))
    }

    func testSignaturesAreRandomizedButAllVerify() throws {
        let key = try ES256PrivateKey.generate()
        let first = try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: 1)
        let second = try makeProviderToken(key: key, keyID: keyID, teamID: teamID, issuedAt: 1)
        XCTAssertNotEqual(first, second)
        let verifier = ProviderTokenVerifier(publicKey: key.publicKey)
        XCTAssertTrue(verifier.verify(first, now: 1).isValid)
        XCTAssertTrue(verifier.verify(second, now: 1).isValid)
    }

    func testKeyAndTeamIDsAreJSONEscaped() throws {
        let key = try ES256PrivateKey.generate()
        let token = try makeProviderToken(key: key, keyID: "k\"e\\y\n", teamID: "tëam", issuedAt: 5)
        let header = try XCTUnwrap(CryptoTestSupport.base64URLDecode(token.split(separator: ".")[0]))
        let object = try JSONSerialization.jsonObject(with: Data(header)) as? [String: String]
        XCTAssertEqual(object?["kid"], "k\"e\\y\n")
        XCTAssertEqual(
            ProviderTokenVerifier(publicKey: key.publicKey).verify(token, now: 5),
            .valid(ProviderTokenClaims(keyID: "k\"e\\y\n", teamID: "tëam", issuedAt: 5)))
    }

    func testRejectsEmptyIDs() throws {
        let key = try ES256PrivateKey.generate()
        XCTAssertThrowsError(try ProviderTokenSigner(key: key, keyID: "", teamID: teamID)) { error in
            XCTAssertEqual((error as! CryptoError).kind, .invalidArgument)
        }
        XCTAssertThrowsError(try makeProviderToken(key: key, keyID: keyID, teamID: "", issuedAt: 0)) { error in
            XCTAssertEqual((error as! CryptoError).kind, .invalidArgument)
        }
    }
}
