/// A bad command line: the one-line message every Fanout binary prints before exiting non-zero.
package struct UsageError: Error, CustomStringConvertible, Sendable {
    package let message: String
    package init(_ message: String) { self.message = message }
    package var description: String { message }
}

/// Walks a command line flag by flag. Each binary switches over `nextFlag()` and pulls values with
/// the typed accessors, so every error names the flag and the bad value.
package struct ArgumentCursor {
    private var arguments: ArraySlice<String>
    /// The flag being read, for messages.
    package private(set) var currentFlag = ""

    package init(_ arguments: [String]) {
        self.arguments = arguments[...]
    }

    /// The next flag (`--name`, or `--name=value` split so the value comes next), or nil at the end.
    package mutating func nextFlag() throws(UsageError) -> String? {
        guard let argument = arguments.popFirst() else { return nil }
        guard argument.hasPrefix("-") else { throw UsageError("unexpected argument '\(argument)'") }
        if let equals = argument.firstIndex(of: "="), argument.hasPrefix("--") {
            arguments.insert(String(argument[argument.index(after: equals)...]), at: arguments.startIndex)
            currentFlag = String(argument[..<equals])
        } else {
            currentFlag = argument
        }
        return currentFlag
    }

    /// Positional words before the first flag (a subcommand), or nil.
    package mutating func nextWord() -> String? {
        guard let first = arguments.first, !first.hasPrefix("-") else { return nil }
        return arguments.popFirst()
    }

    /// The value after the current flag.
    package mutating func string() throws(UsageError) -> String {
        guard let value = arguments.popFirst() else { throw UsageError("\(currentFlag) needs a value") }
        return value
    }

    /// An integer value within `range`.
    package mutating func int(in range: ClosedRange<Int> = Int.min...Int.max) throws(UsageError) -> Int {
        let text = try string()
        guard let value = Int(text), range.contains(value) else {
            throw UsageError(
                "\(currentFlag) takes a whole number from \(range.lowerBound) to \(range.upperBound), not '\(text)'")
        }
        return value
    }

    /// A decimal value within `range`.
    package mutating func double(in range: ClosedRange<Double>) throws(UsageError) -> Double {
        let text = try string()
        guard let value = Double(text), range.contains(value) else {
            throw UsageError(
                "\(currentFlag) takes a number from \(range.lowerBound) to \(range.upperBound), not '\(text)'")
        }
        return value
    }

    /// A positive number of seconds (fractions allowed, at most a day) as a `Duration`.
    package mutating func seconds() throws(UsageError) -> Duration {
        let value = try double(in: 0.001...86_400)
        return .milliseconds(Int64((value * 1000).rounded()))
    }

    /// A `HOST:PORT` value (IPv6 hosts in brackets: `[::1]:443`).
    package mutating func hostPort() throws(UsageError) -> (host: String, port: Int) {
        let text = try string()
        guard let parsed = Self.parseHostPort(text) else {
            throw UsageError("\(currentFlag) takes HOST:PORT with a port from 0 to 65535, not '\(text)'")
        }
        return parsed
    }

    package static func parseHostPort(_ text: String) -> (host: String, port: Int)? {
        guard let colon = text.lastIndex(of: ":") else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty, let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port) else {
            return nil
        }
        return (host, port)
    }
}
