// The status page at `/` in a real headless browser: Debian's chromium (installed by `make deps`) loads the page
// from the real `fanout serve`, the page's own script fetches `/v1/status` with the key from the address's fragment,
// and the DOM it rendered (`--dump-dom`) is compared with what the API reports.
import Foundation
import XCTest

final class ServeStatusPageTests: XCTestCase {
    private var mock: MockHarness!
    private var serve: ServeHarness!
    private var directory = ""

    /// Tokens the mock answers 410 Unregistered: three of the activity's ten, one of the four devices.
    private static let goneTokens =
        (0..<3).map { ServeNativeAPITests.token("a9", $0) } + [ServeNativeAPITests.token("c9", 3)]

    override func setUpWithError() throws {
        directory = try ProcessSupport.temporaryDirectory(for: self, "status-page")
        let gone = (directory as NSString).appendingPathComponent("unregistered.txt")
        try Data(Self.goneTokens.joined(separator: "\n").utf8).write(to: URL(fileURLWithPath: gone))
        mock = try MockHarness { $0.unregisteredPath = gone }
        // One request an hour refills nothing while the test runs, so what the page shows and what the API reports
        // differ by exactly the requests made in between.
        serve = try ServeHarness(testCase: self, mock: mock, acmeRateLimit: (perHour: 1, burst: 1_000))
        try serve.start()
    }

    override func tearDown() {
        serve?.stop()
        mock?.stop()
    }

