/// A Fanout failure with a message for people. Messages never contain keys, provider tokens or
/// authorization headers.
public struct FanoutError: Error, Sendable, CustomStringConvertible, Equatable {
    /// What went wrong; a struct over a string so that kinds can be added later.
    public struct Kind: Hashable, Sendable, CustomStringConvertible {
        let name: String
        public var description: String { name }

        /// The notification is malformed (bad token, header rule, payload); nothing was sent.
        public static let invalidNotification = Kind(name: "invalid-notification")
        /// The signing key or its ids are missing or unusable; nothing was sent.
        public static let credentials = Kind(name: "credentials")
        /// The connection could not be made or broke.
        public static let connection = Kind(name: "connection")
        /// The client was shut down.
        public static let shutdown = Kind(name: "shutdown")
        /// Too many `send` calls were under way at once (`FanoutEngineConfiguration.maxPendingSends`); this one was
        /// refused at once and nothing was sent. Back off, or answer your own caller with a 503.
        public static let overloaded = Kind(name: "overloaded")
        /// A setting is out of its range (`FanoutEngine(configuration:)` names the field and the range); nothing was
        /// started.
        public static let configuration = Kind(name: "configuration")
    }

    public let kind: Kind
    public let message: String
    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { message }
}
