import CommandLineSupport
import Foundation
import MockAPNsKit

let usage = """
    mock-apns: an APNs look-alike over HTTP/2 and TLS, with fault injection, for tests and load tests.

    usage: mock-apns --listen HOST:PORT [--tls-dir DIR | --cert PEM --key PEM | --h2c]
                     [--auth-key PEM_OR_P8 | --no-auth] [--key-id ID] [--team-id ID] [--client-ca PEM]
                     [--max-streams N] [--threads N] [--stats FILE] [--record FILE] [--unregistered FILE]
                     [--fail RATE:STATUS:REASON]... [--latency-ms N] [--goaway-every N] [--drop-every N]
                     [--refuse-every N] [--blackhole-every N] [--blackhole-after N] [--throttle-after-reject] [--token-max-age SECONDS] [--seed N]
                     [--manage-listen HOST:PORT] [--environment development|production] [--max-channels-per-app N]

      --listen HOST:PORT        address to listen on; port 0 picks a free one (printed on start)
      --tls-dir DIR             create or reuse ca.pem, server.pem, server-key.pem, auth-key.p8, auth-key.pub.pem
                                and a provider certificate for com.example.app signed by ca.pem (client.pem,
                                client-key.pem, client.p12 with password fanout-test) in DIR; tokens are verified
                                against auth-key unless --no-auth
      --cert PEM --key PEM      serve this certificate chain and key instead
      --h2c                     no TLS: cleartext HTTP/2 with prior knowledge (h2load http://, curl
                                --http2-prior-knowledge); provider tokens are checked only with --auth-key
      --auth-key PEM_OR_P8      public key (or .p8 private key) that provider tokens must verify with
      --no-auth                 accept requests without checking provider tokens
      --key-id ID, --team-id ID reject tokens whose kid / iss differ (InvalidProviderToken)
      --client-ca PEM           ask clients for a certificate and verify it against these CAs: a verified one
                                authenticates the connection without a token (topics it does not name get 400
                                TopicDisallowed); a wrong one fails the TLS handshake; none needs a token
      --max-streams N           MAX_CONCURRENT_STREAMS after the first valid token (default 1000)
      --threads N               event-loop threads (default 1)
      --stats FILE              JSON counters, rewritten every second and on exit
      --record FILE             append "token apns-id" for each accepted notification
      --unregistered FILE       tokens answered 410 Unregistered, one per line, each optionally followed by the
                                Unix milliseconds the 410 is dated with (default: when it answers)
      --fail RATE:STATUS:REASON answer that share of requests with that error (repeatable)
      --latency-ms N            delay every answer by N ms
      --goaway-every N          send GOAWAY after every Nth request
      --drop-every N            drop the TCP connection at every Nth request
      --refuse-every N          reset every Nth stream with REFUSED_STREAM
      --blackhole-every N       accept every Nth stream and never answer it (the client must time out)
      --blackhole-after N       answer the first N streams, then accept and never answer the rest
      --throttle-after-reject   drop the stream limit to 1 after a rejection, until the next accepted push
      --token-max-age SECONDS   oldest provider-token iat accepted (default 3600)
      --seed N                  seed of the fault draws (default 1)
      --manage-listen HOST:PORT serve the broadcast channel-management API (/1/apps/BUNDLE/channels) there too,
                                with the same TLS material and token checks; prints "manage listening on ..."
      --environment ENV         development (default) or production; channels belong to this mock only
      --max-channels-per-app N  channels one app may have before CannotCreateChannelConfig (default 10000)
    """

