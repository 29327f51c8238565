/// A first-in first-out queue over one array that is reused, not reallocated: popping advances a
/// head index, and the array is compacted only when the dead prefix is both large and most of it.
/// `prepend` puts an item before all others (a retry that must go first). Once warm it allocates
/// nothing per item. `@inlinable` so that other modules get a specialised copy on their hot paths.
package struct FIFOQueue<Element> {
    @usableFromInline var items: [Element?] = []
    @usableFromInline var head = 0
    /// Items put in front, last in first out.
    @usableFromInline var front: [Element] = []

    @inlinable package init() {}

    @inlinable package var count: Int { items.count - head + front.count }
    @inlinable package var isEmpty: Bool { count == 0 }

    @inlinable package mutating func append(_ item: Element) { items.append(item) }

    @inlinable package mutating func prepend(_ item: Element) { front.append(item) }

    @inlinable package mutating func popFirst() -> Element? {
        if let item = front.popLast() { return item }
        guard head < items.count else { return nil }
        let item = items[head]
        items[head] = nil
        head += 1
        if head == items.count {
            items.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 4096 && head * 2 >= items.count {
            items.removeFirst(head)
            head = 0
        }
        return item
    }
}
