import CommandLineSupport
import FanoutCore
import FanoutRegistry
import Foundation

// registry-import-probe: writes a registrations file, imports one into a registry, or pages through an activity,
// timing each. The kill -9 test launches `import` and kills it mid-way; the import and paging rates in the README and
// docs/REGISTRY.md come from a release build of it.

let usage = """
    registry-import-probe: generate, import and page registrations, with timings.

    usage: registry-import-probe generate --out FILE --count N [--app BUNDLE] [--activity ID] [--seed N] [--devices] [--csv]
           registry-import-probe import --db FILE --file FILE [--app BUNDLE] [--batch N] [--progress] [--dry-run]
           registry-import-probe apply --db FILE --count N [--batch N] [--devices]
           registry-import-probe page --db FILE --activity ID [--app BUNDLE] [--limit N]

      generate  N update-token lines (JSON lines, or CSV with a header) for one activity: distinct 64-hex-digit
                tokens whose last 16 digits are the line's index; --devices gives each a device id d<N> and a user
                id u<N mod 1000>
      import    defines the app, imports FILE; with --progress prints `committed N` after each batch (flushed)
      apply     the store alone: N registrations built in memory, then applied in batches (timed)
      page      reads every live token of the activity in pages of --limit (default 10000)
    Each command ends with one JSON line: what it did, the seconds it took and the rate.
    """

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("registry-import-probe: \(message)\n".utf8))
    exit(2)
}

