import CommandLineSupport
import FanoutCore
import Foundation

// make-tokens: writes N distinct, valid 64-hex-digit device tokens, one per line, for examples,
// tests and benchmarks. Deterministic for a given --seed.

let usage = """
    make-tokens: write N random device tokens (64 hex digits), one per line.

    usage: make-tokens --count N [--seed N] [--out FILE]

      --count N   how many tokens (distinct)
      --seed N    seed of the generator (default 1): the same seed gives the same tokens
      --out FILE  write there instead of standard output
    """

var count: Int?
var seed: UInt64 = 1
var output: String?
var cursor = ArgumentCursor(Array(CommandLine.arguments.dropFirst()))
do {
    while let flag = try cursor.nextFlag() {
        switch flag {
        case "--help", "-h":
            print(usage)
            exit(0)
        case "--count": count = try cursor.int(in: 0...1_000_000_000)
        case "--seed": seed = UInt64(try cursor.int(in: 0...Int.max))
        case "--out": output = try cursor.string()
        default: throw UsageError("unknown option \(flag) (see make-tokens --help)")
        }
    }
    guard count != nil else { throw UsageError("--count N is required") }
} catch let error as UsageError {
    StandardStream.error.write("make-tokens: \(error.message)\n")
    exit(2)
}

let handle: FileHandle
if let output {
    guard FileManager.default.createFile(atPath: output, contents: nil), let file = FileHandle(forWritingAtPath: output)
    else {
        StandardStream.error.write("make-tokens: cannot write \(output)\n")
        exit(2)
    }
    handle = file
} else {
    handle = FileHandle.standardOutput
}
var random = FastRandomGenerator(seed: seed)
let digits = Array("0123456789abcdef".utf8)
var buffer: [UInt8] = []
buffer.reserveCapacity(1 << 20)
for index in 0..<count! {
    // Three random words and the index: distinct whatever the generator does.
    for word in [random.next(), random.next(), random.next(), UInt64(index)] {
        for shift in stride(from: 60, through: 0, by: -4) { buffer.append(digits[Int((word >> UInt64(shift)) & 0xF)]) }
    }
    buffer.append(UInt8(ascii: "\n"))
    if buffer.count >= 1 << 20 {
        handle.write(Data(buffer))
        buffer.removeAll(keepingCapacity: true)
    }
}
handle.write(Data(buffer))