    func testPageShowsTheCountsTheAPIReports() throws {
        let server = ServeKeys.acmeServer
        let device = ServeKeys.acmeDevice
        // An update by activity id to ten tokens, three of them gone.
        for index in 0..<10 {
            let response = try serve.curl(
                "POST", "/v1/activities/match-9/tokens", key: device,
                json: #"{"token": "\#(ServeNativeAPITests.token("a9", index))", "device_id": "a-\#(index)"}"#)
            XCTAssertEqual(response.status, 200, response.text)
        }
        let update = try serve.curl(
            "POST", "/v1/activities/match-9/update", key: server, json: #"{"content_state": {"home": 1, "away": 0}}"#)
        XCTAssertEqual(update.status, 202, update.text)
        let updated = try serve.waitForDispatch(try XCTUnwrap(try update.object()["dispatch_id"] as? String))
        XCTAssertEqual(updated["notifications"] as? Int, 10, "\(updated)")
        XCTAssertEqual(updated["delivered"] as? Int, 7, "\(updated)")
        XCTAssertEqual(updated["unregistered"] as? Int, 3, "\(updated)")

        // A regular push to four users' devices, one of them gone.
        for index in 0..<4 {
            let response = try serve.curl(
                "POST", "/v1/devices", key: device,
                json:
                    #"{"device_id": "d-\#(index)", "user_id": "u-\#(index)", "push_token": "\#(ServeNativeAPITests.token("c9", index))"}"#
            )
            XCTAssertEqual(response.status, 200, response.text)
        }
        let push = try serve.curl(
            "POST", "/v1/push", key: server,
            json: #"{"alert": {"title": "Full time"}, "audience": {"users": ["u-0", "u-1", "u-2", "u-3"]}}"#)
        XCTAssertEqual(push.status, 202, push.text)
        let pushed = try serve.waitForDispatch(try XCTUnwrap(try push.object()["dispatch_id"] as? String))
        XCTAssertEqual(pushed["notifications"] as? Int, 4, "\(pushed)")
        XCTAssertEqual(pushed["delivered"] as? Int, 3, "\(pushed)")
        XCTAssertEqual(pushed["unregistered"] as? Int, 1, "\(pushed)")

        let before = try serve.curl("GET", "/v1/status", key: server).object()
        let page = try renderedPage(fragment: "#key=\(server)")
        let after = try serve.curl("GET", "/v1/status", key: server).object()

        XCTAssertTrue(page.loaded, "the page rendered a status: \(page.html)")
        XCTAssertEqual(page.text(id: "error"), "", page.html)
        XCTAssertFalse(page.loginShown, "a server key needs no form")
        XCTAssertEqual(page.text(id: "workspace"), "acme")
        let rows = page.rows()
        let ids = try [updated, pushed].map { try XCTUnwrap($0["id"] as? String) }
        XCTAssertEqual(Set(rows.keys), Set(ids), page.html)
        for id in ids {
            // Read again through the API: the page must show what GET /v1/dispatches/{id} says.
            let api = try serve.curl("GET", "/v1/dispatches/\(id)", key: server).object()
            let row = try XCTUnwrap(rows[id], "a row for \(id): \(page.html)")
            for field in ["state", "kind", "app"] {
                XCTAssertEqual(row[field], api[field] as? String, "\(field) of \(id)")
            }
            for field in ["notifications", "delivered", "unregistered", "rejected", "failed"] {
                XCTAssertEqual(row[field], (api[field] as? Int).map { String($0) }, "\(field) of \(id)")
            }
            let other = ["expired", "rate_limited", "invalid", "superseded"].reduce(0) { $0 + (api[$1] as? Int ?? 0) }
            XCTAssertEqual(row["other"], String(other), "other of \(id)")
        }

        // The tiles. Every poll of the page takes one request from the budget: the page shows what was left after
        // its last poll, the API's read afterwards took one more.
        let shownBudget = try XCTUnwrap(page.text(id: "budget-remaining").flatMap { Int($0) }, page.html)
        let budgetBefore = try XCTUnwrap((before["budget"] as? [String: Any])?["remaining"] as? Int)
        let budgetAfter = try XCTUnwrap((after["budget"] as? [String: Any])?["remaining"] as? Int)
        XCTAssertLessThan(shownBudget, budgetBefore, "the page polled at least once")
        XCTAssertEqual(shownBudget, budgetAfter + 1)
        XCTAssertEqual(page.text(id: "budget-limit"), "1")
        XCTAssertEqual(page.text(id: "apns-connections"), (after["apns_connections"] as? Int).map { String($0) })
        XCTAssertEqual(page.text(id: "running-dispatches"), "0")
        XCTAssertFalse(serve.log.contains(server), "the key in the fragment never reaches the server")
    }

    func testWithoutAServerKeyThePageShowsNoDispatches() throws {
        let update = try serve.curl(
            "POST", "/v1/activities/match-9/update", key: ServeKeys.acmeServer, json: #"{"content_state": {}}"#)
        XCTAssertEqual(update.status, 202, update.text)
        _ = try serve.waitForDispatch(try XCTUnwrap(try update.object()["dispatch_id"] as? String))

        let noKey = try renderedPage(fragment: "")
        XCTAssertTrue(noKey.loginShown, "no key: the form asks for one: \(noKey.html)")
        XCTAssertEqual(noKey.rows().count, 0)
        XCTAssertEqual(noKey.text(id: "error"), "")
        XCTAssertFalse(noKey.loaded)

        for key in [ServeKeys.acmeDevice, "sk_guess"] {
            let refused = try renderedPage(fragment: "#key=\(key)")
            XCTAssertTrue(refused.loginShown, "\(key): the form asks again: \(refused.html)")
            XCTAssertEqual(refused.text(id: "error"), "That key is not a server key of any workspace.", key)
            XCTAssertEqual(refused.rows().count, 0, key)
            XCTAssertEqual(refused.text(id: "workspace"), "", key)
            XCTAssertFalse(refused.loaded, key)
        }
    }

    /// The page as chromium rendered it after its script ran. `--virtual-time-budget` runs the page's timers in
    /// virtual time, which stands still while a fetch is pending; 2.5 s is not a multiple of the 1 s poll, so no
    /// poll is under way when `--dump-dom` prints the DOM. A fresh profile each time: no session storage carries
    /// over. `--no-sandbox` because the tests may run as root (containers, CI), where chromium's sandbox refuses.
    private func renderedPage(fragment: String) throws -> StatusPageDOM {
        let chromium = try XCTUnwrap(ProcessSupport.findTool("chromium"), "chromium is installed by make deps")
        let profile = (directory as NSString).appendingPathComponent("profile-\(UUID().uuidString)")
        let result = try ProcessSupport.run(
            chromium,
            [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--user-data-dir=\(profile)", "--virtual-time-budget=2500", "--dump-dom",
                serve.baseURL + "/" + fragment,
            ], environment: ProcessSupport.cleanEnvironment(), timeout: 30)
        XCTAssertEqual(result.exitCode, 0, result.summary)
        XCTAssertTrue(result.stdout.contains("<tbody id=\"dispatches\">"), result.summary)
        return StatusPageDOM(html: result.stdout)
    }
}

/// What the test reads from the DOM chromium dumped: the serialization is Chromium's own, so the elements the page
/// builds come out in one predictable shape (`<td class="delivered">7</td>`).
private struct StatusPageDOM {
    let html: String

    /// The text of the element with this id (a tile, the error line, the workspace), nil when there is none.
    func text(id: String) -> String? {
        let pattern = #"id="\#(id)"[^>]*>([^<]*)<"#
        guard let regex = try? Regex(pattern, as: (Substring, Substring).self),
            let match = html.firstMatch(of: regex)
        else { return nil }
        return Self.unescape(match.output.1)
    }

    /// The dispatch rows: id → cell class → text.
    func rows() -> [String: [String: String]] {
        var rows: [String: [String: String]] = [:]
        for row in html.matches(of: #/<tr data-dispatch="([^"]*)">(.*?)</tr>/#) {
            var cells: [String: String] = [:]
            for cell in row.output.2.matches(of: #/<td class="([^"]*)">([^<]*)</td>/#) {
                cells[String(cell.output.1)] = Self.unescape(cell.output.2)
            }
            rows[String(row.output.1)] = cells
        }
        return rows
    }

    /// Whether the key form is visible (the page removes its `hidden` attribute).
    var loginShown: Bool {
        guard let form = html.firstMatch(of: #/<form id="login"([^>]*)>/#) else { return false }
        return !form.output.1.contains("hidden")
    }

    /// Whether a status was rendered (the page sets `data-loaded` on the body).
    var loaded: Bool { html.contains(#"data-loaded="true""#) }

    private static func unescape(_ text: Substring) -> String {
        text.replacingOccurrences(of: "&lt;", with: "<").replacingOccurrences(of: "&gt;", with: ">")
            .replacingOccurrences(of: "&nbsp;", with: "\u{a0}").replacingOccurrences(of: "&amp;", with: "&")
    }
}
