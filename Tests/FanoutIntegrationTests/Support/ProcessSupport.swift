// Running the project's binaries (`fanout`, `mock-apns`) and third-party tools (h2load, curl, nghttpd) from
// integration tests: every wait is bounded, output goes to files (so a chatty child can never block on a full
// pipe), and a child that overstays its timeout is killed and reported as a failure.
import FanoutTestSupport
import Foundation
import XCTest

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A failure of the test machinery itself (binary missing, timeout, child died early), with a message for people.
struct ProcessSupportError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// What one finished run produced.
struct ProcessResult: Sendable {
    /// The command line, for messages.
    var commandLine: String
    /// The exit status, or 128 + the signal number when the child was killed by a signal (as a shell reports it).
    var exitCode: Int32
    /// True when the child ended by a signal (a crash, for our binaries).
    var killedBySignal: Bool
    var stdoutData: Data
    var stderrData: Data

    var stdout: String { String(decoding: stdoutData, as: UTF8.self) }
    var stderr: String { String(decoding: stderrData, as: UTF8.self) }
    var stdoutLines: [String] { stdout.split(separator: "\n").map(String.init) }
    var stderrLines: [String] { stderr.split(separator: "\n").map(String.init) }

    /// A short account for assertion messages.
    var summary: String {
        func clip(_ text: String) -> String { text.count > 1500 ? String(text.prefix(1500)) + "…" : text }
        return "`\(commandLine)` exited \(exitCode)\(killedBySignal ? " (signal)" : "")\n"
            + "--- stdout ---\n\(clip(stdout))\n--- stderr ---\n\(clip(stderr))"
    }
}

enum ProcessSupport {
    // MARK: Locating binaries

    /// The directory holding the package's executables: the test runner's own directory (on Linux the runner is
    /// `<scratch>/debug/FanoutPackageTests.xctest`, next to `fanout` and `mock-apns`), or a parent of it (macOS
    /// bundles). `FANOUT_BIN_DIR` overrides.
    static func productsDirectory() throws -> URL {
        try located.get()
    }

    /// The path of a built executable of this package (`fanout`, `mock-apns`, `fanout-bench`).
    static func builtExecutable(_ name: String) throws -> String {
        let path = try productsDirectory().appendingPathComponent(name).path
        guard isExecutableFile(path) else {
            throw ProcessSupportError(
                "\(name) is not built in \(try productsDirectory().path); run swift build --build-tests first")
        }
        return path
    }

