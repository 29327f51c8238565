/// A first-in first-out queue over one array that is reused, not reallocated: popping advances a
/// head index, and the array is compacted only when the dead prefix is both large and most of it.
/// `prepend` puts an item before all others (a retry that must go first). Once warm it allocates
/// nothing per item. `@inlinable` so that other modules get a specialised copy on their hot paths, and `public`
/// (the module is no product, so no library user sees it) because Swift 6.3 does not specialise an `@inlinable
/// package` generic in another module: as `package`, the engine's `pump` would call the generic `popFirst`, with a
/// metadata lookup per notification.
public struct FIFOQueue<Element> {
    @usableFromInline var items: [Element?] = []
    @usableFromInline var head = 0
    /// Items put in front, last in first out.
    @usableFromInline var front: [Element] = []

    @inlinable public init() {}

    @inlinable public var count: Int { items.count - head + front.count }
    @inlinable public var isEmpty: Bool { count == 0 }

    @inlinable public mutating func append(_ item: Element) { items.append(item) }

    @inlinable public mutating func prepend(_ item: Element) { front.append(item) }

    @inlinable public mutating func popFirst() -> Element? {
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

    /// The item `popFirst` would return, left in place.
    @inlinable public var first: Element? {
        if let item = front.last { return item }
        return head < items.count ? items[head] : nil
    }

    /// The first item, in pop order, that satisfies `predicate`.
    @inlinable public func first(where predicate: (Element) -> Bool) -> Element? {
        for item in front.reversed() where predicate(item) { return item }
        for index in head..<items.count { if let item = items[index], predicate(item) { return item } }
        return nil
    }

    /// Removes every item that satisfies `predicate`, keeping the others in order; returns the removed
    /// ones in pop order. Linear: for rare events (a cancelled job), not the hot path.
    @inlinable public mutating func removeAll(where predicate: (Element) -> Bool) -> [Element] {
        var removed: [Element] = []
        var keptFront: [Element] = []
        for item in front.reversed() {
            if predicate(item) { removed.append(item) } else { keptFront.append(item) }
        }
        var kept: [Element?] = []
        for index in head..<items.count {
            guard let item = items[index] else { continue }
            if predicate(item) { removed.append(item) } else { kept.append(item) }
        }
        front = keptFront.reversed()
        items = kept
        head = 0
        return removed
    }
}
