import FanoutRedis
import FanoutRedisRegistry
import FanoutRegistry
import FanoutTestSupport
import Foundation
import Synchronization
import XCTest

/// A clock the test moves by hand (Unix milliseconds).
final class TestClock: Sendable {
    private let value: Atomic<Int64>

    init(_ start: Int64 = 1_764_460_800_000) {
        value = Atomic(start)
    }

    var now: Int64 { value.load(ordering: .relaxed) }

    func advance(hours: Double) {
        value.add(Int64(hours * 3_600_000), ordering: .relaxed)
    }

    func advance(milliseconds: Int64) {
        value.add(milliseconds, ordering: .relaxed)
    }

    var registryClock: RegistryClock { RegistryClock { [self] in self.now } }
}

/// A scratch directory removed after the test.
final class ScratchDirectory {
    let path: String

    init(_ name: String = #function) throws {
        let base = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent(
            "fanout-registry-\(name.filter { $0.isLetter || $0.isNumber })-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: base, withIntermediateDirectories: true)
        path = base.path
    }

    func file(_ name: String) -> String { path + "/" + name }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }
}

enum TestTokens {
    /// A distinct valid token for `index` (64 lowercase hex digits), spread over the whole key space.
    static func token(_ index: Int, salt: UInt64 = 0) -> String {
        let mixed = (UInt64(index) &+ salt &* 0x1_0000_0000) &* 0x9E37_79B9_7F4A_7C15
        return hex16(mixed) + hex16(salt) + hex16(0xfeed_face_cafe_beef) + hex16(UInt64(index))
    }

    static func hex16(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}

/// Opens a store on a fresh file with the test clock and one app (`com.acme.app`, workspace `acme`).
func makeStore(
    in directory: ScratchDirectory, clock: TestClock, apps: [String] = ["com.acme.app"],
    configure: (inout RegistryConfiguration) -> Void = { _ in }
) async throws -> SQLiteRegistryStore {
    var configuration = RegistryConfiguration()
    configuration.clock = clock.registryClock
    configure(&configuration)
    let store = try SQLiteRegistryStore(path: directory.file("registry.db"), configuration: configuration)
    try await store.defineApps(apps.map { RegistryApp(bundleID: $0, workspace: "acme") })
    return store
}

extension RegistryStore {
    /// Every live token of an activity, paging with `limit`.
    func allLiveTokens(app: String = "com.acme.app", activityID: String, limit: Int = 1000, now: Int64) async throws
        -> [UpdateTokenRecord]
    {
        var tokens: [UpdateTokenRecord] = []
        var cursor: RegistryCursor?
        repeat {
            let page = try await liveUpdateTokens(
                app: app, activityID: activityID, after: cursor, limit: limit, now: now)
            tokens += page.items
            cursor = page.next
        } while cursor != nil
        return tokens
    }

    /// Every event in the log.
    func allEvents() async throws -> [RegistryEvent] {
        var events: [RegistryEvent] = []
        var cursor: RegistryCursor?
        while true {
            let page = try await self.events(after: cursor, limit: 500)
            if page.items.isEmpty { return events }
            events += page.items
            cursor = page.next
        }
    }
}

/// Asserts that `body` throws a `RegistryError` of `kind` (and `field`, when given); returns it.
@discardableResult
func assertRegistryError<T>(
    _ kind: RegistryError.Kind, field: String? = nil, file: StaticString = #filePath, line: UInt = #line,
    _ body: () async throws -> T
) async -> RegistryError? {
    do {
        _ = try await body()
        XCTFail("expected a \(kind) error", file: file, line: line)
        return nil
    } catch let error as RegistryError {
        XCTAssertEqual(error.kind, kind, "\(error)", file: file, line: line)
        if let field { XCTAssertEqual(error.field, field, "\(error)", file: file, line: line) }
        return error
    } catch {
        XCTFail("expected a RegistryError, got \(error)", file: file, line: line)
        return nil
    }
}

// MARK: - One behaviour, two stores

/// The stores the behaviour tests (lifecycle, reads, events) run against.
enum RegistryStoreKind {
    case sqlite
    /// A `RedisRegistryStore` on a redis-server the test starts in a temporary directory on a free port.
    case redis
}

/// What the behaviour tests need of a store: the protocol, and `close()`.
protocol TestRegistryStore: RegistryStore {
    func close()
}

extension SQLiteRegistryStore: TestRegistryStore {}
extension RedisRegistryStore: TestRegistryStore {}

/// The base of the behaviour tests: `makeStore` opens the store of `storeKind`. Each test class runs on SQLite; its
/// `Redis…` subclass (RedisRegistryTests.swift) runs every one of its tests again on Redis.
class RegistryStoreTestCase: XCTestCase {
    class var storeKind: RegistryStoreKind { .sqlite }

    private var redisClients: [RedisClient] = []

    /// A store with the test clock and `apps` (workspace `acme`): on a fresh file, or on a fresh Redis server.
    func makeStore(
        in directory: ScratchDirectory, clock: TestClock, apps: [String] = ["com.acme.app"],
        configure: (inout RegistryConfiguration) -> Void = { _ in }
    ) async throws -> any TestRegistryStore {
        switch Self.storeKind {
        case .sqlite:
            return try await FanoutRegistryTests.makeStore(
                in: directory, clock: clock, apps: apps, configure: configure)
        case .redis:
            let server = try RedisServerProcess(for: self)
            var configuration = RegistryConfiguration()
            configuration.clock = clock.registryClock
            configure(&configuration)
            let client = try RedisClient(url: server.url)
            redisClients.append(client)
            let store = RedisRegistryStore(client: client, configuration: configuration)
            try await store.defineApps(apps.map { RegistryApp(bundleID: $0, workspace: "acme") })
            return store
        }
    }

    override func tearDown() async throws {
        for client in redisClients { await client.shutdown() }
        redisClients = []
        try await super.tearDown()
    }
}