    private static let located: Result<URL, ProcessSupportError> = {
        let required = ["fanout", "mock-apns"]
        var starts: [URL] = []
        if let override = ProcessInfo.processInfo.environment["FANOUT_BIN_DIR"], !override.isEmpty {
            starts.append(URL(fileURLWithPath: override))
        }
        if let executable = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            starts.append(URL(fileURLWithPath: executable).deletingLastPathComponent())
        }
        starts.append(Bundle(for: RunningProcess.self).bundleURL)
        if let executable = Bundle.main.executableURL { starts.append(executable.deletingLastPathComponent()) }
        starts.append(Bundle.main.bundleURL)
        if let first = CommandLine.arguments.first {
            starts.append(URL(fileURLWithPath: first).deletingLastPathComponent())
        }
        var tried: [String] = []
        for start in starts {
            var directory = start.standardizedFileURL
            for _ in 0..<5 {
                tried.append(directory.path)
                if required.allSatisfy({ isExecutableFile(directory.appendingPathComponent($0).path) }) {
                    return .success(directory)
                }
                let parent = directory.deletingLastPathComponent()
                if parent.path == directory.path { break }
                directory = parent
            }
        }
        return .failure(
            ProcessSupportError(
                "cannot find the built fanout and mock-apns executables near the test runner (looked in "
                    + "\(tried.joined(separator: ", "))); build them with swift build --build-tests, or set FANOUT_BIN_DIR"
            ))
    }()

    static func isExecutableFile(_ path: String) -> Bool {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), !isDirectory.boolValue else {
            return false
        }
        return access(path, X_OK) == 0
    }

    /// A third-party tool from PATH (or the sbin directories, which PATH often lacks for non-root users:
    /// Debian installs nghttpd in /usr/sbin). Nil when it is not installed.
    static func findTool(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        var directories = path.split(separator: ":").map(String.init)
        directories += ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        for directory in directories where !directory.isEmpty {
            let candidate = (directory as NSString).appendingPathComponent(name)
            if isExecutableFile(candidate) { return candidate }
        }
        return nil
    }

    /// This process's environment without the `APNS_*` variables, so that children see only what a test gives.
    static func cleanEnvironment(adding extra: [String: String] = [:]) -> [String: String] {
        // No signing key and no proxy from the developer's environment: `fanout` honours HTTPS_PROXY and NO_PROXY.
        let proxyVariables: Set<String> = ["HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"]
        var environment = ProcessInfo.processInfo.environment.filter {
            !$0.key.hasPrefix("APNS_") && !proxyVariables.contains($0.key)
        }
        environment.merge(extra) { _, new in new }
        return environment
    }

    // MARK: Running

    /// Runs `executable` to completion and captures its output. A child still running after `timeout` seconds is
    /// killed (SIGKILL) and the call throws, naming the command and what it printed so far.
    static func run(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil,
        currentDirectory: String? = nil, timeout: TimeInterval = 20
    ) throws -> ProcessResult {
        let child = try RunningProcess(
            executable, arguments, environment: environment, currentDirectory: currentDirectory)
        defer { child.discardFiles() }
        guard child.waitForExit(timeout: timeout) else {
            child.kill(SIGKILL)
            _ = child.waitForExit(timeout: 5)
            throw ProcessSupportError(
                "timed out after \(timeout) s and was killed: `\(child.commandLine)`\n--- stdout ---\n"
                    + "\(child.stdoutText())\n--- stderr ---\n\(child.stderrText())")
        }
        return child.result()
    }

    /// A fresh empty directory, removed when `testCase` tears down.
    static func temporaryDirectory(for testCase: XCTestCase, _ label: String = "it") throws -> String {
        let path = (NSTemporaryDirectory() as NSString).appendingPathComponent("fanout-\(label)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        testCase.addTeardownBlock { try? FileManager.default.removeItem(atPath: path) }
        return path
    }

    // MARK: Ports

    /// A TCP port that was free on 127.0.0.1 a moment ago. Another process may take it before the caller binds it:
    /// callers retry.
    static func freeLoopbackPort() throws -> Int {
        do { return try LoopbackPort.free() } catch { throw ProcessSupportError(error.description) }
    }

    /// True when a TCP connection to 127.0.0.1:`port` succeeds (the connection is closed at once).
    static func canConnect(port: Int) -> Bool { LoopbackPort.canConnect(port: port) }

    /// Starts a server that prints nothing when ready (nghttpd): picks a free loopback port, starts
    /// `executable` with `arguments(port)`, and waits until the port accepts connections. When the server exits
    /// first (the port was taken meanwhile), tries again with another port, `attempts` times in all.
    static func startServer(
        _ executable: String, attempts: Int = 4, readyTimeout: TimeInterval = 5, arguments: (Int) -> [String]
    ) throws -> (process: RunningProcess, port: Int) {
        var failures: [String] = []
        for _ in 0..<attempts {
            let port = try freeLoopbackPort()
            let child = try RunningProcess(executable, arguments(port))
            let deadline = Date().addingTimeInterval(readyTimeout)
            while Date() < deadline {
                if canConnect(port: port) {
                    if child.isRunning { return (child, port) }
                    break  // someone else's listener; ours died
                }
                if !child.isRunning { break }
                usleep(20_000)
            }
            failures.append(
                "port \(port): \(child.isRunning ? "not listening after \(readyTimeout) s" : "exited") \(child.stderrText())"
            )
            _ = try? child.stop(timeout: 5)
            child.discardFiles()
        }
        throw ProcessSupportError(
            "cannot start `\(executable)` after \(attempts) attempts: \(failures.joined(separator: "; "))")
    }
}

/// `kill(2)` by pid (outside `RunningProcess`, whose `kill` method shadows it).
private func sendSignal(_ pid: Int32, _ signal: Int32) {
    _ = kill(pid, signal)
}

/// A child process whose stdout and stderr go to temporary files. Stop it with `stop()`; it is killed with
/// SIGKILL if it is still running when released.
final class RunningProcess: @unchecked Sendable {
    let process = Process()
    let commandLine: String
    private let outputDirectory: String
    private let stdoutPath: String
    private let stderrPath: String
    private let exited = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var exitObserved = false

