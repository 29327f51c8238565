package import Fanout
import FanoutCore
import Foundation

/// The results file's line for one notification, as docs/SEND.md gives it:
/// `{"job":…,"token":…,"outcome":…,"status":…,"reason":…,"apns_id":…,"apns_unique_id":…,"attempts":…,
/// "latency_ms":…,"timestamp":…}`, written straight into a byte buffer (no JSONSerialization per line).
package enum ResultLine {
    package static func append(_ result: NotificationResult, to output: inout [UInt8]) {
        func key(_ name: StaticString) {
            output.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
        }
        func string(_ value: String?) {
            if let value { JSONStringEscaping.appendString(value, to: &output) } else { key("null") }
        }
        // One per type (each lends its bytes without a generic call): the text as given is escaped; a canonical
        // id or token is hex digits and dashes, with nothing to escape.
        func quoted(_ bytes: UnsafeRawBufferPointer) {
            output.append(UInt8(ascii: "\""))
            output.append(contentsOf: bytes)
            output.append(UInt8(ascii: "\""))
        }
        func compact(_ value: RecipientToken?) {
            guard let value else { return key("null") }
            if let text = value.storedText { return JSONStringEscaping.appendString(text, to: &output) }
            value.withUTF8 { quoted($0) }
        }
        func compact(_ value: APNsIdentifier?) {
            guard let value else { return key("null") }
            if let text = value.storedText { return JSONStringEscaping.appendString(text, to: &output) }
            value.withUTF8 { quoted($0) }
        }
        func integer(_ value: Int64?) {
            if let value { appendDecimal(value, to: &output) } else { key("null") }
        }
        key("{\"job\":")
        string(result.jobID)
        key(",\"token\":")
        compact(result.tokenValue)
        key(",\"outcome\":")
        string(result.outcome.name)
        key(",\"status\":")
        integer(result.status.map(Int64.init))
        key(",\"reason\":")
        string(result.reason)
        key(",\"apns_id\":")
        compact(result.apnsIDValue)
        key(",\"apns_unique_id\":")
        compact(result.apnsUniqueIDValue)
        key(",\"attempts\":")
        integer(Int64(result.attempts))
        key(",\"latency_ms\":")
        appendTenths(ofNanoseconds: result.latencyNanoseconds, to: &output)
        key(",\"timestamp\":")
        integer(result.timestamp)
        if let channel = result.channel {
            key(",\"channel\":")
            string(channel)
        }
        if let retryAfter = result.retryAfterSeconds {
            key(",\"retry_after_s\":")
            output.append(contentsOf: String(format: "%.3f", retryAfter).utf8)
        }
        key("}\n")
    }

    /// `value` in decimal, written in place (no String per number: this runs once per result field).
    package static func appendDecimal(_ value: Int64, to output: inout [UInt8]) {
        if value < 0 { output.append(UInt8(ascii: "-")) }
        var magnitude = value.magnitude
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes: Int64.min has 19 digits
        withUnsafeMutableBytes(of: &digits) { buffer in
            var index = buffer.count
            repeat {
                index -= 1
                buffer[index] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
            } while magnitude != 0
            output.append(contentsOf: buffer[index...])
        }
    }

    /// Nanoseconds as milliseconds with one decimal, rounded half up (`1_250_000` is `1.3`), written in place.
    package static func appendTenths(ofNanoseconds nanoseconds: Int64, to output: inout [UInt8]) {
        let tenths = (nanoseconds.magnitude + 50_000) / 100_000
        if nanoseconds < 0 && tenths > 0 { output.append(UInt8(ascii: "-")) }
        appendDecimal(Int64(tenths / 10), to: &output)
        output.append(UInt8(ascii: "."))
        output.append(UInt8(ascii: "0") + UInt8(tenths % 10))
    }

    /// What resuming needs of a results line: whose it is, and what it counts for in the summary.
    package struct Parsed: Sendable, Equatable {
        package var job: String
        /// Nil for a broadcast (then `channel` is set) and for the job's own line (an `invalid` job).
        package var token: String?
        package var outcome: String
        /// The channel of a broadcast's line: an activity's broadcast or a channel job's one recipient.
        package var channel: String?
        /// 1 when the line gives none (a line of an older format).
        package var attempts: Int

        /// The job's own line (a job that failed validation), not a recipient's: it ends the job. A job whose
        /// recipients broke mid-read gets none (`JobFileRunner.send`): it stays unfinished for `--resume`. (An older
        /// Fanout wrote one for the unread rest, and it still ends that job.)
        package var isJobLine: Bool { token == nil && channel == nil }
    }

    /// Reads a results line back whole, as the result it was written from (for a dispatch taken over from another
    /// process, whose results it published as lines): nil for a line that does not parse.
    package static func result(_ line: some Collection<UInt8>, position: Int) -> NotificationResult? {
        guard case .object(let object)? = try? JSONValue.parse(line), let job = object["job"]?.stringValue,
            let outcome = object["outcome"]?.stringValue
        else { return nil }
        let latencyMilliseconds = object["latency_ms"]?.doubleValue ?? 0
        var result = NotificationResult(
            jobID: job, token: object["token"]?.stringValue, outcome: NotificationOutcome(named: outcome),
            status: object["status"]?.int64Value.map { Int(clamping: $0) }, reason: object["reason"]?.stringValue,
            apnsID: object["apns_id"]?.stringValue, apnsUniqueID: object["apns_unique_id"]?.stringValue,
            attempts: object["attempts"]?.int64Value.map { Int(clamping: $0) } ?? 1,
            latency: .nanoseconds(Int64(latencyMilliseconds * 1_000_000)),
            timestamp: object["timestamp"]?.int64Value, retryAfterSeconds: object["retry_after_s"]?.doubleValue)
        result.position = position
        result.channel = object["channel"]?.stringValue
        return result
    }

    /// Reads a results line back (for resuming from the results file).
    package static func parse(_ line: some Collection<UInt8>) -> Parsed? {
        // A line that does not parse (the torn last line of an interrupted run) is simply not a result.
        guard case .object(let object)? = try? JSONValue.parse(line), let job = object["job"]?.stringValue,
            let outcome = object["outcome"]?.stringValue
        else { return nil }
        return Parsed(
            job: job, token: object["token"]?.stringValue, outcome: outcome, channel: object["channel"]?.stringValue,
            attempts: object["attempts"]?.int64Value.map { Int(clamping: $0) } ?? 1)
    }
}
