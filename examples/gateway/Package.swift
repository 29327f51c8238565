// swift-tools-version:6.0
// A gateway's own package, using the Fanout library as a dependency (see README.md).
import PackageDescription

let package = Package(
    name: "gateway",
    platforms: [.macOS(.v15)],
    dependencies: [
        // SwiftPM names a path dependency after its folder, not after its manifest's `name`: `.package(path: "../..")`
        // would be "main", "fanout" or whatever the clone's folder is called. .deps/fanout is a symlink to the
        // repository root (../../..; scripts/gateway-example.sh makes it), so the name is "fanout" in every clone,
        // as it is for `.package(url: "https://github.com/<owner>/fanout.git", ...)`.
        .package(path: ".deps/fanout")
    ],
    targets: [
        .executableTarget(name: "gateway", dependencies: [.product(name: "Fanout", package: "fanout")])
    ]
)
