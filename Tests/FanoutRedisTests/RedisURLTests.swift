import FanoutRedis
import XCTest

final class RedisURLTests: XCTestCase {
    func testParsesHostPortDatabaseAndCredentials() throws {
        let plain = try RedisURL(parsing: "redis://127.0.0.1:6380")
        XCTAssertEqual(plain, RedisURL(host: "127.0.0.1", port: 6380))
        XCTAssertEqual(try RedisURL(parsing: "redis://cache.internal").port, 6379)
        XCTAssertEqual(try RedisURL(parsing: "redis://cache.internal:7000/").database, 0)

        let full = try RedisURL(parsing: "redis://fanout:s3cr%40t:x@redis.example:6390/4")
        XCTAssertEqual(full.host, "redis.example")
        XCTAssertEqual(full.port, 6390)
        XCTAssertEqual(full.user, "fanout")
        XCTAssertEqual(full.password, "s3cr@t:x")
        XCTAssertEqual(full.database, 4)

        let passwordOnly = try RedisURL(parsing: "redis://:p@ss/word@10.0.0.2:6379/2")
        XCTAssertNil(passwordOnly.user)
        XCTAssertEqual(passwordOnly.password, "p@ss/word")
        XCTAssertEqual(passwordOnly.host, "10.0.0.2")
        XCTAssertEqual(passwordOnly.database, 2)

        let ipv6 = try RedisURL(parsing: "redis://[::1]:6379/1")
        XCTAssertEqual(ipv6.host, "::1")
        XCTAssertEqual(ipv6.description, "redis://[::1]:6379/1")
    }

    func testPasswordNeverAppearsInDescriptionsOrErrors() throws {
        let url = try RedisURL(parsing: "redis://fanout:hunter2@redis.example:6390/4")
        XCTAssertEqual(url.description, "redis://fanout:***@redis.example:6390/4")
        XCTAssertEqual(String(describing: url), "redis://fanout:***@redis.example:6390/4")
        XCTAssertFalse("\(url)".contains("hunter2"))
        XCTAssertEqual(try RedisURL(parsing: "redis://:hunter2@h:1").description, "redis://:***@h:1")

        for bad in [
            "redis://fanout:hunter2@redis.example:notaport", "redis://fanout:hunter2@redis.example:6379/x",
            "redis://fanout:hunter2@redis.example:6379/1?timeout=3", "redis://hunter2@redis.example:6379",
            "redis://fanout:hunter2%zz@redis.example", "redis://fanout:hunter2@:6379", "http://fanout:hunter2@h:1",
            "rediss://fanout:hunter2@redis.example:6379",
            // Without its '@', or with it percent-encoded, user info reads as host and port: neither is quoted back.
            "redis://default:hunter2", "redis://default:hunter2%40127.0.0.1:6379", "redis://:hunter2",
        ] {
            do {
                _ = try RedisURL(parsing: bad)
                XCTFail("\(bad) parsed")
            } catch {
                XCTAssertFalse(error.message.contains("hunter2"), "\(error.message)")
                XCTAssertFalse(error.description.contains("hunter2"), "\(error.description)")
            }
        }
    }

    func testRedissIsRefusedNamingTheMissingTLSSupport() {
        do {
            _ = try RedisURL(parsing: "rediss://redis.example:6380")
            XCTFail("rediss:// parsed")
        } catch {
            XCTAssertEqual(error.kind, .unsupported)
            XCTAssertTrue(error.message.contains("hiredis_ssl"), error.message)
            XCTAssertTrue(error.message.contains("0.14"), error.message)
        }
    }

    func testRejectsMalformedURLs() {
        for bad in [
            "", "redis:/h", "h:6379", "redis://h:0", "redis://h:65536", "redis://h:-1", "redis://h/-1",
            "redis://[::1", "redis://[::1]x", "redis://h:6379/1#frag", "redis://",
        ] {
            XCTAssertThrowsError(try RedisURL(parsing: bad), bad) { error in
                XCTAssertEqual((error as? RedisError)?.kind, .invalidURL, bad)
            }
        }
    }

    func testScriptSHA1MatchesRedis() {
        // SHA-1 of "return 1", as SCRIPT LOAD answers it.
        XCTAssertEqual(RedisScript("return 1").sha1, "e0e1f9fabfc9d4800c877a703b823ac0578ff8db")
    }
}
