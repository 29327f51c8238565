#!/usr/bin/env bash
# h2load's rate against mock-apns and against nghttpd on this machine, same flags
# (-c 4 -m 100, 300-byte body, TLS), median of RUNS runs each. Usage:
#   scripts/compare-h2load.sh [REQUESTS] [RUNS] [MOCK_THREADS]
set -euo pipefail
requests=${1:-200000}
runs=${2:-3}
threads=${3:-2}
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

python3 -c "import json; print(json.dumps({'aps': {'alert': {'title': 'Benchmark', 'body': 'x' * 240}}}, separators=(',', ':')))" \
    | head -c 300 > "$work/body.json"
python3 - "$work/body.json" <<'PY'
import sys, json
path = sys.argv[1]
body = {'aps': {'alert': {'title': 'Benchmark', 'body': ''}}}
base = len(json.dumps(body, separators=(',', ':')))
body['aps']['alert']['body'] = 'x' * (300 - base)
open(path, 'w').write(json.dumps(body, separators=(',', ':')))
PY
token=$(printf '%064x' 1)

"$bin/mock-apns" --listen 127.0.0.1:0 --tls-dir "$work/tls" --no-auth --threads "$threads" > "$work/mock.out" &
for _ in $(seq 100); do grep -q listening "$work/mock.out" && break; sleep 0.1; done
mock_port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$work/mock.out")

mkdir -p "$work/docroot/3/device" && echo ok > "$work/docroot/3/device/$token"
nghttpd_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nghttpd -n "$threads" -d "$work/docroot" "$nghttpd_port" "$work/tls/server-key.pem" "$work/tls/server.pem" >/dev/null 2>&1 &
sleep 0.5

rate() {  # rate URL
    h2load -n "$requests" -c 4 -m 100 -d "$work/body.json" -H 'apns-topic: com.example.bench' "$1" 2>&1 \
        | sed -n 's/.*finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p'
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "cores: $(nproc), requests per run: $requests, runs: $runs, server threads: $threads"
mock_rates=(); nghttpd_rates=()
for _ in $(seq "$runs"); do
    mock_rates+=("$(rate "https://127.0.0.1:$mock_port/3/device/$token")")
    nghttpd_rates+=("$(rate "https://127.0.0.1:$nghttpd_port/3/device/$token")")
done
mock_median=$(printf '%s\n' "${mock_rates[@]}" | median)
nghttpd_median=$(printf '%s\n' "${nghttpd_rates[@]}" | median)
echo "mock-apns: ${mock_rates[*]} req/s (median $mock_median)"
echo "nghttpd:   ${nghttpd_rates[*]} req/s (median $nghttpd_median)"
awk -v m="$mock_median" -v n="$nghttpd_median" 'BEGIN {printf "mock-apns / nghttpd = %.2f\n", m / n}'
