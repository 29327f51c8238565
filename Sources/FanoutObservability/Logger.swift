import CommandLineSupport
import Fanout
package import Foundation

/// Structured logs, one line per event, on stderr (`--log-format text|json`).
///
/// text: `2026-11-30T01:02:03Z info connected host=api.push.apple.com port=443`
/// json: `{"ts":"2026-11-30T01:02:03Z","level":"info","msg":"connected","host":"api.push.apple.com","port":"443"}`
///
/// Secrets never reach the output: every event goes through `LogRedaction` first (fields named like a credential,
/// values that look like a JWT or a PEM block, bearer tokens in messages).
package struct FanoutLogger: Sendable {
    /// How lines are written.
    package struct Format: Hashable, Sendable, CustomStringConvertible {
        let name: String
        package var description: String { name }

        /// `TIMESTAMP LEVEL MESSAGE key=value ...`, values quoted when needed.
        package static let text = Format(name: "text")
        /// One JSON object per line: `ts`, `level`, `msg`, then the fields.
        package static let json = Format(name: "json")

        /// Parses a `--log-format` value.
        package init?(_ name: String) {
            switch name {
            case "text": self = .text
            case "json": self = .json
            default: return nil
            }
        }

        private init(name: String) {
            self.name = name
        }
    }

    /// How severe an event is. Events below the logger's `minimumLevel` are dropped.
    package struct Level: Hashable, Sendable, Comparable, CustomStringConvertible {
        let severity: Int
        package let name: String
        package var description: String { name }

        package static let debug = Level(severity: 10, name: "debug")
        package static let info = Level(severity: 20, name: "info")
        package static let warning = Level(severity: 30, name: "warning")
        package static let error = Level(severity: 40, name: "error")

        /// Parses a level name (`debug`, `info`, `warning` or `warn`, `error`).
        package init?(_ name: String) {
            switch name.lowercased() {
            case "debug": self = .debug
            case "info": self = .info
            case "warning", "warn": self = .warning
            case "error": self = .error
            default: return nil
            }
        }

        private init(severity: Int, name: String) {
            self.severity = severity
            self.name = name
        }

        package static func < (lhs: Level, rhs: Level) -> Bool { lhs.severity < rhs.severity }
    }

    /// Where finished lines go (each with its trailing newline).
    package struct Sink: Sendable {
        let write: @Sendable ([UInt8]) -> Void

        package init(_ write: @escaping @Sendable ([UInt8]) -> Void) {
            self.write = write
        }

        /// Standard error, one `write(2)` per line so that lines from several threads do not interleave (a reader
        /// that has gone drops them: `StandardStream`).
        package static let standardError = Sink { StandardStream.error.write($0) }
    }

    package var format: Format
    package var minimumLevel: Level
    private let sink: Sink
    private let clock: @Sendable () -> Date

    package init(
        format: Format = .text, minimumLevel: Level = .info, sink: Sink = .standardError,
        clock: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.format = format
        self.minimumLevel = minimumLevel
        self.sink = sink
        self.clock = clock
    }

    /// Writes one event, redacted, if `level` is at least `minimumLevel`.
    package func log(_ level: Level, _ message: String, fields: [String: String] = [:]) {
        guard level >= minimumLevel else { return }
        var line = formatLine(level, message, fields: fields, at: clock())
        line.append("\n")
        sink.write(Array(line.utf8))
    }

    package func debug(_ message: String, fields: [String: String] = [:]) { log(.debug, message, fields: fields) }
    package func info(_ message: String, fields: [String: String] = [:]) { log(.info, message, fields: fields) }
    package func warning(_ message: String, fields: [String: String] = [:]) { log(.warning, message, fields: fields) }
    package func error(_ message: String, fields: [String: String] = [:]) { log(.error, message, fields: fields) }

    /// The line `log` would write (without its newline): redacted, fields sorted by name.
    package func formatLine(_ level: Level, _ message: String, fields: [String: String], at date: Date) -> String {
        let message = LogRedaction.redactMessage(message)
        let fields = LogRedaction.redactFields(fields).sorted { $0.key < $1.key }
        let timestamp = Self.timestamp(date)
        switch format {
        case .json:
            var line = "{\"ts\":\(LogEscaping.jsonString(timestamp)),\"level\":\(LogEscaping.jsonString(level.name))"
            line += ",\"msg\":\(LogEscaping.jsonString(message))"
            for (key, value) in fields {
                // A field cannot replace the three fixed keys.
                let key = ["ts", "level", "msg"].contains(key) ? "field_\(key)" : key
                line += ",\(LogEscaping.jsonString(key)):\(LogEscaping.jsonString(value))"
            }
            return line + "}"
        default:
            var line = "\(timestamp) \(level.name) \(LogEscaping.textMessage(message))"
            for (key, value) in fields {
                line += " \(LogEscaping.textKey(key))=\(LogEscaping.textValue(value))"
            }
            return line
        }
    }

    /// RFC 3339 in UTC to the second: `2026-11-30T01:02:03Z`.
    static func timestamp(_ date: Date) -> String {
        var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let year = Int(parts.tm_year) + 1900
        let paddedYear = String(repeating: "0", count: max(0, 4 - String(year).count)) + String(year)
        return "\(paddedYear)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday))T"
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec))Z"
    }
}

