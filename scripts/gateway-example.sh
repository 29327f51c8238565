#!/usr/bin/env bash
# make gateway-example: build examples/gateway (a package of its own that depends on this one, as a gateway's would)
# and run it against two mock-apns: one that answers (alert, 10,000-token Live Activity job, 6,000 concurrent sends)
# and one that never does (--blackhole-every 1: a send's 200 ms deadline). Prints the gateway's JSON lines and exits
# with its status.
#
# The example names its dependency `package: "fanout"`, and SwiftPM names a path dependency after its folder, which is
# the clone's (main, fanout, repo, ...): so it depends on .deps/fanout, a symlink to this repository's root made here
# (git ignores it), whatever the clone's folder is called.
set -euo pipefail
cd "$(dirname "$0")/.."
SWIFT=${SWIFT:-swift}
example=examples/gateway

mkdir -p "$example/.deps"
[ -L "$example/.deps/fanout" ] || { rm -rf "$example/.deps/fanout" && ln -s ../../.. "$example/.deps/fanout"; }

"$SWIFT" build -c release --product mock-apns
bin=$("$SWIFT" build -c release --show-bin-path)
# Its own build directory (examples/gateway/.build): it compiles the Fanout modules there again. SwiftPM keeps the
# dependency's list of source files from the example's last build (reached through the .deps symlink, it does not
# look again), so when a file of the package was added, removed or renamed since, that build directory is thrown
# away first: the list of the package's files is kept beside it and compared.
sources=$(cd "$example/.deps/fanout" && find Sources Package.swift -name '*.swift' -o -name 'module.modulemap' -o -name '*.[ch]' | LC_ALL=C sort | sha256sum | cut -d' ' -f1)
stamp="$example/.build/fanout-sources.sha256"
if [ -d "$example/.build" ] && [ "$(cat "$stamp" 2>/dev/null)" != "$sources" ]; then
    echo "gateway-example: the package's files changed since the example's last build; building it afresh" >&2
    rm -rf "$example/.build"
fi
"$SWIFT" build -c release --package-path "$example"
echo "$sources" > "$stamp"
gateway="$("$SWIFT" build -c release --package-path "$example" --show-bin-path)/gateway"

work=$(mktemp -d "${TMPDIR:-/tmp}/gateway-example.XXXXXX")
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# start_mock NAME [ARGS...]: mock-apns in the background on a free port (printed in $port), its output in
# $work/NAME.out and .err, with the TLS material and signing key in $work/tls.
start_mock() {
    local name=$1
    shift
    "$bin/mock-apns" --listen 127.0.0.1:0 --tls-dir "$work/tls" --key-id GATEWAYKEY --team-id GATEWAYTMX \
        "$@" > "$work/$name.out" 2> "$work/$name.err" &
    local pid=$!
    pids+=("$pid")
    for _ in $(seq 100); do
        grep -q '^listening on' "$work/$name.out" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || { cat "$work/$name.err" >&2; exit 1; }
        sleep 0.1
    done
    port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$work/$name.out")
    [ -n "$port" ] || { echo "mock-apns $name did not start" >&2; cat "$work/$name.err" >&2; exit 1; }
}

start_mock mock
mock_port=$port
start_mock blackhole --blackhole-every 1
blackhole_port=$port
echo "mock-apns on 127.0.0.1:$mock_port, and on 127.0.0.1:$blackhole_port with --blackhole-every 1"

echo "gateway --endpoint localhost:$mock_port --deadline-endpoint localhost:$blackhole_port ..."
set +e
"$gateway" --endpoint "localhost:$mock_port" --ca-file "$work/tls/ca.pem" --key "$work/tls/auth-key.p8" \
    --key-id GATEWAYKEY --team-id GATEWAYTMX --deadline-endpoint "localhost:$blackhole_port"
status=$?
set -e
if [ "$status" = 0 ]; then echo "gateway example OK"; else echo "gateway example FAILED (exit $status)"; fi
exit "$status"
