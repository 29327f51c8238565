import FanoutRegistry
import FanoutSQLite

/// A dispatch-store failure: a kind callers act on and a one-line message.
///
/// Messages name the file and SQLite's reason, never a job line's contents (SQLite's messages do not quote bound
/// values, and this store never puts job lines into SQL text).
package struct DispatchStoreError: Error, CustomStringConvertible, Sendable, Equatable {
    /// A struct with static members, like `RegistryError.Kind`, so new kinds do not break callers.
    package struct Kind: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        package var description: String { name }

        /// No dispatch with that id (`markRunning`, `markDone`, `appendResults`).
        package static let notFound = Kind("not found")
        /// Another connection held the write lock past the busy timeout.
        package static let busy = Kind("busy")
        /// The file is damaged.
        package static let corrupt = Kind("corrupt")
        /// The file is not a Fanout registry (the dispatch tables live in the registry's file).
        package static let notARegistry = Kind("not a Fanout registry")
        /// The dispatch tables were made by a newer Fanout.
        package static let unsupportedVersion = Kind("unsupported version")
        /// The file cannot be opened, or the store was closed.
        package static let unavailable = Kind("unavailable")
        /// Any other storage failure.
        package static let storage = Kind("storage")
        /// The idempotency key was taken by another request; the message is the dispatch id that took it.
        package static let idempotencyKeyReused = Kind("idempotency key reused")
    }

    package let kind: Kind
    package let message: String

    package init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    package var description: String { message }

    /// A storage failure as the store reports it, mapped like the registry's.
    static func map(_ error: SQLiteError, path: String) -> DispatchStoreError {
        if error.isBusy {
            return DispatchStoreError(.busy, "\(path) is locked by another process (gave up waiting): \(error.message)")
        }
        if error.isNotADatabase {
            return DispatchStoreError(.notARegistry, "\(path) is not a Fanout registry (not an SQLite database)")
        }
        if error.isCorrupt { return DispatchStoreError(.corrupt, "\(path) is corrupt: \(error.message)") }
        if error.isCannotOpen || error.isReadOnly {
            return DispatchStoreError(.unavailable, "cannot open \(path) for writing: \(error.message)")
        }
        return DispatchStoreError(.storage, "\(path): \(error)")
    }

    /// The registry's verdict on the file, when opening it to make sure the file is a registry.
    static func map(_ error: RegistryError) -> DispatchStoreError {
        let kind: Kind
        switch error.kind {
        case .notARegistry: kind = .notARegistry
        case .corrupt: kind = .corrupt
        case .unsupportedVersion: kind = .unsupportedVersion
        case .busy: kind = .busy
        case .unavailable: kind = .unavailable
        default: kind = .storage
        }
        return DispatchStoreError(kind, error.message)
    }
}
