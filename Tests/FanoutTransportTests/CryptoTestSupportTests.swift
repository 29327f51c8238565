// Helpers shared by the Crypto*/JWT* tests (the file name follows the Crypto*Tests.swift convention of the
// crypto test files). Independent of FanoutTransport's internals on purpose: the DER encoder and base64url
// decoder here are separate implementations, so the tests check the library rather than itself.
import Foundation
import XCTest

#if canImport(Glibc)
    import Glibc
#endif

/// Output of one `/usr/bin/openssl` run.
struct OpenSSLRun {
    var status: Int32
    var stdout: String
    var stderr: String
    var output: String { stdout + stderr }
}

enum CryptoTestSupport {
    static let openSSLPath = "/usr/bin/openssl"

    /// Runs the OpenSSL command-line tool with `arguments`.
    static func openssl(_ arguments: [String]) throws -> OpenSSLRun {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: openSSLPath)
        process.arguments = arguments
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        let stderr = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return OpenSSLRun(
            status: process.terminationStatus, stdout: String(decoding: stdout, as: UTF8.self),
            stderr: String(decoding: stderr, as: UTF8.self))
    }

    /// A fresh empty directory under the system temporary directory, removed when `testCase` tears down.
    static func temporaryDirectory(for testCase: XCTestCase) throws -> String {
        let path = (NSTemporaryDirectory() as NSString).appendingPathComponent("fanout-crypto-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        testCase.addTeardownBlock { try? FileManager.default.removeItem(atPath: path) }
        return path
    }

    static func write(_ text: String, to path: String) throws {
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
    }

    static func write(_ bytes: [UInt8], to path: String) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: path))
    }

    static func read(_ path: String) throws -> String {
        String(decoding: try Data(contentsOf: URL(fileURLWithPath: path)), as: UTF8.self)
    }

    /// Permission bits of `path` (e.g. 0o600).
    static func mode(of path: String) throws -> Int {
        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        return (attributes[.posixPermissions] as? NSNumber)?.intValue ?? -1
    }

    /// Base64url (no padding) → bytes, via Foundation's base64.
    static func base64URLDecode(_ text: some StringProtocol) -> [UInt8]? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64).map { [UInt8]($0) }
    }

    /// Bytes → base64url without padding, via Foundation's base64.
    static func base64URLEncode(_ bytes: some Sequence<UInt8>) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    /// A tiny DER encoder: raw r‖s (64 bytes) → `SEQUENCE { INTEGER r, INTEGER s }`.
    static func derEncodeECDSASignature(_ raw: [UInt8]) -> [UInt8] {
        precondition(raw.count == 64)
        func integer(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
            var value = Array(bytes.drop(while: { $0 == 0 }))
            if value.isEmpty { value = [0] }
            if value[0] & 0x80 != 0 { value.insert(0, at: 0) }  // keep it positive
            return [0x02, UInt8(value.count)] + value
        }
        let body = integer(raw[0..<32]) + integer(raw[32..<64])
        return [0x30, UInt8(body.count)] + body
    }

    /// Fails if `message` contains any 16-character run of a PEM body line from `pem` (i.e. key bytes).
    static func assertNoKeyMaterial(
        _ message: String, from pem: String, file: StaticString = #filePath, line: UInt = #line
    ) {
        for bodyLine in pem.split(separator: "\n") where !bodyLine.hasPrefix("-----") && bodyLine.count >= 16 {
            var start = bodyLine.startIndex
            while let end = bodyLine.index(start, offsetBy: 16, limitedBy: bodyLine.endIndex) {
                let window = bodyLine[start..<end]
                XCTAssertFalse(
                    message.contains(window), "message leaks key material: \(message)", file: file, line: line)
                if message.contains(window) { return }
                start = bodyLine.index(start, offsetBy: 8, limitedBy: bodyLine.endIndex) ?? bodyLine.endIndex
            }
        }
    }
}

/// A lock-protected array for collecting results from concurrent closures.
final class LockedArray<Element>: @unchecked Sendable {
    private let lock = NSLock()
    private var storage: [Element] = []

    func append(_ element: Element) {
        lock.lock()
        storage.append(element)
        lock.unlock()
    }

    var values: [Element] {
        lock.lock()
        defer { lock.unlock() }
        return storage
    }
}
