/// Open streams by stream id, for the nghttp2 callbacks that name a stream only by its id (several per request:
/// each response header, the end of the stream, its close, each body read).
///
/// HTTP/2 stream ids of one side are odd and only grow, so the streams open at once sit in a window of ids:
/// each id has its slot in a power-of-two array (`(id >> 1) & mask`), found with a shift and a mask instead of a
/// `Dictionary`'s seeded hash (which would be about 2% of the sender's loop thread). A stream that is still open when a
/// later id needs its slot (one slow stream while thousands of others pass it) goes to a small dictionary,
/// looked in only while it holds anything. Once warm, nothing is allocated per stream.
///
/// `context(of:)` gives a stream's context without a retain, for the callbacks of each arriving header, data chunk and
/// end of stream (about a dozen per request a server answers); copying the stream out would retain and release it.
struct HTTP2StreamTable {
    typealias Value = HTTP2Session.OpenStream

    private struct Slot {
        /// 0: empty (stream ids start at 1).
        var id: Int32 = 0
        var value: Value?
        /// `value.context`, unretained: `value` holds it for as long as the slot does.
        var context: Unmanaged<AnyObject>?
    }

    private var slots: [Slot]
    private var mask: Int
    /// Streams whose slot was taken when they opened.
    private var overflow: [Int32: Value] = [:]
    private(set) var count = 0

    /// - Parameter capacity: about how many streams are open at once (the slots are at least twice that; the
    ///   table grows when more are).
    init(capacity: Int) {
        var size = 16
        while size < 2 * capacity { size *= 2 }
        slots = Array(repeating: Slot(), count: size)
        mask = size - 1
    }

    var isEmpty: Bool { count == 0 }

    private func slot(of id: Int32) -> Int { Int(id >> 1) & mask }

    /// Adds the stream `id`, which must not be in the table. A taken slot while the table is half full or more
    /// means the open streams span more ids than it has slots: it doubles first.
    mutating func insert(_ value: Value, for id: Int32) {
        precondition(id > 0, "stream ids start at 1")
        if slots[slot(of: id)].id != 0 && count >= slots.count / 2 { grow() }
        let index = slot(of: id)
        if slots[index].id == 0 {
            slots[index] = Slot(id: id, value: value, context: .passUnretained(value.context))
        } else {
            overflow[id] = value
        }
        count += 1
    }

    /// Doubles the slots and places every open stream again.
    private mutating func grow() {
        let open = removeAll()
        slots = Array(repeating: Slot(), count: 2 * slots.count)
        mask = slots.count - 1
        for (id, value) in open { insert(value, for: id) }
    }

    /// The stream `id`'s value, if it is open.
    func value(for id: Int32) -> Value? {
        let index = slot(of: id)
        if slots[index].id == id { return slots[index].value }
        return overflow.isEmpty ? nil : overflow[id]
    }

    /// The stream `id`'s context, unretained (the table holds it while the stream is open); nil when the stream is
    /// not open. A reference, not a closure run inside the table: a callback that changes the table (an answer's
    /// `respond`) while a read of it is still going on would copy the whole slot array.
    func context(of id: Int32) -> Unmanaged<AnyObject>? {
        let index = slot(of: id)
        if slots[index].id == id { return slots[index].context }
        guard !overflow.isEmpty, let stream = overflow[id] else { return nil }
        return .passUnretained(stream.context)
    }

    /// Runs `body` on the stream `id`'s value in place; nil when the stream is not open.
    mutating func update<R>(_ id: Int32, _ body: (inout Value) -> R) -> R? {
        let index = slot(of: id)
        if slots[index].id == id { return body(&slots[index].value!) }
        guard !overflow.isEmpty, overflow[id] != nil else { return nil }
        return body(&overflow[id]!)
    }

    /// Removes the stream `id` and returns its value, if it was open.
    mutating func remove(_ id: Int32) -> Value? {
        let index = slot(of: id)
        if slots[index].id == id {
            let value = slots[index].value
            slots[index] = Slot()
            count -= 1
            return value
        }
        guard !overflow.isEmpty, let value = overflow.removeValue(forKey: id) else { return nil }
        count -= 1
        return value
    }

    /// Empties the table and returns every open stream, in no particular order.
    mutating func removeAll() -> [(id: Int32, value: Value)] {
        var open: [(id: Int32, value: Value)] = []
        for index in slots.indices where slots[index].id != 0 {
            open.append((slots[index].id, slots[index].value!))
            slots[index] = Slot()
        }
        for (id, value) in overflow { open.append((id, value)) }
        overflow = [:]
        count = 0
        return open
    }
}
