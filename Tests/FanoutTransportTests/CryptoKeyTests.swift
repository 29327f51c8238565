import FanoutTestSupport
import Foundation
import XCTest

@testable import FanoutTransport

final class CryptoKeyTests: XCTestCase {
    func testGeneratedKeyRoundTripsThroughPKCS8PEM() throws {
        let key = try ES256PrivateKey.generate()
        let pem = key.pemPKCS8()
        XCTAssertTrue(pem.hasPrefix("-----BEGIN PRIVATE " + "KEY-----\n"))
        XCTAssertTrue(pem.hasSuffix("-----END PRIVATE KEY-----\n"))
        let reloaded = try ES256PrivateKey(pem: pem)
        XCTAssertEqual(reloaded.publicKey, key.publicKey)
        XCTAssertEqual(reloaded.pemPKCS8(), pem)
        XCTAssertNotEqual(try ES256PrivateKey.generate().publicKey, key.publicKey)
    }

    func testPublicKeyPEMRoundTripsAndIsP256ForOpenSSL() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let key = try ES256PrivateKey.generate()
        let pem = key.publicKey.pem()
        XCTAssertTrue(pem.hasPrefix("-----BEGIN PUBLIC KEY-----\n"))
        XCTAssertEqual(try ES256PublicKey(pem: pem), key.publicKey)
        XCTAssertEqual(try ES256PublicKey(pemData: Data(pem.utf8)), key.publicKey)

