import Foundation
import XCTest

/// A valid 64-hex-digit device token, different for each `index`.
func testDeviceToken(_ index: Int = 0) -> String {
    let hex = String(index, radix: 16)
    return "f" + String(repeating: "0", count: 63 - hex.count) + hex
}

extension XCTestCase {
    /// A fresh empty directory, removed when the test tears down.
    func temporaryDirectory(_ label: String) throws -> String {
        let path = (NSTemporaryDirectory() as NSString).appendingPathComponent("fanout-\(label)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        addTeardownBlock { try? FileManager.default.removeItem(atPath: path) }
        return path
    }
}
