import FanoutCore
import Foundation

/// `--record FILE`: one line `token apns-id` per accepted notification, appended. Lines are buffered
/// and written at least once a second and on exit.
final class MockRecord: Sendable {
    private struct State {
        var buffer: [UInt8] = []
        var handle: FileHandle?
    }
    private let state: FanoutMutex<State>

    init(path: String) throws {
        guard
            FileManager.default.fileExists(atPath: path) || FileManager.default.createFile(atPath: path, contents: nil)
        else {
            throw MockStartError("cannot create --record file \(path)")
        }
        guard let handle = FileHandle(forWritingAtPath: path) else {
            throw MockStartError("cannot open --record file \(path) for writing")
        }
        _ = try? handle.seekToEnd()  // throwing, not trapping: a pipe (`--record /dev/stdout`) cannot seek
        state = FanoutMutex(State(handle: handle))
    }

    func append(token: String, apnsID: String) {
        let shouldFlush = state.withLock { state -> Bool in
            state.buffer.append(contentsOf: token.utf8)
            state.buffer.append(UInt8(ascii: " "))
            state.buffer.append(contentsOf: apnsID.utf8)
            state.buffer.append(UInt8(ascii: "\n"))
            return state.buffer.count >= 1 << 20
        }
        if shouldFlush { flush() }
    }

    func flush() {
        state.withLock { state in
            guard !state.buffer.isEmpty else { return }
            // Throwing, not trapping as write(_:) does (a full disk, a reader gone): the lines are dropped.
            _ = try? state.handle?.write(contentsOf: state.buffer)
            state.buffer.removeAll(keepingCapacity: true)
        }
    }
}

/// mock-apns could not start: a message for the operator.
package struct MockStartError: Error, CustomStringConvertible {
    package let description: String
    init(_ description: String) { self.description = description }
}
