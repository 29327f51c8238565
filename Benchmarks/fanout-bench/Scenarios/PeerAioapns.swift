import Foundation

/// peer-aioapns: aioapns, a Python APNs client, installed from PyPI into a virtual environment in
/// the scratch directory, sends the same notifications (the same 1 KiB Live Activity payload to the
/// same tokens, JWT auth) to the same mock-apns as Fanout does with 1 loop and 1 connection;
/// `ratio_vs_aioapns` = Fanout's rate / aioapns's rate. Whatever goes wrong on the Python side
/// (no python3, no venv module, no PyPI, a failed run) prints a skip line; the bench goes on.
func runPeerAioapns(_ bench: BenchContext) throws {
    let count = bench.quick ? 2_000 : 50_000
    do {
        let python = try installAioapns(bench)
        let tokensFile = try bench.tokensFile(count: count)
        let body = "\(bench.work)/aioapns-body.json"
        _ = FileManager.default.createFile(atPath: body, contents: Data(liveActivityPayload(size: 1024)))
        let script = "\(bench.work)/aioapns_bench.py"
        _ = FileManager.default.createFile(atPath: script, contents: Data(aioapnsScript.utf8))
        var fanoutRuns: [[String: Any]] = []
        var peerRuns: [[String: Any]] = []
        for _ in 0..<bench.runs {
            fanoutRuns.append(
                try bench.measureChild(
                    ChildOptions(tokens: count, tokensFile: tokensFile, loops: 1, connections: 1, streams: 1000)))
            let child = try ChildProcess.start(
                python,
                [
                    script, String(bench.mock.port), "\(bench.mock.tlsDirectory)/ca.pem",
                    "\(bench.mock.tlsDirectory)/auth-key.p8", MockProcess.keyID, MockProcess.teamID, benchTopic,
                    String(count), body, "1000",
                ], in: bench.work)
            let status = child.wait(seconds: 600)
            guard status == 0, let line = child.output.split(separator: "\n").last,
                let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            else {
                throw BenchError("aioapns run failed (exit \(status)): \(child.errorOutput.suffix(600))")
            }
            guard Int(number(object["delivered"])) == count else {
                throw BenchError(
                    "aioapns delivered \(Int(number(object["delivered"]))) of \(count): \(child.errorOutput.suffix(600))"
                )
            }
            peerRuns.append(object)
        }
        let fanout = spread(fanoutRuns, "rate")
        let peer = spread(peerRuns, "rate")
        let ratio = fanout.median / peer.median
        let version = (peerRuns.first?["aioapns_version"] as? String) ?? "?"
        print(
            String(
                format:
                    "peer-aioapns: %d notifications, up to 1000 in flight: Fanout (1 connection) %.0f/s [%.0f-%.0f], "
                    + "%.2f CPU s; aioapns %@ (%d connection(s)) %.0f/s [%.0f-%.0f], %.2f CPU s, %.0f MB peak; "
                    + "ratio_vs_aioapns %.1f (goal >= 30)",
                count, fanout.median, fanout.min, fanout.max, spread(fanoutRuns, "cpu_seconds").median, version,
                Int(spread(peerRuns, "connections").max), peer.median, peer.min, peer.max,
                spread(peerRuns, "cpu_seconds").median, spread(peerRuns, "peak_rss_mb").median, ratio))
        bench.record([
            "scenario": "peer-aioapns", "notifications": count, "rate": fanout.median, "rate_min": fanout.min,
            "rate_max": fanout.max, "seconds": spread(fanoutRuns, "seconds").median,
            "cpu_seconds": spread(fanoutRuns, "cpu_seconds").median,
            "peak_rss_mb": spread(fanoutRuns, "peak_rss_mb").median, "aioapns_version": version,
            "aioapns_rate": peer.median, "aioapns_rate_min": peer.min, "aioapns_rate_max": peer.max,
            "aioapns_cpu_seconds": spread(peerRuns, "cpu_seconds").median,
            "aioapns_peak_rss_mb": spread(peerRuns, "peak_rss_mb").median, "ratio_vs_aioapns": ratio,
            "aioapns_connections": Int(spread(peerRuns, "connections").max),
            "key_figure": String(format: "ratio_vs_aioapns %.1f (aioapns %.0f/s)", ratio, peer.median),
        ])
    } catch {
        let reason = "\(error)".split(separator: "\n").joined(separator: " ")
        print("peer-aioapns: skipped: \(reason)")
        bench.record([
            "scenario": "peer-aioapns", "notifications": 0, "rate": 0, "seconds": 0, "cpu_seconds": 0,
            "peak_rss_mb": 0, "skipped": reason, "key_figure": "skipped (see above)",
        ])
    }
}

