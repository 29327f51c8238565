import XCTest

@testable import FanoutTransport

/// The session's stream table against a Dictionary doing the same operations: streams opened in id order
/// (odd ids, as one side's are), closed in a random order with some left open for a long time (so that later
/// ids land on their slots and go to the overflow), more open at once than the table was made for (so it
/// grows), and every lookup, update and removal compared.
final class HTTP2StreamTableTests: XCTestCase {
    private final class Context {}

    func testMatchesADictionaryThroughOverflowAndGrowth() {
        var table = HTTP2StreamTable(capacity: 8)
        var reference: [Int32: HTTP2Session.OpenStream] = [:]
        var generator = SystemRandomNumberGenerator()
        var nextID: Int32 = 1
        // Streams that stay open through the whole run: their slots are wanted by many later ids.
        var longLived: [Int32] = []
        for round in 0..<4_000 {
            let opening = Int.random(in: 0...3, using: &generator)
            for _ in 0..<opening {
                let stream = HTTP2Session.OpenStream(context: Context(), body: nil)
                table.insert(stream, for: nextID)
                reference[nextID] = stream
                if round % 97 == 0 { longLived.append(nextID) }
                nextID += 2
            }
            // Close about as many as were opened, never a long-lived one.
            let closable = reference.keys.filter { !longLived.contains($0) }
            for id in closable.shuffled(using: &generator).prefix(Int.random(in: 0...3, using: &generator)) {
                XCTAssertTrue(table.remove(id)?.context === reference.removeValue(forKey: id)?.context)
            }
            // Bursts past the initial capacity make the table grow.
            if round == 1_000 {
                for _ in 0..<300 {
                    let stream = HTTP2Session.OpenStream(context: Context(), body: nil)
                    table.insert(stream, for: nextID)
                    reference[nextID] = stream
                    nextID += 2
                }
            }
            XCTAssertEqual(table.count, reference.count)
        }
        for id in stride(from: Int32(1), to: nextID + 4, by: 1) {
            XCTAssertTrue(table.value(for: id)?.context === reference[id]?.context, "stream \(id)")
            XCTAssertTrue(table.context(of: id)?.takeUnretainedValue() === reference[id]?.context, "context \(id)")
            let updated = table.update(id) { stream -> Int in
                stream.bodyOffset = Int(id)
                return Int(id)
            }
            XCTAssertEqual(updated, reference[id] == nil ? nil : Int(id))
        }
        for id in longLived { XCTAssertEqual(table.value(for: id)?.bodyOffset, Int(id), "long-lived stream \(id)") }
        XCTAssertNil(table.remove(nextID), "an id never opened")
        let open = table.removeAll()
        XCTAssertEqual(Set(open.map(\.id)), Set(reference.keys))
        XCTAssertTrue(table.isEmpty)
        XCTAssertNil(table.value(for: longLived.first ?? 1))
    }
}