/// Keeps keys and tokens of authentication out of logs.
package enum LogRedaction {
    /// What replaces a secret.
    package static let placeholder = "[redacted]"

    /// Parts of a field name that mark its value as secret (compared lowercased, without `_`, `-` and `.`).
    static let secretNameParts = [
        "authorization", "token", "jwt", "key", "bearer", "secret", "password", "passwd", "credential", "cookie",
        "signature", "privatekey",
    ]

    /// True when a field of this name must not be logged.
    package static func isSecretName(_ name: String) -> Bool {
        let normalized = String(name.lowercased().unicodeScalars.filter { !"_-. ".unicodeScalars.contains($0) })
        return secretNameParts.contains { normalized.contains($0) }
    }

    /// True when the value holds something that looks like a credential: a JWT (`eyJ…` with two dots), a PEM
    /// block, or a bearer token.
    package static func isSecretValue(_ value: String) -> Bool {
        guard !value.contains("-----BEGIN") else { return true }
        let bytes = Array(value.utf8)
        return bytes.indices.contains { jwtLength(in: bytes, at: $0) != nil || bearerLength(in: bytes, at: $0) != nil }
    }

    /// Fields with secret names or secret-looking values replaced by the placeholder.
    package static func redactFields(_ fields: [String: String]) -> [String: String] {
        var redacted = fields
        for (name, value) in fields where isSecretName(name) || isSecretValue(value) {
            redacted[name] = placeholder
        }
        return redacted
    }

    /// The message with every JWT, bearer token and PEM block in it replaced by the placeholder (the rest kept,
    /// since a message is prose and its other words matter).
    package static func redactMessage(_ message: String) -> String {
        guard isSecretValue(message) else { return message }
        var bytes = Array(message.utf8)
        // A PEM block: from its BEGIN line to the end of its END line, or to the end of the message.
        if let begin = find(Array("-----BEGIN".utf8), in: bytes, from: 0) {
            var end = bytes.count
            if let endMarker = find(Array("-----END".utf8), in: bytes, from: begin) {
                let afterMarker = endMarker + 8
                if let close = find(Array("-----".utf8), in: bytes, from: afterMarker) { end = close + 5 }
            }
            bytes.replaceSubrange(begin..<end, with: placeholder.utf8)
            return redactMessage(String(decoding: bytes, as: UTF8.self))
        }
        var output: [UInt8] = []
        var index = 0
        while index < bytes.count {
            if let length = bearerLength(in: bytes, at: index) {
                output += Array("Bearer ".utf8) + Array(placeholder.utf8)
                index += length
            } else if let length = jwtLength(in: bytes, at: index) {
                output += placeholder.utf8
                index += length
            } else {
                output.append(bytes[index])
                index += 1
            }
        }
        return String(decoding: output, as: UTF8.self)
    }

    /// At `index`: `eyJ` then base64url, a dot, base64url, a dot, and optional base64url (empty for `alg: none`).
    /// Returns the length of that run.
    private static func jwtLength(in bytes: [UInt8], at index: Int) -> Int? {
        guard index + 3 <= bytes.count, bytes[index] == UInt8(ascii: "e"), bytes[index + 1] == UInt8(ascii: "y"),
            bytes[index + 2] == UInt8(ascii: "J")
        else {
            return nil
        }
        var position = index + 3
        var dots = 0
        while position < bytes.count {
            let byte = bytes[position]
            if byte == UInt8(ascii: ".") {
                dots += 1
                if dots > 2 { break }
            } else if !isBase64URL(byte) && byte != UInt8(ascii: "=") {
                break
            }
            position += 1
        }
        return dots >= 2 ? position - index : nil
    }

    /// At `index`: the word `Bearer` (any case), spaces, and a credential. Returns the length of that phrase.
    private static func bearerLength(in bytes: [UInt8], at index: Int) -> Int? {
        let word = Array("bearer ".utf8)
        guard index + word.count < bytes.count, index == 0 || !isBase64URL(bytes[index - 1]),
            (0..<word.count).allSatisfy({ bytes[index + $0] | 0x20 == word[$0] | 0x20 })
        else {
            return nil
        }
        var end = index + word.count
        while end < bytes.count && bytes[end] == 0x20 { end += 1 }
        let credentialStart = end
        // The credential is a token68 (RFC 9110 section 11.2): base64url or base64 characters, `.`, `~`, then `=`.
        while end < bytes.count
            && (isBase64URL(bytes[end]) || bytes[end] == UInt8(ascii: ".") || bytes[end] == UInt8(ascii: "~")
                || bytes[end] == UInt8(ascii: "="))
        {
            end += 1
        }
        return end > credentialStart ? end - index : nil
    }

    private static func isBase64URL(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "+"),
            UInt8(ascii: "/"):
            return true
        default:
            return false
        }
    }

    private static func find(_ needle: [UInt8], in haystack: [UInt8], from start: Int) -> Int? {
        guard needle.count <= haystack.count else { return nil }
        var index = start
        while index + needle.count <= haystack.count {
            if haystack[index..<index + needle.count].elementsEqual(needle) { return index }
            index += 1
        }
        return nil
    }
}

