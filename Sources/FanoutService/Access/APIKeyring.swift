import FanoutTransport

/// What a key may do. A server key does everything; a device key only registers devices and tokens.
package enum APIKeyKind: Sendable, Hashable {
    case server
    case device
}

/// Who is calling: the workspace a key belongs to and its kind.
package struct Caller: Sendable, Hashable {
    package var workspace: String
    package var kind: APIKeyKind
}

/// Finds the workspace of an API key from the SHA-256 digests in the configuration. The key itself is never kept:
/// it is hashed on arrival and compared against every digest in constant time (no early exit on a match, so the
/// time does not say which workspace or how many keys there are).
package struct APIKeyring: Sendable {
    private var entries: [(digest: [UInt8], caller: Caller)] = []

    package init(_ configuration: ServiceConfiguration) {
        for workspace in configuration.workspaces.values.sorted(by: { $0.name < $1.name }) {
            for digest in workspace.serverKeyDigests {
                entries.append((digest, Caller(workspace: workspace.name, kind: .server)))
            }
            for digest in workspace.deviceKeyDigests {
                entries.append((digest, Caller(workspace: workspace.name, kind: .device)))
            }
        }
    }

    /// The caller a presented key stands for, or nil.
    package func caller(forKey key: String) -> Caller? {
        guard !key.isEmpty, key.utf8.count <= 512 else { return nil }
        let digest = SHA256Digest.hash(Array(key.utf8))
        var found: Caller?
        for entry in entries where SHA256Digest.constantTimeEquals(entry.digest, digest) {
            found = found ?? entry.caller
        }
        return found
    }
}
