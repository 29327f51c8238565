/// Why the registry refused a request or could not be used.
///
/// A struct over a kind with static members (new kinds do not break callers), the field at fault for bad input, and a
/// one-line message a command can print as is.
public struct RegistryError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Kind: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        public var description: String { name }

        /// A registration or change is malformed (bad token, activity id too long, unknown app, ...): `field` names
        /// it, and nothing was written.
        public static let invalidInput = Kind("invalid input")
        /// The file is an SQLite database of something else, or not a database at all.
        public static let notARegistry = Kind("not a Fanout registry")
        /// The file is a registry but damaged.
        public static let corrupt = Kind("corrupt")
        /// The file was made by a newer Fanout (its schema version is unknown to this one).
        public static let unsupportedVersion = Kind("unsupported version")
        /// Another process held the lock longer than the busy timeout.
        public static let busy = Kind("busy")
        /// The file cannot be opened or written (missing directory, permissions, read-only).
        public static let unavailable = Kind("unavailable")
        /// An import file cannot be opened or read.
        public static let unreadableInput = Kind("unreadable input")
        /// Any other storage failure.
        public static let storage = Kind("storage")
    }

    public let kind: Kind
    /// The field at fault for `invalidInput`, spelled as import lines and the command line spell it (`token`,
    /// `activity_id`, `app`, ...).
    public let field: String?
    /// What is wrong, in one line.
    public let message: String

    public init(_ kind: Kind, field: String? = nil, _ message: String) {
        self.kind = kind
        self.field = field
        self.message = message
    }

    package static func invalid(_ field: String, _ message: String) -> RegistryError {
        RegistryError(.invalidInput, field: field, message)
    }

    /// `token: must be 64 to 200 hex digits` for bad input; the message alone otherwise.
    public var description: String {
        if let field { return "\(field): \(message)" }
        return message
    }
}
