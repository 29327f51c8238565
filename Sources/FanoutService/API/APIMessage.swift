package import FanoutCore
package import FanoutTransport

/// One API request as the router sees it, whatever the protocol it came over.
package struct APIRequest: Sendable {
    package var method: String
    /// The path without the query, percent-decoding left to the route.
    package var path: String
    package var query: [String: String]
    /// Names lowercase.
    package var headers: [(name: String, value: String)]
    package var body: [UInt8]

    package init(method: String, target: String, headers: [(name: String, value: String)], body: [UInt8]) {
        self.method = method
        self.headers = headers
        self.body = body
        let parts = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        path = String(parts[0])
        query = [:]
        if parts.count == 2 {
            for pair in parts[1].split(separator: "&") {
                let keyValue = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                let key = PercentDecoding.decode(keyValue[0], plusIsSpace: true) ?? String(keyValue[0])
                query[key] = keyValue.count == 2 ? PercentDecoding.decode(keyValue[1], plusIsSpace: true) ?? "" : ""
            }
        }
    }

    /// The request's `Idempotency-Key`, with the digest of the request it came with; nil without the header.
    package var idempotencyKey: IdempotencyKey? {
        header("idempotency-key").map { IdempotencyKey(key: $0, method: method, path: path, body: body) }
    }

    package func header(_ name: String) -> String? {
        headers.first { $0.name == name }?.value
    }

    /// The path's segments after the leading slash, percent-decoded (nil when one does not decode).
    package var segments: [String]? {
        var decoded: [String] = []
        for segment in path.split(separator: "/", omittingEmptySubsequences: true) {
            guard let text = PercentDecoding.decode(segment) else { return nil }
            decoded.append(text)
        }
        return decoded
    }
}

/// One answer: the transport's response, which every API flavour builds.
package typealias APIResponse = HTTPResponse

extension HTTPResponse {
    package static func json(_ status: Int, _ value: JSONValue) -> APIResponse {
        var body = value.encoded()
        body.append(UInt8(ascii: "\n"))
        return APIResponse(status: status, headers: [("content-type", "application/json")], body: body)
    }
}

/// `%XX` decoding of a path segment or query part (`+` is a space in a query).
enum PercentDecoding {
    /// - Parameter plusIsSpace: `+` means a space in a query (form encoding), not in a path segment.
    static func decode(_ text: Substring, plusIsSpace: Bool = false) -> String? {
        var bytes: [UInt8] = []
        var iterator = Array(text.utf8)[...]
        while let byte = iterator.popFirst() {
            switch byte {
            case UInt8(ascii: "%"):
                guard iterator.count >= 2,
                    let high = HexDigest.decode(String(decoding: iterator.prefix(2), as: UTF8.self))
                else { return nil }
                bytes.append(contentsOf: high)
                iterator = iterator.dropFirst(2)
            case UInt8(ascii: "+") where plusIsSpace: bytes.append(UInt8(ascii: " "))
            default: bytes.append(byte)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }
}

/// A request the API refuses: the HTTP status, the field at fault (nil when it is not one field) and a message
/// meant for the caller. Each API flavour renders it in its own shape.
package struct APIError: Error, Sendable {
    package var status: Int
    package var field: String?
    package var message: String

    package init(_ status: Int, field: String? = nil, _ message: String) {
        self.status = status
        self.field = field
        self.message = message
    }

    static func badField(_ field: String, _ message: String) -> APIError { APIError(400, field: field, message) }
    static let notFound = APIError(404, "not found")
}
