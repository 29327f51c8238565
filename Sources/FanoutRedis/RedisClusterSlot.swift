/// Redis Cluster's key space: 16,384 hash slots, a key's slot being CRC16 (XMODEM) of the key, or of its hash tag,
/// modulo 16384 (the Redis Cluster specification, "Keys distribution model").
package enum RedisClusterSlot {
    package static let count = 16384

    /// The slot of `key`: when the key holds a `{`, then a `}` after it with at least one byte between them, only those
    /// bytes (the hash tag) are hashed, so `{user1000}.following` and `{user1000}.followers` share a slot; otherwise
    /// the whole key. `slot("123456789") == 12739` (CRC16 0x31C3, the specification's test vector).
    package static func slot<Key: Collection<UInt8>>(of key: Key) -> Int {
        if let open = key.firstIndex(of: UInt8(ascii: "{")) {
            let afterOpen = key.index(after: open)
            if let close = key[afterOpen...].firstIndex(of: UInt8(ascii: "}")), close != afterOpen {
                return Int(crc16(key[afterOpen..<close]) & 0x3FFF)
            }
        }
        return Int(crc16(key) & 0x3FFF)
    }

    /// CRC16-CCITT as XMODEM computes it: polynomial 0x1021, initial value 0, no reflection, no final XOR.
    package static func crc16<Bytes: Sequence<UInt8>>(_ bytes: Bytes) -> UInt16 {
        var crc: UInt16 = 0
        for byte in bytes {
            crc = (crc << 8) ^ table[Int(UInt8(truncatingIfNeeded: crc >> 8) ^ byte)]
        }
        return crc
    }

    private static let table: [UInt16] = (0..<256).map { index in
        var crc = UInt16(index) << 8
        for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
        return crc
    }
}

/// Where a command goes in a cluster, from its name and arguments.
enum RedisClusterRoute: Equatable {
    /// To the primary serving this slot (the slot of the command's first key).
    case slot(Int)
    /// To any primary: the command reads or writes no key (PING, TIME, INFO, EVAL with no keys, MULTI, EXEC).
    case anyNode
    /// To every primary: it changes server state every node must share (SCRIPT LOAD, SCRIPT FLUSH, FLUSHALL, FLUSHDB,
    /// FUNCTION LOAD/DELETE/FLUSH/RESTORE). The call's reply is the first error among the nodes', else the first node's.
    case everyPrimary

    /// How the key of `command` is found: at index 1 for most commands; after `numkeys` for EVAL, EVALSHA, FCALL and
    /// the `numkeys` family; after `STREAMS` for XREAD and XREADGROUP; after the subcommand for XGROUP, XINFO, OBJECT
    /// and MEMORY USAGE. A multi-key command is routed by its first key (Redis answers `CROSSSLOT` when the others are
    /// in other slots).
    init(_ command: [RedisArgument]) {
        guard let first = command.first else {
            self = .anyNode
            return
        }
        let name = Self.upper(first.bytes)
        func key(at index: Int) -> RedisClusterRoute {
            index < command.count ? .slot(RedisClusterSlot.slot(of: command[index].bytes)) : .anyNode
        }
        func keyAfterCount(at index: Int) -> RedisClusterRoute {
            guard index < command.count, let count = Int(String(decoding: command[index].bytes, as: UTF8.self)),
                count > 0
            else { return .anyNode }
            return key(at: index + 1)
        }
        switch name {
        case "SCRIPT", "FUNCTION":
            let sub = command.count > 1 ? Self.upper(command[1].bytes) : ""
            let everywhere = name == "SCRIPT" ? ["LOAD", "FLUSH"] : ["LOAD", "DELETE", "FLUSH", "RESTORE"]
            self = everywhere.contains(sub) ? .everyPrimary : .anyNode
        case "FLUSHALL", "FLUSHDB":
            self = .everyPrimary
        case "PING", "ECHO", "TIME", "INFO", "CLUSTER", "CLIENT", "CONFIG", "DBSIZE", "COMMAND", "HELLO", "ROLE",
            "LASTSAVE", "SAVE", "BGSAVE", "BGREWRITEAOF", "SLOWLOG", "LATENCY", "DEBUG", "WAIT", "WAITAOF", "PUBLISH",
            "SPUBLISH", "RANDOMKEY", "KEYS", "SCAN", "MULTI", "EXEC", "DISCARD", "UNWATCH", "ACL", "MODULE", "AUTH",
            "SELECT", "ASKING", "READONLY", "READWRITE", "QUIT", "RESET", "LOLWUT", "SWAPDB", "MONITOR", "SHUTDOWN":
            self = .anyNode
        case "MEMORY":
            self = command.count > 2 && Self.upper(command[1].bytes) == "USAGE" ? key(at: 2) : .anyNode
        case "XGROUP", "XINFO", "OBJECT":
            self = key(at: 2)
        case "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO":
            self = keyAfterCount(at: 2)
        case "ZUNION", "ZINTER", "ZDIFF", "ZINTERCARD", "SINTERCARD", "LMPOP", "ZMPOP":
            self = keyAfterCount(at: 1)
        case "BLMPOP", "BZMPOP":
            self = keyAfterCount(at: 2)
        case "XREAD", "XREADGROUP":
            let streams = command.indices.dropFirst().first { Self.upper(command[$0].bytes) == "STREAMS" }
            self = streams.map { key(at: $0 + 1) } ?? .anyNode
        case "MIGRATE":
            // MIGRATE host port key|"" db timeout [...] [KEYS key...]
            if command.count > 3, !command[3].bytes.isEmpty {
                self = key(at: 3)
            } else {
                let keys = command.indices.dropFirst(6).first { Self.upper(command[$0].bytes) == "KEYS" }
                self = keys.map { key(at: $0 + 1) } ?? .anyNode
            }
        default:
            self = key(at: 1)
        }
    }

    /// ASCII upper case of a command word (at most 32 bytes read: no command name is longer).
    static func upper(_ bytes: [UInt8]) -> String {
        String(decoding: bytes.prefix(32).map { $0 >= 97 && $0 <= 122 ? $0 - 32 : $0 }, as: UTF8.self)
    }
}
