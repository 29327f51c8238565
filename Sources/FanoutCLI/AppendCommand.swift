import CommandLineSupport
import FanoutJobFile
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// `fanout append --jobs FILE [JOB_LINE | -]`: a producer's side of a followed job file (`fanout send --follow`).
/// Each line is checked as `fanout validate` checks it, and a valid one is appended whole: one write, under an
/// exclusive advisory lock (`flock`), to a file opened for appending, so that concurrent producers never interleave
/// their lines and a reader never sees half of one.
enum AppendCommand {
    static let usage = """
        fanout append: check job lines and append each valid one to a job file, atomically.

        usage: fanout append --jobs FILE JOB_LINE
               fanout append --jobs FILE -          (one job line per line of standard input)

        Each line is checked as fanout validate checks it; an invalid one is reported on stderr (with its
        line number for -) and not appended. A valid one is written whole, in one write under an exclusive
        flock(2) of FILE, which is created if missing: any number of producers (fanout append, or any
        program that takes the same lock and writes one line per write) never interleave lines. The
        output is {"appended": N, "invalid": M}.

        Exit status: 0 when every line was appended; 1 when some were invalid; 2 for bad arguments or a
        file that cannot be written (nothing more is appended after a failed write).
        """

    static func run(_ arguments: [String]) -> Int32 {
        var jobs: String?
        var lines: [String] = []
        do {
            // The job line is a positional argument that starts with `{`, and `-` is one too: read by hand.
            var rest = arguments[...]
            while let argument = rest.popFirst() {
                switch argument {
                case "--help", "-h":
                    print(usage)
                    return 0
                case "--jobs":
                    guard let value = rest.popFirst() else { throw UsageError("--jobs needs a value") }
                    jobs = value
                case "-": lines.append(argument)
                default:
                    guard !argument.hasPrefix("-") else {
                        throw UsageError("unknown option \(argument) (see fanout append --help)")
                    }
                    lines.append(argument)
                }
            }
            guard let jobs else { throw UsageError("--jobs FILE is required (see fanout append --help)") }
            guard lines.count == 1 else {
                throw UsageError("give one job line, or - to read job lines from standard input")
            }
            let file = try JobFileAppender(path: jobs)
            defer { file.close() }
            var appended = 0
            var invalid = 0
            let parser = JobLineParser()
            let now = Int64(Date().timeIntervalSince1970)
            let directory = (jobs as NSString).deletingLastPathComponent
            func append(_ bytes: [UInt8], lineNumber: Int) throws {
                if case .failure(let error) = parser.parse(
                    line: bytes, lineNumber: lineNumber, jobFileDirectory: directory.isEmpty ? "." : directory,
                    now: now)
                {
                    invalid += 1
                    StandardStream.error.write("fanout append: \(error.description)\n")
                    return
                }
                try file.append(line: bytes)
                appended += 1
            }
            if lines[0] == "-" {
                let input = try JobFileReader(path: JobFileReader.standardInput)
                while let line = try input.nextLine() { try append(line.bytes, lineNumber: line.number) }
            } else {
                try append(Array(lines[0].utf8), lineNumber: 1)
            }
            print("{\"appended\": \(appended), \"invalid\": \(invalid)}")
            return invalid == 0 ? 0 : 1
        } catch let error as UsageError {
            StandardStream.error.write("fanout append: \(error.message)\n")
            return 2
        } catch {
            StandardStream.error.write("fanout append: \(error)\n")
            return 2
        }
    }
}

/// A job file opened for appending whole lines: `O_APPEND`, and each line written with one `write(2)` (repeated
/// only for what a short write left) under `flock(LOCK_EX)`.
struct JobFileAppender {
    /// Owned: opened in init, closed by `close()`.
    private let descriptor: Int32
    let path: String

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    init(path: String) throws {
        self.path = path
        descriptor = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            throw Failure(description: "cannot open \(path) for appending: \(String(cString: strerror(errno)))")
        }
    }

    /// Appends `line` and its `\n` as one write under the file's exclusive lock. A line with a `\n` of its own is
    /// refused (it would be two lines).
    func append(line: [UInt8]) throws {
        guard !line.contains(UInt8(ascii: "\n")) else {
            throw Failure(description: "a job line cannot contain a newline")
        }
        let bytes = line + [UInt8(ascii: "\n")]
        var locked: Int32
        repeat { locked = flock(descriptor, LOCK_EX) } while locked != 0 && errno == EINTR
        guard locked == 0 else {
            throw Failure(description: "cannot lock \(path): \(String(cString: strerror(errno)))")
        }
        defer { _ = flock(descriptor, LOCK_UN) }
        var written = 0
        while written < bytes.count {
            let count = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress! + written, bytes.count - written) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else {
                throw Failure(description: "cannot write to \(path): \(String(cString: strerror(errno)))")
            }
            written += count
        }
    }

    func close() {
        _ = Glibc.close(descriptor)
    }
}