func printLine(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func seconds(since start: ContinuousClock.Instant) -> Double {
    let elapsed = ContinuousClock.now - start
    return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
}

func rate(_ count: Int, _ seconds: Double) -> String {
    String(format: "%.0f", Double(count) / max(seconds, 1e-9))
}

var arguments = CommandLine.arguments.dropFirst()
guard let command = arguments.popFirst() else { fail("a command is required (see --help)") }
if command == "--help" || command == "-h" {
    print(usage)
    exit(0)
}
var out: String?
var db: String?
var file: String?
var count = 0
var app = "com.acme.app"
var activity = "match-7"
var seed: UInt64 = 1
var devices = false
var csv = false
var batch = 50_000
var progress = false
var dryRun = false
var limit = 10_000
var cursor = ArgumentCursor(Array(arguments))
do throws(UsageError) {
    while let flag = try cursor.nextFlag() {
        switch flag {
        case "--help", "-h":
            print(usage)
            exit(0)
        case "--out": out = try cursor.string()
        case "--db": db = try cursor.string()
        case "--file": file = try cursor.string()
        case "--count": count = try cursor.int(in: 0...1_000_000_000)
        case "--app": app = try cursor.string()
        case "--activity": activity = try cursor.string()
        case "--seed": seed = UInt64(try cursor.int(in: 0...Int.max))
        case "--devices": devices = true
        case "--csv": csv = true
        case "--batch": batch = try cursor.int(in: 1...10_000_000)
        case "--progress": progress = true
        case "--dry-run": dryRun = true
        case "--limit": limit = try cursor.int(in: 1...10_000_000)
        default: throw UsageError("unknown option \(flag) (see --help)")
        }
    }
} catch {
    fail(error.message)
}

switch command {
case "generate":
    guard let out else { fail("generate needs --out FILE") }
    let start = ContinuousClock.now
    guard FileManager.default.createFile(atPath: out, contents: nil), let handle = FileHandle(forWritingAtPath: out)
    else { fail("cannot write \(out)") }
    var random = FastRandomGenerator(seed: seed)
    let digits = Array("0123456789abcdef".utf8)
    // Each token: three random words, then the line's index (so tokens are distinct, and a token tells its line).
    let (prefix, suffix): ([UInt8], [UInt8])
    if csv {
        handle.write(Data((devices ? "app,activity_id,token,device,user\n" : "app,activity_id,token\n").utf8))
        prefix = Array("\(app),\(activity),".utf8)
        suffix = []
    } else {
        prefix = Array(
            "{\"app\":\(JSONStringEscaping.quoted(app)),\"activity_id\":\(JSONStringEscaping.quoted(activity)),\"token\":\""
                .utf8)
        suffix = Array("\"".utf8)
    }
    let chunkLines = 8192
    let lineCapacity = prefix.count + 64 + suffix.count + 64
    let output = UnsafeMutablePointer<UInt8>.allocate(capacity: chunkLines * lineCapacity)
    defer { output.deallocate() }
    var index = 0
    while index < count {
        let lines = min(chunkLines, count - index)
        var used = 0
        for line in index..<(index + lines) {
            for byte in prefix {
                output[used] = byte
                used += 1
            }
            for word in [random.next(), random.next(), random.next(), UInt64(line)] {
                var shift: UInt64 = 64
                while shift > 0 {
                    shift -= 4
                    output[used] = digits[Int((word >> shift) & 0xF)]
                    used += 1
                }
            }
            var tail = suffix
            if devices {
                tail += Array(
                    (csv ? ",d\(line),u\(line % 1000)" : ",\"device\":\"d\(line)\",\"user\":\"u\(line % 1000)\"").utf8)
            }
            tail += csv ? [UInt8(ascii: "\n")] : [UInt8(ascii: "}"), UInt8(ascii: "\n")]
            for byte in tail {
                output[used] = byte
                used += 1
            }
        }
        handle.write(Data(bytes: output, count: used))
        index += lines
    }
    try? handle.close()
    let elapsed = seconds(since: start)
    printLine("{\"generated\":\(count),\"seconds\":\(String(format: "%.3f", elapsed))}")

case "import":
    guard let db, let file else { fail("import needs --db FILE and --file FILE") }
    do {
        let store = try SQLiteRegistryStore(path: db)
        try await store.defineApps([RegistryApp(bundleID: app)])
        let start = ContinuousClock.now
        let importer = RegistryImporter(batchSize: batch, dryRun: dryRun)
        var invalid = 0
        let summary = try await importer.run(
            path: file, into: store,
            onInvalidLine: { error in
                invalid += 1
                if invalid <= 10 { FileHandle.standardError.write(Data("\(error)\n".utf8)) }
            },
            onBatch: { summary in
                if progress { printLine("committed \(summary.committed)") }
            })
        let elapsed = seconds(since: start)
        store.close()
        printLine(
            "{\"imported\":\(summary.registrations),\"added\":\(summary.added),\"unchanged\":\(summary.unchanged),"
                + "\"invalid\":\(summary.invalid),\"seconds\":\(String(format: "%.3f", elapsed)),"
                + "\"rate\":\(rate(summary.registrations, elapsed))}")
    } catch {
        fail("\(error)")
    }

case "apply":
    // The store alone: --count registrations built in memory first, then applied in batches of --batch and timed.
    guard let db else { fail("apply needs --db FILE") }
    do {
        let store = try SQLiteRegistryStore(path: db)
        try await store.defineApps([RegistryApp(bundleID: app)])
        var random = FastRandomGenerator(seed: seed)
        func hex(_ word: UInt64) -> String {
            let digits = String(word, radix: 16)
            return String(repeating: "0", count: 16 - digits.count) + digits
        }
        let changes = (0..<count).map { index in
            RegistryChange.updateToken(
                UpdateTokenRegistration(
                    app: app, activityID: activity, deviceID: devices ? "d\(index)" : nil,
                    token: hex(random.next()) + hex(random.next()) + hex(random.next()) + hex(UInt64(index))))
        }
        let start = ContinuousClock.now
        var offset = 0
        while offset < changes.count {
            let end = min(offset + batch, changes.count)
            _ = try await store.apply(Array(changes[offset..<end]))
            offset = end
        }
        let elapsed = seconds(since: start)
        store.close()
        printLine(
            "{\"applied\":\(count),\"seconds\":\(String(format: "%.3f", elapsed)),\"rate\":\(rate(count, elapsed))}")
    } catch {
        fail("\(error)")
    }

case "page":
    guard let db else { fail("page needs --db FILE") }
    do {
        let store = try SQLiteRegistryStore(path: db)
        let start = ContinuousClock.now
        var total = 0
        var after: RegistryCursor?
        repeat {
            let page = try await store.liveUpdateTokens(app: app, activityID: activity, after: after, limit: limit)
            total += page.items.count
            after = page.next
        } while after != nil
        let elapsed = seconds(since: start)
        store.close()
        printLine(
            "{\"tokens\":\(total),\"seconds\":\(String(format: "%.3f", elapsed)),\"rate\":\(rate(total, elapsed))}")
    } catch {
        fail("\(error)")
    }

default:
    fail("unknown command \(command) (see --help)")
}
