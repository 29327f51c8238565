package import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// POSIX write(2), under a name that does not clash with `CryptoFile.write`.
private func systemWrite(_ descriptor: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Int {
    #if canImport(Glibc)
        return Glibc.write(descriptor, buffer, count)
    #else
        return Musl.write(descriptor, buffer, count)
    #endif
}

/// Reading key files and writing key/certificate files with the right permissions.
package enum CryptoFile {
    /// Reads the whole file, with errors that name the path (and never the contents).
    package static func read(_ path: String, what: String) throws -> [UInt8] {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw CryptoError(.fileNotFound, "\(what) file not found: \(path)", path: path)
        }
        guard !isDirectory.boolValue else {
            throw CryptoError(.fileUnreadable, "\(what) path is a directory, not a file: \(path)", path: path)
        }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CryptoError(
                .fileUnreadable, "\(what) file could not be read (check permissions): \(path)", path: path)
        }
        return [UInt8](data)
    }

    /// Writes `bytes` to `path` atomically with permission bits `mode` (0o600 for keys, 0o644 for certificates).
    ///
    /// The data goes to a temporary file created with `mode` from the start (so a key is never readable by
    /// others, not even briefly), is fsynced, and is then renamed over `path`.
    package static func write(_ bytes: [UInt8], to path: String, mode: mode_t) throws {
        let temporary = "\(path).tmp-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
        guard descriptor >= 0 else {
            throw CryptoError(.fileWriteFailed, "cannot create \(path): \(errnoText())", path: path)
        }
        var failure: String?
        // fchmod: the umask may have narrowed `mode` (never widened), so set it exactly.
        if fchmod(descriptor, mode) != 0 { failure = "fchmod: \(errnoText())" }
        var offset = 0
        while failure == nil && offset < bytes.count {
            let written = bytes.withUnsafeBytes { raw in
                systemWrite(descriptor, raw.baseAddress! + offset, raw.count - offset)
            }
            if written < 0 {
                if errno == EINTR { continue }
                failure = "write: \(errnoText())"
            } else {
                offset += written
            }
        }
        if failure == nil && fsync(descriptor) != 0 { failure = "fsync: \(errnoText())" }
        if close(descriptor) != 0 && failure == nil { failure = "close: \(errnoText())" }
        if failure == nil && rename(temporary, path) != 0 { failure = "rename: \(errnoText())" }
        if let failure {
            unlink(temporary)
            throw CryptoError(.fileWriteFailed, "cannot write \(path): \(failure)", path: path)
        }
    }

    /// Creates `directory` (and parents) if needed.
    package static func makeDirectory(_ directory: String) throws {
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw CryptoError(
                .fileWriteFailed, "cannot create directory \(directory): \(error.localizedDescription)", path: directory
            )
        }
    }

    /// Runs `body` while holding an exclusive `flock` on `directory/.fanout-tls.lock`, so two processes
    /// sharing a TLS directory don't interleave their files.
    package static func withDirectoryLock<Result>(_ directory: String, _ body: () throws -> Result) throws -> Result {
        let lockPath = (directory as NSString).appendingPathComponent(".fanout-tls.lock")
        let descriptor = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw CryptoError(.fileWriteFailed, "cannot create lock file \(lockPath): \(errnoText())", path: lockPath)
        }
        defer { close(descriptor) }  // Closing the descriptor releases the lock.
        while flock(descriptor, LOCK_EX) != 0 {
            guard errno == EINTR else {
                throw CryptoError(.fileWriteFailed, "cannot lock \(lockPath): \(errnoText())", path: lockPath)
            }
        }
        return try body()
    }

    private static func errnoText() -> String { String(cString: strerror(errno)) }
}