    init(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil,
        currentDirectory: String? = nil
    ) throws {
        guard ProcessSupport.isExecutableFile(executable) else {
            throw ProcessSupportError("\(executable) is missing or not executable")
        }
        commandLine = ([executable] + arguments).map { $0.contains(" ") ? "'\($0)'" : $0 }.joined(separator: " ")
        outputDirectory = (NSTemporaryDirectory() as NSString).appendingPathComponent(
            "fanout-proc-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: outputDirectory, withIntermediateDirectories: true)
        TemporaryDirectories.removeAtExit(outputDirectory)
        stdoutPath = (outputDirectory as NSString).appendingPathComponent("stdout")
        stderrPath = (outputDirectory as NSString).appendingPathComponent("stderr")
        guard FileManager.default.createFile(atPath: stdoutPath, contents: nil),
            FileManager.default.createFile(atPath: stderrPath, contents: nil),
            let stdoutHandle = FileHandle(forWritingAtPath: stdoutPath),
            let stderrHandle = FileHandle(forWritingAtPath: stderrPath)
        else { throw ProcessSupportError("cannot create output files in \(outputDirectory)") }
        defer {
            try? stdoutHandle.close()
            try? stderrHandle.close()
        }
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if let environment { process.environment = environment }
        if let currentDirectory { process.currentDirectoryURL = URL(fileURLWithPath: currentDirectory) }
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = stdoutHandle
        process.standardError = stderrHandle
        let exited = self.exited
        process.terminationHandler = { _ in exited.signal() }
        do {
            try process.run()
        } catch {
            throw ProcessSupportError("cannot start `\(commandLine)`: \(error)")
        }
    }

    deinit {
        if !hasExited {
            kill(SIGKILL)
            _ = waitForExit(timeout: 5)
        }
        discardFiles()
    }

    var pid: Int32 { process.processIdentifier }

    private var hasExited: Bool { lock.withLock { exitObserved } }

    var isRunning: Bool { !waitForExit(timeout: 0) }

    /// True when the child has exited (now or within `timeout` seconds).
    func waitForExit(timeout: TimeInterval) -> Bool {
        if hasExited { return true }
        guard exited.wait(timeout: .now() + max(0, timeout)) == .success else { return false }
        lock.withLock { exitObserved = true }
        return true
    }

    /// Sends `signal` to the child (only to this pid).
    func kill(_ signal: Int32) {
        guard !hasExited, pid > 0 else { return }
        sendSignal(pid, signal)
    }

    func stdoutText() -> String {
        String(decoding: FileManager.default.contents(atPath: stdoutPath) ?? Data(), as: UTF8.self)
    }

    func stderrText() -> String {
        String(decoding: FileManager.default.contents(atPath: stderrPath) ?? Data(), as: UTF8.self)
    }

    /// The first line the child printed on stdout, waiting up to `timeout` seconds for it. Throws when the child
    /// exits first or stays silent.
    func firstStdoutLine(timeout: TimeInterval) throws -> String {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let text = stdoutText()
            if let newline = text.firstIndex(of: "\n") { return String(text[..<newline]) }
            if hasExited || !isRunning {
                throw ProcessSupportError(
                    "`\(commandLine)` exited (\(process.terminationStatus)) before printing a line; stderr: \(stderrText())"
                )
            }
            if Date() >= deadline {
                throw ProcessSupportError(
                    "`\(commandLine)` printed no line within \(timeout) s; stderr: \(stderrText())")
            }
            usleep(10_000)
        }
    }

    /// Sends SIGTERM and waits up to `timeout` seconds; a child still running then is killed and the call throws.
    /// Returns the exit status.
    @discardableResult
    func stop(timeout: TimeInterval = 5) throws -> Int32 {
        kill(SIGTERM)
        guard waitForExit(timeout: timeout) else {
            kill(SIGKILL)
            _ = waitForExit(timeout: 5)
            throw ProcessSupportError("`\(commandLine)` did not exit within \(timeout) s of SIGTERM and was killed")
        }
        return process.terminationStatus
    }

    /// The finished run's result (call after `waitForExit` returned true).
    func result() -> ProcessResult {
        let bySignal = process.terminationReason == .uncaughtSignal
        let status = process.terminationStatus
        return ProcessResult(
            commandLine: commandLine, exitCode: bySignal ? 128 + status : status, killedBySignal: bySignal,
            stdoutData: FileManager.default.contents(atPath: stdoutPath) ?? Data(),
            stderrData: FileManager.default.contents(atPath: stderrPath) ?? Data())
    }

    func discardFiles() {
        try? FileManager.default.removeItem(atPath: outputDirectory)
    }
}

/// `mock-apns` as a subprocess: started with the given arguments (which must include `--listen HOST:0` or a
/// port), its port read from its first line `listening on HOST:PORT`.
final class MockAPNsProcess: @unchecked Sendable {
    let child: RunningProcess
    let host: String
    let port: Int

    /// Starts `mock-apns` and waits up to `timeout` seconds for its `listening on` line.
    init(arguments: [String], timeout: TimeInterval = 15) throws {
        let executable = try ProcessSupport.builtExecutable("mock-apns")
        child = try RunningProcess(executable, arguments, environment: ProcessSupport.cleanEnvironment())
        let line: String
        do {
            line = try child.firstStdoutLine(timeout: timeout)
        } catch {
            _ = try? child.stop()
            throw error
        }
        let prefix = "listening on "
        guard line.hasPrefix(prefix), let colon = line.lastIndex(of: ":"),
            let port = Int(line[line.index(after: colon)...]), port > 0
        else {
            _ = try? child.stop()
            throw ProcessSupportError("mock-apns's first line is not `listening on HOST:PORT`: \(line)")
        }
        self.port = port
        host = String(line[line.index(line.startIndex, offsetBy: prefix.count)..<colon])
    }

    /// SIGTERM, then waits (bounded); returns the exit status. mock-apns writes its stats and record files
    /// one last time before exiting.
    @discardableResult
    func stop(timeout: TimeInterval = 10) throws -> Int32 {
        try child.stop(timeout: timeout)
    }

    /// Reads a `--stats` file as a JSON object.
    static func readStats(_ path: String) throws -> [String: Any] {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ProcessSupportError("no stats file at \(path)")
        }
        guard let object = try JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw ProcessSupportError(
                "stats file \(path) is not a JSON object: \(String(decoding: data, as: UTF8.self))")
        }
        return object
    }
}
