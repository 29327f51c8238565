/// Text the engine keeps as words when it has its canonical form (`APNsIdentifier`: a lowercase UUID;
/// `RecipientToken`: 64 lowercase hex digits) and as the text itself otherwise, so that writers (the results line,
/// the dispatch store) handle both the same way: the canonical form is hex digits and dashes, with nothing to
/// escape, and its bytes are lent by `withUTF8`; the other form is the text as it was given.
package protocol CompactText {
    /// The text, when it is kept as given; nil for the canonical form.
    var storedText: String? { get }
    /// Lends `body` the UTF-8 bytes (the canonical form spelled on the stack), valid only inside `body`.
    func withUTF8<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R
}
