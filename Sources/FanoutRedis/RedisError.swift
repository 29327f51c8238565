/// A failure of a Redis command or of the client: what failed, and a message for people. Messages never carry a
/// password (neither the URL's nor an AUTH argument) nor any command's arguments: a command is named by its first
/// word only.
package struct RedisError: Error, Sendable, CustomStringConvertible, Equatable {
    /// What failed. A struct over a string so that kinds can be added without breaking callers.
    package struct Kind: Hashable, Sendable, CustomStringConvertible {
        let name: String
        package var description: String { name }

        /// The URL could not be parsed (the message names the part, never the password).
        package static let invalidURL = Kind(name: "invalid-url")
        /// The URL or the call asks for something this client cannot do: `rediss://` (TLS), because Debian's hiredis
        /// 0.14 has no `hiredis_ssl`; on a cluster, a batch holding a `MULTI` without its `EXEC` or `DISCARD`.
        package static let unsupported = Kind(name: "unsupported")
        /// The command was not answered within its deadline; the connection it was sent on has been dropped (a
        /// late answer could otherwise be taken for the next command's), and the client reconnects. The command
        /// may have run.
        package static let timeout = Kind(name: "timeout")
        /// No connection to the server could be made (and authenticated) before the command's deadline: it was
        /// never sent. The message carries the last connection error.
        package static let unavailable = Kind(name: "unavailable")
        /// The connection broke while the command was in flight: it may have run. The client reconnects.
        package static let connectionLost = Kind(name: "connection-lost")
        /// AUTH (or SELECT) was refused after connecting: commands waiting for that connection fail with this at
        /// once rather than at their deadline. The client keeps reconnecting with backoff.
        package static let authenticationFailed = Kind(name: "authentication-failed")
        /// The server answered with an error reply (`-ERR ...`, `-WRONGTYPE ...`, `-NOSCRIPT ...`); thrown by
        /// `command` and `evalScript`, while `commands` keeps error replies as `.error` values in place.
        package static let server = Kind(name: "server")
        /// `shutdown()` was called: the command was refused, or failed while waiting or in flight.
        package static let shutdown = Kind(name: "shutdown")
        /// On a Redis Cluster, a batch holds a transaction (`MULTI` ... `EXEC`) whose keys are in more than one slot:
        /// refused before anything is sent (Redis would refuse its EXEC with `CROSSSLOT`). A multi-key command on
        /// keys of several slots is answered by Redis itself with a `CROSSSLOT` error reply (`.server`).
        package static let crossSlot = Kind(name: "cross-slot")
        /// hiredis refused the command or the reply could not be read (out of memory, protocol error).
        package static let clientError = Kind(name: "client-error")
    }

    package let kind: Kind
    package let message: String

    package init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    /// An error reply from the server, thrown as an error (`message` is the reply's text, e.g. "ERR unknown command").
    package static func server(_ message: String) -> RedisError { RedisError(.server, message) }

    package var description: String { message }
}
