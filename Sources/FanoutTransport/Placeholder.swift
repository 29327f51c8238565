import CFanoutShims
import CLibUV
import CNGHTTP2
import COpenSSL

enum TransportPlaceholder {
    static func versions() -> String {
        let uv = String(cString: uv_version_string())
        let h2 = String(cString: nghttp2_version(0).pointee.version_str)
        return "libuv \(uv), nghttp2 \(h2), \(String(cString: OpenSSL_version(OPENSSL_VERSION)))"
    }
}
