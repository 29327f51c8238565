// Shared by every fuzz target (scripts/fuzz.sh compiles it into each one).
#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A property every input must keep. A violation prints what broke and aborts, which libFuzzer records as a crash
/// (with the input saved under .build/fuzz/crashes/<target>/), exactly like a trap inside the code under test.
@inline(__always)
func require(_ condition: Bool, _ message: @autoclosure () -> String, file: StaticString = #fileID, line: UInt = #line)
{
    if !condition { violated(message(), file: file, line: line) }
}

@inline(never)
func violated(_ message: String, file: StaticString, line: UInt) -> Never {
    var report = "fuzz property violated (\(file):\(line)): \(message)\n"
    report.withUTF8 { bytes in _ = write(2, bytes.baseAddress, bytes.count) }
    abort()
}

/// The input as text for messages, cut short.
func shown(_ bytes: some Collection<UInt8>, limit: Int = 300) -> String {
    let text = String(decoding: bytes.prefix(limit), as: UTF8.self)
    return bytes.count > limit ? text.debugDescription + "…" : text.debugDescription
}
