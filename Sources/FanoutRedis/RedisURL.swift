/// Where a Redis server is and how to log in: `redis://[[user]:password@]host[:port][/db]`; or where a Redis Cluster is:
/// `redis+cluster://[[user]:password@]host[:port][,host[:port]...]`.
///
/// - The port defaults to 6379 and the database to 0. An IPv6 host is written in brackets (`redis://[::1]:6379`).
/// - `user` and `password` may be percent-encoded (`%40` for `@`). With a user, the client sends `AUTH user password`
///   (Redis 6 ACLs); with only a password (`redis://:secret@host`), `AUTH password`.
/// - `redis+cluster://` says the server is a Redis Cluster: the hosts are seed nodes (any nodes of the cluster; one is
///   enough, more help when some cannot be reached). The client connects to every seed, reads the slot map
///   (`CLUSTER SLOTS`) from the first that answers, and connects to every primary (see `RedisClient`); a seed that
///   cannot be reached is retried in the background, as a single server is. The credentials apply to every node. A cluster has
///   only database 0, so a cluster URL takes no `/db`. The scheme decides, not a probe: a plain `redis://` client
///   never sends `CLUSTER` commands, so the single-server path costs nothing more.
/// - `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/MASTER[/db]` says the server is the primary
///   that Redis Sentinel watches under the name `MASTER`: the hosts are sentinels (port 26379 by default). The client
///   asks them for the primary's address (`SENTINEL get-master-addr-by-name`) before each connection, and asks again
///   when the connection is lost or the server answers `READONLY` (a failover made it a replica). The credentials and
///   database are the primary's; the sentinels are asked without credentials.
/// - `rediss://` (TLS) is refused: Debian 12's hiredis 0.14 (libhiredis-dev 0.14.1) is built without TLS, there is
///   no `hiredis_ssl` library nor `hiredis_ssl.h` header to link, so the client cannot speak TLS. Reach a TLS-only
///   Redis through a local TLS tunnel (stunnel, spiped) and point `redis://` at it.
///
/// The password never appears in `description` nor in any error: it is shown as `***`.
package struct RedisURL: Sendable, Equatable, CustomStringConvertible {
    /// The server, or a cluster's first seed node.
    package var host: String
    package var port: Int
    package var user: String?
    package var password: String?
    package var database: Int
    /// True for `redis+cluster://`: `host:port` and `otherSeeds` are seed nodes of a Redis Cluster.
    package var isCluster: Bool
    /// A cluster's seed nodes after the first (`host:port`), or the sentinels after the first; empty for a single
    /// server.
    package var otherSeeds: [RedisNodeAddress]
    /// For `redis+sentinel://`: the name the sentinels know the primary by; `host:port` and `otherSeeds` are the
    /// sentinels.
    package var sentinelMaster: String?

    /// True for `redis+sentinel://`.
    package var isSentinel: Bool { sentinelMaster != nil }

    package init(host: String, port: Int = 6379, user: String? = nil, password: String? = nil, database: Int = 0) {
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.database = database
        isCluster = false
        otherSeeds = []
        sentinelMaster = nil
    }

    /// A cluster URL: `seeds` (at least one) with the credentials every node takes.
    package init(clusterSeeds seeds: [RedisNodeAddress], user: String? = nil, password: String? = nil) {
        precondition(!seeds.isEmpty, "a cluster URL needs a seed node")
        self.init(host: seeds[0].host, port: seeds[0].port, user: user, password: password)
        isCluster = true
        otherSeeds = Array(seeds.dropFirst())
    }

    /// Every seed node, the first being `host:port`.
    package var seeds: [RedisNodeAddress] { [RedisNodeAddress(host: host, port: port)] + otherSeeds }

    /// The single-server URL of one node of this URL's cluster (same credentials, database 0).
    package func node(_ address: RedisNodeAddress) -> RedisURL {
        RedisURL(host: address.host, port: address.port, user: user, password: password)
    }

    /// The single-server URL of the primary a sentinel named (this URL's credentials and database).
    package func primary(_ address: RedisNodeAddress) -> RedisURL {
        RedisURL(host: address.host, port: address.port, user: user, password: password, database: database)
    }

    /// Parses `text`. Errors name the part that is wrong, never the password (nor the user info around it).
    package init(parsing text: String) throws(RedisError) {
        let rest: Substring
        let cluster: Bool
        let sentinel: Bool
        if text.hasPrefix("redis://") {
            rest = text.dropFirst("redis://".count)
            (cluster, sentinel) = (false, false)
        } else if text.hasPrefix("redis+cluster://") {
            rest = text.dropFirst("redis+cluster://".count)
            (cluster, sentinel) = (true, false)
        } else if text.hasPrefix("redis+sentinel://") {
            rest = text.dropFirst("redis+sentinel://".count)
            (cluster, sentinel) = (false, true)
        } else if text.hasPrefix("rediss://") {
            throw RedisError(
                .unsupported,
                "rediss:// (Redis over TLS) is not supported: Debian's hiredis 0.14 (libhiredis-dev) is built without "
                    + "TLS (no hiredis_ssl); use redis:// through a TLS tunnel such as stunnel")
        } else {
            throw RedisError(
                .invalidURL,
                "a Redis URL starts with redis:// (redis://[user:password@]host:port[/db]), redis+cluster:// "
                    + "(redis+cluster://[user:password@]host:port[,host:port...]) or redis+sentinel:// "
                    + "(redis+sentinel://[user:password@]host:port[,host:port...]/MASTER[/db])")
        }
        // The user info ends at the last '@': a password may hold '@', '/', ':' or '?' unencoded.
        var afterUserInfo = rest
        user = nil
        password = nil
        if let at = rest.lastIndex(of: "@") {
            let userInfo = rest[..<at]
            afterUserInfo = rest[rest.index(after: at)...]
            guard let colon = userInfo.firstIndex(of: ":") else {
                throw RedisError(.invalidURL, "the user info of a Redis URL is user:password or :password")
            }
            guard let decodedUser = Self.percentDecoded(userInfo[..<colon]),
                let decodedPassword = Self.percentDecoded(userInfo[userInfo.index(after: colon)...])
            else {
                throw RedisError(.invalidURL, "the user info of a Redis URL has a malformed percent escape")
            }
            user = decodedUser.isEmpty ? nil : decodedUser
            password = decodedPassword
        }
        if afterUserInfo.contains("?") || afterUserInfo.contains("#") {
            throw RedisError(
                .invalidURL, "a Redis URL takes no query nor fragment (redis://[user:password@]host:port[/db])")
        }
        let hostPort: Substring
        var path: Substring
        if let slash = afterUserInfo.firstIndex(of: "/") {
            hostPort = afterUserInfo[..<slash]
            path = afterUserInfo[afterUserInfo.index(after: slash)...]
        } else {
            hostPort = afterUserInfo
            path = ""
        }
        sentinelMaster = nil
        if sentinel {
            // /MASTER[/db]
            let parts = path.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = parts.first, !name.isEmpty, name.allSatisfy({ $0.isASCII && !$0.isWhitespace }) else {
                throw RedisError(
                    .invalidURL,
                    "a redis+sentinel:// URL names the primary after the hosts: "
                        + "redis+sentinel://host:26379[,host:port...]/MASTER[/db]")
            }
            sentinelMaster = String(name)
            path = parts.count == 2 ? parts[1] : ""
        }
        // Hosts (one, or a cluster's seeds or the sentinels separated by commas), each with an optional port.
        var addresses: [RedisNodeAddress] = []
        for piece in hostPort.split(separator: ",", omittingEmptySubsequences: false) {
            addresses.append(try Self.address(piece, defaultPort: sentinel ? 26379 : 6379))
        }
        if addresses.count > 1, !cluster, !sentinel {
            throw RedisError(
                .invalidURL,
                "a redis:// URL names one host; several seed nodes are for redis+cluster://h1:p1,h2:p2, several "
                    + "sentinels for redis+sentinel://h1:p1,h2:p2/MASTER")
        }
        host = addresses[0].host
        port = addresses[0].port
        otherSeeds = Array(addresses.dropFirst())
        isCluster = cluster
        if path.isEmpty {
            database = 0
        } else {
            guard let value = Int(path), value >= 0, path.allSatisfy(\.isASCII) else {
                throw RedisError(.invalidURL, "the database of a Redis URL must be a number >= 0, not '\(path)'")
            }
            guard value == 0 || !cluster else {
                throw RedisError(
                    .invalidURL, "a Redis Cluster has only database 0: a redis+cluster:// URL takes no /db")
            }
            database = value
        }
    }

    /// One `host[:port]` of the URL (an IPv6 host in brackets).
    private static func address(_ hostPort: Substring, defaultPort: Int) throws(RedisError) -> RedisNodeAddress {
        let host: String
        var portText: Substring? = nil
        if hostPort.hasPrefix("[") {
            guard let close = hostPort.firstIndex(of: "]") else {
                throw RedisError(.invalidURL, "the IPv6 host of a Redis URL lacks its closing ]")
            }
            host = String(hostPort[hostPort.index(after: hostPort.startIndex)..<close])
            let after = hostPort[hostPort.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else {
                    throw RedisError(.invalidURL, "a Redis URL's IPv6 host must be followed by :port or nothing")
                }
                portText = after.dropFirst()
            }
        } else if let colon = hostPort.lastIndex(of: ":") {
            host = String(hostPort[..<colon])
            portText = hostPort[hostPort.index(after: colon)...]
        } else {
            host = String(hostPort)
        }
        guard !host.isEmpty else { throw RedisError(.invalidURL, "a Redis URL needs a host") }
        // Neither the host nor the port is quoted back: without its '@' (or with it percent-encoded), user info reads
        // as host and port, and the password would be in the message.
        if !hostPort.hasPrefix("["), host.contains(where: { $0 == ":" || $0 == "%" || $0 == " " }) {
            throw RedisError(
                .invalidURL,
                "the host of a Redis URL cannot hold ':', '%' or spaces (an IPv6 address goes in brackets; user info "
                    + "ends with '@': redis://user:password@host:port)")
        }
        guard let portText else { return RedisNodeAddress(host: host, port: defaultPort) }
        guard let value = Int(portText), (1...65535).contains(value), portText.allSatisfy(\.isASCII) else {
            throw RedisError(
                .invalidURL,
                "the port of a Redis URL must be a number 1-65535 (user info ends with '@': "
                    + "redis://user:password@host:port)")
        }
        return RedisNodeAddress(host: host, port: value)
    }

    /// `redis://user:***@host:port/db` (or `redis+cluster://user:***@h1:p1,h2:p2`): the password redacted, for logs
    /// and errors.
    package var description: String {
        var text = isCluster ? "redis+cluster://" : isSentinel ? "redis+sentinel://" : "redis://"
        if password != nil { text += "\(user ?? ""):***@" }
        text += seeds.map(\.endpoint).joined(separator: ",")
        if let sentinelMaster { text += "/\(sentinelMaster)" }
        if database != 0 { text += "/\(database)" }
        return text
    }

    /// `host:port`, for messages (a cluster's first seed).
    package var endpoint: String { RedisNodeAddress(host: host, port: port).endpoint }

    private static func percentDecoded(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        var iterator = Array(text.utf8).makeIterator()
        while let byte = iterator.next() {
            if byte == UInt8(ascii: "%") {
                guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else {
                    return nil
                }
                bytes.append(high << 4 | low)
            } else {
                bytes.append(byte)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

/// One node's address: a host (name, IPv4 or IPv6 address) and a port.
package struct RedisNodeAddress: Sendable, Hashable, CustomStringConvertible {
    package var host: String
    package var port: Int

    package init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// `host:port` (`[v6]:port`), for messages.
    package var endpoint: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
    package var description: String { endpoint }
}
