// swift-tools-version:6.0
// Fanout: an APNs fan-out send engine. No package dependencies: the C libraries come from the
// system (Debian: libuv1-dev, libnghttp2-dev, libssl-dev, libsqlite3-dev) through pkg-config.
import PackageDescription

let package = Package(
    name: "Fanout",
    products: [
        .library(name: "Fanout", targets: ["Fanout"]),
        .executable(name: "fanout", targets: ["fanout"]),
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
        // Function-like C macros that Swift cannot import, wrapped as functions.
        .target(name: "CFanoutShims", dependencies: ["COpenSSL"]),

        // Pure Swift: APNs model (headers, reasons, responses, payloads, validation). Imports no C.
        .target(name: "FanoutCore"),
        // Pure Swift policies: workspace rate limits (hierarchical token buckets, injectable clock).
        .target(name: "FanoutPolicy"),
        // The only Swift code that imports the C modules: loop thread, TCP, TLS, HTTP/2, crypto (JWT,
        // test CA). Depends on FanoutCore only for shared pure-Swift helpers (base64url).
        .target(
            name: "FanoutTransport",
            dependencies: ["FanoutCore", "CLibUV", "CNGHTTP2", "COpenSSL", "CFanoutShims"]),
        // The only Swift code that imports CSQLite: a small SQLite binding (connections, cached
        // statements, transactions, errors).
        .target(name: "FanoutSQLite", dependencies: ["CSQLite"]),
        // The token registry: the store protocol, its SQLite implementation, lifecycle, change feed, import.
        .target(name: "FanoutRegistry", dependencies: ["FanoutCore", "FanoutSQLite"]),
        // Flag parsing shared by the three binaries.
        .target(name: "CommandLineSupport"),
        // Public library API for gateway services.
        .target(name: "Fanout", dependencies: ["FanoutCore", "FanoutPolicy", "FanoutTransport"]),
        // The `fanout` command.
        .executableTarget(
            name: "fanout",
            dependencies: ["Fanout", "FanoutCore", "FanoutPolicy", "FanoutTransport", "CommandLineSupport"]),

        // mock-apns: an APNs look-alike (HTTP/2 over TLS, JWT checks, fault injection).
        .target(name: "MockAPNsKit", dependencies: ["FanoutCore", "FanoutTransport"], path: "Tools/MockAPNsKit"),
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
            dependencies: ["Fanout", "FanoutCore", "FanoutPolicy", "FanoutTransport", "CommandLineSupport"],
            path: "Benchmarks/fanout-bench"),

        .testTarget(name: "FanoutCoreTests", dependencies: ["FanoutCore"]),
        .testTarget(name: "FanoutPolicyTests", dependencies: ["FanoutPolicy"]),
        .testTarget(name: "FanoutRegistryTests", dependencies: ["FanoutRegistry", "FanoutSQLite", "FanoutCore"]),
        .testTarget(name: "FanoutTransportTests", dependencies: ["FanoutTransport", "FanoutCore"]),
        .testTarget(
            name: "FanoutIntegrationTests",
            dependencies: ["Fanout", "FanoutCore", "FanoutPolicy", "FanoutTransport", "MockAPNsKit"]),
    ]
)
