/// One argument of a Redis command: bytes, sent with their explicit length (`redisAsyncCommandArgv`), so any byte,
/// NUL included, goes through unchanged. Strings are sent as their UTF-8 bytes, integers in decimal.
package struct RedisArgument: Sendable, Hashable, ExpressibleByStringInterpolation, ExpressibleByIntegerLiteral {
    package var bytes: [UInt8]

    package init(bytes: [UInt8]) { self.bytes = bytes }
    package init(_ string: String) { bytes = Array(string.utf8) }
    package init(_ integer: Int) { bytes = Array(String(integer).utf8) }
    package init(stringLiteral value: String) { self.init(value) }
    package init(integerLiteral value: Int) { self.init(value) }
}

/// One reply (RESP2, what hiredis 0.14 reads), copied out of hiredis's `redisReply` tree.
package enum RedisValue: Sendable, Hashable {
    /// `$-1` or `*-1`: no value (GET of a missing key, BLPOP that timed out on the server).
    case null
    /// `:n`.
    case integer(Int64)
    /// `$n` bulk string: bytes, binary-safe.
    case bytes([UInt8])
    /// `+OK`: a status line.
    case status(String)
    /// `-ERR ...`: an error reply, kept as a value by `RedisClient.commands` (thrown as `RedisError.server` by
    /// `command`).
    case error(String)
    /// `*n`: nested replies.
    case array([RedisValue])

    /// A bulk string or status as text (UTF-8, invalid bytes replaced); nil for other replies.
    package var string: String? {
        switch self {
        case .bytes(let bytes): String(decoding: bytes, as: UTF8.self)
        case .status(let status): status
        default: nil
        }
    }

    /// An integer reply, or a bulk string holding a decimal integer (GET of a counter); nil otherwise.
    package var integer: Int64? {
        switch self {
        case .integer(let value): value
        case .bytes(let bytes): Int64(String(decoding: bytes, as: UTF8.self))
        default: nil
        }
    }

    /// The elements of an array reply; nil otherwise.
    package var array: [RedisValue]? {
        if case .array(let elements) = self { return elements }
        return nil
    }

    /// True for the `+OK` status.
    package var isOK: Bool { self == .status("OK") }
}
