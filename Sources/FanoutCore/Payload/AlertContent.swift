/// An alert's title, subtitle or body: text shown as given, or a key into the app's `Localizable.strings` with the
/// arguments for its format specifiers.
public enum AlertText: Sendable, Hashable, ExpressibleByStringLiteral {
    case plain(String)
    case localized(key: String, arguments: [String])

    public init(stringLiteral value: String) {
        self = .plain(value)
    }

    func validate(field: String) throws(PayloadError) {
        if case .localized(let key, _) = self, key.isEmpty {
            throw PayloadError(field: field + ".loc_key", message: "must not be empty")
        }
    }

    /// The Live Activity form: `"title":"…"` or `"title":{"loc-key":"…","loc-args":[…]}` (the nested form of
    /// Apple's ActivityKit samples).
    func writeNested(_ key: StaticString, to writer: inout JSONWriter) {
        writer.key(key)
        switch self {
        case .plain(let text):
            writer.string(text)
        case .localized(let locKey, let arguments):
            writer.beginObject()
            writer.key("loc-key")
            writer.string(locKey)
            if !arguments.isEmpty {
                writer.key("loc-args")
                writer.writeStrings(arguments)
            }
            writer.endObject()
        }
    }

    /// The regular-alert form: `"title":"…"` or the flat `"title-loc-key":"…","title-loc-args":[…]` pair.
    func writeFlat(
        plain: StaticString, locKey: StaticString, locArgs: StaticString, to writer: inout JSONWriter
    ) {
        switch self {
        case .plain(let text):
            writer.key(plain)
            writer.string(text)
        case .localized(let key, let arguments):
            writer.key(locKey)
            writer.string(key)
            if !arguments.isEmpty {
                writer.key(locArgs)
                writer.writeStrings(arguments)
            }
        }
    }
}

/// An alert sound: a sound file name in the app bundle (or `default`), or a critical alert sound with its volume.
public enum AlertSound: Sendable, Hashable, ExpressibleByStringLiteral {
    case named(String)
    /// `{"critical":1,"name":…,"volume":…}`; critical alerts need Apple's entitlement.
    case critical(name: String, volume: Double)

    public static let `default` = AlertSound.named("default")

    public init(stringLiteral value: String) {
        self = .named(value)
    }

    func validate(field: String) throws(PayloadError) {
        switch self {
        case .named(let name):
            if name.isEmpty { throw PayloadError(field: field, message: "must not be empty") }
        case .critical(let name, let volume):
            if name.isEmpty { throw PayloadError(field: field + ".name", message: "must not be empty") }
            guard volume.isFinite, (0...1).contains(volume) else {
                throw PayloadError(field: field + ".volume", message: "must be between 0 and 1")
            }
        }
    }

    func write(to writer: inout JSONWriter) {
        writer.key("sound")
        switch self {
        case .named(let name):
            writer.string(name)
        case .critical(let name, let volume):
            writer.beginObject()
            writer.key("critical")
            writer.one()
            writer.key("name")
            writer.string(name)
            writer.key("volume")
            writer.double(volume)
            writer.endObject()
        }
    }
}

/// The `alert` of a Live Activity push: it lights the screen or shows the expanded view.
public struct LiveActivityAlert: Sendable, Hashable {
    public var title: AlertText?
    public var body: AlertText?
    public var sound: AlertSound?

    public init(title: AlertText? = nil, body: AlertText? = nil, sound: AlertSound? = nil) {
        self.title = title
        self.body = body
        self.sound = sound
    }

    /// Checks the alert; `field` is its path, `live_activity.alert`.
    public func validate(field: String = "live_activity.alert") throws(PayloadError) {
        guard title != nil || body != nil else {
            throw PayloadError(field: field, message: "needs a title or a body")
        }
        try title?.validate(field: field + ".title")
        try body?.validate(field: field + ".body")
        try sound?.validate(field: field + ".sound")
    }

    func write(to writer: inout JSONWriter) {
        writer.key("alert")
        writer.beginObject()
        title?.writeNested("title", to: &writer)
        body?.writeNested("body", to: &writer)
        sound?.write(to: &writer)
        writer.endObject()
    }
}

extension JSONWriter {
    mutating func writeStrings(_ strings: [String]) {
        beginArray()
        for string in strings { self.string(string) }
        endArray()
    }
}