func parse(_ arguments: [String]) throws(UsageError) -> MockOptions? {
    var options = MockOptions()
    var cursor = ArgumentCursor(arguments)
    var sawListen = false
    var certificate: String?
    var key: String?
    var cleartext = false
    while let flag = try cursor.nextFlag() {
        switch flag {
        case "--help", "-h": return nil
        case "--listen":
            let (host, port) = try cursor.hostPort()
            options.host = host
            options.port = port
            sawListen = true
        case "--tls-dir": options.tls = .directory(try cursor.string())
        case "--cert": certificate = try cursor.string()
        case "--key": key = try cursor.string()
        case "--h2c": cleartext = true
        case "--auth-key": options.authKeyPath = try cursor.string()
        case "--no-auth": options.noAuth = true
        case "--client-ca": options.clientCAPath = try cursor.string()
        case "--key-id": options.keyID = try cursor.string()
        case "--team-id": options.teamID = try cursor.string()
        case "--max-streams": options.maxStreams = UInt32(try cursor.int(in: 1...100_000))
        case "--threads": options.threads = try cursor.int(in: 1...64)
        case "--stats": options.statsPath = try cursor.string()
        case "--record": options.recordPath = try cursor.string()
        case "--unregistered": options.unregisteredPath = try cursor.string()
        case "--fail":
            let text = try cursor.string()
            guard let failure = InjectedFailure(parsing: text) else {
                throw UsageError("--fail takes RATE:STATUS:REASON (e.g. 0.05:503:ServiceUnavailable), not '\(text)'")
            }
            options.failures.append(failure)
        case "--latency-ms": options.latencyMilliseconds = UInt64(try cursor.int(in: 0...600_000))
        case "--goaway-every": options.goawayEvery = try cursor.int(in: 0...Int(Int32.max))
        case "--drop-every": options.dropEvery = try cursor.int(in: 0...Int(Int32.max))
        case "--refuse-every": options.refuseEvery = try cursor.int(in: 0...Int(Int32.max))
        case "--blackhole-every": options.blackholeEvery = try cursor.int(in: 0...Int(Int32.max))
        case "--blackhole-after": options.blackholeAfter = try cursor.int(in: 0...Int(Int32.max))
        case "--throttle-after-reject": options.throttleAfterReject = true
        case "--token-max-age": options.tokenMaxAge = Int64(try cursor.int(in: 1...86_400 * 365))
        case "--seed": options.seed = UInt64(try cursor.int(in: 0...Int.max))
        case "--manage-listen":
            let (host, port) = try cursor.hostPort()
            options.manageListen = MockListenAddress(host: host, port: port)
        case "--environment":
            let text = try cursor.string()
            guard let environment = MockEnvironment(rawValue: text) else {
                throw UsageError("--environment takes development or production, not '\(text)'")
            }
            options.environment = environment
        case "--max-channels-per-app": options.maxChannelsPerApp = try cursor.int(in: 1...10_000_000)
        default: throw UsageError("unknown option \(flag) (see mock-apns --help)")
        }
    }
    guard sawListen else { throw UsageError("--listen HOST:PORT is required (see mock-apns --help)") }
    switch (certificate, key) {
    case (nil, nil): break
    case (let certificate?, let key?):
        guard options.tls == nil else { throw UsageError("give either --tls-dir or --cert/--key, not both") }
        options.tls = .files(certificate: certificate, key: key)
    default: throw UsageError("--cert and --key go together")
    }
    if cleartext {
        guard options.tls == nil else {
            throw UsageError("--h2c is cleartext: give it without --tls-dir or --cert/--key")
        }
        if !options.noAuth && options.authKeyPath == nil {
            guard options.keyID == nil && options.teamID == nil else {
                throw UsageError(
                    "--key-id and --team-id are checked with the token's signature: with --h2c give --auth-key")
            }
            // No TLS directory to take a signing key from: a cleartext mock is for load tests (h2load http://).
            options.noAuth = true
            StandardStream.error.write("mock-apns: --h2c without --auth-key: provider tokens are not checked\n")
        }
        options.tls = .cleartext
    }
    if options.clientCAPath != nil, options.tls == .cleartext {
        throw UsageError("--client-ca checks certificates in the TLS handshake: give it with --tls-dir or --cert/--key")
    }
    guard options.tls != nil else { throw UsageError("give --tls-dir DIR, --cert PEM --key PEM or --h2c") }
    let failureShare = options.failures.reduce(0) { $0 + $1.rate }
    guard failureShare <= 1 else { throw UsageError("--fail rates add up to \(failureShare), more than 1") }
    return options
}

let options: MockOptions
do {
    guard let parsed = try parse(Array(CommandLine.arguments.dropFirst())) else {
        print(usage)
        exit(0)
    }
    options = parsed
} catch {
    StandardStream.error.write("mock-apns: \(error.message)\n")
    exit(2)
}

signal(SIGINT, SIG_IGN)
signal(SIGTERM, SIG_IGN)
signal(SIGPIPE, SIG_IGN)

let server: MockAPNsServer
do {
    server = try MockAPNsServer(options: options)
} catch {
    StandardStream.error.write("mock-apns: \(error)\n")
    exit(2)
}
/// HOST as the listening lines show it: an IPv6 address in brackets.
func shown(_ host: String) -> String { host.contains(":") ? "[\(host)]" : host }
print("listening on \(shown(options.host)):\(server.port)")
if let manageHost = server.manageHost, let managePort = server.managePort {
    print("manage listening on \(shown(manageHost)):\(managePort)")
}
fflush(nil)  // all streams: Swift 6 forbids naming the global `stdout`

let stopped = DispatchSemaphore(value: 0)
var signalSources: [DispatchSourceSignal] = []
for number in [SIGINT, SIGTERM] {
    let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
    source.setEventHandler { stopped.signal() }
    source.resume()
    signalSources.append(source)
}
stopped.wait()
server.shutdown()
exit(0)