/// Creates a virtual environment in the scratch directory and installs aioapns into it; returns
/// its python.
func installAioapns(_ bench: BenchContext) throws -> String {
    guard let python3 = findTool("python3") else { throw BenchError("python3 not found") }
    let venv = "\(bench.work)/aioapns-venv"
    let create = try ChildProcess.start(python3, ["-m", "venv", venv], in: bench.work)
    guard create.wait(seconds: 120) == 0 else {
        throw BenchError("python3 -m venv failed (install python3-venv?): \(create.errorOutput.suffix(300))")
    }
    let pip = try ChildProcess.start(
        "\(venv)/bin/python",
        [
            "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--timeout", "20", "--retries", "2",
            "aioapns",
        ],
        in: bench.work)
    guard pip.wait(seconds: 300) == 0 else {
        let last = pip.errorOutput.split(separator: "\n").last { !$0.trimmingCharacters(in: .whitespaces).isEmpty }
        throw BenchError("pip install aioapns failed (no access to PyPI?): \(last ?? "")")
    }
    return "\(venv)/bin/python"
}

/// Sends COUNT notifications with aioapns to the mock and prints one JSON line. aioapns always
/// connects to Apple's hosts on port 443: the protocol classes' APNS_SERVER and APNS_PORT are
/// pointed at the mock, and the SSL context (aioapns's `ssl_context` option) trusts the mock's CA
/// and offers ALPN h2. Up to CONCURRENCY sends are in flight, as Fanout keeps 1000 streams open.
let aioapnsScript = #"""
    import asyncio, json, ssl, sys, time, resource
    from importlib.metadata import version
    from aioapns import APNs, NotificationRequest, PushType
    from aioapns import connection as aio_connection

    port, ca, key_path, key_id, team_id, topic, count, body_path, concurrency = sys.argv[1:10]
    port, count, concurrency = int(port), int(count), int(concurrency)
    for protocol in (aio_connection.APNsDevelopmentClientProtocol, aio_connection.APNsProductionClientProtocol):
        protocol.APNS_SERVER = "localhost"
        protocol.APNS_PORT = port

    def token(i):
        digits = format(i, "x")
        return "f" + "0" * (63 - len(digits)) + digits

    def usage():
        r = resource.getrusage(resource.RUSAGE_SELF)
        peak = 0.0
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
        return r.ru_utime + r.ru_stime, peak

    async def main():
        context = ssl.create_default_context(cafile=ca)
        context.set_alpn_protocols(["h2"])
        with open(key_path) as key_file:
            key = key_file.read()
        with open(body_path) as body_file:
            message = json.load(body_file)
        client = APNs(key=key, key_id=key_id, team_id=team_id, topic=topic, use_sandbox=True, ssl_context=context)
        tally = {"delivered": 0, "failed": 0, "errors": 0}
        gate = asyncio.Semaphore(concurrency)

        async def send(i):
            async with gate:
                try:
                    result = await client.send_notification(NotificationRequest(
                        device_token=token(i), message=message, priority=10, push_type=PushType.LIVEACTIVITY))
                    tally["delivered" if result.is_successful else "failed"] += 1
                except Exception as error:
                    tally["errors"] += 1
                    print("send failed:", repr(error), file=sys.stderr)

        cpu_before, _ = usage()
        start = time.perf_counter()
        # The first alone: APNs (and mock-apns) allow one stream until a connection's first valid token.
        await send(0)
        await asyncio.gather(*(send(i) for i in range(1, count)))
        seconds = time.perf_counter() - start
        cpu_after, peak = usage()
        print(json.dumps({
            "notifications": count, "seconds": seconds, "rate": tally["delivered"] / seconds,
            "cpu_seconds": cpu_after - cpu_before, "peak_rss_mb": peak, "aioapns_version": version("aioapns"),
            "connections": len(client.pool.connections), **tally}))

    asyncio.run(main())
    """#
