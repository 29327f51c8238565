import Glibc

/// A file a command writes its output to (`--out`, `--summary`, `--invalid-tokens`), opened with open(2) and written
/// with write(2): through whatever the path names. Foundation's `FileManager.createFile(atPath:contents:)` writes a
/// temporary file and renames it over the path, so `--out /dev/full` or `--summary /dev/null` replaced the device
/// node with a regular file, and a symbolic link with a copy (its target left as it was).
package final class OutputFile {
    /// What went wrong, for the command's one line: `"cannot write /x: No space left on device"`.
    package struct Failure: Error, Sendable {
        package let message: String
        package init(message: String) { self.message = message }
    }

    /// Owned: closed by `close()` or deinit.
    private var descriptor: Int32
    private let path: String

    /// Opens `path` for writing, created if missing (mode 0644 less the umask). `append` keeps what it holds and
    /// writes after it; otherwise it is emptied (a device is just opened).
    package init(path: String, append: Bool = false) throws(Failure) {
        self.path = path
        descriptor = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0o644)
        guard descriptor >= 0 else {
            let code = errno
            throw Failure(message: "cannot open \(path) for writing: \(Self.reason(code))")
        }
    }

    deinit {
        if descriptor >= 0 { Glibc.close(descriptor) }
    }

    package func write(_ text: String) throws(Failure) {
        try write(Array(text.utf8))
    }

    package func write(_ bytes: [UInt8]) throws(Failure) {
        let code = bytes.withUnsafeBytes { writeFully(descriptor, $0) }
        if code != 0 { throw Failure(message: "cannot write \(path): \(Self.reason(code))") }
    }

    /// Writes all of `bytes`, or throws with the system's reason (a full disk, a closed reader).
    package func write(_ bytes: UnsafeRawBufferPointer) throws(Failure) {
        let code = writeFully(descriptor, bytes)
        if code != 0 { throw Failure(message: "cannot write \(path): \(Self.reason(code))") }
    }

    /// Closes the file; a write the system only now reports failed (NFS, a full disk) throws.
    package func close() throws(Failure) {
        guard descriptor >= 0 else { return }
        let result = Glibc.close(descriptor)
        let code = errno
        descriptor = -1
        guard result == 0 else { throw Failure(message: "cannot write \(path): \(Self.reason(code))") }
    }

    package static func reason(_ code: Int32) -> String { String(cString: strerror(code)) }
}

/// write(2) until all of `bytes` is written: 0, or the errno that stopped it (ENOSPC when write(2) took nothing, as
/// only a full device does). Shared by `OutputFile` and `StandardStream`.
func writeFully(_ descriptor: Int32, _ bytes: UnsafeRawBufferPointer) -> Int32 {
    var offset = 0
    while offset < bytes.count {
        let written = Glibc.write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
        if written > 0 {
            offset += written
        } else if written < 0 && errno == EINTR {
            continue
        } else {
            return written < 0 ? errno : ENOSPC
        }
    }
    return 0
}
