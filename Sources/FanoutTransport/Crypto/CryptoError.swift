/// An error from Fanout's crypto layer: loading keys, signing provider tokens, minting test certificates.
///
/// Messages say what was wrong and where (a file path, or "PEM data" for in-memory input), and may carry the
/// text of OpenSSL's error queue. They never contain key bytes or JWT text, so they are safe to log.
package struct CryptoError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What went wrong, as a struct over an internal enum so new kinds don't break callers.
    package struct Kind: Sendable, Hashable, CustomStringConvertible {
        enum Base: String, Sendable, Hashable {
            case fileNotFound
            case fileUnreadable
            case fileWriteFailed
            case malformedKey
            case unsupportedKey
            case invalidArgument
            case signingFailed
            case certificateFailed
            case malformedCertificate
            case wrongPassword
            case internalFailure
        }

        let base: Base

        /// The file does not exist.
        package static let fileNotFound = Kind(base: .fileNotFound)
        /// The file exists but could not be read (permissions, a directory, ...).
        package static let fileUnreadable = Kind(base: .fileUnreadable)
        /// A file or directory could not be created or written.
        package static let fileWriteFailed = Kind(base: .fileWriteFailed)
        /// The input is not a PEM key OpenSSL can parse.
        package static let malformedKey = Kind(base: .malformedKey)
        /// The key parsed but is not an EC P-256 key (RSA, P-384, Ed25519, encrypted, ...).
        package static let unsupportedKey = Kind(base: .unsupportedKey)
        /// An argument was out of range or empty (key ID, team ID, intervals, hostnames).
        package static let invalidArgument = Kind(base: .invalidArgument)
        /// OpenSSL failed to produce a signature.
        package static let signingFailed = Kind(base: .signingFailed)
        /// OpenSSL failed to build or sign a certificate.
        package static let certificateFailed = Kind(base: .certificateFailed)
        /// The input is not a certificate (or PKCS#12 file) OpenSSL can parse, or its key does not match it.
        package static let malformedCertificate = Kind(base: .malformedCertificate)
        /// The password does not open the PKCS#12 file (its integrity check fails with it).
        package static let wrongPassword = Kind(base: .wrongPassword)
        /// An OpenSSL call that should not fail did (allocation failure and the like).
        package static let internalFailure = Kind(base: .internalFailure)

        package var description: String { base.rawValue }
    }

    /// What went wrong.
    package let kind: Kind
    /// A human-readable message naming the input (path) and, where useful, OpenSSL's error queue.
    package let message: String
    /// The file the error is about, if any.
    package let path: String?

    package init(_ kind: Kind, _ message: String, path: String? = nil, includeOpenSSLErrors: Bool = false) {
        self.kind = kind
        self.path = path
        if includeOpenSSLErrors, let queue = OpenSSLErrorQueue.drain() {
            self.message = "\(message) (OpenSSL: \(queue))"
        } else {
            if !includeOpenSSLErrors { OpenSSLErrorQueue.clear() }
            self.message = message
        }
    }

    package var description: String { "CryptoError(\(kind)): \(message)" }
}