        let path = directory + "/pub.pem"
        try CryptoTestSupport.write(pem, to: path)
        let run = try CryptoTestSupport.openssl(["pkey", "-pubin", "-in", path, "-noout", "-text"])
        XCTAssertEqual(run.status, 0, run.output)
        XCTAssertTrue(run.stdout.contains("prime256v1") || run.stdout.contains("P-256"), run.stdout)
    }

    func testLoadsP8FileWrittenByOpenSSLAndDerivesPublicKey() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let p8 = directory + "/AuthKey_ABC123DEFG.p8"
        let generate = try CryptoTestSupport.openssl([
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", p8,
        ])
        XCTAssertEqual(generate.status, 0, generate.output)
        let pub = directory + "/pub.pem"
        let export = try CryptoTestSupport.openssl(["pkey", "-in", p8, "-pubout", "-out", pub])
        XCTAssertEqual(export.status, 0, export.output)

        let key = try ES256PrivateKey(pemFilePath: p8)
        let fromPublicPEM = try ES256PublicKey(pemFilePath: pub)
        let fromP8 = try ES256PublicKey(pemFilePath: p8)  // mock-apns --auth-key accepts a .p8 too
        XCTAssertEqual(key.publicKey, fromPublicPEM)
        XCTAssertEqual(fromP8, fromPublicPEM)
        XCTAssertEqual(try ES256PrivateKey(pemData: Data(contentsOf: URL(fileURLWithPath: p8))).publicKey, fromP8)
    }

    func testAcceptsSEC1ECPrivateKeyPEM() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let path = directory + "/sec1.pem"
        let run = try CryptoTestSupport.openssl(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", path])
        XCTAssertEqual(run.status, 0, run.output)
        XCTAssertTrue(try CryptoTestSupport.read(path).hasPrefix("-----BEGIN EC PRIVATE " + "KEY-----"))
        XCTAssertNoThrow(try ES256PrivateKey(pemFilePath: path))
    }

    func testRejectsMissingFile() throws {
        let path = try CryptoTestSupport.temporaryDirectory(for: self) + "/missing/AuthKey.p8"
        XCTAssertThrowsError(try ES256PrivateKey(pemFilePath: path)) { error in
            let error = error as! CryptoError
            XCTAssertEqual(error.kind, .fileNotFound)
            XCTAssertEqual(error.path, path)
            XCTAssertTrue(error.message.contains(path), error.message)
        }
        XCTAssertThrowsError(try ES256PublicKey(pemFilePath: path)) { error in
            XCTAssertEqual((error as! CryptoError).kind, .fileNotFound)
            XCTAssertTrue((error as! CryptoError).message.contains(path))
        }
    }

    func testRejectsDirectoryAsKeyFile() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        XCTAssertThrowsError(try ES256PrivateKey(pemFilePath: directory)) { error in
            XCTAssertEqual((error as! CryptoError).kind, .fileUnreadable)
            XCTAssertTrue((error as! CryptoError).message.contains(directory))
        }
    }

    func testRejectsGarbageFiles() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let cases: [(String, String)] = [
            ("garbage.p8", "SECRETGARBAGE this is not a key at all SECRETGARBAGE\n"),
            (
                "bad-body.p8",
                "-----BEGIN PRIVATE " + "KEY-----\n"
                    + "SECRETGARBAGEc2VjcmV0IGdhcmJhZ2Ugd2l0aGluIGEgUEVNIGZyYW1l\n-----END PRIVATE KEY-----\n"
            ),
            ("empty.p8", ""),
        ]
        for (name, contents) in cases {
            let path = directory + "/" + name
            try CryptoTestSupport.write(contents, to: path)
            XCTAssertThrowsError(try ES256PrivateKey(pemFilePath: path), name) { error in
                let error = error as! CryptoError
                XCTAssertEqual(error.kind, .malformedKey, "\(name): \(error)")
                XCTAssertTrue(error.message.contains(path), error.message)
                XCTAssertFalse(error.message.contains("SECRETGARBAGE"), error.message)
                XCTAssertFalse(error.message.contains("c2VjcmV0"), error.message)
            }
            XCTAssertThrowsError(try ES256PublicKey(pemFilePath: path), name) { error in
                let error = error as! CryptoError
                XCTAssertEqual(error.kind, .malformedKey, "\(name): \(error)")
                XCTAssertTrue(error.message.contains(path), error.message)
                XCTAssertFalse(error.message.contains("SECRETGARBAGE"), error.message)
            }
        }
        // Random binary bytes as well.
        let binary = directory + "/binary.p8"
        try CryptoTestSupport.write((0..<512).map { _ in UInt8.random(in: 0...255) }, to: binary)
        XCTAssertThrowsError(try ES256PrivateKey(pemFilePath: binary)) { error in
            XCTAssertEqual((error as! CryptoError).kind, .malformedKey)
        }
    }

    func testRejectsRSAKeyWithoutLeakingIt() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let path = directory + "/rsa.p8"
        let run = try CryptoTestSupport.openssl([
            "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", path,
        ])
        XCTAssertEqual(run.status, 0, run.output)
        let pem = try CryptoTestSupport.read(path)
        XCTAssertTrue(pem.hasPrefix("-----BEGIN PRIVATE " + "KEY-----"))

        XCTAssertThrowsError(try ES256PrivateKey(pemFilePath: path)) { error in
            let error = error as! CryptoError
            XCTAssertEqual(error.kind, .unsupportedKey)
            XCTAssertTrue(error.message.contains(path), error.message)
            XCTAssertTrue(error.message.contains("RSA"), error.message)
            XCTAssertTrue(error.message.contains("P-256"), error.message)
            CryptoTestSupport.assertNoKeyMaterial(error.message, from: pem)
            CryptoTestSupport.assertNoKeyMaterial(error.description, from: pem)
        }
        XCTAssertThrowsError(try ES256PrivateKey(pem: pem)) { error in
            XCTAssertEqual((error as! CryptoError).kind, .unsupportedKey)
            XCTAssertNil((error as! CryptoError).path)
            CryptoTestSupport.assertNoKeyMaterial((error as! CryptoError).message, from: pem)
        }

        // Its public key is rejected by the public-key loader too.
        let pub = directory + "/rsa.pub.pem"
        XCTAssertEqual(try CryptoTestSupport.openssl(["pkey", "-in", path, "-pubout", "-out", pub]).status, 0)
        XCTAssertThrowsError(try ES256PublicKey(pemFilePath: pub)) { error in
            XCTAssertEqual((error as! CryptoError).kind, .unsupportedKey)
            XCTAssertTrue((error as! CryptoError).message.contains(pub))
            CryptoTestSupport.assertNoKeyMaterial(
                (error as! CryptoError).message, from: try! CryptoTestSupport.read(pub))
        }
        XCTAssertThrowsError(try ES256PublicKey(pemFilePath: path)) { error in
            XCTAssertEqual((error as! CryptoError).kind, .unsupportedKey)
        }
    }

    func testRejectsOtherCurvesAndKeyTypes() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let p384 = directory + "/p384.p8"
        XCTAssertEqual(
            try CryptoTestSupport.openssl([
                "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384", "-out", p384,
            ]).status, 0)
        XCTAssertThrowsError(try ES256PrivateKey(pemFilePath: p384)) { error in
            let error = error as! CryptoError
            XCTAssertEqual(error.kind, .unsupportedKey)
            XCTAssertTrue(error.message.contains("secp384r1"), error.message)
            XCTAssertTrue(error.message.contains(p384), error.message)
        }
        let ed25519 = directory + "/ed25519.p8"
        XCTAssertEqual(try CryptoTestSupport.openssl(["genpkey", "-algorithm", "ED25519", "-out", ed25519]).status, 0)
        XCTAssertThrowsError(try ES256PrivateKey(pemFilePath: ed25519)) { error in
            XCTAssertEqual((error as! CryptoError).kind, .unsupportedKey)
        }
    }

    func testRejectsEncryptedAndPublicKeyAsPrivateKey() throws {
        let directory = try CryptoTestSupport.temporaryDirectory(for: self)
        let key = try ES256PrivateKey.generate()
        let plain = directory + "/plain.p8"
        try CryptoTestSupport.write(key.pemPKCS8(), to: plain)
        let encrypted = directory + "/encrypted.p8"
        let run = try CryptoTestSupport.openssl([
            "pkcs8", "-topk8", "-in", plain, "-out", encrypted, "-passout", "pass:secret", "-v2", "aes-256-cbc",
        ])
        XCTAssertEqual(run.status, 0, run.output)
        XCTAssertThrowsError(try ES256PrivateKey(pemFilePath: encrypted)) { error in
            XCTAssertEqual((error as! CryptoError).kind, .unsupportedKey)
            XCTAssertTrue((error as! CryptoError).message.contains("encrypted"))
        }

        let pub = directory + "/pub.pem"
        try CryptoTestSupport.write(key.publicKey.pem(), to: pub)
        XCTAssertThrowsError(try ES256PrivateKey(pemFilePath: pub)) { error in
            XCTAssertEqual((error as! CryptoError).kind, .malformedKey)
            XCTAssertTrue((error as! CryptoError).message.contains(pub))
        }
    }

    func testSignatureIsRawRSAndVerifies() throws {
        let key = try ES256PrivateKey.generate()
        let message = Array("hello.world".utf8)
        let signature = try key.signature(for: message)
        XCTAssertEqual(signature.count, 64)
        XCTAssertTrue(key.publicKey.isValidSignature(signature, for: message))
        XCTAssertFalse(key.publicKey.isValidSignature(signature, for: Array("hello.World".utf8)))
        var tampered = signature
        tampered[10] ^= 0x01
        XCTAssertFalse(key.publicKey.isValidSignature(tampered, for: message))
        XCTAssertFalse(key.publicKey.isValidSignature(signature.dropLast(), for: message))
        XCTAssertFalse(try ES256PrivateKey.generate().publicKey.isValidSignature(signature, for: message))
    }

    func testDERConversionRoundTrips() throws {
        let key = try ES256PrivateKey.generate()
        for index in 0..<50 {
            let raw = try key.signature(for: Array("message \(index)".utf8))
            let der = try XCTUnwrap(ECDSASignature.derFromRaw(raw))
            XCTAssertEqual(der, CryptoTestSupport.derEncodeECDSASignature(raw))
            XCTAssertEqual(ECDSASignature.rawFromDER(der), raw)
        }
        // Leading zero bytes in r and s must survive.
        let small = [UInt8](repeating: 0, count: 31) + [7] + [0, 0] + [UInt8](repeating: 0x80, count: 30)
        let der = try XCTUnwrap(ECDSASignature.derFromRaw(small))
        XCTAssertEqual(der, CryptoTestSupport.derEncodeECDSASignature(small))
        XCTAssertEqual(ECDSASignature.rawFromDER(der), small)
        XCTAssertNil(ECDSASignature.rawFromDER([0x30, 0x02, 0x05, 0x00]))
        XCTAssertNil(ECDSASignature.derFromRaw([UInt8](repeating: 1, count: 63)))
    }

    func testConcurrentSigningWithOneKey() throws {
        let key = try ES256PrivateKey.generate()
        let results = LockedArray<Bool>()
        DispatchQueue.concurrentPerform(iterations: 64) { index in
            let message = Array("message \(index)".utf8)
            let ok = (try? key.signature(for: message)).map { key.publicKey.isValidSignature($0, for: message) }
            results.append(ok ?? false)
        }
        XCTAssertEqual(results.values.count, 64)
        XCTAssertTrue(results.values.allSatisfy { $0 })
    }
}
