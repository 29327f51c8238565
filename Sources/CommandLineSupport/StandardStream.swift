import Glibc

/// Standard output and standard error for a binary's own lines, written with write(2). Foundation's
/// `FileHandle.write(_:)` traps when the reader has gone (EPIPE: the binaries ignore SIGPIPE, for their sockets), which
/// would crash `fanout enqueue ... | head -1` halfway through the enqueue, and `fanout send ... 2>&1 | head` at its
/// next progress line. A line the reader can no longer take is dropped, as `print` drops it, and the command goes on
/// with its work and its exit status. Unbuffered, like `FileHandle`: it keeps its order with other raw writes to the
/// descriptor (a results file on stdout); `print`'s buffered lines go out at exit.
package enum StandardStream: Sendable {
    case output, error

    package func write(_ text: String) {
        var text = text
        text.withUTF8 { write(UnsafeRawBufferPointer($0)) }
    }

    package func write(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { write($0) }
    }

    package func write(_ bytes: UnsafeRawBufferPointer) {
        // The reader is gone (EPIPE), the stream is closed or full: dropped.
        _ = writeFully(descriptor, bytes)
    }

    /// Why `writeAll` stopped.
    package enum WriteFailure: Error, Sendable {
        /// The reader has gone (EPIPE: `| head` took what it wanted).
        case readerGone
        /// Anything else (a full disk behind `> file`), with the system's reason.
        case failed(String)
    }

    /// `writeAll` of an array.
    package func writeAll(_ bytes: [UInt8]) throws(WriteFailure) {
        try Self.failure(bytes.withUnsafeBytes { writeFully(descriptor, $0) })
    }

    /// Writes all of `bytes`, or says why not: for output that is the command's product (`fanout results`' lines),
    /// where a full disk must not pass for success.
    package func writeAll(_ bytes: UnsafeRawBufferPointer) throws(WriteFailure) {
        try Self.failure(writeFully(descriptor, bytes))
    }

    private var descriptor: Int32 { self == .output ? STDOUT_FILENO : STDERR_FILENO }

    private static func failure(_ code: Int32) throws(WriteFailure) {
        if code == EPIPE { throw .readerGone }
        if code != 0 { throw .failed(OutputFile.reason(code)) }
    }
}