/// Escaping for the two line formats, through FanoutCore's one string escaper with every control escaped (C0, DEL,
/// C1, U+2028 and U+2029), so that an event stays on one line and cannot drive a terminal.
enum LogEscaping {
    /// A JSON string literal (RFC 8259).
    static func jsonString(_ value: String) -> String {
        JSONStringEscaping.quoted(value, controls: .all)
    }

    /// A message in a text line: controls escaped; quotes and backslashes left alone, since a message is never quoted.
    static func textMessage(_ message: String) -> String {
        JSONStringEscaping.escaped(message, controls: .all, quotesAndBackslashes: false)
    }

    /// A field name in a text line: letters, digits, `_`, `-` and `.`; anything else becomes `_`.
    static func textKey(_ key: String) -> String {
        guard !key.isEmpty else { return "_" }
        let allowed = "_-.".unicodeScalars
        return String(
            String.UnicodeScalarView(
                key.unicodeScalars.map { scalar in
                    (scalar.isASCII && (scalar.properties.isAlphabetic || ("0"..."9").contains(scalar)))
                        || allowed.contains(scalar) ? scalar : "_"
                }))
    }

    /// A field value in a text line: bare when it is plain, else as a quoted string with escapes. Plain means not
    /// empty, no space or `=`, and nothing the escaper would change.
    static func textValue(_ value: String) -> String {
        let quoted = JSONStringEscaping.quoted(value, controls: .all)
        let isPlain =
            !value.isEmpty && !value.utf8.contains { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "=") }
            && quoted.utf8.count == value.utf8.count + 2
        return isPlain ? value : quoted
    }
}
