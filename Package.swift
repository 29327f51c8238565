// swift-tools-version:6.0
// Fanout: an APNs fan-out send engine. No package dependencies: the C libraries come from the system
// (Debian: libuv1-dev, libnghttp2-dev, libssl-dev, libsqlite3-dev, libhiredis-dev) through pkg-config.
//
// docs/ARCHITECTURE.md draws the module graph (every target and edge); `make lint` checks it against this file.
import PackageDescription

/// Library targets see `import X` as an internal import, so a dependency reaches their public API only
/// when a file says `public import X` (SE-0409).
let internalImports: [SwiftSetting] = [.enableUpcomingFeature("InternalImportsByDefault")]

let package = Package(
    name: "Fanout",
    products: [
        .library(name: "Fanout", targets: ["Fanout"]),
        .executable(name: "fanout", targets: ["FanoutCLI"]),
        .executable(name: "mock-apns", targets: ["mock-apns"]),
        .executable(name: "fanout-bench", targets: ["fanout-bench"]),
        .executable(name: "make-tokens", targets: ["make-tokens"]),
    ],
    targets: [
        // C libraries, found through pkg-config (the names are the .pc files' names).
        .systemLibrary(name: "CLibUV", pkgConfig: "libuv", providers: [.apt(["libuv1-dev"]), .brew(["libuv"])]),
        .systemLibrary(
            name: "CNGHTTP2", pkgConfig: "libnghttp2", providers: [.apt(["libnghttp2-dev"]), .brew(["nghttp2"])]),
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"]), .brew(["openssl"])]),
        .systemLibrary(
            name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"]), .brew(["sqlite"])]),
        // hiredis without its pkg-config file: Debian's hiredis.pc adds -D_FILE_OFFSET_BITS=64 to Cflags, which
        // SwiftPM refuses with a warning in every build of the package. Its headers are under the default include
        // path (<hiredis/...>) and the module map links -lhiredis.
        .systemLibrary(name: "CHiredis", providers: [.apt(["libhiredis-dev"]), .brew(["hiredis"])]),
        // Function-like C macros that Swift cannot import, wrapped as functions.
        .target(name: "CFanoutShims", dependencies: ["COpenSSL"]),

        // Pure Swift: APNs model (headers, reasons, responses, payloads, JSON), the chunked line reader and the
        // package's lock (FanoutMutex). Imports no C library but libc (the line reader's open/read, the lock's
        // pthread mutex in ThreadSanitizer builds).
        .target(name: "FanoutCore", swiftSettings: internalImports),
        // Pure Swift policies: workspace rate limits (hierarchical token buckets, injectable clock). FanoutCore for its
        // lock (FanoutMutex).
        .target(name: "FanoutPolicy", dependencies: ["FanoutCore"], swiftSettings: internalImports),
        // The only production Swift that imports the C modules: loop thread, TCP, TLS, the nghttp2
        // session (client and server connections), the HTTP server (HTTP/1.1 and HTTP/2, for `fanout serve` and
        // the metrics endpoint), ES256 keys and provider tokens. Everything is `package`.
        .target(
            name: "FanoutTransport",
            dependencies: ["FanoutCore", "FanoutHTTP1", "CLibUV", "CNGHTTP2", "COpenSSL", "CFanoutShims"],
            swiftSettings: internalImports),
        // The HTTP/1.1 request-head parser and chunked-body decoder. Pure Swift with no dependency, so that
        // scripts/fuzz.sh can build it as a module.
        .target(name: "FanoutHTTP1", swiftSettings: internalImports),
        // The only Swift code that imports CSQLite: a small SQLite binding (connections, cached
        // statements, transactions, errors).
        .target(name: "FanoutSQLite", dependencies: ["CSQLite"], swiftSettings: internalImports),
        // The token registry: the store protocol, its SQLite implementation, lifecycle, change feed, import.
        .target(name: "FanoutRegistry", dependencies: ["FanoutCore", "FanoutSQLite"], swiftSettings: internalImports),
        // A Redis client (issue 14's fleet builds on it): hiredis's async API on a LoopThread, with deadlines,
        // reconnection, LOADING/READONLY retries, scripts and Redis Cluster routing. The only Swift that imports
        // CHiredis; everything `package`.
        .target(
            name: "FanoutRedis", dependencies: ["FanoutTransport", "CHiredis", "CLibUV", "COpenSSL"],
            swiftSettings: internalImports),
        // The registry's store protocol on Redis (issue 14 item 5): hash-tagged keys per activity and per app, one Lua
        // script per change, pages by cursor, the event log on a stream. No C.
        .target(
            name: "FanoutRedisRegistry", dependencies: ["FanoutRegistry", "FanoutRedis", "FanoutCore"],
            swiftSettings: internalImports),
        // The fleet's work on Redis Streams: job lines split into shards on a stream, workers in a consumer group
        // that send them with the engine and write their results to Redis, results and status read back. No C.
        .target(
            name: "FanoutFleet",
            dependencies: [
                "Fanout", "FanoutCore", "FanoutJobFormat", "FanoutJobLines", "FanoutRedis", "FanoutTransport",
            ], swiftSettings: internalImports),
        // Flag parsing shared by the binaries.
        .target(name: "CommandLineSupport", swiftSettings: internalImports),
        // The public library API for gateway services: the engine, jobs, results, errors.
        .target(
            name: "Fanout", dependencies: ["FanoutCore", "FanoutPolicy", "FanoutRegistry", "FanoutTransport"],
            swiftSettings: internalImports),
        // Job files: the line reader and the line parser, which make plain `ParsedJob`s. Pure Swift, so that
        // scripts/fuzz.sh can build it as a module without the transport.
        .target(name: "FanoutJobFormat", dependencies: ["FanoutCore"], swiftSettings: internalImports),
        // Job lines bound to the engine: a `ParsedJob` as the engine's `FanoutJob`, a `NotificationResult` as a results
        // line. Shared by `fanout send`'s driver, the fleet and the service.
        .target(
            name: "FanoutJobLines", dependencies: ["Fanout", "FanoutCore", "FanoutJobFormat"],
            swiftSettings: internalImports),
        // `fanout send`'s driver (the run, results file, journal, resume, progress).
        .target(
            name: "FanoutJobFile",
            dependencies: [
                "Fanout", "FanoutCore", "FanoutPolicy", "FanoutJobFormat", "FanoutJobLines", "FanoutTransport",
                "CommandLineSupport",
            ], swiftSettings: internalImports),
        // Running a Fanout process: structured logs with redaction, the Prometheus endpoint.
        .target(
            name: "FanoutObservability", dependencies: ["Fanout", "FanoutTransport", "CommandLineSupport"],
            swiftSettings: internalImports),
        // `fanout serve`: the HTTP service (native, Pushwoosh- and Braze-shaped APIs), its configuration, keys, rate
        // limits, the durable dispatch queue and the status page.
        .target(
            name: "FanoutService",
            dependencies: [
                "Fanout", "FanoutCore", "FanoutPolicy", "FanoutRegistry", "FanoutSQLite", "FanoutTransport",
                "FanoutJobFormat", "FanoutJobLines", "FanoutObservability", "FanoutRedis", "FanoutFleet",
                "FanoutRedisRegistry",
            ], swiftSettings: internalImports),
        // The `fanout` command (binary name from the product).
        .executableTarget(
            name: "FanoutCLI",
            dependencies: [
                "Fanout", "FanoutCore", "FanoutPolicy", "FanoutJobFile", "FanoutObservability", "FanoutService",
                "FanoutFleet", "FanoutRedis", "FanoutRedisRegistry", "CommandLineSupport",
            ]),

        // Test-only transport: the HTTP/2 server, the test certificate authority, the JWT verifier.
        // Only mock-apns, the benchmarks and the tests depend on it.
        .target(
            name: "FanoutTestSupport",
            dependencies: ["FanoutCore", "FanoutTransport", "CLibUV", "COpenSSL", "CFanoutShims"],
            path: "Tools/FanoutTestSupport", swiftSettings: internalImports),
        // mock-apns's request validator: APNs's rules for a device push. Pure Swift (FanoutCore only), so that
        // scripts/fuzz.sh can build it as a module; its folder sits inside MockAPNsKit's, which excludes it.
        .target(
            name: "MockAPNsValidation", dependencies: ["FanoutCore"], path: "Tools/MockAPNsKit/Validation",
            swiftSettings: internalImports),
        // mock-apns: an APNs look-alike (request validation, JWT checks, fault injection, stats).
        .target(
            name: "MockAPNsKit",
            dependencies: ["FanoutCore", "FanoutTransport", "FanoutTestSupport", "MockAPNsValidation"],
            path: "Tools/MockAPNsKit", exclude: ["Validation"], swiftSettings: internalImports),
        .executableTarget(
            name: "mock-apns", dependencies: ["MockAPNsKit", "CommandLineSupport"], path: "Tools/mock-apns"),

        // make-tokens: device-token files of any size for examples, tests and benchmarks.
        .executableTarget(
            name: "make-tokens", dependencies: ["FanoutCore", "CommandLineSupport"], path: "Tools/make-tokens"),

        // registry-import-probe: imports a registrations file into a registry (the kill -9 test's victim, and a
        // timing of the import rate).
        .executableTarget(
            name: "registry-import-probe", dependencies: ["FanoutRegistry", "FanoutCore", "CommandLineSupport"],
            path: "Tools/registry-import-probe"),

        // fanout-bench: the benchmark suite.
        .executableTarget(
            name: "fanout-bench",
            dependencies: [
                "Fanout", "FanoutCore", "FanoutPolicy", "FanoutRegistry", "FanoutTransport", "FanoutTestSupport",
                "FanoutRedis", "CommandLineSupport",
            ],
            path: "Benchmarks/fanout-bench"),

        // alloc-probe: heap allocations per notification in steady state on throughput-1c's path, counted by
        // CAllocationCounter, a counting malloc/free that only this executable links (it interposes the allocator
        // on its whole process). The allocation test runs it against Tests/AllocationThresholds.
        .target(name: "CAllocationCounter", path: "Benchmarks/CAllocationCounter"),
        .executableTarget(
            name: "alloc-probe", dependencies: ["Fanout", "CAllocationCounter"], path: "Benchmarks/alloc-probe"),

        .testTarget(name: "FanoutCoreTests", dependencies: ["FanoutCore"]),
        .testTarget(name: "FanoutTests", dependencies: ["Fanout"]),
        .testTarget(name: "FanoutSQLiteTests", dependencies: ["FanoutSQLite"]),
        .testTarget(
            name: "FanoutJobFormatTests",
            dependencies: ["FanoutJobFormat", "FanoutJobLines", "FanoutJobFile", "Fanout", "FanoutCore"]),
        .testTarget(name: "FanoutJobLinesTests", dependencies: ["FanoutJobLines", "Fanout", "FanoutCore"]),
        .testTarget(name: "FanoutJobFileTests", dependencies: ["FanoutJobFile", "FanoutJobLines", "Fanout"]),
        .testTarget(name: "FanoutObservabilityTests", dependencies: ["FanoutObservability", "Fanout"]),
        .testTarget(name: "FanoutFleetTests", dependencies: ["FanoutFleet"]),
        .testTarget(name: "FanoutPolicyTests", dependencies: ["FanoutPolicy"]),
        .testTarget(
            name: "FanoutRegistryTests",
            dependencies: [
                "FanoutRegistry", "FanoutSQLite", "FanoutCore", "FanoutRedis", "FanoutRedisRegistry",
                "FanoutTestSupport",
            ]),
        .testTarget(
            name: "FanoutTransportTests",
            dependencies: ["FanoutTransport", "FanoutCore", "FanoutHTTP1", "FanoutTestSupport"]),
        .testTarget(
            name: "FanoutServiceTests",
            dependencies: [
                "FanoutService", "Fanout", "FanoutCore", "FanoutRegistry", "FanoutTransport", "FanoutJobLines",
                "FanoutObservability", "FanoutTestSupport", "MockAPNsKit", "FanoutRedis", "FanoutRedisRegistry",
            ]),
        .testTarget(name: "FanoutRedisTests", dependencies: ["FanoutRedis", "FanoutTestSupport"]),
        .testTarget(name: "MockAPNsKitTests", dependencies: ["MockAPNsKit", "FanoutCore"]),
        .testTarget(
            name: "FanoutIntegrationTests",
            dependencies: [
                "Fanout", "FanoutCore", "FanoutPolicy", "FanoutTransport", "FanoutJobFile", "FanoutJobLines",
                "FanoutObservability",
                "FanoutTestSupport", "MockAPNsKit", "FanoutRedis", "FanoutFleet", "FanoutRegistry",
                "FanoutRedisRegistry", "FanoutSQLite",
            ]),
    ]
)
